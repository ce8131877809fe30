"""Energy over the timed steps: the arithmetic from NVML counter readings (hand numbers), when the meter reads
them, and what a machine without NVML or a GPU records. The NVML calls themselves run only on an NVIDIA GPU
(docs/cost.md: what the GPU suite must check); this file tests the code around them, not a stand-in for NVML."""

from __future__ import annotations

import pytest

from shardbench.measure.energy import EnergyMeter, NvmlCounters, Reading, Window, window


def test_window_from_counter_readings_by_hand() -> None:
    # Two GPUs: 1,000,000 -> 1,450,000 mJ and 2,000,000 -> 2,350,000 mJ over 2.5 s: 450 J + 350 J = 800 J;
    # 800 J / 2.5 s / 2 GPUs = 160 W per GPU.
    found = window(Reading((1_000_000, 2_000_000), 10.0), Reading((1_450_000, 2_350_000), 12.5))
    assert found == Window(800.0, 2.5, 2)
    assert found is not None and found.watts_per_gpu == pytest.approx(160.0)


def test_readings_that_cannot_be_compared_give_none() -> None:
    start = Reading((5_000, 7_000), 1.0)
    assert window(start, Reading((4_000, 8_000), 2.0)) is None  # a counter went back: the driver reloaded
    assert window(start, Reading((6_000,), 2.0)) is None  # a GPU more or less
    assert window(start, Reading((6_000, 8_000), 1.0)) is None  # no time between them
    assert window(Reading((), 1.0), Reading((), 2.0)) is None  # no GPU


class Counters(NvmlCounters):
    """Counters that advance 100 J per GPU a read, without NVML: what the meter does with readings, not NVML."""

    def __init__(self) -> None:
        super().__init__(None, [])
        self.reads = 0

    def read(self) -> Reading:
        self.reads += 1
        return Reading((self.reads * 100_000, self.reads * 100_000), float(self.reads))


def test_meter_reads_when_the_first_timed_interval_starts_and_at_stop() -> None:
    counters = Counters()
    meter = EnergyMeter(warmup=2, counters=counters)
    arrived: list[int] = []
    callback = meter.after(arrived.append)
    for step in range(1, 6):
        callback(step)
        # The step timer keeps intervals from arrival warmup + 2 on: the window opens at arrival warmup + 1.
        assert counters.reads == (1 if step >= 3 else 0)
    meter.stop()
    assert arrived == [1, 2, 3, 4, 5] and counters.reads == 2
    assert meter.result == Window(200.0, 1.0, 2)


def test_too_few_steps_or_no_gpu_leave_energy_estimated_with_the_reason() -> None:
    short = EnergyMeter(warmup=5, counters=Counters())
    for step in range(1, 4):
        short.completed(step)
    short.stop()
    assert short.result is None and "too few steps" in short.why_not
    cpu = EnergyMeter.for_this_host(2, "cpu")
    assert cpu.counters is None and cpu.why_not == "no energy counters on cpu"


def test_nvml_without_a_gpu_says_why() -> None:
    """On this machine: pynvml absent, or present with no driver or GPU; either way a reason, never a failure."""
    counters, why = NvmlCounters.open()
    if counters is not None:
        pytest.skip("an NVIDIA GPU with energy counters is present: the GPU suite checks this path")
    assert why and ("pynvml is not installed" in why or "NVML" in why)
    meter = EnergyMeter.for_this_host(2, "gpu")
    meter.completed(1)
    meter.stop()
    assert meter.result is None and meter.why_not == why


def test_the_counters_read_are_the_gpus_this_process_may_use() -> None:
    """NVML numbers every GPU of the host and ignores CUDA_VISIBLE_DEVICES; the meter reads the visible ones
    only (indices or UUIDs, up to the first entry CUDA would stop at), else all."""
    from shardbench.measure.energy import visible_gpus

    assert visible_gpus(None, 4) == ["0", "1", "2", "3"]
    assert visible_gpus("2,3", 8) == ["2", "3"]
    assert visible_gpus("GPU-5f2c, 1", 8) == ["GPU-5f2c", "1"]
    assert visible_gpus("1,9,2", 8) == ["1"]  # 9 does not exist: CUDA stops there
    assert visible_gpus("", 8) == []
