"""The training run: check everything, build the sharded state, loop over steps, evaluate, checkpoint.

Order matters for the user: every check that needs no compilation (configuration, mesh, divisibility,
precision, dataset, resume directory) happens before the run directory is written to.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from shardbench import cluster, xla_presets
from shardbench.config import Config
from shardbench.data.arrays import Split
from shardbench.data.pipeline import eval_steps, make_batches
from shardbench.jsonfile import write_json_atomic
from shardbench.measure import run_record
from shardbench.measure.collect import build_measurements, default_run_name
from shardbench.measure.peak import HostPeak, host_peak
from shardbench.measure.profile import ProfileWindow
from shardbench.measure.timing import StepTimer, compile_timed, fit_warmup
from shardbench.parallel.rules import Layout
from shardbench.parsing import override
from shardbench.train import compile_cache, hooks
from shardbench.train.checkpoint import Checkpoints
from shardbench.train.console import header_line
from shardbench.train.events import ScalarWriter
from shardbench.train.hooks import scalar
from shardbench.train.optim import build_optimizer, learning_rate
from shardbench.validation import inert_notes
from shardbench.train.state import (
    TrainState, abstract_train_state, init_state, state_shardings,
)
from shardbench.config import cache_root
from shardbench.tasks import Task
from shardbench.train.preflight import CheckedRun, check_profile_window, check_run, eval_batch, resolve_out
from shardbench.train.spmd import make_steps
from shardbench.train.step import Steps

# Fault injection for the resume tests: the process kills itself (SIGKILL, no clean-up) after this step;
# in a run of several processes only the one KILL_PROCESS_ENV names (all of them when it is unset).

def evaluate(steps: Steps, state: Any, arrays: Split, cfg: Config, task: Task, layout: Layout) -> dict[str, float]:
    """Loss (and accuracy, perplexity where they apply) over every example of a split exactly once
    (the last batch is padded and masked); the mean is over targets (tokens for a language model)."""
    if len(arrays) == 0:
        return {}
    batch = eval_batch(cfg)
    totals: dict[str, float] = {}
    part, parts = layout.process_share(batch)
    batches = make_batches(arrays, global_batch=batch, seed=cfg.train.seed, shuffle=False,
                           num_steps=eval_steps(len(arrays), batch), process_index=part, process_count=parts)
    for host_batch in batches:
        for k, v in jax.device_get(steps.evaluate(state, steps.place(host_batch))).items():
            totals[k] = totals.get(k, 0.0) + scalar(v)
    out = {"loss": totals["loss_sum"] / totals["count"], "count": int(totals["count"])}
    if "correct" in totals:
        out["accuracy"] = totals["correct"] / totals["count"]
    if task.perplexity:
        out["perplexity"] = math.exp(min(out["loss"], 700.0))
    return out


def run(cfg: Config) -> dict[str, Any]:
    """Train as `cfg` says; returns the summary also written to <out>/summary.json."""
    xla_presets.apply(cfg.train.xla_presets)  # refused where JAX's backends already run without those flags
    cache = compile_cache.resolve(cfg.train.compile_cache, cache_root(cfg))
    compile_cache.enable(cache)  # before the first compilation (check_run's precision probe compiles)
    cache_counts = compile_cache.counts()
    if jax.process_count() > 1 and not cfg.train.out:  # one directory for all: the name process 0's clock gives
        cfg = override(cfg, {"train.out": cluster.exchange(str(resolve_out(cfg)))[0]})
    # Every process plans (and checks) before any of them writes; one process's error stops them all.
    checked = cluster.agree("checking", lambda: check_run(cfg), timeout_s=cluster.SLOW_STAGE_TIMEOUT_S)
    cfg, out, layout = checked.cfg, checked.out, checked.layout
    is_main = jax.process_index() == 0
    if is_main:
        print(header_line(checked), flush=True)
        for note in inert_notes(cfg):
            print(f"shardbench: note: {note}", flush=True)
    before = compile_cache.counts()
    host = shared_host_peak(cfg, layout)  # measuring it compiles a matmul: not one of this run's programs
    cache_counts = compile_cache.shift(cache_counts, before, compile_cache.counts())
    tx = build_optimizer(cfg.optim, checked.total_steps)
    schedule = learning_rate(cfg.optim, checked.total_steps)
    out.mkdir(parents=True, exist_ok=True)
    if not cfg.train.resume and is_main:
        write_json_atomic(out / "config.json", cfg.to_dict())
    checkpoints = Checkpoints(out / "checkpoints", cfg.train.keep_checkpoints)
    start = checkpoints.latest_step() if cfg.train.resume else None
    finished = out / "summary.json"
    if start is not None and start >= checked.total_steps and finished.exists():
        checkpoints.close()  # nothing left to train: keep the finished run's record as it is
        if is_main:
            print(f"shardbench: {out} already finished all {checked.total_steps} steps; nothing to resume", flush=True)
        return json.loads(finished.read_text())
    if start is not None:
        check_profile_window(cfg.train, checked.total_steps - start)
    elif cfg.train.resume and is_main:
        print(f"shardbench: --resume: {out / 'checkpoints'} holds no finished checkpoint (the run stopped before "
              f"its first); training from step 0", flush=True)
    finished.unlink(missing_ok=True)  # a resumed run is incomplete until it finishes again
    if start is not None:
        try:
            state, start = checkpoints.restore_good(abstract_train_state(checked.spec, layout, tx), start)
        except BaseException:
            checkpoints.close()  # orbax's background threads end here, not in an interpreter shutting down
            raise
    else:
        state, start = init_state(cfg, checked.spec, layout, tx), 0
    steps = make_steps(cfg, checked.task, checked.spec, layout, tx, state_shardings(checked.spec, layout, tx), schedule,
                       tuple(checked.dataset.train.columns()), checked.total_steps)
    state = steps.adopt(state)
    writer = ScalarWriter(out / "tensorboard", enabled=is_main)
    try:
        summary = _loop(checked, steps, state, start, checkpoints, writer, host)
    finally:
        writer.close()
        checkpoints.close()
    summary.setdefault("measurements", {})["compile_cache"] = compile_cache.stats(cache, cache_counts)
    if is_main:
        write_json_atomic(out / "summary.json", summary)
    return summary


def shared_host_peak(cfg: Config, layout: Layout) -> HostPeak | None:
    """On a CPU, the host's matmul peak for MFU (see `shardbench.measure.peak`): process 0 reads or measures it
    and hands it to every other process of the run."""
    if layout.device.platform != "cpu":
        return None
    mine = (host_peak(cfg.precision.dtype, cache_root(cfg), cfg.train.recalibrate_peak).to_dict()
            if jax.process_index() == 0 else None)
    return HostPeak(**cluster.gather_json(mine)[0])


def _loop(checked: CheckedRun, steps: Steps, state: TrainState, start: int, checkpoints: Checkpoints,
          writer: ScalarWriter, host: HostPeak | None = None) -> dict[str, Any]:
    cfg, total, per_epoch, layout = checked.cfg, checked.total_steps, checked.steps_per_epoch, checked.layout
    batch, is_main = cfg.train.batch_size, jax.process_index() == 0  # only process 0 prints and traces
    run_name = cfg.train.run_name or default_run_name(cfg, layout)
    part, parts = layout.process_share(batch)  # this process reads and augments only its rows of each batch
    batches: Iterator[dict[str, np.ndarray]] = make_batches(
        checked.dataset.train, global_batch=batch, seed=cfg.train.seed, shuffle=True, start_step=start,
        num_steps=total - start, process_index=part, process_count=parts, repeats=cfg.data.repeat_augment,
    )
    # Compile explicitly on the first batch: lowering and compilation are timed apart from the steps.
    first = steps.place(next(batches)) if start < total else None
    compiled, compile_times = compile_timed(steps.train, state, first) if first is not None else (None, None)
    warmup, lowered = fit_warmup(cfg.train.timing_warmup, total - start)
    if lowered and is_main:
        print(lowered, flush=True)
    timer = StepTimer(warmup)
    bar = tqdm(total=total, initial=start, disable=not cfg.train.progress or not is_main, unit="step",
               dynamic_ncols=True)
    profile_root = Path(cfg.train.profile_root) if cfg.train.profile_root else checked.out / "tensorboard"
    window = ProfileWindow(profile_root, run_name, start + cfg.train.profile_skip, cfg.train.profile_steps,
                           cfg.train.profile and is_main)
    epochs = hooks.EpochEnd(
        (lambda st: evaluate(steps, st, checked.dataset.val, cfg, checked.task, layout)) if cfg.train.eval else None,
        writer, bar, timer, is_main)
    run = hooks.LoopState(total, per_epoch, hooks.Metrics(timer, hooks.last_good_checkpoint(checkpoints, checked.out)), state,
                    start=start)
    profile = hooks.Profile(window, timer)
    schedule = [
        hooks.Every(hooks.Log(writer, bar, batch * checked.task.units_per_example(cfg), checked.task.unit),
                    cfg.train.log_every, epoch_end=True),
        hooks.Every(hooks.Checkpoint(checkpoints, steps.release, timer), cfg.train.checkpoint_every),
        hooks.Every(hooks.inject_fault, 1),  # after the checkpoint of its step, as a crash would come
        hooks.Every(epochs, epoch_end=True),
    ]
    for step in range(start, total):
        run.done = step + 1
        profile.before_step(run)
        run.state, metrics = compiled(run.state, first if step == start else steps.place(next(batches)))
        run.metrics.push(run.done, metrics)
        profile.after_step(run)
        bar.update(1)
        for every in schedule:
            if every.due(run):
                every.hook(run)
    last = run.metrics.settle()
    window.stop()
    bar.close()
    checkpoints.save(steps.release(run.state))
    return _summary(checked, steps, run, writer, start, run_name, window, build_measurements(
        cfg=cfg, task=checked.task, layout=layout, compiled=compiled, compile_times=compile_times, timer=timer,
        epoch_times=epochs.times, epoch_steps=epochs.steps, steps_per_epoch=per_epoch, steps_run=total - start,
        state=run.state, host_peak=host), epochs.history, last)


def _summary(checked: CheckedRun, steps: Steps, run: hooks.LoopState, writer: ScalarWriter, start: int, run_name: str,
             window: ProfileWindow, measurements: dict[str, Any], history: list[dict[str, Any]],
             last: dict[str, float]) -> dict[str, Any]:
    """The run's record: what ran, its measurements, and the test split's metrics."""
    cfg, layout, unit = checked.cfg, checked.layout, checked.task.unit
    throughput = measurements["throughput"]
    summary: dict[str, Any] = {
        "status": "complete", "run_name": run_name, "steps": run.total, "resumed_from": start, "epochs": history,
        "train_loss": last.get("loss"), "time_s": time.perf_counter() - run.started, "model": cfg.model.kind,
        "spmd": cfg.parallel.spmd, "examples_per_s": throughput["examples_per_s"],
        f"{unit}_per_s": throughput["units_per_s"], "strategy": layout.strategy.name,
        "mesh": "none" if layout.mesh is None else str(layout.shape), "devices": layout.shape.size,
        "out": str(checked.out), "measurements": measurements, "dataset": {"name": checked.dataset.name, **checked.dataset.info},
    }
    if window.path is not None:
        summary["profile"] = str(window.path)
    if cfg.train.eval:
        test = evaluate(steps, run.state, checked.dataset.test, cfg, checked.task, layout)
        summary |= {f"test_{k}": v for k, v in test.items() if k != "count"}
        writer.write(run.total, {f"test/{k}": v for k, v in test.items() if k != "count"})
    summary |= run_record.provenance() | {"device_kind": measurements.get("device_kind")}
    run_record.from_json(json.loads(json.dumps(summary)))  # the record's schema, checked where it is written
    return summary
