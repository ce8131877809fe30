"""Measured runs, recompiled as they ran: what `--calibrate` fits the model to and `--validate` checks it on.

Each complete run below a directory (a sweep's store or any folder of run directories) is compiled again with
its own configuration and device count (compile only, in worker processes), and predicted on the hardware it
ran on: a CPU run on this host's CPU with the matmul peak its record used, a GPU run on its chip's data sheet.
A GPU run is compiled by the GPU compiler where this host has enough GPUs of its chip, else by the CPU compiler
(records measured on another machine and platform read the same way); its record's own compiled memory and
runtime peak are what `--calibrate` fits the activation ratio to.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.hardware import chip_for_kind
from shardbench.measure.memory import compiled_total
from shardbench.parsing import override
from shardbench.plan.calibration import DEFAULTS, HELD_OUT, MIN_FIT_RUNS, Calibration, fit, fit_activations, held_out
from shardbench.plan.predict import Hardware, memory, step_features
from shardbench.plan.steptime import StepFeatures
from shardbench.plan.target import Target, unlinked
from shardbench.plan.workers import compile_all, default_workers
from shardbench.report.content import ReportedRun


@dataclass(frozen=True)
class Measured:
    """One measured run with its recompiled step: what it measured, and where it ran."""

    run: ReportedRun
    cfg: config_lib.Config
    hardware: Hardware | None  # None: not predicted (see problem)
    result: dict[str, Any] | None  # the compile worker's figures (None: see problem)
    problem: str = ""

    @property
    def step_s(self) -> float | None:
        return self.run.step_median

    @property
    def memory_bytes(self) -> float | None:
        """The runtime peak where the backend reported one, else the compiled total (what the run recorded)."""
        mem = self.run.m.memory if self.run.record and self.run.m else None
        if mem is None:
            return None
        return mem.peak_bytes_in_use if mem.peak_bytes_in_use is not None else mem.total_bytes

    @property
    def memory_kind(self) -> str:
        mem = self.run.m.memory if self.run.record and self.run.m else None
        return "runtime peak" if mem is not None and mem.peak_bytes_in_use is not None else "compiled total"

    @property
    def dtype(self) -> str:
        return self.cfg.precision.dtype

    def features(self) -> StepFeatures:
        assert self.result is not None and self.hardware is not None
        return step_features(self.result, self.hardware, self.cfg.model.remat, self.dtype)

    def memory_parts(self) -> tuple[float, float] | None:
        """(the predicted bytes besides the activations, the recompiling compiler's activations), where the run
        was measured on another platform than this host compiles for and recorded its runtime peak: what the
        activation ratio is fitted to."""
        if (self.result is None or self.hardware is None or not self.result.get("compiled")
                or self.result["platform"] == self.hardware.platform or self.memory_kind != "runtime peak"):
            return None
        parts = memory(self.result, 0.0)
        return parts.total_bytes, memory(self.result, 1.0).activations_bytes

    def runtime_extra(self) -> float | None:
        """Bytes the run's runtime held at its peak beyond its own compiled total."""
        mem = self.run.m.memory if self.run.record and self.run.m else None
        if mem is None or mem.peak_bytes_in_use is None or not mem.compiled:
            return None
        return float(mem.peak_bytes_in_use - compiled_total(mem.compiled))


def ran_on(run: ReportedRun) -> Target | str:
    """The target a run ran on, or why it cannot be predicted: a CPU run on this host's CPU; a GPU run on its
    chip's devices (JAX's, as a Target counts them), a node holding as many as the data sheet's node does, so a
    run on more spans ceil(devices / per node) nodes, device i on node i // per node, as a plan places them."""
    m = run.m
    devices = int(m.devices or 1)
    if m.platform == "cpu":
        return Target("cpu", None, devices, devices)
    chip = chip_for_kind(m.device_kind or "")
    if m.platform != "gpu" or chip is None:
        return f"runs on {m.platform} ({m.device_kind}) are not predicted yet"
    target = Target(chip.name, chip, devices, chip.devices_per_node)
    if unlinked(target):
        return (f"runs on {devices} {chip.name} span {target.nodes} nodes, and the {chip.name}'s data sheet gives no "
                f"bandwidth between nodes: not predicted")
    return target


def where_it_ran(run: ReportedRun, cfg: config_lib.Config, cache_dir: Path) -> Hardware | str:
    """The hardware a run ran on (`ran_on`), or why it cannot be predicted."""
    from shardbench.plan.machine import hardware

    target = ran_on(run)
    if isinstance(target, str):
        return target
    peak = None
    if target.chip is None:
        # The peak the run measured at its start (it varied from 207 to 314 GFLOP/s between sweeps on one host):
        # it carries the machine's state at the time. The host's one cached figure instead ranked both
        # validation sweeps worse (Kendall's tau 0.87 against 1.00).
        mfu = run.m.mfu
        peak = (mfu.peak_flops_per_s_per_device * target.devices, mfu.peak_source or "the run's recorded peak") \
            if mfu and mfu.peak_flops_per_s_per_device else None
    return hardware(target, cfg.precision.dtype, cfg.precision.matmul_precision, cache_dir, peak)


def link_span(run: ReportedRun) -> int:
    """The devices of `run` that share one node's links (`ran_on`): a collective among them crosses no node."""
    target = ran_on(run)
    return target.per_node if isinstance(target, Target) else int(run.m.devices or 1)


def measured_runs(directory: Path, workers: int, progress: TextIO | None = sys.stderr,
                  leave_out: frozenset[str] = frozenset()) -> list[Measured]:
    """Every complete run below `directory` with a step time, recompiled (see the module docstring), but the
    runs named in `leave_out`, each of which must be there."""
    from shardbench.config import cache_root
    from shardbench.report.write import load_runs

    runs, _ = load_runs(directory)
    if missing := sorted(leave_out - {run.name for run in runs}):
        raise ConfigError(f"{directory / HELD_OUT} names {', '.join(missing)}: no such run below {directory}")
    runs = [run for run in runs if run.name not in leave_out]
    chosen: list[tuple[ReportedRun, config_lib.Config, Hardware | str]] = []
    for run in runs:
        if not run.ok or run.record is None or not run.config:
            continue
        cfg = override(config_lib.Config(), {k: v for k, v in run.config.items()})
        chosen.append((run, cfg, where_it_ran(run, cfg, cache_root(cfg))))
    # A GPU run names its chip: on a host with enough of those GPUs the worker compiles with the GPU compiler.
    jobs = [{"name": run.name, "config": {**config_lib.flatten(cfg), "parallel.devices": int(run.m.devices or 1)},
             "link_span": link_span(run),
             "gpu_kind": chip.name if hw.platform == "gpu" and (chip := chip_for_kind(run.m.device_kind or ""))
             else None} for run, cfg, hw in chosen if not isinstance(hw, str)]
    if progress is not None and jobs:
        print(f"plan: recompiling {len(jobs)} measured run(s) of {directory}", file=progress, flush=True)
    found = compile_all(jobs, workers or default_workers())
    out: list[Measured] = []
    for run, cfg, hw in chosen:
        if isinstance(hw, str):
            out.append(Measured(run, cfg, None, None, hw))
            continue
        line = found[run.name]
        problem = line.get("refused") or line.get("error") or ""
        out.append(Measured(run, cfg, hw, line.get("result"), problem))
    return out


def too_few_notes(samples: dict[str, list[tuple[StepFeatures, float]]], names: str) -> list[str]:
    """What --calibrate leaves as it was: a platform with fewer measured step times than a fit takes, or none."""
    if not samples:
        return [f"--calibrate {names}: no run there has a step time to fit to (failed, refused or unmeasured runs "
                f"only): the default coefficients are used"]
    return [f"--calibrate {names}: {len(pairs)} {platform} run(s) with a step time, fewer than the "
            f"{MIN_FIT_RUNS} a fit takes: the {platform} default coefficients are used"
            for platform, pairs in samples.items() if len(pairs) < MIN_FIT_RUNS]


def calibrate(directories: list[Path], workers: int, progress: TextIO | None = sys.stderr) -> Calibration:
    """The model's coefficients per platform, fitted to the runs below `directories` (but those each names in its
    held-out.txt) where they hold at least
    four of that platform, the defaults (`shardbench.plan.calibration`) elsewhere; and, from runs measured on
    another platform than this host compiles for, that platform's activation ratio per compute dtype and the
    bytes its runtime holds beyond the program (their medians)."""
    found = Calibration()
    if not directories:
        return found
    samples: dict[str, list[tuple[StepFeatures, float]]] = {}
    parts: dict[str, list[tuple[str, float, float, float]]] = {}
    extra: dict[str, list[float]] = {}
    for directory in directories:
        left_out = held_out(directory)
        if left_out and progress is not None:
            print(f"plan: leaving the {len(left_out)} run(s) named in {directory / HELD_OUT} out of the fit",
                  file=progress, flush=True)
        for m in measured_runs(directory, workers, progress, left_out):
            if m.result is None or m.hardware is None:
                continue
            platform = m.hardware.platform
            if m.step_s:
                samples.setdefault(platform, []).append((m.features(), m.step_s))
            split, runtime = m.memory_parts(), m.runtime_extra()
            if split is not None and runtime is not None and m.memory_bytes:
                parts.setdefault(platform, []).append((m.dtype, *split, m.memory_bytes))
                extra.setdefault(platform, []).append(runtime)
    names = ", ".join(str(d) for d in directories)
    for platform, pairs in samples.items():
        found.coefficients[platform] = fit(pairs, DEFAULTS[platform],
                                           f"fitted to {len(pairs)} {platform} run(s) in {names}")
    if progress is not None:
        for note in too_few_notes(samples, names):
            print(f"shardbench: note: {note}", file=progress, flush=True)
    for platform, values in extra.items():
        # First the runtime's own bytes (their median), then the ratio that best predicts the peaks with them.
        found.runtime_bytes[platform] = runtime = float(statistics.median(values))
        ratios = fit_activations([(d, rest + runtime, acts, peak) for d, rest, acts, peak in parts[platform]])
        found.activation_ratios.setdefault(platform, {}).update(ratios)
        found.activation_sources[platform] = f"fitted to {len(values)} {platform} run(s) in {names}"
    return found
