"""Training a run: `run` builds it (`shardbench.train.build`: checks, state, the compiled step), then the loop
steps, calls its hooks when they are due, keeps the step clock, and writes the run's record.

The loop owns the clock: it tells the step timer when each step's results arrive, and leaves out of the step
times every step in which the profiler traced or a hook outside training ran (checkpoint, evaluation).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import jax
from tqdm import tqdm

from shardbench.config import Config
from shardbench.data.arrays import split_sizes
from shardbench.jsonfile import write_json_atomic
from shardbench.measure import run_record
from shardbench.measure.collect import Clocks, RunSetup, build_measurements, default_run_name, layout_devices
from shardbench.measure.energy import EnergyMeter
from shardbench.measure.profile import ProfileWindow
from shardbench.measure.timing import StepTimer, fit_warmup
from shardbench.models.moe import capacity
from shardbench.prices import run_cost
from shardbench import compile_cache
from shardbench.train import hooks
from shardbench.train.build import BuiltRun, FinishedRun, build_run
from shardbench.train.checkpoint import saved_steps
from shardbench.train.evaluation import evaluate
from shardbench.train.events import ScalarWriter


def run(cfg: Config, given: Collection[str] = ()) -> dict[str, Any]:
    """Train as `cfg` says; returns the summary also written to <out>/summary.json. `given`: the fields the command
    line named (a note says each that does nothing here, even at its preset's value)."""
    try:
        built = build_run(cfg, given)
    except KeyboardInterrupt as err:  # while it checked, restored or compiled: said with the way on, as in training
        raise type(err)(_way_on_unbuilt(cfg)) from None
    if isinstance(built, FinishedRun):
        return built.summary
    return train(built)


def _way_on_unbuilt(cfg: Config) -> str:
    """What a run stopped before its first step can do next: resume from the checkpoints its --out holds, or
    start again (with --resume once its folder holds the run's records, which a plain command refuses)."""
    if cfg.train.out and (steps := saved_steps(Path(cfg.train.out) / "checkpoints")):
        return f"the same command with --resume --out {cfg.train.out} goes on from the checkpoint of step {steps[-1]}"
    return f"no step was trained: {_start_again(cfg)}"


def _start_again(cfg: Config) -> str:
    """How a run with no checkpoint starts again: with --resume where its folder holds the run's records, which
    a plain command refuses ('already holds a run'); else the same command (one without --out makes a new
    folder each time)."""
    if cfg.train.out and (Path(cfg.train.out) / "config.json").exists():
        return f"the same command with --resume --out {cfg.train.out} starts it from step 0"
    return "the same command starts the run over"


def train(built: BuiltRun) -> dict[str, Any]:
    """Train a built run to its last step and write its record; its checkpoints are closed whatever happens."""
    writer = ScalarWriter(built.checked.out / "tensorboard", enabled=jax.process_index() == 0,
                          resumed_from=built.start if built.checked.cfg.train.resume else None)
    try:
        summary = _loop(built, writer)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (`subprocs.Terminated`): said with the way on
        built.checkpoints.wait()  # the checkpoint being written is finished first
        raise type(err)(_way_on(built)) from None
    finally:
        writer.close()
        built.checkpoints.close()
    summary.setdefault("measurements", {})["compile_cache"] = compile_cache.stats(built.cache.path, built.cache.since)
    if jax.process_index() == 0:
        write_json_atomic(built.checked.out / "summary.json", summary)
    return summary


def _way_on(built: BuiltRun) -> str:
    """What a stopped run's user can do next: resume from its last checkpoint, or start over without one."""
    cfg, out = built.checked.cfg, built.checked.out
    step = built.checkpoints.latest_step()
    if step is None:
        every = cfg.train.checkpoint_every
        why = (f"none had been written yet (--train.checkpoint-every {every})" if every > 0 else
               "--train.checkpoint-every 0 writes one only at the end")
        return f"no checkpoint to resume from: {why}; {_start_again(cfg)}"
    return f"the same command with --resume --out {out} goes on from the checkpoint of step {step}"


def _loop(built: BuiltRun, writer: ScalarWriter) -> dict[str, Any]:
    checked, steps, start = built.checked, built.steps, built.start
    cfg, total, layout = checked.cfg, checked.total_steps, checked.layout
    is_main = jax.process_index() == 0  # only process 0 prints and traces
    # None: tqdm's own test, a bar only where stderr is a terminal; a log file or a pipe gets the epoch lines
    # without the bar's carriage-return redraws
    bar = tqdm(total=total, initial=start, disable=None if cfg.train.progress and is_main else True, unit="step",
               dynamic_ncols=True)
    epochs = hooks.EpochEnd(
        (lambda st: evaluate(steps, st, checked.dataset.val, cfg, checked.task, layout)) if cfg.train.eval else None,
        writer, bar, is_main)
    schedule = [
        hooks.Every(hooks.Log(writer, bar, cfg.train.batch_size * checked.task.units_per_example(cfg),
                              checked.task.unit), hooks.Phase.LOG, cfg.train.log_every, epoch_end=True),
        hooks.Every(epochs, hooks.Phase.EPOCH_END, epoch_end=True, light=not cfg.train.eval),
        hooks.Every(hooks.Checkpoint(built.checkpoints, steps.release), hooks.Phase.CHECKPOINT,
                    cfg.train.checkpoint_every),
        *filter(None, [hooks.fault_injection()]),
    ]
    run_name = cfg.train.run_name or default_run_name(cfg, layout)
    profile_root = Path(cfg.train.profile_root) if cfg.train.profile_root else checked.out / "tensorboard"
    window = ProfileWindow(profile_root, run_name, start + cfg.train.profile_skip, cfg.train.profile_steps,
                           cfg.train.profile and is_main)
    warmup, lowered = fit_warmup(cfg.train.timing_warmup, total - start)
    if lowered and is_main:
        print(lowered, flush=True)
    timer = StepTimer(warmup)
    energy = EnergyMeter.for_this_host(warmup, layout_devices(layout))  # NVML: only the GPUs this run uses here
    run = hooks.LoopState(total, checked.steps_per_epoch,
                          hooks.Metrics(energy.after(timer.completed),
                                        hooks.last_good_checkpoint(built.checkpoints, checked.out),
                                        hooks.EpochMeter.resumed(built.meter, start, checked.steps_per_epoch),
                                        epochs=hooks.Metrics.resumed_epochs(built.meter, start)),
                          built.state, start=start)
    with run.metrics.kept_on_error(), window.abandoned_on_error():
        for step in range(start, total):
            run.done = step + 1
            window.before_step(run.done, settle=run.state)
            if window.active:  # the trace's start lands in the step before (settled after it), its stop in this one
                timer.leave_out(run.done - 1, run.done)
            run.state, metrics = steps.train(run.state, next(built.batches))
            run.metrics.push(run.done, metrics)
            window.after_step(run.done, block=metrics)
            bar.update(1)
            if any(every.outside_training for every in hooks.run_due(schedule, run)):
                timer.leave_out(run.done + 1)  # the step was settled before the hooks: their time is in the next
    last = run.metrics.settle()
    energy.stop()
    window.stop()
    bar.close()
    built.checkpoints.save(steps.release(run.state), run.metrics.carried())
    measured = build_measurements(
        RunSetup(cfg, checked.task, layout, checked.spec), steps.compiled,
        Clocks(timer, epochs.times, epochs.steps, checked.steps_per_epoch, total - start), run.state, built.host)
    cost = run_cost(built.prices, measured, checked.steps_per_epoch, energy.result,
                    energy.why_not)
    return _summary(built, run, writer, run_name, window, measured, run.metrics.epochs, last, cost)


def _summary(built: BuiltRun, run: hooks.LoopState, writer: ScalarWriter, run_name: str, window: ProfileWindow,
             measured: run_record.Measurements, history: list[dict[str, Any]],
             last: dict[str, float], cost: run_record.Cost | None = None) -> dict[str, Any]:
    """The run's record: what ran, its measurements, and the test split's metrics, as summary.json holds it
    (fields that do not apply to this run are left out)."""
    checked = built.checked
    cfg, layout, unit = checked.cfg, checked.layout, checked.task.unit
    rate = measured.throughput
    test: dict[str, Any] = {}
    if cfg.train.eval:
        metrics = evaluate(built.steps, run.state, checked.dataset.test, cfg, checked.task, layout)
        test = {f"test_{k}": v for k, v in metrics.items() if k != "count"}
        writer.write(run.total, {f"test/{k}": v for k, v in metrics.items() if k != "count"})
    record = run_record.RunRecord(
        status="complete", run_name=run_name, steps=run.total,
        resumed_from=built.start, epochs=history, train_loss=last.get("loss"),
        time_s=time.perf_counter() - run.started, model=cfg.model.kind, spmd=cfg.parallel.spmd,
        examples_per_s=None if rate is None else rate.examples_per_s, strategy=layout.strategy.name,
        mesh="none" if layout.mesh is None else str(layout.shape), devices=layout.shape.size,
        out=str(checked.out), measurements=measured, dataset={"name": checked.dataset.name, **checked.dataset.info,
                                                      "examples": split_sizes(checked.dataset)},
        profile=None if window.path is None else str(window.path), device_kind=measured.device_kind,
        moe=moe_record(cfg, run.metrics), cost=cost, **run_record.provenance(), **test,
        **({} if unit == "examples" or rate is None else {f"{unit}_per_s": rate.units_per_s}))
    return {k: v for k, v in run_record.to_json(record).items() if v is not None}


def moe_record(cfg: Config, metrics: hooks.Metrics) -> run_record.MoE | None:
    """A mixture of experts' routing and the assignments it dropped over this invocation's steps (None without
    experts)."""
    m = cfg.model
    if not m.num_experts or m.factory:
        return None
    per_step = cfg.train.batch_size * m.seq_len * m.top_k * m.num_layers
    dropped, steps = metrics.totals.get("moe_dropped", 0.0), metrics.settled
    return run_record.MoE(
        experts=m.num_experts, top_k=m.top_k, capacity_factor=m.capacity_factor,
        capacity=capacity(m.seq_len, m.num_experts, m.top_k, m.capacity_factor), assignments_per_step=per_step,
        dropped=dropped, dropped_per_step=dropped / steps if steps else None,
        dropped_fraction=dropped / (per_step * steps) if steps else None, aux_loss=metrics.last.get("moe_aux_loss"))
