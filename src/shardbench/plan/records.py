"""Measured runs, recompiled as they ran: what `--calibrate` fits the model to and `--validate` checks it on.

Each complete run below a directory (a sweep's store or any folder of run directories) is compiled again with
its own configuration and device count (compile only, in worker processes), and predicted on the hardware it
ran on: a CPU run on this host's CPU with the matmul peak its record used, a GPU run on its chip's data sheet.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from shardbench import config as config_lib
from shardbench.hardware import chip_for_kind
from shardbench.plan.calibration import DEFAULTS, Coefficients, fit
from shardbench.plan.predict import Hardware, step_features
from shardbench.plan.target import Target
from shardbench.plan.workers import compile_all, default_workers
from shardbench.sweep.content import Run


@dataclass(frozen=True)
class Measured:
    """One measured run with its recompiled step: what it measured, and where it ran."""

    run: Run
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

    def features(self) -> dict[str, float]:
        assert self.result is not None and self.hardware is not None
        return step_features(self.result, self.hardware, self.cfg.model.remat)


def where_it_ran(run: Run, cfg: config_lib.Config, cache_dir: Path) -> Hardware | str:
    """The hardware a run ran on, or why it cannot be predicted."""
    from shardbench.plan.machine import hardware

    m = run.m
    devices = int(m.devices or 1)
    if m.platform == "cpu":
        # The peak the run measured at its start (it varied from 207 to 314 GFLOP/s between sweeps on one host):
        # it carries the machine's state at the time. The host's one cached figure instead ranked both
        # validation sweeps worse (Kendall's tau 0.87 against 1.00).
        mfu = m.mfu
        peak = (mfu.peak_flops_per_s_per_device * devices, mfu.peak_source or "the run's recorded peak") \
            if mfu and mfu.peak_flops_per_s_per_device else None
        return hardware(Target("cpu", None, devices, devices), cfg.precision.dtype, cfg.precision.matmul_precision,
                        cache_dir, peak)
    chip = chip_for_kind(m.device_kind or "")
    if m.platform != "gpu" or chip is None:
        return f"runs on {m.platform} ({m.device_kind}) are not predicted yet"
    return hardware(Target(chip.name, chip, devices, max(devices, chip.per_node)), cfg.precision.dtype,
                    cfg.precision.matmul_precision, cache_dir)


def measured_runs(directory: Path, workers: int, progress: TextIO | None = sys.stderr) -> list[Measured]:
    """Every complete run below `directory` with a step time, recompiled (see the module docstring)."""
    from shardbench.sweep.report import load_runs
    from shardbench.train.plan import default_cache_dir

    runs, _ = load_runs(directory)
    chosen: list[tuple[Run, config_lib.Config, Hardware | str]] = []
    for run in runs:
        if not run.ok or run.record is None or not run.config:
            continue
        cfg = config_lib.override(config_lib.Config(), {k: v for k, v in run.config.items()})
        chosen.append((run, cfg, where_it_ran(run, cfg, default_cache_dir(cfg))))
    jobs = [{"name": run.name, "config": {**config_lib.flatten(cfg), "parallel.devices": int(run.m.devices or 1)},
             "link_span": int(run.m.devices or 1)} for run, cfg, hw in chosen if not isinstance(hw, str)]
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


def calibrate(directories: list[Path], workers: int, progress: TextIO | None = sys.stderr
              ) -> dict[str, Coefficients]:
    """The model's coefficients per platform: fitted to the runs below `directories` where they hold at least
    four of that platform, the defaults (`shardbench.plan.calibration`) elsewhere."""
    coefficients = dict(DEFAULTS)
    if not directories:
        return coefficients
    samples: dict[str, list[tuple[dict[str, float], float]]] = {}
    for directory in directories:
        for m in measured_runs(directory, workers, progress):
            if m.result is not None and m.hardware is not None and m.step_s:
                samples.setdefault(m.hardware.platform, []).append((m.features(), m.step_s))
    names = ", ".join(str(d) for d in directories)
    for platform, found in samples.items():
        coefficients[platform] = fit(found, DEFAULTS[platform], f"fitted to {len(found)} {platform} run(s) in {names}")
    return coefficients
