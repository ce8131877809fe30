"""The step-time model's coefficients, per platform, and fitting them to measured runs.

    step = max(compute / efficiency, traffic / memory_efficiency)      the slower of matmuls and memory
           + kernels x kernel_s + fixed_s                              launching kernels, a step's own cost
           + (1 - overlap) x (collectives x collective_s + link seconds)

`compute` is the step's matmul FLOPs per device at the peak, `traffic` XLA's count of the bytes the compiled
step reads and writes at the memory bandwidth, `kernels` the kernels it launches, `collectives` how many it
runs, and link seconds its bytes at each link's bandwidth (`shardbench.plan.predict`). `--calibrate DIR`
fits everything but overlap to the runs below DIR, recompiled as they ran: the two efficiencies on a grid,
the rest by non-negative least squares, minimising relative error. The defaults below say what each was
fitted to or assumed from; the README shows how well they predict runs they were not fitted to.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Coefficients:
    efficiency: float  # fraction of the peak FLOP/s the matmul work reaches
    memory_efficiency: float  # fraction of the memory bandwidth the step's traffic reaches
    kernel_s: float  # seconds per kernel (per device program)
    collective_s: float  # seconds per collective, besides its bytes
    fixed_s: float  # seconds per step whatever it holds (dispatch, the host's share)
    overlap: float  # fraction of communication hidden behind compute
    source: str

    def describe(self) -> str:
        return (f"matmuls at {self.efficiency:.1%} of the peak, memory traffic at {self.memory_efficiency:.1%} of "
                f"the bandwidth, {self.kernel_s * 1e6:.2f} us per kernel, {self.fixed_s * 1e3:.2f} ms per step, "
                f"{self.collective_s * 1e6:.2f} us per collective, {self.overlap:.0%} overlap ({self.source})")

    def step(self, f: dict[str, float]) -> float:
        """Seconds per step for the features `f` (see `shardbench.plan.predict.step_features`)."""
        return (max(f["compute"] / self.efficiency, f["traffic"] / self.memory_efficiency)
                + f["kernels"] * self.kernel_s + self.fixed_s
                + (1.0 - self.overlap) * (f["collectives"] * self.collective_s + f["link_intra"] + f["link_inter"]))


# Fitted with `shardbench plan --calibrate` to the CPU sweep benchmarks/plan-calibration-cpu.toml (vit-tiny with
# 8 heads under every strategy at batch 32 and 512 on 8 simulated devices: 11 runs, tp at 512 ran out of host
# memory) on a 2-core Intel Xeon, 2026-11-22 (benchmarks/plan-cpu.md); XLA's CPU collectives run synchronously,
# hence no overlap.
CPU_DEFAULT = Coefficients(efficiency=0.263, memory_efficiency=0.531, kernel_s=0.0, collective_s=23.22e-6,
                           fixed_s=0.09849, overlap=0.0,
                           source="CPU default, fitted to the sweep benchmarks/plan-calibration-cpu.toml")
# Issue 16's measurement of vit-seed at bfloat16, batch 512 on one H100 SXM: 32,000 images/s of 4.26 GFLOP
# each = 13.8% of the 989 TFLOP/s data-sheet peak, taken as the matmul efficiency (kernels folded in). HBM at
# 70% of its bandwidth, NCCL's small-message latency of tens of microseconds and no overlap (an upper bound
# on the step) are assumptions, not measurements.
GPU_DEFAULT = Coefficients(efficiency=0.138, memory_efficiency=0.7, kernel_s=0.0, collective_s=20e-6, fixed_s=0.0,
                           overlap=0.0, source="GPU default, from one vit-seed bf16 b512 run on an H100 (issue 16) "
                                               "and assumptions; no GPU calibration runs yet")
# No TPU run has been measured with shardbench: the GPU's efficiencies are borrowed, and said to be.
TPU_DEFAULT = replace(GPU_DEFAULT, collective_s=10e-6,
                      source="TPU default, assumed equal to the GPU default (no TPU run measured yet)")
DEFAULTS = {"cpu": CPU_DEFAULT, "gpu": GPU_DEFAULT, "tpu": TPU_DEFAULT}

# Temporaries (activations) of another compiler, relative to XLA's CPU compiler, on the same step. GPU: the
# vit-seed float32 b128 step compiled to 1,564 MB of temporaries for an H100 and 2,420 MB on the CPU
# (issue 15's measurement). TPU targets compile with the TPU compiler itself, so need no ratio.
ACTIVATION_SCALE = {"gpu": (1564 / 2420, "the CPU compiler's temporaries x 0.646, the H100/CPU ratio measured on "
                                         "vit-seed f32 b128 (issue 15): not the GPU compiler's own")}
GRID = np.geomspace(0.02, 2.0, 60)  # efficiencies tried


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of unknowns: the best of least squares on every subset of
    the columns whose solution is non-negative."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b**2))
    for size in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), size):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x < 0):
                continue
            err = float(np.sum((a[:, cols] @ x - b) ** 2))
            if err < best_err - 1e-15:
                full = np.zeros(a.shape[1])
                full[list(cols)] = x
                best, best_err = full, err
    return best


def fit(samples: list[tuple[dict[str, float], float]], base: Coefficients, source: str) -> Coefficients:
    """Coefficients fitted to (features, measured step seconds) pairs, minimising the mean relative error;
    overlap is kept from `base`. Fewer than 4 samples keep `base` (too few to fit five numbers honestly)."""
    if len(samples) < 4:
        return base
    keep = 1.0 - base.overlap
    measured = np.asarray([m for _, m in samples])
    links = np.asarray([keep * (f["link_intra"] + f["link_inter"]) for f, _ in samples])
    compute = np.asarray([f["compute"] for f, _ in samples])
    traffic = np.asarray([f["traffic"] for f, _ in samples])
    rest = np.asarray([[f["kernels"], keep * f["collectives"], 1.0] for f, _ in samples]) / measured[:, None]
    best: tuple[float, float, float, np.ndarray] | None = None
    for eff, meff in itertools.product(GRID, GRID):
        bound = np.maximum(compute / eff, traffic / meff) + links
        x = _nnls(rest, (measured - bound) / measured)
        error = float(np.mean(np.abs(bound / measured + rest @ x - 1.0)))
        if best is None or error < best[0]:
            best = (error, float(eff), float(meff), x)
    assert best is not None
    _, eff, meff, x = best
    return Coefficients(efficiency=eff, memory_efficiency=meff, kernel_s=float(x[0]), collective_s=float(x[1]),
                        fixed_s=float(x[2]), overlap=base.overlap, source=source)


def to_dict(c: Coefficients) -> dict[str, Any]:
    return {"efficiency": c.efficiency, "memory_efficiency": c.memory_efficiency, "kernel_s": c.kernel_s,
            "collective_s": c.collective_s, "fixed_s": c.fixed_s, "overlap": c.overlap, "source": c.source}


def activation_scale(compiled_for: str, target_platform: str) -> tuple[float, str]:
    """(factor on the compiled temporaries, its source): 1 where the target's own compiler compiled the step,
    else the calibration's ratio of the target's compiler to the one that did."""
    if compiled_for == target_platform:
        return 1.0, f"the {target_platform.upper()} compiler's own temporaries"
    return ACTIVATION_SCALE[target_platform]
