"""Would `shardbench tune` choose better if it recalibrated the planner on its own first runs? An offline
simulation over the grid benchmarks/tune_bench.py measured (each layout's "measurement" is its grid run's median
step): tune's rule (measure the plan's top k) against adaptive rules that measure the plan's first layout(s),
fit the step-time model to those runs of this very model, re-rank the layouts not yet measured with it, measure
the next, refit, until k are measured; each picks the fastest it measured. Writes nothing but what it prints
(the section "Recalibrating on tune's own first runs" of benchmarks/tune-cpu.md).

    # once: recompile the grid's runs (compile only, as `plan --calibrate` does) for their step features
    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/tune_adaptive_sim.py --work /tmp/tb/work
    # then, from benchmarks/data/tune-cpu/adaptive-features.json and each model's bench.json
    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/tune_adaptive_sim.py
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from shardbench.plan import calibration as cal
from shardbench.plan.calibration import CPU_DEFAULT, fit
from shardbench.report.kendall import kendall_tau
from shardbench.plan.steptime import Coefficients, StepFeatures, step_time

MODELS = ("vit-tiny", "lm-tiny", "mlp-small")
WITHIN = 0.05
Samples = list[tuple[StepFeatures, float]]


def extract(work: Path, out: Path) -> None:
    """Each grid run's step features, recompiled as `plan --calibrate` recompiles a measured run."""
    from shardbench.plan.measured import measured_runs

    found = {}
    for model in MODELS:
        found[model] = [{"run": m.run.name, "step_s": m.step_s, "compute_s": f.compute_s, "traffic_s": f.traffic_s,
                         "kernels": f.kernels, "collectives": f.collectives, "link_s": f.link_s,
                         "low_precision": f.low_precision}
                        for m in measured_runs(work / model, 1)
                        if m.result is not None and m.hardware is not None and m.step_s and (f := m.features())]
    out.write_text(json.dumps(found, indent=1) + "\n")


def features(row: dict) -> StepFeatures:
    return StepFeatures(row["compute_s"], row["traffic_s"], row["kernels"], row["collectives"], row["link_s"],
                        row["low_precision"])


def fit_as_is(samples: Samples, base: Coefficients) -> Coefficients:
    """`calibration.fit` unchanged: under 4 runs it keeps the defaults."""
    return fit(samples, base, "tune's runs")


def fit_no_floor(samples: Samples, base: Coefficients) -> Coefficients:
    """`calibration.fit`'s own search (efficiencies and compute/traffic overlap on its grids, per-kernel,
    per-collective and per-step costs by non-negative least squares, the mean relative error) without its floor
    of 4 runs: 5 coefficients from 1 to 3 runs, underdetermined (the first exact fit of its grid order wins)."""
    if len(samples) >= 4:
        return fit(samples, base, "tune's runs")
    measured = np.asarray([m for _, m in samples])
    columns = np.asarray([cal.linear_split(f, base)[1] for f, _ in samples]) / measured[:, None]
    nnls = cal._NNLS(columns)
    zero = {name: 0.0 for name in cal.LINEAR}
    best: tuple[float, Coefficients] | None = None
    for eff, meff, cmo in itertools.product(cal.GRID[cal.GRID <= 1.0], cal.GRID, cal.OVERLAP_GRID):
        trial = replace(base, efficiency=float(eff), memory_efficiency=float(meff), compute_memory_overlap=float(cmo),
                        **zero)
        rest = np.asarray([step_time(f, trial).total_s for f, _ in samples])
        x = nnls((measured - rest) / measured)
        error = float(np.mean(np.abs(rest / measured + columns @ x - 1.0)))
        if best is None or error < best[0] - 1e-12:
            kept = {n: float(x[i]) if np.any(columns[:, i]) else getattr(base, n) for i, n in enumerate(cal.LINEAR)}
            best = (error, replace(trial, **kept))
    assert best is not None
    return best[1]


def fit_two(samples: Samples, base: Coefficients) -> Coefficients:
    """Only what two runs can determine: the memory efficiency (on calibration's grid) and the per-step cost
    (>= 0, least squares of the relative error), the rest kept. The plan prices every vit-tiny and lm-tiny
    layout memory-bound (mlp-small: 3 of 9; the others compute-bound), where step = traffic / memory
    efficiency + per-step cost + communication: the two set the level, which the defaults miss by 3-5x on
    lm-tiny, and the memory efficiency the weight of traffic against communication and matmuls (what can
    reorder). Under 2 runs, the defaults (one run fixes only a scale, which reorders nothing)."""
    if len(samples) < 2:
        return base
    measured = np.asarray([m for _, m in samples])
    w = 1.0 / measured
    best: tuple[float, Coefficients] | None = None
    for meff in cal.GRID:
        trial = replace(base, memory_efficiency=float(meff), fixed_s=0.0)
        rest = np.asarray([step_time(f, trial).total_s for f, _ in samples])
        fixed = max(0.0, float(np.sum(w * (1.0 - rest * w)) / np.sum(w * w)))
        error = float(np.mean(np.abs((rest + fixed) * w - 1.0)))
        if best is None or error < best[0] - 1e-12:
            best = (error, replace(trial, fixed_s=fixed))
    assert best is not None
    return best[1]


def adaptive(order: list[str], feats: dict[str, StepFeatures], step: dict[str, float], k: int, first: int,
             fitter: Callable[[Samples, Coefficients], Coefficients]) -> list[str]:
    """The layouts the adaptive rule measures, in order: the plan's `first`, then one at a time the best of the
    rest by the model refitted to everything measured so far (ties: the plan's order)."""
    measured = list(order[:first])
    while len(measured) < min(k, len(order)):
        c = fitter([(feats[n], step[n]) for n in measured], CPU_DEFAULT)
        rest = sorted((n for n in order if n not in measured), key=lambda n: step_time(feats[n], c).total_s)
        measured.append(rest[0])
    return measured


RULES: dict[str, tuple[Callable[[Samples, Coefficients], Coefficients] | None, Callable[[int], int]]] = {
    "top-k (tune today)": (None, lambda k: k),
    "adaptive, `fit` as it is, from the top 1": (fit_as_is, lambda k: 1),
    "adaptive, `fit` without its 4-run floor, from the top 1": (fit_no_floor, lambda k: 1),
    "adaptive, `fit` without its 4-run floor, from the top ceil(k/2)": (fit_no_floor, lambda k: math.ceil(k / 2)),
    "adaptive, memory efficiency + per-step cost only, from the top max(2, ceil(k/2))":
        (fit_two, lambda k: max(2, math.ceil(k / 2))),
}


def short(name: str) -> str:
    """A layout's name without what every layout of the grid shares."""
    return name.split(" remat=")[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("benchmarks/data/tune-cpu"))
    parser.add_argument("--work", type=Path, default=None, help="recompile the grid's runs below WORK/<model> first")
    args = parser.parse_args(argv)
    store = args.data / "adaptive-features.json"
    if args.work is not None:
        extract(args.work, store)
    rows = json.loads(store.read_text())
    print("| model | k | rule | measured, in order | pick | regret | hit |")
    print("|---|---:|---|---|---|---:|---|")
    ceiling = []
    for model in MODELS:
        bench = json.loads((args.data / model / "bench.json").read_text())
        feats = {r["run"]: features(r) for r in rows[model]}
        step = {r["run"]: r["step_s"] for r in rows[model]}
        order = [row["run"] for row in bench["layouts"] if row["run"] in step]  # the plan's order
        layout = {row["run"]: short(row["name"]) for row in bench["layouts"]}
        best = min(step.values())
        everything = fit([(feats[n], step[n]) for n in order], CPU_DEFAULT, "the whole grid")
        two = fit_two([(feats[n], step[n]) for n in order], CPU_DEFAULT)
        by_all = sorted(order, key=lambda n: step_time(feats[n], everything).total_s)
        for k in (bench["k"], bench["k"] + 1):
            for name, (fitter, first) in RULES.items():
                seq = order[:k] if fitter is None else adaptive(order, feats, step, k, first(k), fitter)
                pick = min(seq, key=lambda n: step[n])
                r = step[pick] / best - 1
                print(f"| {model} | {k} | {name} | {', '.join(layout[n] for n in seq)} | {layout[pick]} | {r:+.1%} | "
                      f"{'yes' if r <= WITHIN else ''} |")
            pick = min(by_all[:k], key=lambda n: step[n])
            r = step[pick] / best - 1
            print(f"| {model} | {k} | ceiling: top-k of `fit` to the whole grid (in-sample) | "
                  f"{', '.join(layout[n] for n in by_all[:k])} | {layout[pick]} | {r:+.1%} | "
                  f"{'yes' if r <= WITHIN else ''} |")
        taus = [kendall_tau([step_time(feats[n], c).total_s for n in order], [step[n] for n in order])
                for c in (CPU_DEFAULT, everything, two)]
        ceiling.append(f"{model}: tau {taus[0]:.2f} (defaults), {taus[1]:.2f} (`fit` to the whole grid), "
                       f"{taus[2]:.2f} (memory efficiency + per-step cost fitted to the whole grid)")
    print()
    print("Kendall's tau of the model against the grid's measurements: " + "; ".join(ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
