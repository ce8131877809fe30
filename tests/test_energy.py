"""Energy over the timed steps: the arithmetic from NVML counter readings (hand numbers), when the meter reads
them, which GPUs it reads, and what a machine without NVML or a GPU records. The NVML calls themselves run only on
an NVIDIA GPU (docs/cost.md: what the GPU suite must check); here a stand-in pynvml module (NVML is the boundary:
this machine has none) gives the counters of a host of 8 GPUs, so that shardbench's own code around it runs."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import jax
import pytest

from shardbench.measure import energy
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


@dataclass(frozen=True)
class Gpu:
    """A JAX GPU device as the meter reads one: its platform and CUDA ordinal (`local_hardware_id`)."""

    local_hardware_id: int | None
    platform: str = "gpu"


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
    cpu = EnergyMeter.for_this_host(2, jax.local_devices()[:2])
    assert cpu.counters is None and cpu.why_not == "no energy counters on cpu"


def test_nvml_without_a_gpu_says_why() -> None:
    """On this machine: pynvml absent, or present with no driver or GPU; either way a reason, never a failure."""
    counters, why = NvmlCounters.open([Gpu(0)])
    if counters is not None:
        pytest.skip("an NVIDIA GPU with energy counters is present: the GPU suite checks this path")
    assert why and ("pynvml is not installed" in why or "NVML" in why)
    meter = EnergyMeter.for_this_host(2, [Gpu(0)])
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


BUSY = (2, 3)  # a `train --devices 2` run's GPUs on a host of 8: 600 W each; the other 6 idle at 70 W


@pytest.fixture
def eight_gpus(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A stand-in pynvml for one host of 8 GPUs (NVML's index i is handle i), GPUs 2 and 3 drawing 600 W and the
    rest 70 W, whose energy counters advance with a clock the test sets (the list's one value, in seconds), which
    the meter's timestamps read too."""
    clock = [0.0]

    class NVMLError(Exception):
        pass

    def joules_so_far(handle: int) -> int:
        return int((600 if handle in BUSY else 70) * clock[0] * 1000)  # millijoules

    nvml = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 8,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetHandleByUUID=lambda u: int(u.removeprefix("GPU-")),
        nvmlDeviceGetTotalEnergyConsumption=joules_so_far)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(energy, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return clock


def _watts_over_10_s(devices: list[Gpu], clock: list[float]) -> float:
    meter = EnergyMeter.for_this_host(0, devices)
    meter.completed(1)  # no warm-up: the window opens at the first arrival
    clock[0] = 10.0
    meter.stop()
    assert meter.result is not None, meter.why_not
    return meter.result.watts_per_gpu


def test_a_run_on_2_of_8_gpus_reads_only_its_own(eight_gpus: list[float]) -> None:
    """The run's 2 busy GPUs of 8, not the 6 idle ones averaged in: 600 W per GPU (not (2 x 600 + 6 x 70) / 8)."""
    assert _watts_over_10_s([Gpu(2), Gpu(3)], eight_gpus) == pytest.approx(600.0)


def test_the_run_s_gpus_are_found_among_the_visible_ones_in_cuda_s_order(eight_gpus: list[float],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA_VISIBLE_DEVICES=5,2,GPU-3 CUDA numbers those three 0, 1, 2: JAX's devices 1 and 2 are NVML's GPUs
    2 and 3 (by index and by UUID), the busy ones; device 0 alone is GPU 5, idle."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,2,GPU-3")
    assert _watts_over_10_s([Gpu(1), Gpu(2)], eight_gpus) == pytest.approx(600.0)
    eight_gpus[0] = 0.0
    assert _watts_over_10_s([Gpu(0)], eight_gpus) == pytest.approx(70.0)


def test_a_device_that_cannot_be_placed_leaves_energy_estimated(eight_gpus: list[float],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A device past the visible GPUs (or without a number) is not guessed at: no counters, and the reason."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    for device in (Gpu(2), Gpu(None)):
        meter = EnergyMeter.for_this_host(0, [Gpu(0), device])
        assert meter.counters is None and "cannot tell which GPU" in meter.why_not, device
        meter.completed(1)
        meter.stop()
        assert meter.result is None
