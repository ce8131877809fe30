"""Sweep report: read the runs of a sweep (its sweep.db, or any folder of run directories) and describe them:
report.md, a self-contained report.html and PNG charts, plus the terminal lines `shardbench sweep` prints.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from shardbench.errors import ShardbenchError
from shardbench.sweep import html as html_page
from shardbench.sweep import plots
from shardbench.sweep.findings import explain
from shardbench.sweep.store import RunRow, Store

MIB = 1024 * 1024
DASH = "-"
INCOMPLETE = "incomplete"  # a run folder without summary.json
# Fields that differ between runs by construction (where each run writes) or that do not change results:
# they are never "what was swept" and never stop two runs from being compared.
NOISE = frozenset({"train.out", "train.resume", "train.run_name", "train.profile_root", "train.progress",
                   "train.recalibrate_peak", "data.cache_dir", "preset"})


def _dig(value: Any, *path: str) -> Any:
    """A nested value of a run record, or None where a trainer did not measure it."""
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Run:
    """One run as the report sees it, from the store or from a run directory; metrics are None when absent."""

    name: str
    status: str
    error_kind: str | None
    error: str | None
    overrides: dict[str, Any]
    config: dict[str, Any]  # flattened {"section.field": value}
    record: dict[str, Any] | None  # summary.json when complete

    @property
    def ok(self) -> bool:
        return self.status == "complete" and self.record is not None

    @property
    def settings(self) -> dict[str, Any]:
        """The configuration that defines what ran: two runs with equal settings are the same experiment."""
        return {k: v for k, v in self.config.items() if k not in NOISE}

    def recorded(self, *path: str) -> Any:
        """A raw value of the run's record (None when absent)."""
        return _dig(self.record, *path)

    def measurement(self, *path: str) -> Any:
        """A raw value under the record's "measurements" (None when absent)."""
        return _dig(self.record, "measurements", *path)

    def measured(self, *path: str) -> float | None:
        return _number(self.measurement(*path))

    def why_not(self, figure: str) -> str:
        """Why a complete run lacks `figure` ("mfu" or "step_time_s"), as its record says (never a guess)."""
        said = self.measurement(figure, "not_measured")
        if said:
            return str(said)
        if figure == "mfu" and self.measurement("step_time_s", "not_measured"):
            return f"no step time: {self.measurement('step_time_s', 'not_measured')}"
        return "the record does not say why (written by an older shardbench)"

    def field(self, record_key: str, config_key: str) -> Any:
        # The record says what actually ran (e.g. the resolved mesh); the config is all a failed run has.
        value = _dig(self.record, record_key)
        return self.config.get(config_key) if value in (None, "") else value

    @property
    def strategy(self) -> str:
        return str(self.field("strategy", "parallel.strategy") or "?")

    @property
    def devices(self) -> int | None:
        value = _number(self.field("devices", "parallel.devices"))
        return int(value) if value else None  # 0 in a config means "all", which is unknown here

    @property
    def batch(self) -> int | None:
        value = _number(self.config.get("train.batch_size"))
        return None if value is None else int(value)

    def mib(self, *path: str) -> float | None:
        value = self.measured(*path)
        return None if value is None else value / MIB

    @property
    def unit(self) -> str:
        """What throughput counts: images (vit, and records from before other models), tokens or examples."""
        return str(self.measurement("throughput", "unit") or "images")

    @property
    def images_per_s(self) -> float | None:
        if self.unit != "images":
            return None
        # Records written before measurements existed still carry the top-level figure.
        measured = self.measured("throughput", "examples_per_s")
        return measured if measured is not None else _number(_dig(self.record, "images_per_s"))

    def per_s(self, unit: str) -> float | None:
        """Throughput in `unit`s per second, for runs that count that unit."""
        return self.measured("throughput", "units_per_s") if self.unit == unit else None

    @property
    def rate_text(self) -> str:
        """Throughput with its unit, for one line: '1300 img/s', '52,000 tokens/s'."""
        if self.unit == "images":
            return f"{_fixed(self.images_per_s, '.0f')} img/s"
        return f"{_fixed(self.per_s(self.unit), ',.0f')} {self.unit}/s"

    @property
    def epoch_s(self) -> float | None:
        times = [t for t in map(_number, _dig(self.record, "measurements", "epoch_time_s") or []) if t is not None]
        return statistics.fmean(times) if times else None

    @property
    def why_no_epoch(self) -> str:
        """Why a complete run has no epoch time: it trained only part of an epoch (from its record)."""
        partial = _dig(self.record, "measurements", "partial_epochs") or []
        if partial:
            p = partial[0]
            return f"partial epoch only: {p.get('steps')} of {p.get('of')} steps in {p.get('time_s', 0):.1f} s"
        return "not measured"

    @property
    def memory(self) -> tuple[float | None, str]:
        """Per-device memory in MiB and its source: the runtime peak where reported, else XLA's compiled total."""
        peak = self.mib("memory", "peak_bytes_in_use")
        return (peak, "peak") if peak is not None else (self.mib("memory", "total_bytes"), "compiled")

    def part(self, name: str) -> float | None:
        """One entry of the memory breakdown in MiB: params, optimizer, gradients, activations_temporaries."""
        return self.mib("memory", "breakdown", f"{name}_bytes")

    @property
    def state_mib(self) -> float | None:
        """Parameters + optimizer state + gradients: the bytes the parameter dtype governs."""
        parts = [self.part(p) for p in ("params", "optimizer", "gradients")]
        return None if None in parts else sum(p for p in parts if p is not None)

    @property
    def comms(self) -> dict[str, dict[str, Any]]:
        found = _dig(self.record, "measurements", "comms")
        return found if isinstance(found, dict) else {}

    def comms_bytes(self, kind: str) -> float:
        return _number(_dig(self.comms, kind, "bytes")) or 0.0

    @property
    def comms_mib(self) -> float | None:
        total = self.mib("comms_total_bytes")
        if total is None and _dig(self.record, "measurements", "comms") is not None:
            total = sum(self.comms_bytes(kind) for kind in self.comms) / MIB
        return total

    @property
    def collectives(self) -> str:
        if self.measurement("comms") is None:
            return ""
        kinds = sorted(self.comms, key=lambda kind: -self.comms_bytes(kind))  # the heaviest first
        return ", ".join(f"{k}×{int(_number(_dig(self.comms, k, 'count')) or 0)}" for k in kinds) or "none"

    @property
    def label(self) -> str:
        return f"failed ({self.error_kind})" if self.error_kind else self.status


@dataclass(frozen=True)
class Column:
    """One table column: `value` gives the sort key (None = missing), `text` what is shown."""

    key: str
    label: str
    numeric: bool
    value: Callable[[Run], Any]
    digits: int = 1
    optional: bool = False  # shown only when some run has a value (e.g. tokens/s only for language models)
    usual: Any = None  # an optional column whose every value is this one is not shown either (e.g. spmd jit)

    def text(self, run: Run) -> str:
        value = self.value(run)
        if value is None or value == "":
            return "–"
        if self.key == "mem_mib":  # the figure alone would hide whether it is measured or compiled
            return f"{value:,.{self.digits}f} ({run.memory[1]})"
        return f"{value:,.{self.digits}f}" if self.numeric else str(value)


def _scaled(get: Callable[[Run], float | None], factor: float) -> Callable[[Run], float | None]:
    def scaled(run: Run) -> float | None:
        value = get(run)
        return None if value is None else value * factor

    return scaled


COLUMNS: tuple[Column, ...] = (
    Column("run", "run", False, lambda r: r.name),
    Column("status", "status", False, lambda r: r.label),
    Column("model", "model", False, lambda r: r.config.get("model.kind") or _dig(r.record, "model"), optional=True,
           usual="vit"),
    Column("strategy", "strategy", False, lambda r: r.strategy),
    Column("spmd", "spmd", False, lambda r: r.config.get("parallel.spmd") or _dig(r.record, "spmd"), optional=True,
           usual="jit"),
    Column("mesh", "mesh", False, lambda r: r.field("mesh", "parallel.mesh")),
    Column("devices", "devices", True, lambda r: r.devices, 0),
    Column("batch", "batch", True, lambda r: r.batch, 0),
    Column("param_dtype", "param dtype", False, lambda r: r.config.get("precision.param_dtype")),
    Column("dtype", "dtype", False, lambda r: r.config.get("precision.dtype")),
    Column("epoch_s", "epoch time s", True, lambda r: r.epoch_s, 2),
    Column("step_ms_median", "step ms median", True, _scaled(lambda r: r.measured("step_time_s", "median"), 1e3)),
    Column("step_ms_p90", "step ms p90", True, _scaled(lambda r: r.measured("step_time_s", "p90"), 1e3)),
    Column("compile_s", "compile s", True, lambda r: r.measured("compile", "compile_s"), 2),
    Column("img_s", "img/s", True, lambda r: r.images_per_s, 0, optional=True),
    Column("img_s_device", "img/s/device", True,
           lambda r: r.measured("throughput", "examples_per_s_per_device") if r.unit == "images" else None, 0,
           optional=True),
    Column("tokens_s", "tokens/s", True, lambda r: r.per_s("tokens"), 0, optional=True),
    Column("examples_s", "examples/s", True, lambda r: r.per_s("examples"), 0, optional=True),
    Column("mfu_pct", "MFU %", True, _scaled(lambda r: r.measured("mfu", "mfu"), 100.0)),
    Column("mem_mib", "memory/device MiB", True, lambda r: r.memory[0]),
    Column("params_mib", "params MiB", True, lambda r: r.part("params")),
    Column("optimizer_mib", "optimizer MiB", True, lambda r: r.part("optimizer")),
    Column("gradients_mib", "gradients MiB", True, lambda r: r.part("gradients")),
    Column("activations_mib", "activations MiB", True, lambda r: r.part("activations_temporaries")),
    Column("comms_mib", "comms/step MiB", True, lambda r: r.comms_mib, 2),
    Column("collectives", "collectives", False, lambda r: r.collectives),
    Column("test_acc_pct", "test acc %", True, _scaled(lambda r: _number(_dig(r.record, "test_accuracy")), 100.0)),
    Column("test_loss", "test loss", True, lambda r: _number(_dig(r.record, "test_loss")), 4, optional=True),
    Column("test_ppl", "test perplexity", True, lambda r: _number(_dig(r.record, "test_perplexity")), 2, optional=True),
    Column("loss_floor", "best possible loss", True, lambda r: _number(_dig(r.record, "dataset", "loss_floor")), 4, optional=True),
)


# ------------------------------------------------------------------------------------------- loading runs
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ShardbenchError(f"cannot read {path}: {err}") from None


def _from_store(db: Path) -> tuple[list[Run], dict[str, Any]]:
    with Store(db) as store:
        rows = store.runs()
        meta = {key: store.get_meta(key) for key in ("preset", "axes", "created")}
    return [Run(r.name, r.status, r.error_kind, r.error, r.overrides, r.config, r.record) for r in rows], meta


def _from_folders(root: Path, skip: Path) -> list[Run]:
    runs: list[Run] = []
    for summary in sorted(root.rglob("summary.json")):
        if skip in summary.parents:
            continue
        record = _read_json(summary)
        nested = _read_json(summary.with_name("config.json")) if summary.with_name("config.json").exists() else {}
        config = {f"{s}.{k}": v for s, sec in nested.items() if isinstance(sec, dict) for k, v in sec.items()}
        relative = summary.parent.relative_to(root).as_posix()
        name = str(record.get("run_name") or relative)
        if name in {r.name for r in runs}:  # two folders with one run name: their paths tell them apart
            name = relative
        runs.append(Run(name, str(record.get("status", "complete")), None, None, {}, config, record))
    # A run folder (it has the config.json a run writes first) without summary.json did not finish: it is
    # listed among the failed runs, never silently left out.
    for saved in sorted(root.rglob("config.json")):
        if skip in saved.parents or saved.with_name("summary.json").exists():
            continue
        nested = _read_json(saved)
        config = {f"{s}.{k}": v for s, sec in nested.items() if isinstance(sec, dict) for k, v in sec.items()}
        runs.append(Run(saved.parent.relative_to(root).as_posix(), "failed", INCOMPLETE,
                        "no summary.json: the run did not finish (stopped, killed, or still running)", {}, config,
                        None))
    # A folder keeps no list of swept fields: they are the fields whose values differ between the runs.
    keys = sorted({k for r in runs for k in r.settings})
    swept = [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1]
    return [Run(r.name, r.status, r.error_kind, r.error, {k: r.config.get(k) for k in swept}, r.config, r.record)
            for r in runs]


def load_runs(sweep_dir: Path, skip: Path | None = None) -> tuple[list[Run], dict[str, Any]]:
    """The runs in store order (path order for a plain folder of runs) and the sweep's meta."""
    if not sweep_dir.is_dir():
        raise ShardbenchError(f"{sweep_dir}: no such directory")
    runs, meta = _from_store(sweep_dir / "sweep.db") if (sweep_dir / "sweep.db").exists() else ([], {})
    if not runs:
        runs, meta = _from_folders(sweep_dir, skip or sweep_dir / "report"), {}
    if not any(r.ok for r in runs) and all(r.error_kind == INCOMPLETE for r in runs):
        runs = []  # nothing but unfinished folders is nothing to report
    if not runs:
        raise ShardbenchError(f"{sweep_dir}: no runs to report (no runs in a sweep.db and no summary.json below it)")
    return runs, meta


def swept_fields(runs: list[Run]) -> dict[str, list[Any]]:
    """Each swept field with its distinct values, in the order the runs first use them."""
    fields: dict[str, list[Any]] = {}
    for key in dict.fromkeys(k for r in runs for k in r.overrides if k not in NOISE):
        values = [r.overrides.get(key, r.config.get(key)) for r in runs]
        fields[key] = list({json.dumps(v, sort_keys=True): v for v in values}.values())
    return fields


# ------------------------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class ReportPaths:
    """Where write_report put everything; charts maps a chart's name (e.g. "epoch_time") to its PNG."""

    directory: Path
    markdown: Path
    html: Path
    charts: dict[str, Path]
    clipped: dict[str, tuple[str, ...]] = dataclass_field(default_factory=dict)  # per chart: texts its edges cut
    incomplete: tuple[str, ...] = ()  # run folders without summary.json


@dataclass(frozen=True)
class ReportContent:
    """Everything both renderings show, computed once."""

    title: str
    source: str
    runs: list[Run]
    columns: tuple[Column, ...]
    swept: dict[str, list[Any]]
    findings: dict[str, list[str]]
    charts: list[plots.Chart]
    table_note: str

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if not r.ok]

    @property
    def varied(self) -> dict[str, list[Any]]:
        """The swept fields that took more than one value."""
        return {k: v for k, v in self.swept.items() if len(v) > 1}

    @property
    def fixed(self) -> dict[str, Any]:
        """Overridden fields with one value over these runs (e.g. a sweep stopped before its second value)."""
        return {k: v[0] for k, v in self.swept.items() if len(v) == 1}


TABLE_NOTE = ("Byte figures are per device; comms are per training step. Memory/device is the runtime peak "
               "where the backend reports one (\"peak\"), else XLA's compiled total: arguments + outputs − "
               "aliased + temporaries (\"compiled\"). Epoch time is the mean wall time per epoch, data loading "
               "included, evaluation excluded.")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(content: ReportContent) -> str:
    lines = [f"# {content.title}", "", content.source, "", "## What was swept", ""]
    lines += [f"- `{key}`: {', '.join(map(str, values))}" for key, values in content.varied.items()] or [
        "Nothing: the runs share one configuration."]
    if content.fixed:
        lines += ["", "Set the same for every run: " + ", ".join(f"`{k}` = {v if v != '' else '(default)'}"
                                                                  for k, v in content.fixed.items())]
    if content.findings:
        lines += ["", "## What the numbers say"]
        for heading, sentences in content.findings.items():
            lines += ["", f"### {heading}", "", *(f"- {s}" for s in sentences)]
    cols = content.columns
    lines += ["", "## Runs", "", "| " + " | ".join(c.label for c in cols) + " |",
              "|" + "|".join("---:" if c.numeric else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(_md_cell(c.text(run)) for c in cols) + " |" for run in content.runs]
    lines += ["", content.table_note]
    if content.failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- `{r.name}`: {r.error_kind or r.status}: {r.error or 'no message'}" for r in content.failed]
    lines += ["", "## Charts"]
    for chart in content.charts:
        lines += ["", f"### {chart.title}", "", f"![{chart.title}]({chart.path.name})"]
        lines += ["", f"_{chart.note}_"] if chart.note else []
    return "\n".join(lines) + "\n"


def write_report(sweep_dir: Path, out_dir: Path | None = None) -> ReportPaths:
    """Write report.md, report.html and the charts into `out_dir` (default `<sweep_dir>/report`)."""
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep_dir / "report"
    runs, meta = load_runs(sweep_dir, skip=out)
    out.mkdir(parents=True, exist_ok=True)
    swept = swept_fields(runs)
    complete = sum(r.ok for r in runs)
    preset = f" (preset {meta['preset']})" if meta.get("preset") else ""
    origin = f"`sweep.db`{preset}" if meta else "the run folders below it"
    count = f"{len(runs)} run{'' if len(runs) == 1 else 's'}"
    source = f"Read from {origin} in `{sweep_dir}`: {count}, {complete} complete, {len(runs) - complete} failed."
    content = ReportContent(title=f"shardbench sweep report: {sweep_dir.resolve().name}", source=source, runs=runs,
                            columns=shown(COLUMNS, runs), swept=swept, findings=explain(runs, swept),
                            charts=plots.write_charts(runs, out), table_note=TABLE_NOTE)
    markdown, page = out / "report.md", out / "report.html"
    markdown.write_text(render_markdown(content), encoding="utf-8")
    page.write_text(html_page.render(content), encoding="utf-8")
    return ReportPaths(out, markdown, page, {c.name: c.path for c in content.charts},
                       {c.name: c.clipped for c in content.charts if c.clipped},
                       tuple(r.name for r in content.runs if r.error_kind == INCOMPLETE))


# ---------------------------------------------------------------- terminal lines printed by `shardbench sweep`
TERMINAL_KEYS = ("run", "status", "epoch_s", "step_ms_median", "img_s", "tokens_s", "examples_s", "mfu_pct",
                 "mem_mib", "comms_mib", "test_acc_pct", "test_loss")


def shown(columns: tuple[Column, ...], runs: list[Run]) -> tuple[Column, ...]:
    """The columns to show for `runs`: optional ones only where some run has a value."""
    return tuple(c for c in columns if not c.optional or any(c.value(r) not in (None, "", c.usual) for r in runs))


def _run(row: RunRow) -> Run:
    return Run(row.name, row.status, row.error_kind, row.error, row.overrides, row.config, row.record)


def status_text(row: RunRow) -> str:
    return row.status if row.status == "complete" else f"FAILED ({row.error_kind})"


def _fixed(value: float | None, fmt: str) -> str:
    return DASH if value is None else format(value, fmt)


def progress_line(index: int, total: int, row: RunRow) -> str:
    """`[3/9] mesh_4_2_batch_1024  complete  41.2s  1066 img/s  step 0.120s  mem 512.0 MiB (compiled) ...`"""
    head = f"[{index}/{total}] {row.name}"
    if row.status != "complete":
        return f"{head}  {status_text(row)}: {row.error}"
    run = _run(row)
    memory, source = run.memory
    step = run.measured("step_time_s", "median")
    step_text = f"step {step:.3f}s" if step is not None else f"step time {run.why_not('step_time_s')}"
    return (f"{head}  complete  {_fixed(_number(_dig(row.record, 'time_s')), '.1f')}s  "
            f"{run.rate_text}  {step_text}  "
            f"mem {_fixed(memory, '.1f')} MiB ({source})  comms {_fixed(run.comms_mib, '.1f')} MiB")


def summary_table(rows: list[RunRow]) -> str:
    """The report's main columns at fixed width, names left-aligned and numbers right-aligned."""
    columns = [c for c in shown(COLUMNS, [_run(row) for row in rows]) if c.key in TERMINAL_KEYS]
    body = [[status_text(row) if c.key == "status" else c.text(_run(row)) for c in columns] for row in rows]
    header = [c.label for c in columns]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if col.numeric else c.ljust(w)
                         for c, w, col in zip(cells, widths, columns, strict=True)).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(b) for b in body)])
