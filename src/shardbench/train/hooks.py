"""The side effects of a training loop, each a hook with its own interval: logging, checkpoints, the profiler
window, fault injection for tests, and the end of an epoch (evaluation, the epoch's line and record).

The loop (`shardbench.train.loop`) only steps; each hook sees the `Run` (what the loop knows: the step just
dispatched, the state, the metrics settled so far) before and after every step. Metrics reach the host one
step late (`Metrics`), so the device never waits for the host; a hook that needs the latest step's numbers
(a checkpoint must know its loss is finite) settles them first.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from shardbench.errors import TrainingDiverged
from shardbench.measure.profile import ProfileWindow
from shardbench.measure.timing import StepTimer
from shardbench.train.checkpoint import Checkpoints
from shardbench.train.console import epoch_line
from shardbench.train.events import ScalarWriter

KILL_AT_STEP_ENV = "SHARDBENCH_FAULT_KILL_AT_STEP"
KILL_PROCESS_ENV = "SHARDBENCH_FAULT_KILL_PROCESS"


def scalar(value: Any) -> float:
    """A metric as a float: pmap returns one (equal) copy per device."""
    return float(np.ravel(np.asarray(value))[0])


class EpochMeter:
    """Running means of the train metrics over the current epoch."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.count += 1

    def means(self) -> dict[str, float]:
        return {k: v / max(self.count, 1) for k, v in self.sums.items()}


@dataclass
class Metrics:
    """Each step's metrics, brought to the host one step late and checked: a non-finite loss or gradient
    norm stops training before the state after that step can be checkpointed."""

    timer: StepTimer
    last_good: Callable[[], str]  # where the last good checkpoint is, for the error
    meter: EpochMeter = field(default_factory=EpochMeter)
    pending: tuple[int, dict[str, jax.Array]] | None = None
    last: dict[str, float] = field(default_factory=dict)

    def push(self, step: int, metrics: dict[str, jax.Array]) -> None:
        """The step just dispatched; the one before it is settled now."""
        if self.pending is not None:
            self.settle()
        self.pending = (step, metrics)

    def settle(self) -> dict[str, float]:
        """The latest step's metrics on the host (waiting for it, if it is still pending)."""
        if self.pending is None:
            return self.last
        step, metrics = self.pending
        self.pending = None
        values = {k: scalar(v) for k, v in jax.device_get(metrics).items()}
        self.timer.completed()
        # The loss comes from the parameters before the update, the gradient norm from the update itself:
        # either one non-finite means the state after this step must not be trusted (or checkpointed).
        bad = [name for name in ("loss", "grad_norm") if not math.isfinite(values[name])]
        if bad:
            what = "loss" if bad[0] == "loss" else "gradient norm"
            raise TrainingDiverged(f"{what} became {values[bad[0]]} at step {step} (loss {values['loss']:.4g}): "
                                   f"training stopped; {self.last_good()}")
        self.meter.add(values)
        self.last = values
        return values


@dataclass
class Run:
    """What the loop knows, shared with its hooks."""

    total: int
    per_epoch: int
    metrics: Metrics
    state: Any
    started: float = field(default_factory=time.perf_counter)
    done: int = 0  # steps completed, counting the one just dispatched

    @property
    def end_of_epoch(self) -> bool:
        return self.done % self.per_epoch == 0 or self.done == self.total


class Hook:
    """A side effect of the loop; both methods do nothing unless a hook overrides them."""

    def before_step(self, run: Run) -> None:
        """`run.done` is the step about to be dispatched."""

    def after_step(self, run: Run) -> None:
        """`run.done` is the step just dispatched; its metrics are pending."""


@dataclass
class Profile(Hook):
    """The profiler window; the intervals it touches are left out of the step times."""

    window: ProfileWindow
    timer: StepTimer

    def before_step(self, run: Run) -> None:
        self.window.before_step(run.done)
        if self.window.active:
            self.timer.mark_dirty()  # the interval that starts the trace carries its cost too

    def after_step(self, run: Run) -> None:
        if self.window.active:
            self.timer.mark_dirty()  # traced steps carry the profiler's overhead
        self.window.after_step(run.done, block=run.metrics.pending[1] if run.metrics.pending else None)


@dataclass
class Log(Hook):
    """Every `every` steps, at each epoch's end and before each checkpoint: the train scalars and the rate."""

    writer: ScalarWriter
    bar: Any
    every: int
    checkpoint_every: int
    examples_per_step: float  # in the task's unit (images, tokens, examples)
    unit: str
    _window: tuple[float, int] = field(default_factory=lambda: (time.perf_counter(), 0))

    def after_step(self, run: Run) -> None:
        start, steps = self._window
        self._window = (start, steps + 1)
        due_checkpoint = self.checkpoint_every > 0 and run.done % self.checkpoint_every == 0
        if run.done % self.every == 0 or run.end_of_epoch or due_checkpoint:
            last = run.metrics.settle()
            now = time.perf_counter()
            rate = (steps + 1) * self.examples_per_step / max(now - start, 1e-9)
            self._window = (now, 0)
            self.writer.write(run.done, {f"train/{k}": v for k, v in last.items()} | {f"train/{self.unit}_per_s": rate})
            self.bar.set_postfix({"epoch": (run.done - 1) // run.per_epoch + 1, "loss": f"{last['loss']:.4f}",
                                  f"{self.unit}/s": f"{rate:.0f}"})
        self.bar.update(1)

    def restart_window(self) -> None:
        """After evaluation: the next rate counts training only."""
        self._window = (time.perf_counter(), 0)


@dataclass
class Checkpoint(Hook):
    """Every `every` steps (the final one is written after the loop), once the step's loss is known finite."""

    checkpoints: Checkpoints
    every: int
    release: Callable[[Any], Any]
    timer: StepTimer

    def after_step(self, run: Run) -> None:
        if self.every > 0 and run.done % self.every == 0 and run.done != run.total:
            run.metrics.settle()
            self.checkpoints.save(self.release(run.state))
            self.timer.mark_dirty()


class FaultInjection(Hook):
    """Tests: SIGKILL this process after the step `SHARDBENCH_FAULT_KILL_AT_STEP` names (in the process
    `SHARDBENCH_FAULT_KILL_PROCESS` names, default every one), as a crash or an OOM kill would."""

    def after_step(self, run: Run) -> None:
        if os.environ.get(KILL_AT_STEP_ENV) == str(run.done) and os.environ.get(
                KILL_PROCESS_ENV, str(jax.process_index())) == str(jax.process_index()):
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class EpochEnd(Hook):
    """At each epoch's end: its wall time (data and steps, no evaluation: the seed's epoch time), the
    validation metrics, the epoch's record and line."""

    evaluate: Callable[[Any], dict[str, float]] | None  # validation on the state, or None without evaluation
    writer: ScalarWriter
    bar: Any
    timer: StepTimer
    log: Log
    show: bool
    history: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    _clock: tuple[float, int] | None = None  # (start, first step) of the current epoch

    def before_step(self, run: Run) -> None:
        if self._clock is None:
            self._clock = (time.perf_counter(), run.done - 1)

    def after_step(self, run: Run) -> None:
        if not run.end_of_epoch:
            return
        run.metrics.settle()
        assert self._clock is not None
        start, first = self._clock
        self.times.append(time.perf_counter() - start)
        self.steps.append(run.done - first)
        record = {"epoch": (run.done - 1) // run.per_epoch + 1, "step": run.done,
                  **{f"train_{k}": v for k, v in run.metrics.meter.means().items()}}
        if self.evaluate is not None:
            val = self.evaluate(run.state)
            record |= {f"val_{k}": v for k, v in val.items() if k != "count"}
            self.writer.write(run.done, {f"val/{k}": v for k, v in val.items() if k != "count"})
        record["time_s"] = time.perf_counter() - run.started
        self.history.append(record)
        run.metrics.meter = EpochMeter()
        self.writer.flush()
        if self.show:
            self.bar.write(epoch_line(record))
        self.timer.mark_dirty()
        self._clock = (time.perf_counter(), run.done)
        self.log.restart_window()


def last_good_checkpoint(checkpoints: Checkpoints, out: Path) -> Callable[[], str]:
    def where() -> str:
        good = checkpoints.latest_step()
        return f"the last good checkpoint is step {good} in {out / 'checkpoints'}" if good else "no checkpoint"

    return where
