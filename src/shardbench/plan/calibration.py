"""The step-time model's coefficients and the memory model's activation ratios, per platform, and fitting both
to measured runs.

The model itself is `shardbench.plan.steptime` (one formula, one function). `--calibrate DIR` recompiles the
runs below DIR as they ran and fits everything but the communication overlap: the efficiencies, the 16-bit
traffic factor and the compute/traffic overlap on a grid, the per-kernel, per-collective and per-step costs
by non-negative least squares, minimising the mean relative error. Runs measured on another platform than the
compiler's (GPU records recompiled on a CPU) also fit that platform's temporaries relative to the CPU
compiler's, per compute dtype, and the bytes the runtime holds beyond the compiled program. The defaults below
say what each was fitted to or assumed from.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from shardbench.plan.steptime import LINEAR, Coefficients, StepFeatures, linear_split, step_time

__all__ = ["Coefficients", "Calibration", "DEFAULTS", "GRID", "HELD_OUT", "activation_scale", "fit",
           "fit_activations", "held_out", "to_dict"]

# A folder of measured runs may name, one run name a line, the runs no fit may see: `--calibrate DIR` leaves
# them out and `--validate DIR` reports their error apart. Fixing the split in a file before fitting keeps it
# from being chosen after seeing which split scores best.
HELD_OUT = "held-out.txt"


def held_out(directory: Path) -> frozenset[str]:
    """The run names DIR/held-out.txt holds out of every fit ('#' starts a comment); none without the file."""
    path = Path(directory) / HELD_OUT
    if not path.is_file():
        return frozenset()
    return frozenset(name for line in path.read_text().splitlines() if (name := line.split("#", 1)[0].strip()))

# Fitted with `shardbench plan --calibrate` to two CPU sweeps of 2026-11-28 on a 2-core AMD EPYC, 8 simulated
# devices (benchmarks/plan-cpu.md): vit-tiny (8 heads) and mlp-small under single, dp, fsdp, tp and dp+tp at batch
# 32 and 256, 20 runs; a third, lm-tiny's, is held out whole (its held-out.txt) to check the fit on a model it
# never saw. The fit sums matmuls and memory traffic (XLA's CPU runs them in turn) and finds no per-step,
# per-kernel or per-collective cost beyond them: the earlier default, fitted to vit-tiny alone, put 98 ms of
# vit-tiny's step in a per-step cost and overestimated mlp-small's steps by 159% on average on these sweeps.
CPU_DEFAULT = Coefficients(efficiency=0.8475, memory_efficiency=0.8475, kernel_s=0.0, collective_s=0.0,
                           fixed_s=0.0, overlap=0.0, compute_memory_overlap=0.0,
                           source="CPU default, fitted to the vit-tiny and mlp-small sweeps of benchmarks/plan-cpu.md")

# The H100 records these GPU defaults were fitted to (benchmarks/plan-h100.md has the commands and the errors).
H100_RECORDS = ("H100 records of 2026-11-24 (NVIDIA H100 80GB HBM3, jax 0.11.2; benchmarks/data/h100-2026-11-24/"
                "runs but its held-out.txt: vit-seed b256 f32/bf16, b1024 f32, b4096 f32, bf16 b1024 remat full, "
                "lm-seed b32 f32)")
# Fitted with `shardbench plan --validate benchmarks/data/h100-2026-11-24/runs --calibrate
# benchmarks/data/h100-2026-11-24/runs` on a CPU-only machine, with the CPU compiler (as a user without a GPU
# would): 6 runs; the 3 runs named in runs/held-out.txt were not used (its raw output:
# benchmarks/data/h100-2026-11-24/plan-calibrate.txt). The fit chose the sum of matmuls and traffic over their
# maximum, a bfloat16 step moving 0.55 of the bytes the CPU compiler counts for it (which holds bfloat16 work in
# float32), and a per-step cost of 1.61 ms (lm-seed's launch-bound step) over a per-kernel one (the CPU
# compiler's kernel count is not the GPU's). The matmul and memory efficiencies trade against each other in a
# sum over so few runs (an earlier split of the same records gave 57% and 125%): read them together, not as
# the H100's. The memory efficiency passes 1 because the GPU's fusions move fewer bytes than the CPU compiler
# counts. On a single GPU there are no collectives: the per-collective cost is NCCL's small-message latency,
# and the links are the data sheet's, both unmeasured.
GPU_DEFAULT = Coefficients(efficiency=0.3322, memory_efficiency=1.8498, kernel_s=0.0, collective_s=20e-6,
                           fixed_s=1.609e-3, overlap=0.0, compute_memory_overlap=0.0, low_precision_traffic=0.55,
                           source=f"GPU default, fitted with the CPU compiler's features to the {H100_RECORDS}; "
                                  f"communication: data sheet and an assumed 20 us per collective, no multi-GPU "
                                  f"run measured")
# No TPU run has been measured with shardbench: the GPU's efficiencies are borrowed, and said to be; its own
# per-collective cost (10 us, ICI's) and its traffic (the TPU compiler counts bfloat16 bytes as they are) are
# assumed, and said to be too.
TPU_DEFAULT = replace(GPU_DEFAULT, collective_s=10e-6, low_precision_traffic=1.0,
                      source="TPU default, the GPU default's efficiencies (no TPU run measured yet); "
                             "communication: data sheet and an assumed 10 us per collective, unmeasured")
DEFAULTS = {"cpu": CPU_DEFAULT, "gpu": GPU_DEFAULT, "tpu": TPU_DEFAULT}

# Temporaries (activations) of another platform's compiler per byte of the CPU compiler's, on the same step,
# by compute dtype: (ratio, source). The CPU compiler holds bfloat16 work in float32, so its bfloat16 steps
# overstate a GPU's more than its float32 ones. Fitted as above (the GPU compiler's temporaries are in each
# record); the ratio is the one that best predicts the runs' runtime peaks. The remat policies differ by under
# 5% (the GPU's temporaries per the CPU's, bfloat16: none 0.43, block 0.42, full 0.41), so one ratio per dtype.
# TPU targets compile with the TPU compiler itself, so need none.
# float16 is assumed to behave as bfloat16 (no float16 run measured).
ACTIVATION_RATIOS: dict[str, dict[str, float]] = {"gpu": {"float32": 0.6432, "bfloat16": 0.4067, "float16": 0.4067}}
# Bytes the runtime holds at its peak beyond the compiled program (the median over the same records: 18-90 MiB).
RUNTIME_BYTES: dict[str, float] = {"gpu": 25_326_068.0}
ACTIVATION_SOURCE = {"gpu": f"fitted to the {H100_RECORDS}"}

# Grids of the coefficients the step time is not linear in.
# Efficiencies tried: the matmuls cannot beat the peak; the memory efficiency is relative to the traffic the
# compiling compiler counted, which a GPU's larger fusions can undercut, so it may pass 1.
GRID = np.geomspace(0.02, 2.0, 60)
LOW_PRECISION_GRID = np.round(np.arange(0.3, 1.001, 0.05), 2)
OVERLAP_GRID = (1.0, 0.0)


@dataclass(frozen=True)
class Calibration:
    """Everything a prediction takes from calibration, per platform."""

    coefficients: dict[str, Coefficients] = field(default_factory=lambda: dict(DEFAULTS))
    activation_ratios: dict[str, dict[str, float]] = field(default_factory=lambda: {
        k: dict(v) for k, v in ACTIVATION_RATIOS.items()})
    runtime_bytes: dict[str, float] = field(default_factory=lambda: dict(RUNTIME_BYTES))
    activation_sources: dict[str, str] = field(default_factory=lambda: dict(ACTIVATION_SOURCE))

    def activation_scale(self, compiled_for: str, target_platform: str, dtype: str) -> tuple[float, str]:
        """(factor on the compiled temporaries, its source): 1 where the target's own compiler compiled the
        step, else the calibrated ratio of the target's compiler to the one that did."""
        if compiled_for == target_platform:
            return 1.0, f"the {target_platform.upper()} compiler's own temporaries"
        ratios = self.activation_ratios.get(target_platform, {})
        ratio = ratios.get(dtype, ratios.get("float32", 1.0))
        return ratio, (f"the {compiled_for.upper()} compiler's temporaries x {ratio:.3f}, the {target_platform.upper()}"
                       f"/{compiled_for.upper()} ratio for {dtype} "
                       f"({self.activation_sources.get(target_platform, 'assumed')}): not the "
                       f"{target_platform.upper()} compiler's own")

    def runtime(self, compiled_for: str, target_platform: str) -> float:
        """Bytes the target's runtime holds beyond the program: only where another compiler compiled it (a
        GPU's own compiled total already matched its runtime peak within 0.3%)."""
        return 0.0 if compiled_for == target_platform else self.runtime_bytes.get(target_platform, 0.0)


def activation_scale(compiled_for: str, target_platform: str, dtype: str = "float32") -> tuple[float, str]:
    """The shipped defaults' `Calibration.activation_scale`."""
    return Calibration().activation_scale(compiled_for, target_platform, dtype)


class _NNLS:
    """Non-negative least squares for a handful of unknowns and one matrix `a`, many right-hand sides at once:
    for each, the best of least squares on every subset of the columns that are not all zero whose solution is
    non-negative (each subset's pseudo-inverse computed once, then applied to every right-hand side together)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        live = [i for i in range(a.shape[1]) if np.any(a[:, i])]
        self.subsets = [(list(cols), np.linalg.pinv(a[:, list(cols)]))
                        for size in range(1, len(live) + 1) for cols in itertools.combinations(live, size)]

    def __call__(self, b: np.ndarray) -> np.ndarray:
        """`b`: one right-hand side, or one per row; returns a solution for each. A subset replaces the best so
        far only where its solution is non-negative and its squared error lower by more than 1e-15."""
        if b.ndim == 1:
            return self(b[None, :])[0]
        best, best_err = np.zeros((b.shape[0], self.a.shape[1])), np.sum(b**2, axis=1)
        for cols, pinv in self.subsets:
            x = b @ pinv.T
            err = np.sum((x @ self.a[:, cols].T - b) ** 2, axis=1)
            better = ~np.any(x < 0, axis=1) & (err < best_err - 1e-15)
            best[better] = 0.0
            best[np.ix_(better, cols)] = x[better]
            best_err = np.where(better, err, best_err)
        return best


MIN_FIT_RUNS = 4  # fewer measured runs than this keep the defaults: too few to fit the model honestly
FIT_CHUNK = 4096  # grid trials solved together by `fit`


def fit(samples: list[tuple[StepFeatures, float]], base: Coefficients, source: str) -> Coefficients:
    """Coefficients fitted to (features, measured step seconds) pairs, minimising the mean relative error of
    `step_time`; overlap is kept from `base`, and so is the 16-bit traffic factor when no sample is 16-bit on a
    borrowed compiler. Fewer than MIN_FIT_RUNS samples keep `base`."""
    if len(samples) < MIN_FIT_RUNS:
        return base
    measured = np.asarray([m for _, m in samples])
    # The linear coefficients' columns do not depend on the others: one `linear_split` each.
    columns = np.asarray([linear_split(f, base)[1] for f, _ in samples]) / measured[:, None]
    nnls = _NNLS(columns)
    low = LOW_PRECISION_GRID if any(f.low_precision for f, _ in samples) else (base.low_precision_traffic,)
    zero = {name: 0.0 for name in LINEAR}
    grid = itertools.product(GRID[GRID <= 1.0], GRID, low, OVERLAP_GRID)
    best: tuple[float, Coefficients] | None = None
    # The grid's trials a chunk at a time (memory bounded whatever the number of runs): each trial's step times
    # with the linear coefficients at 0, through `step_time` itself, then the chunk's linear coefficients solved
    # together; the first trial of least error wins, as trial by trial.
    while chunk := [replace(base, efficiency=float(eff), memory_efficiency=float(meff), low_precision_traffic=float(lp),
                            compute_memory_overlap=float(cmo), **zero)
                    for eff, meff, lp, cmo in itertools.islice(grid, FIT_CHUNK)]:
        rest = np.asarray([[step_time(f, trial).total_s for f, _ in samples] for trial in chunk])
        x = nnls((measured - rest) / measured)
        errors = np.mean(np.abs(rest / measured + x @ columns.T - 1.0), axis=1)
        for trial, error, solved in zip(chunk, errors.tolist(), x):
            if best is None or error < best[0] - 1e-12:
                # A cost no sample exercises (collectives, on one GPU) stays as it was, not 0.
                kept = {name: float(solved[i]) if np.any(columns[:, i]) else getattr(base, name)
                        for i, name in enumerate(LINEAR)}
                best = (error, replace(trial, **kept, source=source))
    assert best is not None
    return best[1]


def fit_activations(samples: list[tuple[str, float, float, float]]) -> dict[str, float]:
    """{compute dtype: the activation ratio} fitted to (dtype, the bytes predicted besides the activations,
    the CPU compiler's activations, the measured peak) per run: the ratio that minimises the mean relative
    error of the predicted peak, i.e. the weighted median of each run's own ratio."""
    by: dict[str, list[tuple[float, float]]] = {}
    for dtype, rest, cpu, measured in samples:
        if cpu > 0 and measured > 0:
            by.setdefault(dtype, []).append(((measured - rest) / cpu, cpu / measured))
    out: dict[str, float] = {}
    for dtype, pairs in by.items():
        pairs.sort()
        half, acc = sum(w for _, w in pairs) / 2, 0.0
        for ratio, weight in pairs:
            acc += weight
            if acc >= half:
                out[dtype] = float(ratio)
                break
    return out


def to_dict(c: Coefficients) -> dict[str, Any]:
    return {"efficiency": c.efficiency, "memory_efficiency": c.memory_efficiency, "kernel_s": c.kernel_s,
            "collective_s": c.collective_s, "fixed_s": c.fixed_s, "overlap": c.overlap,
            "compute_memory_overlap": c.compute_memory_overlap, "low_precision_traffic": c.low_precision_traffic,
            "source": c.source}
