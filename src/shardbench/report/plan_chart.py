"""The plan against the measurement, in a sweep's report: wherever the planner predicted the runs (`shardbench
plan --validate DIR`, or `shardbench tune`, whose tune.json keeps its predictions of the runs it measured), a
chart of predicted against measured step time with Kendall's tau of the two orders, and one sentence saying it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench.report.kendall import describe_tau, kendall_tau
from shardbench.report.content import Chart, number
from shardbench.report.plots import BESIDE, NOTE_WIDTH, _save, _strategy_colors
from shardbench.report.speed import TIE, UNDECIDED, Model, comparable, label, noise, steps_note, verdict

if TYPE_CHECKING:
    from shardbench.report.content import ReportedRun

TUNE_JSON = "tune.json"  # written by `shardbench tune` (`shardbench.tune.report`)


def tune_predictions(sweep_dir: Path) -> dict[str, Any] | None:
    """{run name: the plan's prediction} from a tune folder's tune.json; None where there is none."""
    path = sweep_dir / TUNE_JSON
    if not path.is_file():
        return None
    try:
        runs = json.loads(path.read_text()).get("runs")
    except (OSError, ValueError, AttributeError):
        return None
    return runs if isinstance(runs, dict) else None


def _pairs(runs: list[ReportedRun]) -> list[tuple[ReportedRun, float, float]]:
    """(run, predicted step s, measured median step s) for every run that has both."""
    out = []
    for r in runs:
        predicted = number((r.predicted or {}).get("step_s"))
        if r.ok and predicted and r.step_median:
            out.append((r, predicted, r.step_median))
    return out


Pair = tuple["ReportedRun", float, float]


def groups(runs: list[ReportedRun]) -> dict[Model, list[Pair]]:
    """The predicted runs by the work they do (`speed.comparable`: model, its shape and the global batch): only
    within one group does the plan's order rank layouts; across groups it ranks models and batch sizes."""
    out: dict[Model, list[Pair]] = {}
    for pair in _pairs(runs):
        out.setdefault(comparable(pair[0]), []).append(pair)
    return dict(sorted(out.items(), key=lambda item: [(k, (len(v), v)) for k, v in item[0]]))


def tau(pairs: list[Pair]) -> float | None:
    """Kendall's tau of predicted against measured step times of one group (None under two runs with both)."""
    return kendall_tau([p for _, p, _ in pairs], [m for _, _, m in pairs]) if len(pairs) > 1 else None


def tau_text(pairs: list[Pair]) -> str:
    """Kendall's tau of a group with its n, or why it says nothing there."""
    return describe_tau([p for _, p, _ in pairs], [m for _, _, m in pairs])


def plan_vs_measured(runs: list[ReportedRun], out: Path) -> Chart | str:
    """Each run a point, predicted step (x) against measured (y), on log axes with the line where they agree."""
    pairs = _pairs(runs)
    if not pairs:
        return ""  # no plan for these runs: the chart does not apply
    colors = _strategy_colors([r for r, _, _ in pairs])
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(8.0, 5.5), dpi=100, layout="constrained")
    ax = fig.subplots()
    xs, ys = [1e3 * p for _, p, _ in pairs], [1e3 * m for _, _, m in pairs]
    ax.scatter(xs, ys, c=[colors[r.strategy] for r, _, _ in pairs], s=40, zorder=3)
    low, high = min(xs + ys) / 1.5, max(xs + ys) * 1.5
    middle = (low * high) ** 0.5
    for (r, _, _), x, y in zip(pairs, xs, ys, strict=True):  # names run away from the nearer edge
        right = x > middle
        ax.annotate(r.name, (x, y), xytext=(-4 if right else 4, 3), textcoords="offset points", fontsize=7,
                    color="#333333", ha="right" if right else "left")
    ax.plot([low, high], [low, high], linestyle="--", color="#888888", linewidth=1, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("predicted step time, ms (the plan)")
    ax.set_ylabel("measured median step time, ms")
    ax.grid(alpha=0.3, which="both")
    grouped = groups(runs)
    keys = list(grouped)
    note = ("Kendall's tau of the two orders within each group of the same work (1: the plan ranks them as "
            "measured; 0: no better than chance): " + "; ".join(
                f"{label(k, keys) + ': ' if len(keys) > 1 else ''}{tau_text(v)}" for k, v in grouped.items()))
    ax.set_title(textwrap.fill(note, NOTE_WIDTH), fontsize=8, color="#555555")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in colors.items()], title="strategy", fontsize=8,
              title_fontsize=8, loc="upper left", bbox_to_anchor=BESIDE)
    return _save(fig, out, "plan_vs_measured", "Predicted against measured step time", note)


FILE = "plan_vs_measured.png"


def write_chart(runs: list[ReportedRun], out: Path) -> list[Chart]:
    """The chart where the planner predicted the runs (none otherwise)."""
    made = plan_vs_measured(runs, out)
    return [made] if isinstance(made, Chart) else []


def plan_findings(runs: list[ReportedRun]) -> list[str]:
    """One sentence per group of the same work (`groups`): how well the plan's step times order and size its runs,
    and whether the plan's fastest was the fastest measured."""
    grouped = groups(runs)
    keys = list(grouped)
    return [_group_sentence(pairs, label(key, keys)) for key, pairs in grouped.items()]


def _group_sentence(pairs: list[Pair], name: str) -> str:
    errors = [abs(p - m) / m for _, p, m in pairs]
    where = f" ({name})" if name else ""
    head = f"Predicted against measured step time{where}: {tau_text(pairs)}; mean absolute error " \
           f"{sum(errors) / len(errors):.1%}"
    if len(pairs) < 2:
        return head + "."
    top = min(pairs, key=lambda pair: pair[1])
    best = min(pairs, key=lambda pair: pair[2])
    gap = (top[2] - best[2]) / best[2]
    # Ranked by the Speed section's rule (speed.verdict): a gap it calls a tie or undecided is one here too.
    ranked = verdict(top[0], best[0], gap) if top[0] is not best[0] else None
    if ranked == UNDECIDED:
        return (f"{head}; the plan's fastest, {top[0].name}, against the fastest measured, {best[0].name}, is "
                f"undecided ({1e3 * top[2]:,.1f} against {1e3 * best[2]:,.1f} ms, {gap:+.1%}, "
                f"{steps_note([top[0], best[0]])}).")
    if ranked == TIE:
        return (f"{head}; the plan's fastest, {top[0].name}, ties with the fastest measured, {best[0].name} "
                f"({1e3 * top[2]:,.1f} against {1e3 * best[2]:,.1f} ms, {gap:+.1%}, within the spread of their step "
                f"times, median to p90, up to {noise(top[0], best[0]):.1%}).")
    fastest = (f"the plan's fastest, {top[0].name}, was also the fastest measured ({1e3 * best[2]:,.1f} ms)"
               if top[0] is best[0] else
               f"the plan's fastest, {top[0].name}, measured {1e3 * top[2]:,.1f} ms against the fastest measured, "
               f"{best[0].name}, {1e3 * best[2]:,.1f} ms ({gap:+.1%})")
    return f"{head}; {fastest}."
