"""Assemble one run's measurements (the "measurements" section of summary.json, as the record's own
`Measurements`) from a few typed inputs, and name the run."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any

import jax

from shardbench import cluster, malloc, models
from shardbench.config import Config
from shardbench.measure import flops as flops_lib
from shardbench.measure.comms import along_one_axis, count_collectives
from shardbench.measure.memory import gradient_buffers, memory_report, per_device_report
from shardbench.measure.peak import HostPeak
from shardbench.measure.run_record import (
    CompileTimes, Flops, Measurements, Mfu, PartialEpoch, StepTimes, Throughput,
)
from shardbench.measure.timing import MIN_MEASURED_STEPS, StepTimer
from shardbench.models.spec import ModelSpec, example_input
from shardbench.naming import config_run_name
from shardbench.parallel.context import uses_context
from shardbench.parallel.mesh import DATA, MESH_AXES, MODEL, SEQUENCE, STAGE, MeshShape
from shardbench.parallel.pipeline import bubble_fraction, microbatch_count, schedule_repeats, uses_pipeline
from shardbench.parallel.rules import Layout, resolve_strategy
from shardbench.tasks import Task


def default_run_name(cfg: Config, layout: Layout) -> str:
    """A run's name from its configuration and the layout that ran (see `shardbench.naming`)."""
    mesh = "none" if layout.mesh is None else mesh_name(layout.shape)
    implied = resolve_strategy("auto", "none" if layout.mesh is None else str(layout.shape), layout.shape.size)
    return config_run_name(cfg, mesh, layout.strategy.name, implied)


def mesh_name(shape: MeshShape) -> str:
    """The mesh in a run's name: data_model ('4_2', the seed's names) while only those two axes are split, else
    each split axis by name ('data2_seq4'), whichever axes the shape has: data_model would drop the others, and
    name a run on seq=4 as one on a single device, or data=2,seq=4 as plain data parallelism on two."""
    if any(size > 1 for axis, size in shape.items() if axis not in (DATA, MODEL)):
        return "_".join(f"{axis}{size}" for axis, size in shape.items() if size > 1)
    return f"{shape.data}_{shape.model}"


def layout_devices(layout: Layout) -> list[jax.Device]:
    if layout.mesh is None:
        return [layout.device]
    return [d for d in layout.mesh.devices.flat if d.process_index == jax.process_index()]


@dataclass(frozen=True)
class RunSetup:
    """What ran: the configuration, its task and the layout over devices; the model's spec, where MFU needs XLA's
    count of a model of your own."""

    cfg: Config
    task: Task
    layout: Layout
    spec: ModelSpec | None = None


@dataclass(frozen=True)
class CompiledStep:
    """The compiled train step, its compile times, and where it places its gradients where the strategy places
    them apart from the parameters, as ZeRO-2 splits them (a tree of shardings like the parameters,
    `train.state.gradient_shardings`; None: laid out as the parameters)."""

    compiled: Any
    times: CompileTimes | None
    gradient_shardings: Any = None


@dataclass(frozen=True)
class Clocks:
    """The run's clocks: the step timer, each epoch's wall time and steps (an epoch cut short by --steps or a
    resume has fewer than `steps_per_epoch`), and the steps this invocation trained."""

    timer: StepTimer
    epoch_times: list[float]
    epoch_steps: list[int]
    steps_per_epoch: int
    steps_run: int


def _mfu_missing(peak: float | None, steps: StepTimes, layout: Layout) -> str | None:
    """Why a run has no MFU, in words a report can print; None when it has one."""
    if steps.median is None:
        return f"no step time: {steps.not_measured}"
    if peak is None:
        kind = getattr(layout.device, "device_kind", layout.device.platform)
        return f"no peak FLOP/s is known for device kind {kind}"
    return None


def credible_steps(steps: StepTimes, mfu: float | None) -> StepTimes:
    """The step times as they are, or, where fewer than MIN_MEASURED_STEPS intervals put the step's FLOPs above
    the devices' peak (MFU > 100%), none, with the reason (`not_credible`). From more intervals the median stands,
    and the peak is what is wrong (`peak_too_low`)."""
    if mfu is None or mfu <= 1.0 or (steps.measured_steps or 0) >= MIN_MEASURED_STEPS:
        return steps
    return not_credible(steps, mfu)


def peak_too_low(mfu: Mfu, steps: StepTimes) -> Mfu:
    """An MFU over 100% from a median of MIN_MEASURED_STEPS intervals or more: the steps are timed alike, so the
    peak divided by is what reads low. A host's matmul peak is measured (a sweep measures it as it starts): one
    measured while other work loaded the cores reads low, and a run that ran later, on quieter cores, then beats
    it. The step time and throughput stand; the MFU is dropped, saying so."""
    if mfu.mfu is None or mfu.mfu <= 1.0:
        return mfu
    peak = mfu.peak_flops_per_s_per_device or 0.0
    measured = f", measured {mfu.peak_measured_at}" if mfu.peak_measured_at else ""
    why = ("so that peak reads low: a host's, measured while other work loaded its cores, does; "
           "--train.recalibrate-peak measures it again" if mfu.peak_origin else
           "so the step's FLOP count or that peak is wrong")
    return replace(mfu, mfu=None, not_measured=(
        f"above the peak: the median of {steps.measured_steps} step(s), {(steps.median or 0) * 1e3:.3g} ms, runs the "
        f"step's FLOPs at {mfu.mfu:.0%} of the peak divided by ({peak / 1e9:.3g} GFLOP/s per device, "
        f"{mfu.peak_source}{measured}), {why}"))


def not_credible(steps: StepTimes, mfu: float) -> StepTimes:
    """A step time that would put the step's FLOPs above the devices' peak (MFU > 100%) measured the host, not
    the step: with few intervals, one that began when the host saw the step before complete late (the devices
    had already run on: on a CPU they share the host's cores with it) is shorter than the step. It is dropped,
    and so are the throughput and MFU that divide by it, with that said."""
    return replace(steps, median=None, p90=None, not_measured=(
        f"not credible: the median of {steps.measured_steps} interval(s), {(steps.median or 0) * 1e3:.3g} ms, would "
        f"run the step's FLOPs at {mfu:.0%} of the peak; so few intervals time when the host saw steps complete, "
        f"not the steps: train more steps (--steps) for a step time"))


def _throughput(setup: RunSetup, steps: StepTimes, clocks: Clocks) -> Throughput:
    # Throughput is the steady state, from the same median step MFU divides by, so every speed figure of a run
    # ranks it alike; the wall-clock rate (data and checkpoints included, evaluation not, and the train step's
    # compilation not either: `train.build` compiles it before the loop's clock starts) is kept apart.
    devices, batch = setup.layout.shape.size, setup.cfg.train.batch_size
    train_time = sum(clocks.epoch_times)
    rate = batch / steps.median if steps.median else None
    units = None if rate is None else rate * setup.task.units_per_example(setup.cfg)
    return Throughput(examples_per_s=rate, examples_per_s_per_device=None if rate is None else rate / devices,
                      unit=setup.task.unit, units_per_s=units,
                      units_per_s_per_device=None if units is None else units / devices,
                      wall_examples_per_s=clocks.steps_run * batch / train_time
                      if train_time > 0 and clocks.steps_run else None)


def _flops_and_mfu(setup: RunSetup, compiled: Any, steps: StepTimes, host_peak: HostPeak | None,
                   hosts: int = 1) -> tuple[Flops, Mfu]:
    cfg, layout, devices = setup.cfg, setup.layout, setup.layout.shape.size
    per_example = setup.task.train_flops_per_example(cfg)
    analytic = None if per_example is None else float(per_example * cfg.train.batch_size)
    xla = flops_lib.xla_flops(compiled) if compiled is not None else None
    xla_step = None if xla is None else xla * devices
    traced = traced_per_step(setup) if analytic is None else None  # a model of your own without its own count
    counted, uses = next(((c, name) for c, name in ((analytic, "analytic"), (traced, "traced"), (xla_step, "xla"))
                          if c is not None), (None, "xla"))
    peak, source = flops_lib.peak_per_device(layout.device, devices, cfg.precision.dtype,
                                             cfg.precision.matmul_precision, host_peak, hosts)
    flops = Flops(analytic_per_step=analytic, xla_per_step=xla_step, traced_per_step=traced,
                  formula=setup.task.formula, mfu_uses=uses,
                  # Measured here: for vit-tiny (4 layers) XLA reports ~0.28x the analytic count.
                  xla_note="XLA's cost analysis counts a while-loop body once, so with the layers under a scan it "
                           "undercounts by roughly the layer count; MFU uses the analytic count where the model "
                           "has one" + (f"; with --train.grad-accum {cfg.train.grad_accum} the microbatch loop's body "
                                        f"counts once too: a further 1/{cfg.train.grad_accum}"
                                        if cfg.train.grad_accum > 1 else ""))
    mfu = Mfu(mfu=None if counted is None else flops_lib.mfu(counted, steps.median, peak, devices),
              peak_flops_per_s_per_device=peak, peak_source=source,
              peak_measured_at=host_peak.measured_at if host_peak and peak else None,
              peak_origin=host_peak.origin if host_peak and peak else None,
              peak_busy=(host_peak.busy or None) if host_peak and peak else None,
              not_measured=_mfu_missing(peak, steps, layout))
    return flops, mfu


def traced_per_step(setup: RunSetup) -> float | None:
    """A model of your own without flops_per_example: XLA's count of its forward and backward on one device
    (`ModelSpec.traced_train_flops`, on one microbatch of its inputs) x the microbatches of a step."""
    if setup.spec is None or not setup.spec.custom:
        return None
    batch, k = setup.cfg.train.batch_size, setup.cfg.train.grad_accum
    example, _, _ = example_input(setup.cfg, rows=batch // k)
    traced = setup.spec.traced_train_flops(example)
    return None if traced is None else traced * k


def batch_sizes(setup: RunSetup) -> dict[str, int | float]:
    """The record's batch fields: the global batch per update and the microbatch it is computed in; with pipeline
    stages, the stages, their microbatches and the schedule's bubble."""
    batch, k = setup.cfg.train.batch_size, setup.cfg.train.grad_accum
    sizes: dict[str, int | float] = {"global_batch": batch, "grad_accum": k, "microbatch": batch // k,
                                     "microbatch_per_shard": batch // k // setup.layout.data_size}
    if uses_pipeline(setup.layout):
        stages, m = setup.layout.shape.stage, microbatch_count(setup.cfg.parallel.microbatches, setup.layout)
        sizes.update(pipeline_stages=stages, pipeline_microbatches=m,
                     pipeline_bubble=bubble_fraction(stages, m, schedule_repeats(setup.cfg.parallel)))
    return sizes


def build_measurements(setup: RunSetup, step: CompiledStep | None, clocks: Clocks, state: Any,
                       host_peak: HostPeak | None = None) -> Measurements:
    """Every measurement of one run (`step` None: this invocation trained no step)."""
    layout = setup.layout
    steps = clocks.timer.stats()
    compiled = None if step is None else step.compiled
    comms = count_collectives(compiled.as_text()) if compiled is not None else None
    devices_here = layout_devices(layout)
    memory = None
    if compiled is not None:
        gradients = gradient_buffers(state.params, step.gradient_shardings)
        memory = memory_report(compiled, state.params, state.opt_state, devices_here, gradients=gradients,
                               model_state=state.model_state)
    # Every process sends what it measured; the one record holds every device of every process.
    here = {"process": jax.process_index(), "host": socket.gethostname(), "devices": [d.id for d in devices_here],
            "step_time_median_s": steps.median, "train_time_s": sum(clocks.epoch_times)}
    gathered = cluster.gather_json({"process": here,
                                    "devices": per_device_report(state.params, state.opt_state, devices_here,
                                                                 state.model_state)})
    if memory is not None:
        memory = replace(memory, per_device=[entry for g in gathered for entry in g["devices"]])
    hosts = flops_lib.host_count([g["process"] for g in gathered])
    flops, mfu = _flops_and_mfu(setup, compiled, steps, host_peak, hosts)
    credible = credible_steps(steps, mfu.mfu)
    if credible is not steps:
        steps = credible
        flops, mfu = _flops_and_mfu(setup, compiled, steps, host_peak, hosts)
    mfu = peak_too_low(mfu, steps)
    # Whole epochs only: a run cut short by --steps (or resumed mid-epoch) ends with a partial one.
    epochs = list(zip(clocks.epoch_times, clocks.epoch_steps, strict=False))
    return Measurements(
        platform=layout.device.platform,
        device_kind=getattr(layout.device, "device_kind", layout.device.platform),
        devices=layout.shape.size,
        processes=jax.process_count(),
        allocator=malloc.describe(os.environ),
        xla_flags=os.environ.get("XLA_FLAGS") or None,
        attention="context" if uses_context(layout) else models.attention_ran(setup.cfg),
        qkv_layout=models.qkv_layout_ran(setup.cfg),
        per_process=[g["process"] for g in gathered],
        **batch_sizes(setup),
        compile=None if step is None else step.times,
        step_time_s=steps,
        epoch_time_s=[t for t, n in epochs if n == clocks.steps_per_epoch],
        partial_epochs=[PartialEpoch(steps=n, of=clocks.steps_per_epoch, time_s=t)
                        for t, n in epochs if n != clocks.steps_per_epoch],
        throughput=_throughput(setup, steps, clocks),
        flops=flops,
        mfu=mfu,
        memory=memory,
        pipeline_transfers=(along_one_axis(comms.ops, layout.shape.sizes, MESH_AXES.index(STAGE))
                            if comms is not None and uses_pipeline(layout) else None),
        context_transfers=(along_one_axis(comms.ops, layout.shape.sizes, MESH_AXES.index(SEQUENCE))
                           if comms is not None and uses_context(layout) else None),
        comms={} if comms is None else dict(comms.by_kind),
        comms_total_bytes=0 if comms is None else comms.total_bytes,
        comms_total_sent_bytes=0 if comms is None else comms.total_sent_bytes,
        comms_unknown_trip_counts=None if comms is None else comms.unknown_trip_counts,
    )
