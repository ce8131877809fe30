"""The step-time model's coefficients, per platform and compute class, and fitting them to measured runs.

    step = compute / efficiency + kernels x kernel_s + (1 - overlap) x (collectives x collective_s + link seconds)

`compute` is the step's matmul FLOPs per device at the peak, `kernels` the kernels the compiled step launches,
`collectives` how many it runs and link seconds its bytes at each link's bandwidth (`shardbench.plan.predict`).
`--calibrate DIR` fits efficiency, kernel_s and collective_s (non-negative least squares on relative error)
to every run below DIR, recompiled as it ran; overlap stays as given. The defaults below say what each was
fitted to or assumed from; the README shows how well they predict runs they were not fitted to.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Coefficients:
    efficiency: float  # fraction of the peak the matmul work reaches
    kernel_s: float  # seconds per kernel (per device program)
    collective_s: float  # seconds per collective, besides its bytes
    overlap: float  # fraction of communication hidden behind compute
    source: str


# Fitted with `shardbench plan --calibrate` on the CPU sweep in benchmarks/plan-calibration-cpu.md (vit-tiny,
# mlp-small and lm-tiny under every strategy on 8 simulated devices, 2-core Intel Xeon); XLA's CPU collectives
# run synchronously, hence no overlap.
CPU_DEFAULT = Coefficients(efficiency=0.55, kernel_s=4.0e-6, collective_s=60e-6, overlap=0.0,
                           source="default for CPUs, fitted to benchmarks/plan-calibration-cpu.md")
# Issue 16's measurement of vit-seed at bfloat16, batch 512 on one H100 SXM: 32,000 images/s of 4.26 GFLOP
# each = 13.8% of the 989 TFLOP/s data-sheet peak. Kernels are folded into that efficiency; NCCL's
# small-message latency is tens of microseconds; overlap is assumed to be none (an upper bound on the step).
GPU_DEFAULT = Coefficients(efficiency=0.138, kernel_s=0.0, collective_s=20e-6, overlap=0.0,
                           source="default for GPUs, from one vit-seed bf16 b512 run on an H100 (issue 16); "
                                  "no GPU calibration runs yet")
# No TPU run has been measured with shardbench: the GPU's efficiency is borrowed, and said to be.
TPU_DEFAULT = replace(GPU_DEFAULT, collective_s=10e-6,
                      source="assumed equal to the GPU default (no TPU run measured yet)")
DEFAULTS = {"cpu": CPU_DEFAULT, "gpu": GPU_DEFAULT, "tpu": TPU_DEFAULT}

# Temporaries (activations) of another compiler, relative to XLA's CPU compiler, on the same step. GPU: the
# vit-seed float32 b128 step compiled to 1,564 MB of temporaries for an H100 and 2,420 MB on the CPU
# (issue 15's measurement). TPU targets compile with the TPU compiler itself, so need no ratio.
ACTIVATION_SCALE = {"gpu": (1564 / 2420, "the CPU compiler's temporaries x 0.646, the H100/CPU ratio measured on "
                                         "vit-seed f32 b128 (issue 15): not the GPU compiler's own")}


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
    """Coefficients fitted to (features, measured step seconds) pairs, minimising relative error; overlap
    is kept from `base`. Fewer than 3 samples keep `base` (nothing to fit honestly)."""
    if len(samples) < 3:
        return base
    keep = 1.0 - base.overlap
    rows, targets = [], []
    for f, measured in samples:
        links = f["link_intra"] + f["link_inter"]
        rows.append([f["compute"], f["kernels"], keep * f["collectives"]])
        targets.append(measured - keep * links)
    a = np.asarray(rows) / np.asarray([m for _, m in samples])[:, None]
    b = np.asarray(targets) / np.asarray([m for _, m in samples])
    x = _nnls(a, b)
    efficiency = 1.0 / x[0] if x[0] > 0 else base.efficiency
    return Coefficients(efficiency=float(efficiency), kernel_s=float(x[1]), collective_s=float(x[2]),
                        overlap=base.overlap, source=source)


def to_dict(c: Coefficients) -> dict[str, Any]:
    return {"efficiency": c.efficiency, "kernel_s": c.kernel_s, "collective_s": c.collective_s,
            "overlap": c.overlap, "source": c.source}
