"""Building a training run before its first step: every check that needs no compilation, the run directory,
the sharded state (new or restored from the last checkpoint) and the train step compiled on the first batch,
as one `BuiltRun` that `shardbench.train.loop` trains.

Order matters for the user: every check (configuration, mesh, divisibility, precision, dataset, resume
directory, whether the train state fits a device) happens before anything is written into the run directory, so a
refused run leaves nothing half-written. A run given no --out makes its folder first, as it names it
(`shardbench.outdir`), and a refused one removes it again while it is empty.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import optax

from shardbench import cluster, compile_cache, outdir
from shardbench.capacity import check_state_fits
from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.data.pipeline import make_batches
from shardbench.measure.peak import HostPeak, host_peak
from shardbench.optim import build_optimizer
from shardbench.parallel.checks import layout_notes
from shardbench.preflight import CheckedRun, check_run
from shardbench.prices import PriceTable, prices_from_flag, row_for
from shardbench.rundir import claim_out, with_out, write_start_records
from shardbench.runtime import CacheUse, start_process
from shardbench.train.checkpoint import Checkpoints
from shardbench.train.console import header_line
from shardbench.train.spmd import make_steps
from shardbench.train.state import TrainState, abstract_train_state, init_state
from shardbench.train.step import Batch, Steps
from shardbench.validation import check_profile_window, inert_notes


@dataclass
class BuiltRun:
    """A run ready to train: checked, its state placed and its train step compiled."""

    checked: CheckedRun
    steps: Steps  # `train` compiled on the first batch (with its compile times), unless no step is left
    state: Any  # the train state, in the steps' layout
    start: int  # the first step to train: 0, or a resumed run's last checkpoint
    batches: Iterator[Batch]  # this process's rows of every batch from `start` on, placed on the devices
    checkpoints: Checkpoints
    host: HostPeak | None  # on a CPU, the host's matmul peak for MFU
    cache: CacheUse
    prices: PriceTable  # --prices (or the packaged table), read before anything is written: the record's cost
    meter: dict[str, Any] | None = None  # a resumed run's checkpoint's running sums of its epoch, where it holds them


@dataclass(frozen=True)
class FinishedRun:
    """A resumed run that had already trained every step: its record as it was written."""

    summary: dict[str, Any]


def build_run(cfg: Config, given: Collection[str] = ()) -> BuiltRun | FinishedRun:
    """Check `cfg`, then create (or restore) the run's state and compile its train step. `given`: the fields the
    command line named, for the notes on those that do nothing here."""
    cache = start_process(cfg)  # XLA's flags and the compilation cache come before the first compilation
    claimed = claim_out(cfg)
    with outdir.released_on_error(claimed):  # a run refused before its first record leaves no folder it made
        checked, tx, abstract = _check(with_out(cfg, claimed), given)
        cfg, out, total = checked.cfg, checked.out, checked.total_steps
        prices = prices_from_flag(cfg.train.prices)  # a bad table is one line here, not after the last step
        device = checked.layout.device
        if row_for(prices, device.device_kind, device.platform) is None and jax.process_index() == 0:
            print(f"shardbench: note: the {prices.origin} price table has no row for device "
                  f"'{device.device_kind}': this run's record will have no cost", flush=True)
        before = compile_cache.counts()
        host = shared_host_peak(checked)  # measuring it compiles a matmul: not one of this run's programs
        cache = CacheUse(cache.path, compile_cache.shift(cache.since, before, compile_cache.counts()))
        out.mkdir(parents=True, exist_ok=True)
        if not cfg.train.resume and jax.process_index() == 0:
            write_start_records(out, cfg, checked.spec, checked.layout, checked.dataset.name,
                                checked.data_fingerprint)
    checkpoints = Checkpoints(out / "checkpoints", cfg.train.keep_checkpoints)
    try:
        start = _start_step(checked, checkpoints)
        if isinstance(start, FinishedRun):
            checkpoints.close()  # nothing left to train: keep the finished run's record as it is
            return start
        meter = None
        if start:
            state, restored, meter = checkpoints.restore_good(abstract, start)
            if restored == start and jax.process_index() == 0:  # one it fell back from is said by restore_good
                print(f"shardbench: --resume: resuming from step {start} of {total}", flush=True)
            start = restored
            # A run re-timing its last steps (its record was never written) resumes before its final checkpoint,
            # which goes, to be written again at the end: `save` keeps a step it holds, and a damaged one would
            # stay under a record that says complete.
            checkpoints.remove([s for s in checkpoints.all_steps() if s > start])
            if (unfinished := checkpoints.unfinished_note()) and jax.process_index() == 0:
                print(f"shardbench: --resume: {unfinished}", flush=True)
        else:
            state = init_state(cfg, checked.spec, checked.layout, tx)
        steps = make_steps(cfg, checked.task, checked.spec, checked.layout, tx,
                           tuple(checked.dataset.train.columns()), total)
        state = steps.adopt(state)
        batches = _batches(checked, steps, start)
        first = next(batches, None)
        if first is not None:  # lowering and compilation are timed apart from the steps
            steps = steps.compile(state, first)
            batches = itertools.chain([first], batches)
    except BaseException:
        checkpoints.close()  # orbax's background threads end here, not in an interpreter shutting down
        raise
    return BuiltRun(checked, steps, state, start, batches, checkpoints, host, cache, prices, meter)


def _start_step(checked: CheckedRun, checkpoints: Checkpoints) -> int | FinishedRun:
    """The step to train from: 0, or with --resume the last checkpoint's; a resumed run that had trained every
    step already is finished (its record as it was written)."""
    out, total = checked.out, checked.total_steps
    is_main = jax.process_index() == 0
    start = checkpoints.latest_step() if checked.cfg.train.resume else None
    finished = out / "summary.json"
    record = _record(finished) if start is not None and start >= total else None
    if start is not None and start >= total and record is not None:
        if is_main:
            print(f"shardbench: {out} already finished all {total} steps; nothing to resume", flush=True)
        return FinishedRun(record)
    if start is not None and start >= total:  # trained every step; its record was not written, or is unreadable
        why = (f"its record {finished} is unreadable" if finished.exists()
               else "it stopped before writing its record")
        earlier = [s for s in checkpoints.all_steps() if s < total]
        if not earlier:
            raise ConfigError(
                f"--resume: {out} trained all {total} steps (its checkpoint of step {start}) but {why}, and it "
                f"holds no earlier checkpoint to time its last steps again from: train it again with another "
                f"--out, or remove {out / 'checkpoints'} to train from step 0")
        start = max(earlier)  # `build_run` removes the final one once an earlier one restores
        if is_main:
            print(f"shardbench: --resume: {out} trained all {total} steps but {why}; training its last steps again "
                  f"from the last checkpoint before step {total} that restores (step {start} or earlier), to time "
                  f"them", flush=True)
    if start is not None:
        check_profile_window(checked.cfg.train, total - start)
    elif checked.cfg.train.resume and is_main:
        print(f"shardbench: --resume: {out / 'checkpoints'} holds no finished checkpoint (the run stopped "
              f"before its first); training from step 0", flush=True)
    finished.unlink(missing_ok=True)  # a resumed run is incomplete until it finishes again
    return start or 0


def _record(path: Path) -> dict[str, Any] | None:
    """A finished run's record, or None where `path` is missing or holds no complete record (a truncated or
    emptied file, or JSON that is not an object)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("status") == "complete" else None


def _check(cfg: Config, given: Collection[str] = ()) -> tuple[CheckedRun, optax.GradientTransformation, TrainState]:
    """Every process plans (and checks) before any of them writes; one process's error stops them all. The run is
    announced (its header, and the options it leaves without effect) once checked. Also returns the optimizer and
    the abstract train state (the target a checkpoint is restored into)."""
    checked, tx, abstract = cluster.agree("checking", lambda: _check_state(cfg),
                                          timeout_s=cluster.SLOW_STAGE_TIMEOUT_S)
    if jax.process_index() == 0:
        print(header_line(checked), flush=True)
        for note in [*inert_notes(checked.cfg, given), *layout_notes(checked.spec, checked.layout,
                                                                    cfg.parallel.mesh)]:
            print(f"shardbench: note: {note}", flush=True)
    return checked, tx, abstract


def _check_state(cfg: Config) -> tuple[CheckedRun, optax.GradientTransformation, TrainState]:
    """`check_run`, then whether the whole train state (parameters and optimizer state) fits a device."""
    checked = check_run(cfg)
    tx = build_optimizer(checked.cfg.optim, checked.total_steps)
    abstract = abstract_train_state(checked.spec, checked.layout, tx)
    check_state_fits(checked.cfg, checked.spec, checked.layout, abstract.params, abstract)
    return checked, tx, abstract


def shared_host_peak(checked: CheckedRun) -> HostPeak | None:
    """On a CPU, the host's matmul peak for MFU (see `shardbench.measure.peak`): process 0 reads or measures it
    and hands it to every other process of the run."""
    if checked.layout.device.platform != "cpu":
        return None
    cfg = checked.cfg
    mine = (host_peak(cfg.precision.dtype, checked.cache_root, cfg.train.recalibrate_peak).to_dict()
            if jax.process_index() == 0 else None)
    return HostPeak(**cluster.gather_json(mine)[0])


def _batches(checked: CheckedRun, steps: Steps, start: int) -> Iterator[Batch]:
    """This process reads and augments only its rows of each batch, from `start` on; each placed as it is
    needed."""
    cfg, batch = checked.cfg, checked.cfg.train.batch_size
    part, parts = checked.layout.process_share(batch)
    host = make_batches(checked.dataset.train, global_batch=batch, seed=cfg.train.seed, shuffle=True,
                        start_step=start, num_steps=checked.total_steps - start, process_index=part,
                        process_count=parts, repeats=cfg.data.repeat_augment)
    return (steps.place(b) for b in host)
