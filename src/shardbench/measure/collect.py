"""Assemble one run's measurements (the "measurements" section of summary.json) and name the run."""

from __future__ import annotations

import os
import socket
from typing import Any

import jax

from shardbench import cluster, malloc
from shardbench.config import Config
from shardbench.measure import flops as flops_lib
from shardbench.measure.comms import count_collectives
from shardbench.measure.memory import memory_report, per_device_report
from shardbench.measure.peak import HostPeak
from shardbench.naming import config_run_name
from shardbench.measure.timing import CompileTimes, StepTimer
from shardbench.parallel.rules import Layout, resolve_strategy
from shardbench.tasks import Task


def default_run_name(cfg: Config, layout: Layout) -> str:
    """A run's name from its configuration and the layout that ran (see `shardbench.naming`)."""
    mesh = "none" if layout.mesh is None else f"{layout.shape.data}_{layout.shape.model}"
    implied = resolve_strategy("auto", "none" if layout.mesh is None else str(layout.shape), layout.shape.size)
    return config_run_name(cfg, mesh, layout.strategy.name, implied)


def layout_devices(layout: Layout) -> list[jax.Device]:
    if layout.mesh is None:
        return [layout.device]
    return [d for d in layout.mesh.devices.flat if d.process_index == jax.process_index()]


def _mfu_missing(peak: float | None, step_stats: dict[str, Any], layout: Layout) -> str | None:
    """Why a run has no MFU, in words a report can print; None when it has one."""
    if step_stats["median"] is None:
        return f"no step time: {step_stats['not_measured']}"
    if peak is None:
        kind = getattr(layout.device, "device_kind", layout.device.platform)
        return f"no peak FLOP/s is known for device kind {kind}"
    return None


def build_measurements(*, cfg: Config, task: Task, layout: Layout, compiled: Any,
                       compile_times: CompileTimes | None, timer: StepTimer, epoch_times: list[float],
                       steps_run: int, state: Any, host_peak: HostPeak | None = None,
                       epoch_steps: list[int] | None = None, steps_per_epoch: int = 0) -> dict[str, Any]:
    devices = layout.shape.size
    batch = cfg.train.batch_size
    step_stats = timer.stats()
    train_time = sum(epoch_times)
    # Throughput is the steady state, from the same median step MFU divides by, so every speed figure of a run
    # ranks it alike; the wall-clock rate (first step's compilation, data and checkpoints included) is kept apart.
    median = step_stats["median"]
    throughput = batch / median if median else None
    wall = steps_run * batch / train_time if train_time > 0 and steps_run else None
    units = None if throughput is None else throughput * task.units_per_example(cfg)
    per_example = task.train_flops_per_example(cfg)
    analytic = None if per_example is None else float(per_example * batch)
    xla = flops_lib.xla_flops(compiled) if compiled is not None else None
    xla_step = None if xla is None else xla * devices
    counted = analytic if analytic is not None else xla_step  # a model of your own without its own count
    peak, source = flops_lib.peak_per_device(layout.device, devices, cfg.precision.dtype,
                                             cfg.precision.matmul_precision, host_peak)
    comms = count_collectives(compiled.as_text()) if compiled is not None else None
    devices_here = layout_devices(layout)
    memory = (memory_report(compiled, state.params, state.opt_state, devices_here, state.model_state)
              if compiled else {})
    # Every process sends what it measured; the one record holds every device of every process.
    here = {"process": jax.process_index(), "host": socket.gethostname(), "devices": [d.id for d in devices_here],
            "step_time_median_s": step_stats["median"], "train_time_s": train_time}
    gathered = cluster.gather_json({"process": here,
                                    "devices": per_device_report(state.params, state.opt_state, devices_here,
                                                                 state.model_state)})
    if memory:
        memory["per_device"] = [entry for g in gathered for entry in g["devices"]]
    return {
        "platform": layout.device.platform,
        "device_kind": getattr(layout.device, "device_kind", layout.device.platform),
        "devices": devices,
        "processes": jax.process_count(),
        "allocator": malloc.describe(os.environ),
        "xla_flags": os.environ.get("XLA_FLAGS") or None,
        "per_process": [g["process"] for g in gathered],
        "compile": None if compile_times is None else {"lower_s": compile_times.lower_s,
                                                       "compile_s": compile_times.compile_s},
        "step_time_s": step_stats,
        # Whole epochs only: a run cut short by --steps (or resumed mid-epoch) ends with a partial one.
        "epoch_time_s": [t for t, n in zip(epoch_times, epoch_steps or [], strict=False) if n == steps_per_epoch]
        if epoch_steps is not None else epoch_times,
        "partial_epochs": [{"steps": n, "of": steps_per_epoch, "time_s": t}
                           for t, n in zip(epoch_times, epoch_steps or [], strict=False) if n != steps_per_epoch],
        "throughput": {"examples_per_s": throughput,
                       "examples_per_s_per_device": None if throughput is None else throughput / devices,
                       "unit": task.unit, "units_per_s": units,
                       "units_per_s_per_device": None if units is None else units / devices,
                       "wall_examples_per_s": wall},
        "flops": {"analytic_per_step": analytic, "xla_per_step": xla_step, "formula": task.formula,
                  "mfu_uses": "analytic" if analytic is not None else "xla",
                  # Measured here: for vit-tiny (4 layers) XLA reports ~0.28x the analytic count.
                  "xla_note": "XLA's cost analysis counts a while-loop body once, so with the layers under a "
                              "scan it undercounts by roughly the layer count; MFU uses the analytic count "
                              "where the model has one"},
        "mfu": {"mfu": None if counted is None else flops_lib.mfu(counted, step_stats["median"], peak, devices),
                "peak_flops_per_s_per_device": peak, "peak_source": source,
                "peak_measured_at": host_peak.measured_at if host_peak and peak else None,
                "peak_origin": host_peak.origin if host_peak and peak else None,
                "not_measured": _mfu_missing(peak, step_stats, layout)},
        "memory": memory,
        "comms": {} if comms is None else comms.as_dict(),
        "comms_total_bytes": 0 if comms is None else comms.total_bytes,
    }
