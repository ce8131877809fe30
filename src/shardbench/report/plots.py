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

from shardbench.report.content import Chart, comms_measure

if TYPE_CHECKING:
    from shardbench.report.content import ReportedRun

PALETTE = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979", "#d5bb67",
           "#82c6e2")
# Every part of the compiled total (run_record.Breakdown), so that a bar's total is the run's memory/device: a model
# of your own's BatchNorm statistics and RNG streams too. Parts no run has (0 for the built-in models) are not drawn.
BREAKDOWN = (("params", "parameters"), ("optimizer", "optimizer state"),
             ("model_state", "model state (BatchNorm statistics, RNG)"), ("gradients", "gradients"),
             ("activations_temporaries", "activations / temporaries"), ("other", "batch and other outputs"))
OPTIONAL_PARTS = ("model_state", "other")
NOTE_WIDTH = 110  # characters per line of a chart's note, so that it fits the figure
# The most characters of a run's name on a chart's axis; a longer name (a sweep's names reach 200) keeps its start
# and its end (where a long name's hash is) around an ellipsis, and the report's table gives it whole.
LABEL_CHARS = 60
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
    # Tick labels of ticks beyond an axis' view are kept by matplotlib but never drawn: not a text anyone sees.
    # Minor ones too: a log axis spanning less than a decade labels its minor ticks ("6x10^0" beyond the view).
    undrawn = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            ticks = [*zip(axis.get_majorticklocs(), axis.get_majorticklabels(), strict=False),
                     *zip(axis.get_minorticklocs(), axis.get_minorticklabels(), strict=False)]
            for loc, label in ticks:
                if not low - 1e-9 * abs(high - low) <= loc <= high + 1e-9 * abs(high - low):
                    undrawn.add(id(label))
    cut = []
    for text in fig.findobj(match=lambda a: isinstance(a, Text)):
        if not text.get_visible() or not text.get_text().strip() or id(text) in undrawn:
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1:
            cut.append(text.get_text())
    return tuple(cut)


def _figure(rows: int, columns: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(6.0 + 4.0 * columns, 1.6 + 0.34 * max(rows, 2)), dpi=100, layout="constrained")
    return fig, list(fig.subplots(1, columns, sharey=True, squeeze=False)[0])


def _strategy_colors(runs: list[ReportedRun]) -> dict[str, str]:
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(dict.fromkeys(r.strategy for r in runs))}


def _gap_label(ax: Axes, y: float, text: str) -> None:
    ax.text(0, y, f"  {text}", va="center", fontsize=8, color="#666666", style="italic")


def _run_bars(ax: Axes, runs: list[ReportedRun], values: list[float | None], fmt: str, colors: list[str],
              missing: Callable[[ReportedRun], str] | None = None) -> None:
    """One bar per run; a run without the value keeps its row with the reason written in it (for a complete
    run, `missing` says why, from its record)."""
    bars = ax.barh(range(len(runs)), [v or 0.0 for v in values], color=colors, height=0.7)
    ax.bar_label(bars, labels=["" if v is None else fmt.format(v) for v in values], padding=3, fontsize=8)
    for y, (run, value) in enumerate(zip(runs, values, strict=True)):
        if value is None:
            _gap_label(ax, y, run.label if not run.ok else missing(run) if missing else "not measured")
    _finish_axes(ax, [r.name for r in runs], range(len(runs)), max((v or 0.0 for v in values), default=0.0))


def axis_label(name: str) -> str:
    """A run's name as a chart's axis shows it: whole up to `LABEL_CHARS`, else its start and end."""
    if len(name) <= LABEL_CHARS:
        return name
    head = (LABEL_CHARS - 1) // 2
    return f"{name[:head]}\u2026{name[-(LABEL_CHARS - 1 - head):]}"


def _finish_axes(ax: Axes, names: list[str], positions: range | list[float], top: float) -> None:
    ax.set_yticks(list(positions), [axis_label(n) for n in names], fontsize=8)
    ax.set_ylim(max(positions, default=0) + 0.6, min(positions, default=0) - 0.6)  # first run on top
    ax.set_xlim(0, top * 1.15 if top > 0 else 1.0)  # room for the value written after the longest bar
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _strategy_legend(ax: Axes, colors: dict[str, str], drawn: list[ReportedRun]) -> None:
    """The strategies of the runs `drawn` (those with a bar): a strategy whose every run failed has no colour on
    the chart to name."""
    shown = {r.strategy for r in drawn}
    ax.legend(handles=[Patch(color=c, label=s) for s, c in colors.items() if s in shown], title="strategy", fontsize=8,
              title_fontsize=8, loc="upper left", bbox_to_anchor=BESIDE)


def _save(fig: Figure, out: Path, name: str, title: str, note: str = "") -> Chart:
    # Wrapped to the figure's width (about 9 characters of 12 pt an inch): a narrow chart's title stays inside it.
    fig.suptitle(textwrap.fill(title, max(30, int(9 * fig.get_figwidth()))), fontsize=12)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=100)
    return Chart(name, title, path, note, clipped_texts(fig))


def _simple(runs: list[ReportedRun], out: Path, name: str, title: str, xlabel: str, fmt: str,
            value: Callable[[ReportedRun], float | None], colors: dict[str, str] | None = None, note: str = "",
            missing: Callable[[ReportedRun], str] | None = None) -> Chart:
    colors = colors or _strategy_colors(runs)
    fig, (ax,) = _figure(len(runs))
    _run_bars(ax, runs, [value(r) for r in runs], fmt, [colors[r.strategy] for r in runs], missing)
    ax.set_xlabel(xlabel)
    if note:
        ax.set_title(textwrap.fill(note, NOTE_WIDTH), fontsize=8, color="#555555")
    _strategy_legend(ax, colors, [r for r in runs if value(r) is not None])
    return _save(fig, out, name, title, note)


PROJECTED_NOTE = ("Hatched bars are projected: steps per epoch x median step, for runs that trained only part of an "
                  "epoch (data loading not included); solid bars are measured whole epochs.")


def _epoch(run: ReportedRun) -> float | None:
    return run.epoch_s if run.epoch_s is not None else run.epoch_projected_s


def epoch_time(runs: list[ReportedRun], out: Path) -> Chart | str:
    if not any(_epoch(r) is not None for r in runs):
        return "Epoch time per run: left out, as no run trained a whole epoch or has a step time to project one from."
    projected = any(r.epoch_projected_s is not None for r in runs)
    chart_note = PROJECTED_NOTE if projected else ""
    colors = _strategy_colors(runs)
    fig, (ax,) = _figure(len(runs))
    _run_bars(ax, runs, [_epoch(r) for r in runs], "{:.2f} s", [colors[r.strategy] for r in runs],
              lambda r: r.why_no_epoch)
    for patch, run in zip(ax.patches, runs, strict=True):
        if run.epoch_projected_s is not None:
            patch.set_hatch("//")
            patch.set_alpha(0.6)
    ax.set_xlabel("wall time per epoch, s (measured: data loading included, evaluation excluded)"
                  if not projected else "time per epoch, s: measured, or projected (hatched)")
    if chart_note:
        ax.set_title(textwrap.fill(chart_note, NOTE_WIDTH), fontsize=8, color="#555555")
    _strategy_legend(ax, colors, [r for r in runs if _epoch(r) is not None])
    return _save(fig, out, "epoch_time", "Epoch time per run" + (" (measured or projected)" if projected else ""),
                 chart_note)


def step_time(runs: list[ReportedRun], out: Path) -> Chart | str:
    """Median step per run with a whisker to its p90: the one speed figure every timed run has."""
    if not any(r.step_median is not None for r in runs):
        return "Step time per run: left out, as no run has a step time."
    colors = _strategy_colors(runs)
    fig, (ax,) = _figure(len(runs))
    medians = [None if r.step_median is None else 1e3 * r.step_median for r in runs]
    ends = [1e3 * (r.step_p90 or r.step_median or 0.0) for r in runs]
    ax.barh(range(len(runs)), [m or 0.0 for m in medians], color=[colors[r.strategy] for r in runs], height=0.7)
    for y, (run, median, end) in enumerate(zip(runs, medians, ends, strict=True)):
        if median is None:
            _gap_label(ax, y, run.label if not run.ok else run.why_not("step_time_s"))
            continue
        if end > median:
            ax.plot([median, end], [y, y], color="#333333", linewidth=1.2)
            ax.plot([end, end], [y - 0.2, y + 0.2], color="#333333", linewidth=1.2)
        ax.text(end, y, f"  {median:,.1f} ms", va="center", fontsize=8)
    _finish_axes(ax, [r.name for r in runs], range(len(runs)), max(ends, default=0.0) * 1.1)
    ax.set_xlabel("median step time, ms (the line runs to the 90th percentile); shorter is faster")
    _strategy_legend(ax, colors, [r for r, m in zip(runs, medians, strict=True) if m is not None])
    return _save(fig, out, "step_time", "Step time per run")


def _mesh(run: ReportedRun) -> str:
    """The mesh a run ran on, or was configured with; a failed run whose mesh its strategy was to choose has none
    recorded (its strategy is no mesh)."""
    return str(run.field("mesh", "parallel.mesh") or "unrecorded")


def _kind(run: ReportedRun) -> str:
    """The model a run trains, by kind or by the file of a model of your own."""
    return str(run.config.get("model.factory") or run.config.get("model.kind") or run.rec.model or "?")


def _grouped(runs: list[ReportedRun], out: Path, name: str, title: str, ylabel: str,
             value: Callable[[ReportedRun], float | None], hatched: Callable[[ReportedRun], bool],
             note: str) -> Chart | str:
    """The seeds' layout: one group of bars per mesh, one bar per batch size (vertical, as drawn by hand). A run
    with no bar (failed, such as out of memory, or without the figure) keeps its cell as a labelled gap, and the
    caption names it, as it does a failed run at a mesh or batch size no bar has."""
    meshes = list(dict.fromkeys(_mesh(r) for r in runs if r.ok))
    batches = sorted({r.batch for r in runs if r.ok and r.batch})
    cells, left_out = _cells(runs, value)
    if len(meshes) < 2 or len(batches) < 2 or not cells:
        return ""
    kinds = list(dict.fromkeys(_kind(r) for r in runs if r.ok))
    if len(kinds) > 1:  # bars side by side would compare one model's mesh with another's
        return (f"{title}: left out, as the runs train {len(kinds)} models ({', '.join(kinds)}); the per-run "
                f"charts and the table name each run's.")
    gaps = _gaps(runs, cells, value)  # a failed run has its cell by its configured mesh and batch
    # A failed run (or one without the figure) whose cell another run's bar fills: no gap to label, so said.
    covered = [r for r in runs if (not r.ok or value(r) is None) and (_mesh(r), r.batch) in cells]
    inside = {cell: failed for cell, failed in gaps.items() if cell[0] in meshes and cell[1] in batches}
    outside = [run for cell, failed in gaps.items() if cell not in inside for run in failed]
    # Said under the chart (the figure is too narrow for a list of names).
    caption = " ".join(filter(None, [
        note, f"One bar per mesh and batch size: left out, as another run has its mesh and batch (the first is "
              f"drawn): {', '.join(left_out)}." if left_out else "",
        "No bar, a labelled gap: " + "; ".join(f"{r.name}, {_gap_text(r)}" for failed in inside.values()
                                               for r in failed) + "."
        if inside else "",
        "Not drawn, at a mesh or batch size no bar has: " + "; ".join(
            f"{r.name}, {_gap_text(r)} (mesh {_mesh(r)}, batch {r.batch or '?'})" for r in outside) + "."
        if outside else "",
        "Not drawn, at a mesh and batch size another run's bar has: " + "; ".join(
            f"{r.name}, {_gap_text(r)} (mesh {_mesh(r)}, batch {r.batch or '?'})" for r in covered) + "."
        if covered else ""]))
    fig = Figure(figsize=(2.0 + 1.3 * len(meshes) * max(1, len(batches) / 2), 4.2), dpi=100, layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(batches)
    for i, batch in enumerate(batches):
        xs, heights, hatches = [], [], []
        for j, mesh in enumerate(meshes):
            x = j - 0.4 + width * (i + 0.5)
            run = cells.get((mesh, batch))
            if run is not None:
                xs.append(x)
                heights.append(value(run) or 0.0)
                hatches.append(hatched(run))
            elif (mesh, batch) in inside:
                ax.text(x, 0, f" {_gap_text(inside[mesh, batch][0])}", rotation=90, ha="center", va="bottom",
                        fontsize=7, color="#666666", style="italic")
        bars = ax.bar(xs, heights, width=width * 0.95, color=PALETTE[i % len(PALETTE)], label=f"batch {batch}")
        for bar, hatch in zip(bars, hatches, strict=True):
            if hatch:
                bar.set_hatch("//")
        ax.bar_label(bars, fmt="{:,.1f}", fontsize=7, padding=2)
    ax.set_xticks(range(len(meshes)), meshes, fontsize=9)
    ax.set_xlabel("mesh (data x model)")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=BESIDE)
    if note:
        ax.set_title(textwrap.fill(note, 70), fontsize=8, color="#555555")
    return _save(fig, out, name, title, caption)


def _cells(runs: list[ReportedRun], value: Callable[[ReportedRun], float | None]
           ) -> tuple[dict[tuple[str, int | None], ReportedRun], list[str]]:
    """The run drawn in each (mesh, batch) cell, the first in store order, and the names of the runs left out
    because an earlier one has their cell (runs that differ in another setting, a dtype or a strategy)."""
    cells: dict[tuple[str, int | None], ReportedRun] = {}
    left_out = []
    for run in (r for r in runs if r.ok and value(r) is not None):
        if cells.setdefault((_mesh(run), run.batch), run) is not run:
            left_out.append(run.name)
    return cells, left_out


def _gap_text(run: ReportedRun) -> str:
    """What a gap in the mesh x batch charts says: the failure ('failed (oom)'), or that the figure is missing."""
    return run.label if not run.ok else "not measured"


def _gaps(runs: list[ReportedRun], cells: dict[tuple[str, int | None], ReportedRun],
          value: Callable[[ReportedRun], float | None]) -> dict[tuple[str, int | None], list[ReportedRun]]:
    """Every run of each (mesh, batch) cell that no bar fills (a failed run, or one without the figure), in store
    order: the gap is labelled by the first, and the caption names them all."""
    gaps: dict[tuple[str, int | None], list[ReportedRun]] = {}
    for run in runs:
        if (not run.ok or value(run) is None) and (_mesh(run), run.batch) not in cells:
            gaps.setdefault((_mesh(run), run.batch), []).append(run)
    return gaps


def mesh_batch_epoch(runs: list[ReportedRun], out: Path) -> Chart | str:
    projected = any(r.epoch_projected_s is not None for r in runs if r.ok)
    return _grouped(runs, out, "mesh_batch_epoch_time", "Epoch time per mesh and batch size",
                    "time per epoch, s" + (" (hatched: projected)" if projected else ""), _epoch,
                    lambda r: r.epoch_projected_s is not None, PROJECTED_NOTE if projected else "")


def memory_title(sources: set[str], per: str) -> str:
    """A memory chart's title by what its bars are: the runtime peak, XLA's compiled total, or both (the compiled
    ones hatched), so that no chart of compiled totals is called a peak."""
    if sources == {"peak"}:
        return f"Runtime peak memory per device {per}"
    if sources == {"compiled"}:
        return f"Compiled memory total per device {per}"
    return f"Memory per device {per} (runtime peak; hatched: compiled total)"


def mesh_batch_memory(runs: list[ReportedRun], out: Path) -> Chart | str:
    sources = {r.memory[1] for r in runs if r.ok and r.memory[0] is not None}
    label = "MiB per device: " + ("runtime peak" if sources == {"peak"} else "compiled total" if sources ==
                                  {"compiled"} else "runtime peak; hatched: compiled total")
    return _grouped(runs, out, "mesh_batch_memory", memory_title(sources, "per mesh and batch size"), label,
                    lambda r: r.memory[0], lambda r: r.memory[1] == "compiled" and len(sources) > 1, "")


def peak_memory(runs: list[ReportedRun], out: Path) -> Chart | str:
    if not any(r.memory[0] is not None for r in runs):
        return "Memory per device per run: left out, as no run reports its memory."
    colors = _strategy_colors(runs)
    fig, (ax,) = _figure(len(runs))
    _run_bars(ax, runs, [r.memory[0] for r in runs], "{:.1f}", [colors[r.strategy] for r in runs])
    sources = {r.memory[1] for r in runs if r.memory[0] is not None}
    title = memory_title(sources, "per run")
    if len(sources) <= 1:
        note = "" if sources else "No run reports its memory."
        ax.set_xlabel(MEMORY_LABELS[sources.pop() if sources else "compiled"])
    else:  # mixed backends: hatch the compiled totals so the two kinds of figure are not confused
        for patch, run in zip(ax.patches, runs, strict=True):
            if run.memory[1] == "compiled":
                patch.set_hatch("//")
        ax.set_xlabel("memory per device, MiB: runtime peak; hatched bars: compiled total (no peak reported)")
        note = "Hatched bars are XLA's compiled totals, for runs whose backend reports no runtime peak."
    _strategy_legend(ax, colors, [r for r in runs if r.memory[0] is not None])
    return _save(fig, out, "peak_memory", title, note)


def throughput_figure(runs: list[ReportedRun]) -> Figure | str:
    """The throughput chart drawn (its bars hold the figures), or why it is left out."""
    if not any(r.rate("examples_per_s") is not None and not r.wall_rate for r in runs):
        return "Training throughput per run: left out, as no run has a step time to derive it from."
    kinds = list(dict.fromkeys(_kind(r) for r in runs if r.ok))
    if len(kinds) > 1:  # one axis would rank an MLP's examples against an LM's sequences
        return (f"Training throughput per run: left out, as the runs train {len(kinds)} models "
                f"({', '.join(kinds)}), whose examples are not alike; the table gives each run's in its own unit.")
    colors = [_strategy_colors(runs)[r.strategy] for r in runs]
    fig, (total, per_device) = _figure(len(runs), columns=2)
    units = {r.unit for r in runs if r.ok}
    unit = units.pop() if len(units) == 1 else "examples"
    key = "units_per_s" if unit != "examples" else "examples_per_s"  # images: the examples (ReportedRun.rate)
    # An old record's wall-clock rate is not the batch over the median step that the bars are: a gap, said why.
    def rate(run: ReportedRun, figure: str) -> float | None:
        return None if run.wall_rate else run.rate(figure)

    def why(run: ReportedRun) -> str:
        return "wall-clock rate only (a record before schema 2 with no step time)" if run.wall_rate else "not measured"

    _run_bars(total, runs, [rate(r, key) for r in runs], "{:,.0f}", colors, why)
    _run_bars(per_device, runs, [rate(r, f"{key}_per_device") for r in runs], "{:,.0f}", colors, why)
    total.set_xlabel(f"{unit} per second (global batch / median step)")
    per_device.set_xlabel(f"{unit} per second per device")
    _strategy_legend(per_device, _strategy_colors(runs), [r for r in runs if rate(r, key) is not None])
    return fig


def throughput(runs: list[ReportedRun], out: Path) -> Chart | str:
    """Examples per second (global batch / median step), in the runs' own unit (images, tokens) when they share one."""
    fig = throughput_figure(runs)
    return fig if isinstance(fig, str) else _save(fig, out, "throughput", "Training throughput per run")


def mfu(runs: list[ReportedRun], out: Path) -> Chart | str:
    title = "Model FLOPs utilisation per run"
    measured = [r for r in runs if r.mfu_value is not None]
    if not measured:
        reasons = sorted({r.why_not("mfu") for r in runs if r.ok})
        why = "; ".join(reasons) if reasons else "no run completed"
        return f"{title}: left out, as no run reports an MFU ({why})."
    sources = sorted({str(r.mfu.peak_source) for r in measured})
    omitted = [f"{r.name} ({r.why_not('mfu') if r.ok else 'failed'})" for r in runs if r.mfu_value is None]
    note = f"Peak FLOP/s from: {'; '.join(sources)}." + (
        f" Omitted, no MFU: {', '.join(omitted)}." if omitted else "")
    # Colours come from every run so that a strategy keeps its colour across the charts.
    return _simple(measured, out, "mfu", title, "MFU, % of the run's peak FLOP/s (each device's peak x devices)",
                   "{:.1f}%", lambda r: 100.0 * (r.mfu_value or 0.0), _strategy_colors(runs), note)


def _stacked(ax: Axes, runs: list[ReportedRun], positions: list[float], parts: list[tuple[str, list[float]]],
             colors: list[str], empty: Callable[[ReportedRun], str]) -> None:
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


COMMS_AXIS = {
    "sent": "bytes sent per device per training step on a ring, MiB (stacked by collective kind)",
    "payload": "collective payload per device per training step, MiB (older records: buffers, not bytes sent)",
    "mixed": "bytes sent per device per training step, MiB (runs marked (payload) in the table: buffers)",
}


def comms(runs: list[ReportedRun], out: Path) -> Chart | str:
    kinds = sorted({k for r in runs for k in r.comms}, key=lambda k: (-sum(r.comms_bytes(k) for r in runs), k))
    if not any(r.ok for r in runs):
        return "Communication per step: left out, as no run completed."
    if not any(r.comms_bytes(k) for r in runs for k in kinds):
        return "Communication per step: left out, as no run moves bytes between devices."
    fig, (ax,) = _figure(len(runs))
    parts = [(kind, [r.comms_bytes(kind) / 2**20 for r in runs]) for kind in kinds]
    _stacked(ax, runs, list(range(len(runs))), parts, list(PALETTE), lambda r: "no collectives" if r.ok
             else r.label)
    ax.set_xlabel(COMMS_AXIS[comms_measure(runs)])
    return _save(fig, out, "comms", "Communication per step per device")


def memory_breakdown(runs: list[ReportedRun], out: Path) -> Chart | str:
    if not any(r.part(key) for r in runs for key, _ in BREAKDOWN):
        return "Memory breakdown: left out, as no run has one."
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
    colors = dict(zip((key for key, _ in BREAKDOWN),
                      ("#4878d0", "#82c6e2", "#6acc64", "#956cb4", "#ee854a", "#bbbbbb"), strict=True))
    drawn = [(key, label, [r.part(key) or 0.0 for r in ordered]) for key, label in BREAKDOWN]
    drawn = [(key, label, values) for key, label, values in drawn if any(values) or key not in OPTIONAL_PARTS]
    _stacked(ax, ordered, positions, [(label, values) for _, label, values in drawn],
             [colors[key] for key, _, _ in drawn], lambda r: r.label if not r.ok else "no breakdown measured")
    ax.set_ylim(y - 0.3, -0.6)
    at_left = blended_transform_factory(ax.transAxes, ax.transData)
    for y_header, strategy in headers:
        ax.text(0.005, y_header, strategy, transform=at_left, fontsize=9, fontweight="bold", va="center")
    ax.set_xlabel("MiB per device")
    return _save(fig, out, "memory_breakdown", "Memory breakdown per device, grouped by strategy")


CHARTS: tuple[Callable[[list[ReportedRun], Path], Chart | str], ...] = (
    step_time, throughput, epoch_time, mesh_batch_epoch, mesh_batch_memory, peak_memory, mfu, comms, memory_breakdown)
# The files CHARTS can write: an earlier report's that this one leaves out are removed when it is published.
FILES = tuple(f"{stem}.png" for stem in ("epoch_time", "step_time", "mesh_batch_epoch_time", "mesh_batch_memory",
                                         "peak_memory", "throughput", "mfu", "comms", "memory_breakdown"))


def write_charts(runs: list[ReportedRun], out: Path) -> tuple[list[Chart], list[str]]:
    """Every chart with something to show, written as PNGs into `out` in the order the report shows them, and one
    line for each chart left out (none is drawn empty). A chart that does not apply to these runs (the per-mesh
    charts of a sweep that varies no mesh and batch) is left out without a line."""
    charts: list[Chart] = []
    omitted: list[str] = []
    for draw in CHARTS:
        made = draw(runs, out)
        if isinstance(made, Chart):
            charts.append(made)
        elif made:
            omitted.append(made)
    return charts, omitted
