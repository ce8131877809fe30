"""Energy of the timed steps, read from NVML's energy counters on NVIDIA GPUs (nvidia-ml-py, the `gpu` extra).

`EnergyMeter` reads the total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules since the driver
loaded) of each GPU the run uses on this host, no other, when the first timed step interval starts and again when
training ends; `window` turns two readings into joules over seconds, a pure function of the counters. Without
pynvml, without a GPU, or on a GPU too old to count energy (before Volta), the meter says why and the run's energy
is estimated from the price table's watts instead (`shardbench.prices`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

UUID_PREFIXES = ("GPU-", "MIG-")


class Device(Protocol):
    """What the meter reads of a JAX device (`jax.Device`): its platform and its number on this host, which for a
    GPU is its CUDA ordinal (counting only the GPUs CUDA_VISIBLE_DEVICES leaves visible), None where unknown."""

    @property
    def platform(self) -> str: ...

    @property
    def local_hardware_id(self) -> int | None: ...


@dataclass(frozen=True)
class Reading:
    """The energy counter (millijoules) of each GPU read, at one moment (seconds, `time.perf_counter`)."""

    millijoules: tuple[int, ...]
    at_s: float


@dataclass(frozen=True)
class Window:
    """Energy that `gpus` GPUs used together over `seconds`."""

    joules: float
    seconds: float
    gpus: int

    @property
    def watts_per_gpu(self) -> float:
        """Average power of one GPU over the window."""
        return self.joules / self.seconds / self.gpus


def window(start: Reading, end: Reading) -> Window | None:
    """The energy between two readings, or None when they cannot be compared: a different number of GPUs, no
    time between them, or a counter that went backwards (the driver reloaded between the readings)."""
    gpus = len(start.millijoules)
    seconds = end.at_s - start.at_s
    if gpus == 0 or len(end.millijoules) != gpus or seconds <= 0:
        return None
    deltas = [b - a for a, b in zip(start.millijoules, end.millijoules)]
    if min(deltas) < 0:
        return None
    return Window(joules=sum(deltas) / 1000.0, seconds=seconds, gpus=gpus)


def visible_gpus(setting: str | None, count: int) -> list[str]:
    """The GPUs this process may use, as NVML names them: CUDA_VISIBLE_DEVICES's entries (indices or UUIDs, up
    to the first invalid one, as CUDA reads it), else all `count` of the host's. NVML itself ignores that
    variable, so without this a run on 2 of a node's 8 GPUs would average the idle 6 (or another job's) in."""
    if setting is None:
        return [str(i) for i in range(count)]
    found = []
    for entry in (e.strip() for e in setting.split(",")):
        if not (entry.startswith(UUID_PREFIXES) or (entry.isdigit() and int(entry) < count)):
            break
        found.append(entry)
    return found


def run_gpus(devices: Sequence[Device], visible: Sequence[str]) -> tuple[list[str], str]:
    """The NVML names (indices or UUIDs, as `visible_gpus` gives them) of the GPUs `devices` run on, or [] and why.

    A JAX GPU device's local_hardware_id is its CUDA ordinal, the position of its GPU among the visible ones
    (JAX's GPU devices carry no PCI bus id to match NVML's by). That position names the same GPU as NVML's index
    where CUDA numbers GPUs as NVML does: with CUDA_DEVICE_ORDER=PCI_BUS_ID, and in practice on a host of one model
    under CUDA's default order. A device without that number, or one past the visible GPUs, leaves energy
    estimated: reading other GPUs would average idle ones (or another job's) into the run's."""
    names: list[str] = []
    for device in devices:
        ordinal = device.local_hardware_id
        if ordinal is None or not 0 <= ordinal < len(visible):
            return [], (f"cannot tell which GPU JAX device {device} is (local_hardware_id {ordinal}, "
                        f"{len(visible)} visible GPUs)")
        names.append(visible[ordinal])
    return list(dict.fromkeys(names)), ""


def _handle(nvml: Any, name: str) -> Any:
    """NVML's handle of a GPU named by index or UUID."""
    if name.startswith(UUID_PREFIXES):
        return nvml.nvmlDeviceGetHandleByUUID(name)
    return nvml.nvmlDeviceGetHandleByIndex(int(name))


class NvmlCounters:
    """The energy counters of the run's GPUs on this host through pynvml; `open` says why not where they cannot
    be read."""

    def __init__(self, nvml: Any, handles: Sequence[Any]) -> None:
        self._nvml = nvml
        self._handles = list(handles)

    @classmethod
    def open(cls, devices: Sequence[Device]) -> tuple[NvmlCounters | None, str]:
        """The counters of the GPUs `devices` (the run's JAX devices on this process) run on, or None and one line
        saying why energy will be estimated."""
        try:
            import pynvml
        except ImportError:
            return None, "pynvml is not installed (pip install 'shardbench[gpu]')"
        try:
            pynvml.nvmlInit()
            visible = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), pynvml.nvmlDeviceGetCount())
            if not visible:
                return None, "NVML sees no GPU"
            names, why = run_gpus(devices, visible)
            if not names:
                return None, why or "the run has no GPU on this host"
            counters = cls(pynvml, [_handle(pynvml, name) for name in names])
            counters.read()  # a GPU before Volta has no energy counter: find out now, not at the end
        except pynvml.NVMLError as err:
            return None, f"NVML cannot read the GPUs' energy counters ({err})"
        return counters, ""

    def read(self) -> Reading:
        values = tuple(int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self._handles)
        return Reading(values, time.perf_counter())


@dataclass
class EnergyMeter:
    """Reads the counters when the first timed step interval starts (after `warmup` intervals, as
    `measure.timing.StepTimer` counts them) and at `stop`. Tell it each step's arrival (`completed`)."""

    warmup: int
    counters: NvmlCounters | None = None
    why_not: str = ""
    _arrivals: int = 0
    _start: Reading | None = None
    result: Window | None = field(default=None)

    @classmethod
    def for_this_host(cls, warmup: int, devices: Sequence[Device]) -> EnergyMeter:
        """A meter on the NVIDIA GPUs that `devices`, the run's devices on this process, run on (only those: a run
        on 2 of a host's 8 GPUs reads 2 counters); on another platform (or without NVML) one that only says why."""
        if not devices:
            return cls(warmup, why_not="no device of the run on this process")
        if devices[0].platform != "gpu":
            return cls(warmup, why_not=f"no energy counters on {devices[0].platform}")
        counters, why = NvmlCounters.open(devices)
        return cls(warmup, counters, why)

    def after(self, arrived: Callable[[int], None]) -> Callable[[int], None]:
        """`arrived` (the step timer's), then this meter's `completed`: one callback for the loop."""

        def both(step: int) -> None:
            arrived(step)
            self.completed(step)

        return both

    def completed(self, step: int) -> None:
        """Step `step`'s results reached the host. The timer's first kept interval starts at arrival warmup + 1."""
        del step
        self._arrivals += 1
        if self.counters is not None and self._arrivals == self.warmup + 1:
            self._start = self._read()

    def stop(self) -> None:
        """Training ended (the last step settled): close the window."""
        if self.counters is None:
            return
        if self._start is None:
            self.why_not = "too few steps to read the energy over timed steps"
            return
        end = self._read()
        self.result = None if end is None else window(self._start, end)
        if self.result is None and not self.why_not:
            self.why_not = "the GPUs' energy counters went backwards or did not advance (driver reloaded?)"

    def _read(self) -> Reading | None:
        assert self.counters is not None
        try:
            return self.counters.read()
        except Exception as err:  # noqa: BLE001 - any NVML fault mid-run leaves energy estimated, not the run failed
            self.counters, self.why_not = None, f"NVML failed during the run ({err})"
            return None


__all__ = ["Device", "EnergyMeter", "NvmlCounters", "Reading", "Window", "run_gpus", "visible_gpus", "window"]
