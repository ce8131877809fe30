"""Timing discipline: compile time split into lowering and compilation, step-time statistics, epoch clocks.

Step times are the intervals between successive step completions seen on the host (each step's metrics
are fetched one step late, so the device never waits for the host); intervals that include evaluation,
checkpointing or profiling, and the first few steps, are excluded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardbench.measure.run_record import CompileTimes, StepTimes

# Fewer timed intervals than this give a median with no spread to judge it by (one interval: p90 = median): the
# report calls a small gap between such figures undecided, a run's last line says how few it timed, and a step
# time above the peak from so few is dropped as the host's artefact (`measure.collect.credible_steps`).
MIN_MEASURED_STEPS = 5


def compile_timed(jitted: Any, *args: Any) -> tuple[Any, CompileTimes]:
    """Lower and compile `jitted` for `args`, timing each phase (the record's own `CompileTimes`); the compiled
    object is also callable."""
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return compiled, CompileTimes(lower_s=t1 - t0, compile_s=t2 - t1)


@dataclass
class StepTimer:
    """Step intervals, each named by the step whose results end it. The loop reports every step's results as
    they reach the host (`completed`) and leaves out a step that was not only training (`leave_out`: a
    checkpoint, evaluation or the profiler ran in its interval); the first `warmup` intervals are left out too."""

    warmup: int = 2
    intervals: list[float] = field(default_factory=list)
    excluded: int = 0
    _last: float | None = None
    _seen: int = 0
    _left_out: set[int] = field(default_factory=set)

    def completed(self, step: int) -> None:
        """Step `step`'s results have arrived on the host: its interval ends now."""
        now = time.perf_counter()
        if self._last is not None:
            self._seen += 1
            if self._seen <= self.warmup or step in self._left_out:
                self.excluded += 1
            else:
                self.intervals.append(now - self._last)
        self._last = now
        self._left_out.discard(step)

    def leave_out(self, *steps: int) -> None:
        """These steps' intervals (ended by their results, still to come) are not counted as training steps."""
        self._left_out.update(steps)

    def stats(self) -> StepTimes:
        """Median and p90 of the kept intervals, as the record's `StepTimes`; with none kept, `not_measured`
        says why."""
        counts = {"measured_steps": len(self.intervals), "excluded_steps": self.excluded, "warmup": self.warmup}
        if not self.intervals:
            steps = self._seen + (self._last is not None)
            others = self.excluded - min(self._seen, self.warmup)
            why = (f"not measured: {steps} step(s) give {self._seen} interval(s); timing warm-up {self.warmup}"
                   + (f", {others} more excluded (evaluation, checkpoint or profiler)" if others else ""))
            return StepTimes(median=None, p90=None, **counts, not_measured=why)
        arr = np.asarray(self.intervals)
        return StepTimes(median=float(np.median(arr)), p90=float(np.percentile(arr, 90)), **counts)


def fit_warmup(warmup: int, steps: int) -> tuple[int, str | None]:
    """The timing warm-up for a run of `steps` steps, and a line to print when it had to be lowered: `steps`
    steps give steps - 1 intervals, and at least one of them should be timed. One step gives none at all:
    the warm-up stays and the record says the step time was not measured."""
    intervals = steps - 1
    if intervals <= 0 or intervals > warmup:
        return warmup, None
    lowered = intervals - 1
    return lowered, (f"shardbench: {steps} steps give {intervals} step interval(s), not more than the timing "
                     f"warm-up of {warmup} (--train.timing-warmup): warm-up lowered to {lowered} for this run")
