"""The report's PNG charts: one horizontal bar per run in store order (names stay readable), failed runs shown
as a labelled gap. Figures are drawn with matplotlib's Agg renderer and never touch pyplot's global state.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import blended_transform_factory

from shardbench.sweep.content import Chart

if TYPE_CHECKING:
    from shardbench.sweep.content import Run

PALETTE = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979", "#d5bb67",
           "#82c6e2")
BREAKDOWN = (("params", "parameters"), ("optimizer", "optimizer state"), ("gradients", "gradients"),
             ("activations_temporaries", "activations / temporaries"), ("other", "batch and other outputs"))
NOTE_WIDTH = 110  # characters per line of a chart's note, so that it fits the figure
BESIDE = (1.01, 1.0)  # legends go beside the axes, where they can never hide a bar
MEMORY_LABELS = {
    "peak": "runtime peak memory per device, MiB",
    "compiled": "compiled total per device (XLA: arguments + outputs − aliased + temporaries), MiB",
}


def clipped_texts(fig: Figure) -> tuple[str, ...]:
    """Every visible text of `fig` (titles, labels, notes, legends) that does not lie wholly inside it."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    frame = fig.bbox
    cut = []
    for text in fig.findobj(match=lambda a: isinstance(a, Text)):
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1:
            cut.append(text.get_text())
    return tuple(cut)


def _figure(rows: int, columns: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(6.0 + 4.0 * columns, 1.6 + 0.34 * max(rows, 2)), dpi=100, layout="constrained")
    return fig, list(fig.subplots(1, columns, sharey=True, squeeze=False)[0])


def _strategy_colors(runs: list[Run]) -> dict[str, str]:
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(dict.fromkeys(r.strategy for r in runs))}


def _gap_label(ax: Axes, y: float, text: str) -> None:
    ax.text(0, y, f"  {text}", va="center", fontsize=8, color="#666666", style="italic")


def _run_bars(ax: Axes, runs: list[Run], values: list[float | None], fmt: str, colors: list[str],
              missing: Callable[[Run], str] | None = None) -> None:
    """One bar per run; a run without the value keeps its row with the reason written in it (for a complete
    run, `missing` says why, from its record)."""
    bars = ax.barh(range(len(runs)), [v or 0.0 for v in values], color=colors, height=0.7)
    ax.bar_label(bars, labels=["" if v is None else fmt.format(v) for v in values], padding=3, fontsize=8)
    for y, (run, value) in enumerate(zip(runs, values, strict=True)):
        if value is None:
            _gap_label(ax, y, run.label if not run.ok else missing(run) if missing else "not measured")
    _finish_axes(ax, [r.name for r in runs], range(len(runs)), max((v or 0.0 for v in values), default=0.0))


def _finish_axes(ax: Axes, names: list[str], positions: range | list[float], top: float) -> None:
    ax.set_yticks(list(positions), names, fontsize=8)
    ax.set_ylim(max(positions, default=0) + 0.6, min(positions, default=0) - 0.6)  # first run on top
    ax.set_xlim(0, top * 1.15 if top > 0 else 1.0)  # room for the value written after the longest bar
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _strategy_legend(ax: Axes, colors: dict[str, str]) -> None:
    ax.legend(handles=[Patch(color=c, label=s) for s, c in colors.items()], title="strategy", fontsize=8,
              title_fontsize=8, loc="upper left", bbox_to_anchor=BESIDE)


def _save(fig: Figure, out: Path, name: str, title: str, note: str = "") -> Chart:
    fig.suptitle(title, fontsize=12)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=100)
    return Chart(name, title, path, note, clipped_texts(fig))


def _simple(runs: list[Run], out: Path, name: str, title: str, xlabel: str, fmt: str,
            value: Callable[[Run], float | None], colors: dict[str, str] | None = None, note: str = "",
            missing: Callable[[Run], str] | None = None) -> Chart:
    colors = colors or _strategy_colors(runs)
    fig, (ax,) = _figure(len(runs))
    _run_bars(ax, runs, [value(r) for r in runs], fmt, [colors[r.strategy] for r in runs], missing)
    ax.set_xlabel(xlabel)
    if note:
        ax.set_title(textwrap.fill(note, NOTE_WIDTH), fontsize=8, color="#555555")
    _strategy_legend(ax, {s: c for s, c in colors.items() if any(r.strategy == s for r in runs)})
    return _save(fig, out, name, title, note)


def epoch_time(runs: list[Run], out: Path) -> Chart:
    return _simple(runs, out, "epoch_time", "Epoch time per run",
                   "mean wall time per whole epoch, s (data loading included, evaluation excluded)", "{:.2f} s",
                   lambda r: r.epoch_s, missing=lambda r: r.why_no_epoch)


def peak_memory(runs: list[Run], out: Path) -> Chart:
    colors = _strategy_colors(runs)
    fig, (ax,) = _figure(len(runs))
    _run_bars(ax, runs, [r.memory[0] for r in runs], "{:.1f}", [colors[r.strategy] for r in runs])
    sources = {r.memory[1] for r in runs if r.memory[0] is not None}
    if len(sources) <= 1:
        note = "" if sources else "No run reports its memory."
        ax.set_xlabel(MEMORY_LABELS[sources.pop() if sources else "compiled"])
    else:  # mixed backends: hatch the compiled totals so the two kinds of figure are not confused
        for patch, run in zip(ax.patches, runs, strict=True):
            if run.memory[1] == "compiled":
                patch.set_hatch("//")
        ax.set_xlabel("memory per device, MiB: runtime peak; hatched bars: compiled total (no peak reported)")
        note = "Hatched bars are XLA's compiled totals, for runs whose backend reports no runtime peak."
    _strategy_legend(ax, colors)
    return _save(fig, out, "peak_memory", "Peak memory per device per run", note)


def throughput(runs: list[Run], out: Path) -> Chart:
    """Examples per second, counted in the runs' own unit (images, tokens) when they share one."""
    colors = [_strategy_colors(runs)[r.strategy] for r in runs]
    fig, (total, per_device) = _figure(len(runs), columns=2)
    units = {r.unit for r in runs if r.ok}
    unit = units.pop() if len(units) == 1 else "examples"
    key = "units_per_s" if unit != "examples" else "examples_per_s"
    _run_bars(total, runs, [r.rate(key) for r in runs], "{:,.0f}", colors)
    _run_bars(per_device, runs, [r.rate(f"{key}_per_device") for r in runs], "{:,.0f}", colors)
    total.set_xlabel(f"{unit} per second (training)")
    per_device.set_xlabel(f"{unit} per second per device")
    _strategy_legend(per_device, _strategy_colors(runs))
    return _save(fig, out, "throughput", "Training throughput per run")


def _placeholder(out: Path, name: str, title: str, message: str) -> Chart:
    fig = Figure(figsize=(9.0, 2.4), dpi=100, layout="constrained")
    ax = fig.subplots()
    ax.text(0.5, 0.5, textwrap.fill(message, 90), ha="center", va="center", fontsize=11)
    ax.set_axis_off()
    return _save(fig, out, name, title, message)


def mfu(runs: list[Run], out: Path) -> Chart:
    title = "Model FLOPs utilisation per run"
    measured = [r for r in runs if r.mfu_value is not None]
    if not measured:
        reasons = sorted({r.why_not("mfu") for r in runs if r.ok})
        why = "; ".join(reasons) if reasons else "no run completed"
        return _placeholder(out, "mfu", title, f"No run reports an MFU: {why}.")
    sources = sorted({str(r.mfu.peak_source) for r in measured})
    omitted = [r.name for r in runs if r.mfu_value is None]
    note = f"Peak FLOP/s from: {'; '.join(sources)}." + (
        f" Omitted, no MFU: {', '.join(omitted)}." if omitted else "")
    # Colours come from every run so that a strategy keeps its colour across the charts.
    return _simple(measured, out, "mfu", title, "MFU, % of the device's peak FLOP/s", "{:.1f}%",
                   lambda r: 100.0 * (r.mfu_value or 0.0), _strategy_colors(runs), note)


def _stacked(ax: Axes, runs: list[Run], positions: list[float], parts: list[tuple[str, list[float]]],
             colors: list[str], empty: Callable[[Run], str]) -> None:
    """Stacked horizontal bars with the total at the end; a run with nothing stacked gets `empty(run)`."""
    left = [0.0] * len(runs)
    for i, (label, values) in enumerate(parts):
        ax.barh(positions, values, left=left, color=colors[i % len(colors)], label=label, height=0.7)
        left = [a + b for a, b in zip(left, values, strict=True)]
    for y, run, total in zip(positions, runs, left, strict=True):
        if total > 0:
            ax.text(total, y, f" {total:,.1f}", va="center", fontsize=8)
        else:
            _gap_label(ax, y, empty(run))
    _finish_axes(ax, [r.name for r in runs], positions, max(left, default=0.0))
    if parts:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=BESIDE)


def comms(runs: list[Run], out: Path) -> Chart:
    kinds = sorted({k for r in runs for k in r.comms}, key=lambda k: -sum(r.comms_bytes(k) for r in runs))
    fig, (ax,) = _figure(len(runs))
    parts = [(kind, [r.comms_bytes(kind) / 2**20 for r in runs]) for kind in kinds]
    _stacked(ax, runs, list(range(len(runs))), parts, list(PALETTE), lambda r: "no collectives" if r.ok
             else r.label)
    ax.set_xlabel("bytes moved per device per training step, MiB (stacked by collective kind)")
    return _save(fig, out, "comms", "Communication per step per device")


def memory_breakdown(runs: list[Run], out: Path) -> Chart:
    # Grouped by strategy (in order of first appearance) so the same model's bytes line up strategy by strategy.
    strategies = list(dict.fromkeys(r.strategy for r in runs))
    ordered, positions, headers, y = [], [], [], 0.0
    for strategy in strategies:
        headers.append((y, strategy))
        y += 0.9
        for run in (r for r in runs if r.strategy == strategy):
            ordered.append(run)
            positions.append(y)
            y += 1.0
    fig, (ax,) = _figure(len(runs) + len(strategies))
    parts = [(label, [r.part(key) or 0.0 for r in ordered]) for key, label in BREAKDOWN]
    parts = [(label, values) for label, values in parts if any(values) or label != BREAKDOWN[-1][1]]
    _stacked(ax, ordered, positions, parts, ["#4878d0", "#82c6e2", "#956cb4", "#ee854a", "#bbbbbb"],
             lambda r: r.label if not r.ok else "no breakdown measured")
    ax.set_ylim(y - 0.3, -0.6)
    at_left = blended_transform_factory(ax.transAxes, ax.transData)
    for y_header, strategy in headers:
        ax.text(0.005, y_header, strategy, transform=at_left, fontsize=9, fontweight="bold", va="center")
    ax.set_xlabel("MiB per device")
    return _save(fig, out, "memory_breakdown", "Memory breakdown per device, grouped by strategy")


def write_charts(runs: list[Run], out: Path) -> list[Chart]:
    """Every chart of the report, written as PNGs into `out`, in the order the report shows them."""
    return [chart(runs, out) for chart in (epoch_time, peak_memory, throughput, mfu, comms, memory_breakdown)]
