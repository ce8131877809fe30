"""How good `shardbench tune`'s search is: for each model, plan the whole grid, measure every layout that fits
once, and set tune's choice against it: the plan's top 30% measured (k = 30% of the grid, rounded down, at least
1), the best of them (tune's pick) against the best of the whole grid, the plan's top-1 hit rate and regret, and
the fixed rules "always fsdp" and "always dp" beside them. Writes benchmarks/tune-cpu.md and the raw output
under benchmarks/data/tune-cpu/.

    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/tune_bench.py            # the three models, ~15 min
    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/tune_bench.py --models mlp-small --candidates dp,fsdp,tp \\
        --md /tmp/tune-check.md --data /tmp/tune-check --work /tmp/tune-check-work    # a check, a minute

Tune's pick is computed from the same measurements as the grid's best (each layout is measured once), so the
comparison is of the search, not of two measurements of the host; tune itself measures its k in a sweep of its
own, the same runner with the same settings.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from shardbench.parsing import override
from shardbench.plan.target import parse_target
from shardbench.report.kendall import kendall_tau
from shardbench.presets import get_preset
from shardbench.report.write import write_report
from shardbench.tune.select import OBJECTIVES, Planned, rank, regret
from shardbench.tune.space import Space, enumerate_space
from shardbench.tune.tune_cmd import make_tune_sweep, measured_runs, plan_space, run_measurements

MODELS = ("vit-tiny", "lm-tiny", "mlp-small")
# The grid: the data-, tensor- and ZeRO-parallel strategies, the pipelines (one microbatch per stage, GPipe) and
# context parallelism, each on every mesh of 8 devices; no remat, float32, one microbatch per update, the
# preset's batch. Each model takes those its shape allows; the planner refuses the others, saying why.
CANDIDATES = "dp,fsdp,tp,dp+tp,fsdp+tp,zero1,zero2,pp,dp+pp,cp,dp+cp"
DEVICES = 8
STEPS = 10  # steps per measured run: the median of the steps after the first is the measurement
SHARE = 0.30  # tune measures at most this share of the grid
WITHIN = 0.05  # a pick within 5% of the best measured step is a hit
RULES = {"always fsdp": ("fsdp", "8x1"), "always dp": ("dp", "8x1")}


def bench_model(model: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Plan the grid, measure every layout that fits, and score tune's choice and the fixed rules."""
    cfg = override(get_preset(model), {"parallel.devices": DEVICES})
    target = parse_target("cpu", cpu_devices=DEVICES)
    space = Space(strategies=tuple(args.candidates.split(",")), remats=("none",), dtypes=(cfg.precision.dtype,),
                  accums=(1,), batches=(cfg.train.batch_size,), per_stage=(1,), schedules=("gpipe",))
    points, dropped = enumerate_space(DEVICES, space)
    out = work / model
    out.mkdir(parents=True)
    started = time.perf_counter()
    planned, _ = plan_space(cfg, target, points, 0, [], out)
    plan_s = time.perf_counter() - started
    grid = rank(planned, OBJECTIVES["time"])  # every layout that fits, the plan's order
    sweep, runs = make_tune_sweep(cfg, grid, DEVICES, args.steps)
    started = time.perf_counter()
    run_measurements(argparse.Namespace(executor=None, timeout=1800.0), sweep, out)
    measure_s = time.perf_counter() - started
    (out / "tune.json").write_text(json.dumps({"runs": {run: next(p.prediction.to_dict() for p in grid
                                                                  if p.point.name == name and p.prediction)
                                                        for run, name in runs.items()}}))
    write_report(out)  # with the plan's chart over the whole grid (tune.json's predictions of the runs)
    measured = measured_runs(out, runs)
    step = {name: m.step_s for name, m in measured.items() if m.step_s}
    timed = [p for p in grid if p.point.name in step]
    k = max(1, math.floor(SHARE * len(grid)))
    chosen = [p for p in grid[:k] if p.point.name in step]
    best = min(timed, key=lambda p: step[p.point.name])
    pick = min(chosen, key=lambda p: step[p.point.name]) if chosen else None
    measured_rank = {p.point.name: i for i, p in enumerate(sorted(timed, key=lambda p: step[p.point.name]), 1)}

    def regret_of(p: Planned | None) -> float | None:
        return None if p is None or p.point.name not in step else regret(step[p.point.name], step[best.point.name])

    def rule(strategy: str, mesh: str) -> Planned | None:
        return next((p for p in timed if (p.point.candidate.strategy, p.point.candidate.mesh) == (strategy, mesh)),
                    None)

    return {
        "model": model, "devices": DEVICES, "steps": args.steps, "batch": cfg.train.batch_size,
        "candidates": args.candidates, "plan_s": plan_s, "measure_s": measure_s,
        "grid": len(grid), "measured": len(timed), "k": k,
        "dropped": [{"name": p.point.name, "why": p.dropped} for p in planned if not p.fits]
                   + [{"name": d.what, "why": d.reason} for d in dropped],
        "layouts": [{"name": p.point.name, "run": {v: n for n, v in runs.items()}[p.point.name],
                     "plan_rank": i, "measured_rank": measured_rank.get(p.point.name),
                     "predicted_step_s": p.prediction.step_s if p.prediction else None,
                     "measured_step_s": step.get(p.point.name), "tune_measured": i <= k}
                    for i, p in enumerate(grid, 1)],
        "best": best.point.name, "best_step_s": step[best.point.name],
        "pick": None if pick is None else pick.point.name, "pick_regret": regret_of(pick),
        "top1": grid[0].point.name, "top1_hit": grid[0] is best, "top1_regret": regret_of(grid[0]),
        "rules": {name: {"layout": None if (p := rule(*layout)) is None else p.point.name, "regret": regret_of(p)}
                  for name, layout in RULES.items()},
        "tau": kendall_tau([p.predicted.step_s for p in timed],
                           [step[p.point.name] for p in timed]) if len(timed) > 1 else None,
    }


def keep_raw(result: dict[str, Any], work: Path, data: Path) -> None:
    """The raw output kept in the repository: the result, the plan, the sweep's report and each run's record."""
    src, dst = work / result["model"], data / result["model"]
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    (dst / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    shutil.copy(src / "plan" / "plan.md", dst / "plan.md")
    if (src / "report" / "report.md").exists():
        shutil.copytree(src / "report", dst / "report", ignore=shutil.ignore_patterns("*.html"))
    for summary in sorted((src / "runs").glob("*/summary.json")):
        (dst / "runs" / summary.parent.name).mkdir(parents=True)
        shutil.copy(summary, dst / "runs" / summary.parent.name / "summary.json")


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1%}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:,.1f}"


def markdown(results: list[dict[str, Any]], command: str, wall_s: float, data: Path) -> str:
    hits = sum(1 for r in results if r["pick_regret"] is not None and r["pick_regret"] <= WITHIN)
    top1 = sum(r["top1_hit"] for r in results)
    lines = [f"# `shardbench tune`'s search on {DEVICES} simulated CPU devices", "",
             f"- Command: `{command}` ({wall_s / 60:.1f} min wall, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             f"- Grid: strategies {results[0]['candidates']} on every mesh of {DEVICES} devices (those each model "
             f"takes), no remat, float32, the preset's batch; pipelines with one microbatch per stage, GPipe. Every "
             f"layout that fits was measured once, {results[0]['steps']} steps each (median step), no evaluation.",
             f"- Tune measures the plan's top k = {SHARE:.0%} of the grid (rounded down) and picks the fastest of "
             f"them; a pick within {WITHIN:.0%} of the best measured is a hit. Regret = (measured step of the choice "
             f"- best measured) / best measured, all from the same measurements.", "",
             f"**Tune's pick within {WITHIN:.0%}: {hits} of {len(results)} models; the plan's top-1 was the best "
             f"measured: {top1} of {len(results)}.**", "",
             "| model | grid (fits) | tune measured | best measured | tune's pick | its regret | plan top-1 | "
             "top-1 regret | always fsdp | always dp | Kendall's tau |",
             "|---|---:|---:|---|---|---:|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['grid']} | {r['k']} ({r['k'] / r['grid']:.0%}) | {r['best']} "
            f"({_ms(r['best_step_s'])} ms) | {r['pick']} | {_pct(r['pick_regret'])} | {r['top1']} | "
            f"{_pct(r['top1_regret'])} | {_pct(r['rules']['always fsdp']['regret'])} | "
            f"{_pct(r['rules']['always dp']['regret'])} | "
            f"{'–' if r['tau'] is None else format(r['tau'], '.2f')} |")
    for r in results:
        lines += ["", f"## {r['model']} (batch {r['batch']}; planned in {r['plan_s']:.0f} s, measured in "
                      f"{r['measure_s']:.0f} s)", "",
                  "| plan rank | layout | predicted step ms | measured step ms | measured rank | measured by tune |",
                  "|---:|---|---:|---:|---:|---|"]
        lines += [f"| {row['plan_rank']} | {row['name']} | {_ms(row['predicted_step_s'])} | "
                  f"{_ms(row['measured_step_s'])} | {row['measured_rank'] or '–'} | "
                  f"{'yes' if row['tune_measured'] else ''} |" for row in r["layouts"]]
        if r["pick_regret"] is not None and r["pick_regret"] > WITHIN:
            best = next(row for row in r["layouts"] if row["name"] == r["best"])
            lines += ["", f"Missed by {r['pick_regret'] - WITHIN:.1%} beyond the {WITHIN:.0%}: the best measured, "
                          f"{r['best']}, was the plan's number {best['plan_rank']} of {r['grid']} (predicted "
                          f"{_ms(best['predicted_step_s'])} ms), outside its top {r['k']}."]
        if r["dropped"]:
            lines += ["", "Not in the grid: " + "; ".join(f"{d['name']}: {d['why']}" for d in r["dropped"])]
        lines += ["", f"Raw output: `{data / r['model']}/` (bench.json, plan.md, the sweep's report with the chart "
                      f"of predicted against measured over the grid, and each run's summary.json); everything the "
                      f"benchmark printed: `{data / 'output.txt'}`."]
    return "\n".join(lines) + "\n"


class Tee:
    """A stream that also writes to a file: the raw output of the whole benchmark, kept beside its data."""

    def __init__(self, stream: Any, file: Any) -> None:
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        self.file.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stream.flush()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--candidates", default=CANDIDATES)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--work", type=Path, default=Path("runs") / f"tune-bench-{time.strftime('%Y%m%d-%H%M%S')}",
                        help="where the sweeps run (every run's folder)")
    parser.add_argument("--data", type=Path, default=Path("benchmarks/data/tune-cpu"), help="raw output kept")
    parser.add_argument("--md", type=Path, default=Path("benchmarks/tune-cpu.md"))
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    log = open(args.data / "output.txt", "w")  # noqa: SIM115 - open for the whole run
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Tee(sys.stdout, log), Tee(sys.stderr, log)
    started = time.perf_counter()
    results = []
    for model in args.models.split(","):
        result = bench_model(model, args, args.work)
        keep_raw(result, args.work, args.data)
        results.append(result)
    command = "python benchmarks/tune_bench.py" + (f" {' '.join(argv)}" if argv else "")
    args.md.write_text(markdown(results, command, time.perf_counter() - started, args.data))
    print(f"tune bench: {args.md}, {args.data}")
    sys.stdout, sys.stderr = streams
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
