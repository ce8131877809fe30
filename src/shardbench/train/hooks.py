"""The side effects of a training loop as hooks, and when each runs: logging, checkpoints, fault injection for
tests, the end of an epoch (evaluation, the epoch's line and record).

The loop (`shardbench.train.loop`) steps and calls each hook when its `Every` says so (every N steps, at each
epoch's end, or both), Levanter-style, in the order of their `Phase`; no hook knows another, and none knows the
step timer: the loop leaves the steps it ran them in out of the step times itself. What they share is the
`LoopState`: the step just dispatched, the state, the metrics (brought to the host one step late, so the device
never waits) and the time spent outside training steps (evaluation), which the logged rate leaves out. A hook after
the LOG phase runs on a settled step (a checkpoint must know its loss is finite); logging does not wait for the step
it logs: it writes that step's scalars when they reach the host (`Metrics.then`), while the next step runs, so a run
that logs every step keeps the device busy.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import jax
import numpy as np

from shardbench.errors import TrainingDiverged
from shardbench.train.checkpoint import Checkpoints
from shardbench.train.console import epoch_line
from shardbench.train.events import ScalarWriter

KILL_AT_STEP_ENV = "SHARDBENCH_FAULT_KILL_AT_STEP"
KILL_PROCESS_ENV = "SHARDBENCH_FAULT_KILL_PROCESS"
KILL_SIGNAL_ENV = "SHARDBENCH_FAULT_KILL_SIGNAL"  # the signal's name, KILL (the default) or TERM (a preemption)


def scalar(value: Any) -> float:
    """A metric as a float: pmap returns one (equal) copy per device."""
    return float(np.ravel(np.asarray(value))[0])


class EpochMeter:
    """Running means of the train metrics over the current epoch; a checkpoint carries its sums (`saved`), so
    an epoch a resume cuts into still averages every one of its steps."""

    def __init__(self, sums: dict[str, float] | None = None, count: int = 0) -> None:
        self.sums: dict[str, float] = dict(sums or {})
        self.count = count

    def saved(self) -> dict[str, Any]:
        return {"sums": self.sums, "count": self.count}

    @classmethod
    def resumed(cls, saved: dict[str, Any] | None, step: int, per_epoch: int) -> EpochMeter:
        """The meter a checkpoint of `step` carried, where it holds exactly the steps of `step`'s epoch up to
        `step`; else an empty one (a checkpoint from before meters were saved, one at an epoch's end, or one
        whose epoch --train.steps cut short), and the epoch's record says its means cover only what follows."""
        if saved is None or step % per_epoch == 0 or saved.get("count") != step % per_epoch:
            return cls()
        return cls({str(k): float(v) for k, v in saved["sums"].items()}, int(saved["count"]))

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.count += 1

    def means(self) -> dict[str, float]:
        return {k: v / max(self.count, 1) for k, v in self.sums.items()}


SUMMED_METRICS = ("moe_dropped",)


@dataclass
class Metrics:
    """Each step's metrics, brought to the host one step late and checked: a non-finite loss or gradient
    norm stops training before the state after that step can be checkpointed."""

    arrived: Callable[[int], None]  # told each step as its results reach the host (the loop's step timer)
    last_good: Callable[[], str]  # where the last checkpoint saved before the loss went bad is, for the error
    meter: EpochMeter = field(default_factory=EpochMeter)
    pending: tuple[int, dict[str, jax.Array]] | None = None
    last: dict[str, float] = field(default_factory=dict)
    last_step: int | None = None  # the step `last` belongs to
    waiting: list[Callable[[dict[str, float]], None]] = field(default_factory=list)  # for the pending step
    # Metrics the run record sums over every step of this invocation (a mixture's dropped assignments), and the
    # steps they cover.
    totals: dict[str, float] = field(default_factory=dict)
    settled: int = 0
    # The record of every finished epoch, a resumed run's earlier ones (as its checkpoint carried them) first.
    epochs: list[dict[str, Any]] = field(default_factory=list)

    def carried(self) -> dict[str, Any]:
        """What a checkpoint holds beside the state: the current epoch's sums and the finished epochs' records,
        so a resumed run's record holds every epoch, not only those trained after the resume."""
        return {**self.meter.saved(), "epochs": self.epochs}

    @staticmethod
    def resumed_epochs(saved: dict[str, Any] | None, step: int) -> list[dict[str, Any]]:
        """The finished epochs' records a checkpoint of `step` carried ([] for one written before they were)."""
        epochs = (saved or {}).get("epochs")
        return [dict(e) for e in epochs if isinstance(e, dict) and e.get("step", step + 1) <= step] \
            if isinstance(epochs, list) else []

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
        self.arrived(step)
        # The loss comes from the parameters before the update, the gradient norm from the update itself:
        # either one non-finite means the state after this step must not be trusted (or checkpointed).
        bad = [name for name in ("loss", "grad_norm") if not math.isfinite(values[name])]
        if bad:
            what = "loss" if bad[0] == "loss" else "gradient norm"
            raise TrainingDiverged(f"{what} became {values[bad[0]]} at step {step} (loss {values['loss']:.4g}): "
                                   f"training stopped; {self.last_good()}")
        self.meter.add(values)
        self.last, self.last_step = values, step
        for name in SUMMED_METRICS:
            if name in values:
                self.totals[name] = self.totals.get(name, 0.0) + values[name]
        self.settled += 1
        waiting, self.waiting = self.waiting, []
        for then in waiting:
            then(values)
        return values

    @contextlib.contextmanager
    def kept_on_error(self) -> Iterator[None]:
        """Where the loop stops on an error (an interrupt, a data error), the pending step a hook is waiting for
        (its log line) is settled first, so its line is written, not lost; an error in doing so gives way to the
        loop's own, which goes on up."""
        try:
            yield
        except BaseException:
            if self.pending is not None and self.waiting:
                with contextlib.suppress(Exception):
                    self.settle()
            raise

    def then(self, step: int, then: Callable[[dict[str, float]], None]) -> None:
        """Call `then` with step `step`'s metrics once they are on the host: now, where it is settled already,
        else when it settles (at the next step's dispatch, before a hook that settles it, or after the loop),
        without waiting for it here."""
        if self.pending is not None and self.pending[0] == step:
            self.waiting.append(then)
        elif self.last_step == step:
            then(self.last)
        else:
            raise ValueError(f"step {step}'s metrics are neither pending nor the last settled ({self.last_step})")


@dataclass
class LoopState:
    """What the loop knows, shared with its hooks."""

    total: int
    per_epoch: int
    metrics: Metrics
    state: Any
    started: float = field(default_factory=time.perf_counter)
    start: int = 0  # the step this invocation started from (a resumed run's checkpoint)
    done: int = 0  # steps completed, counting the one just dispatched
    paused_s: float = 0.0  # seconds spent outside training steps so far (evaluation)

    @property
    def end_of_epoch(self) -> bool:
        return self.done % self.per_epoch == 0 or self.done == self.total


Hook = Callable[[LoopState], None]  # called after a step the loop finds it due at


class Phase(IntEnum):
    """Where a hook runs among those due after the same step: in this order. Logging is part of training as
    the user asked for it (a run that logs every step pays for its host time where the host falls behind the
    device), so its steps stay timed, and it does not wait for the step it logs; every later phase runs on a
    settled step, and, unless `Every.light`, is work outside training that the loop leaves out of the step times."""

    LOG = 1
    # Evaluation, the epoch's record and line, before the checkpoint of the same step: a checkpoint at an epoch's
    # end carries that epoch's record, so a run resumed from it keeps the epoch (it was lost when the epoch's end
    # came after the checkpoint).
    EPOCH_END = 2
    CHECKPOINT = 3
    FAULT = 4  # after the checkpoint of its step, as a crash would come

    @property
    def outside_training(self) -> bool:
        return self > Phase.LOG


@dataclass(frozen=True)
class Every:
    """When the loop calls `hook`: every `steps` steps (0: never by count) and/or at each epoch's end (the last
    step ends an epoch too); `phase` orders it among the hooks due after the same step."""

    hook: Hook
    phase: Phase
    steps: int = 0
    epoch_end: bool = False
    light: bool = False  # a few scalars and a line, as logging is (an epoch's end without evaluation): stays timed

    def due(self, run: LoopState) -> bool:
        return (self.steps > 0 and run.done % self.steps == 0) or (self.epoch_end and run.end_of_epoch)

    @property
    def outside_training(self) -> bool:
        """Whether the step it ran after is left out of the step times."""
        return self.phase.outside_training and not self.light


def run_due(schedule: Iterable[Every], run: LoopState) -> list[Every]:
    """Call the hooks due after the step just dispatched, by phase; the step is settled (waited for) before the
    first hook after the LOG phase (a checkpoint must know its loss is finite), never for logging alone. Returns
    those that ran, in that order."""
    due = sorted((every for every in schedule if every.due(run)), key=lambda every: every.phase)
    for every in due:
        if every.phase > Phase.LOG:  # on a settled step: its loss known finite, its metrics in the epoch's means
            run.metrics.settle()
        every.hook(run)
    return due


@dataclass
class Log:
    """The train scalars and the training rate since the last call (time outside steps left out)."""

    writer: ScalarWriter
    bar: Any
    examples_per_step: float  # in the task's unit (images, tokens, examples)
    unit: str
    _since: tuple[float, int, float] | None = None  # (clock, steps done, paused seconds) at the last call

    def __call__(self, run: LoopState) -> None:
        step = run.done
        run.metrics.then(step, lambda last: self._write(run, step, last))

    def _write(self, run: LoopState, step: int, last: dict[str, float]) -> None:
        """Step `step`'s scalars, as they reach the host; the rate is over the steps since the last write."""
        now = time.perf_counter()
        clock, done, paused = self._since or (run.started, run.start, 0.0)
        seconds = max(now - clock - (run.paused_s - paused), 1e-9)
        rate = (step - done) * self.examples_per_step / seconds
        self._since = (now, step, run.paused_s)
        self.writer.write(step, {f"train/{k}": v for k, v in last.items()} | {f"train/{self.unit}_per_s": rate})
        self.bar.set_postfix({"epoch": (step - 1) // run.per_epoch + 1, "loss": f"{last['loss']:.4f}",
                              f"{self.unit}/s": f"{rate:.0f}"})


@dataclass
class Checkpoint:
    """A checkpoint once the step's loss is known finite (the final one is written after the loop)."""

    checkpoints: Checkpoints
    release: Callable[[Any], Any]

    def __call__(self, run: LoopState) -> None:
        if run.done != run.total:
            self.checkpoints.save(self.release(run.state), run.metrics.carried())


def fault_injection() -> Every | None:
    """Tests: SIGKILL this process after the step `SHARDBENCH_FAULT_KILL_AT_STEP` names (in the process
    `SHARDBENCH_FAULT_KILL_PROCESS` names, default every one), as a crash or an OOM kill would, or send it the
    signal `SHARDBENCH_FAULT_KILL_SIGNAL` names (TERM: a scheduler's preemption); None (no hook) where neither
    asks for it, so an ordinary run has no hook that runs every step."""
    at = os.environ.get(KILL_AT_STEP_ENV, "")
    if not at.isdigit() or int(at) == 0 or os.environ.get(
            KILL_PROCESS_ENV, str(jax.process_index())) != str(jax.process_index()):
        return None

    sig = signal.Signals[f"SIG{os.environ.get(KILL_SIGNAL_ENV, 'KILL')}"]

    def kill(run: LoopState) -> None:
        if run.done == int(at):
            os.kill(os.getpid(), sig)

    return Every(kill, Phase.FAULT, steps=int(at))


@dataclass
class EpochEnd:
    """At each epoch's end: its wall time (data and steps, no evaluation: the seed's epoch time), the
    validation metrics, the epoch's record and line. An epoch a resume cut into has train metrics over every
    step of it where the checkpoint carried the epoch's sums; where it did not, over this invocation's steps
    only, and its record and line say which (`resumed_part`)."""

    evaluate: Callable[[Any], dict[str, float]] | None  # validation on the state, or None without evaluation
    writer: ScalarWriter
    bar: Any
    show: bool
    times: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    _clock: tuple[float, int] | None = None  # (start, steps done) of the current epoch

    def __call__(self, run: LoopState) -> None:
        start, first = self._clock or (run.started, run.start)
        self.times.append(time.perf_counter() - start)
        self.steps.append(run.done - first)
        record = {"epoch": (run.done - 1) // run.per_epoch + 1, "step": run.done,
                  **{f"train_{k}": v for k, v in run.metrics.meter.means().items()}, **resumed_part(run)}
        paused = time.perf_counter()
        if self.evaluate is not None:
            val = self.evaluate(run.state)
            record |= {f"val_{k}": v for k, v in val.items() if k != "count"}
            self.writer.write(run.done, {f"val/{k}": v for k, v in val.items() if k != "count"})
        record["time_s"] = time.perf_counter() - run.started
        run.metrics.epochs.append(record)
        run.metrics.meter = EpochMeter()
        self.writer.flush()
        if self.show:
            self.bar.write(epoch_line(record) + part_note(record) + cut_note(run))
        run.paused_s += time.perf_counter() - paused
        self._clock = (time.perf_counter(), run.done)


def resumed_part(run: LoopState) -> dict[str, int]:
    """Where the epoch ending now has train means over part of its steps (a resume from a checkpoint inside it
    that carried no sums of the epoch's earlier steps: see `EpochMeter.resumed`): `from_step`, the first step its
    train metrics average, and `train_steps`, how many they average, so the record says so rather than pass them
    off as the epoch's. {} for an epoch whose means cover every step: trained here from its first step (one that
    --steps cut short at its end included), or resumed with its sums."""
    first = (run.done - 1) // run.per_epoch * run.per_epoch + 1  # the epoch's first step
    steps = run.metrics.meter.count
    if run.done - steps + 1 <= first:
        return {}
    return {"from_step": run.done - steps + 1, "train_steps": steps}


def part_note(record: dict[str, Any]) -> str:
    """The epoch's line's note where its train metrics cover part of it (`resumed_part`), else ''."""
    if "from_step" not in record:
        return ""
    first, last = record["from_step"], record["step"]
    steps = f"step {last}" if first == last else f"steps {first}-{last}"
    return f" | train metrics over {steps} only (resumed from step {first - 1})"


def cut_note(run: LoopState) -> str:
    """The epoch's line's note where the run ends inside the epoch (--steps short of its end): how many of its
    steps were trained, as its means are over those alone; '' for a whole epoch."""
    done = (run.done - 1) % run.per_epoch + 1  # steps of this epoch up to now
    if run.done < run.total or done == run.per_epoch:
        return ""
    return f" | {done} of its {run.per_epoch} steps: the run ends inside this epoch"


def last_good_checkpoint(checkpoints: Checkpoints, out: Path) -> Callable[[], str]:
    def where() -> str:
        good = checkpoints.latest_step()
        return (f"the last checkpoint, saved before it diverged, is step {good} in {out / 'checkpoints'}" if good
                else "no checkpoint")

    return where
