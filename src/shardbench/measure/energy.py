"""Energy of the timed steps, read from NVML's energy counters on NVIDIA GPUs (nvidia-ml-py, the `gpu` extra).

`EnergyMeter` reads every local GPU's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules
since the driver loaded) when the first timed step interval starts and again when training ends; `window` turns
two readings into joules over seconds, a pure function of the counters. Without pynvml, without a GPU, or on a
GPU too old to count energy (before Volta), the meter says why and the run's energy is estimated from the price
table's watts instead (`shardbench.prices`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reading:
    """Every local GPU's energy counter (millijoules) at one moment (seconds, `time.perf_counter`)."""

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
        if not (entry.startswith(("GPU-", "MIG-")) or (entry.isdigit() and int(entry) < count)):
            break
        found.append(entry)
    return found


class NvmlCounters:
    """The local GPUs' energy counters through pynvml; `open` says why not where they cannot be read."""

    def __init__(self, nvml: Any, handles: Sequence[Any]) -> None:
        self._nvml = nvml
        self._handles = list(handles)

    @classmethod
    def open(cls) -> tuple[NvmlCounters | None, str]:
        """The counters, or None and one line saying why energy will be estimated."""
        try:
            import pynvml
        except ImportError:
            return None, "pynvml is not installed (pip install 'shardbench[gpu]')"
        try:
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByUUID(v) if v.startswith(("GPU-", "MIG-"))
                       else pynvml.nvmlDeviceGetHandleByIndex(int(v))
                       for v in visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), pynvml.nvmlDeviceGetCount())]
            if not handles:
                return None, "NVML sees no GPU"
            counters = cls(pynvml, handles)
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
    def for_this_host(cls, warmup: int, platform: str) -> EnergyMeter:
        """A meter on this host's NVIDIA GPUs; on another platform (or without NVML) one that only says why not."""
        if platform != "gpu":
            return cls(warmup, why_not=f"no energy counters on {platform}")
        counters, why = NvmlCounters.open()
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


__all__ = ["EnergyMeter", "NvmlCounters", "Reading", "Window", "window"]
