"""Sweep report: read the runs of a sweep (its sweep.db, or any folder of run directories) and describe them:
report.md, a self-contained report.html and PNG charts (the lines `shardbench sweep` prints are in
`terminal`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from shardbench.config import Config
from shardbench.errors import ConfigError, DataError, ShardbenchError, writable_dir
from shardbench.measure.run_record import Measurements, RunRecord, from_json
from shardbench.parallel.mesh import MeshShape
from shardbench.prices import PriceTable
from shardbench.rundir import saved_layout
from shardbench.report import html as html_page
from shardbench.report import plan_chart, plots, runs_csv, staging
from shardbench.report.content import (
    COLUMNS, INCOMPLETE, NOISE, Column, ReportContent, ReportedRun, reported, shown,
)
from shardbench.report.cost import cost_note, with_costs
from shardbench.report.findings import explain
from shardbench.report.pipeline import with_bubbles
from shardbench.report.traces import with_traces
from shardbench.report.speed import differing
from shardbench.store import Store, in_use


# ------------------------------------------------------------------------------------------- loading runs
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        # An empty or corrupt file is the data class of mistake (exit 4), as the docs' table says.
        raise DataError(f"cannot read {path}: {err}") from None


def _read_config(path: Path) -> dict[str, Any]:
    """A run folder's config.json as its flat fields ({"section.field": value})."""
    return _flat_config(_read_json(path), path)


def _flat_config(nested: Any, path: Path) -> dict[str, Any]:
    if not isinstance(nested, dict):
        raise DataError(f"{path} is not a run's configuration (a JSON object of sections), but a "
                        f"{type(nested).__name__}")
    return {f"{s}.{k}": v for s, sec in nested.items() if isinstance(sec, dict) for k, v in sec.items()}


def _started_layout(folder: Path) -> dict[str, Any]:
    """The strategy and mesh an unfinished run started with, from its layout.json (`auto` resolved: `pp` on
    `stage=4`), as configuration fields; none where it kept no readable one (a run stopped before its layout)."""
    try:
        then = saved_layout(folder)
    except ConfigError:  # unreadable: the run is listed with its configuration's own values
        return {}
    if then is None:
        return {}
    try:  # as a finished run's record writes it ('4x2', 'stage=4'); one device has none
        mesh = str(MeshShape.of(**dict(then["mesh"]))) if then["mesh"] else "none"  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return {"parallel.strategy": then["strategy"]}
    return {"parallel.strategy": then["strategy"], "parallel.mesh": mesh}


RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))  # a run's config.json: its sections, its preset


def _another_tools(nested: Any) -> bool:
    """JSON that is not the config.json a shardbench run writes (its sections, the model's and train's
    among them), but another tool's file of that name (a Hugging Face model folder's) that lies below DIR."""
    return not (isinstance(nested, dict) and nested.keys() <= RUN_FIELDS
                and all(isinstance(nested.get(section), dict) for section in ("model", "train")))


def _from_store(db: Path, writing: bool = False) -> tuple[list[ReportedRun], dict[str, Any]]:
    """A sweep.db's runs and meta; `writing`: the sweep or tune that holds the folder is the one reporting it."""
    with Store(db, read_only=True) as store:
        rows = store.runs()
        meta = {key: store.get_meta(key) for key in ("preset", "origin", "base_preset", "base", "axes", "created")}
        planned = [r for r in store.get_meta("runs") or [] if isinstance(r, dict)]
    done = {r.name for r in rows}
    left = [r for r in planned if r.get("name") not in done]
    meta["pending"] = [r.get("name") for r in left]  # a stopped or running sweep's runs to run
    meta["pending_overrides"] = [r.get("overrides") for r in left if isinstance(r.get("overrides"), dict)]
    meta["running"] = not writing and in_use(db.parent)  # another process writes the folder: runs to come
    return [reported(r, f"{db}: run {r.name}") for r in rows], meta


def _writer(meta: dict[str, Any]) -> str:
    """What writes a folder of runs, as its sweep.db's meta says: a tune's measurements or a sweep."""
    return "tune" if meta.get("origin") == "tune" else "sweep"


def _read_record(path: Path) -> RunRecord:
    """A run folder's summary.json through the one schema; anything but a JSON object is refused in one line
    (data, exit 4), as a config.json that is not one is."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path} is not a run's record (a JSON object), but a {type(data).__name__}")
    if data.get("status") != "complete":  # every record train writes says so; `{}` was counted a complete run
        raise DataError(f"{path} is not a finished run's record: its status is {data.get('status')!r}, where a "
                        f"record shardbench train wrote says 'complete'; remove it, or train the run again")
    return from_json(data, str(path))


def _record_settings(record: RunRecord) -> dict[str, Any]:
    """The settings a record gives of itself, for a run folder without config.json: what ran (strategy, mesh,
    devices, SPMD style, model kind) and the global batch it measured."""
    given = {"model.kind": record.model, "parallel.strategy": record.strategy, "parallel.mesh": record.mesh,
             "parallel.devices": record.devices, "parallel.spmd": record.spmd,
             "train.batch_size": (record.measurements or Measurements()).global_batch}
    return {k: v for k, v in given.items() if v not in (None, "")}


def _relative(folder: Path, root: Path) -> str:
    return folder.relative_to(root).as_posix()


@dataclass
class Found:
    """What a folder of runs holds: its runs, the sweeps below it whose runs came from their sweep.db, and the
    config.json files that are not a run's (named, then left out)."""

    runs: list[ReportedRun]
    sweeps: list[str]
    skipped: list[str]
    base: dict[str, Any] = dataclass_field(default_factory=dict)  # what every run was given alike (`_held_fixed`)


def _below(folder: Path, places: list[Path]) -> bool:
    return any(place == folder or place in folder.parents for place in places)


def _from_folders(root: Path, skip: Path) -> Found:
    # A sweep below DIR (sweeps copied into one folder to be reported together) is read from its sweep.db: its
    # refused and failed runs are there alone, with no folder of their own. One whose sweep.db holds no run yet
    # is read from its folders, as DIR is.
    sweeps: list[Path] = []
    placed: list[tuple[ReportedRun, str]] = []  # each run, and where it lies (its name where names clash)
    bases: list[dict[str, Any]] = []  # what each sweep held fixed
    for db in sorted(root.rglob("sweep.db")):
        if db.parent == root or skip in db.parents:
            continue
        stored, meta = _from_store(db)
        if stored:
            sweeps.append(db.parent)
            bases.append(meta.get("base") or {})
            for run in stored:
                folder = db.parent / "runs" / run.name
                placed.append((dataclasses.replace(run, folder=folder if folder.is_dir() else None),
                               f"{_relative(db.parent, root)}/{run.name}"))
    from_sweeps = len(placed)  # the runs read from a sweep's store come first; those after lie outside any
    for summary in sorted(root.rglob("summary.json")):
        if skip in summary.parents or _below(summary.parent, sweeps):
            continue
        record = _read_record(summary)
        saved = summary.with_name("config.json")
        config = _read_config(saved) if saved.exists() else _record_settings(record)
        placed.append((ReportedRun(str(record.run_name or _relative(summary.parent, root)),
                                   str(record.status or "complete"), None, None, {}, config, record,
                                   folder=summary.parent, configured=saved.exists()),
                       _relative(summary.parent, root)))
    # Two runs of one name (the same sweep's run copied from two sweeps, or two sweeps' runs of one grid): each
    # is named by where it lies.
    names = [r.name for r, _ in placed]
    runs = [dataclasses.replace(r, name=where) if names.count(r.name) > 1 else r for r, where in placed]
    # A run folder (it has the config.json a run writes first) without summary.json did not finish: it is
    # listed among the failed runs, never silently left out. Another tool's config.json is named and left out.
    skipped = []
    for saved in sorted(root.rglob("config.json")):
        if skip in saved.parents or saved.with_name("summary.json").exists() or _below(saved.parent, sweeps):
            continue
        nested = _read_json(saved)  # read once: whose file it is, then its fields
        if _another_tools(nested):
            skipped.append(_relative(saved.parent, root) or ".")
            continue
        runs.append(ReportedRun(_relative(saved.parent, root), "failed", INCOMPLETE,
                        "no summary.json: the run did not finish (stopped, killed, or still running)", {},
                        _flat_config(nested, saved), None, folder=saved.parent,
                        started=_started_layout(saved.parent)))
    # A folder keeps no list of swept fields: they are the fields whose values differ between the runs. A run
    # without config.json has only its record's few settings: a field it lacks is unknown there, not different.
    keys = sorted({k for r in runs for k in r.settings})
    swept = [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True) for r in runs
                                     if r.configured or k in r.config}) > 1]
    return Found([dataclasses.replace(r, overrides={k: r.config.get(k) for k in swept
                                                    if r.configured or k in r.config}) for r in runs],
                 [_relative(s, root) for s in sweeps], skipped,
                 _held_fixed(bases, runs[from_sweeps:], set(swept)))


def _held_fixed(bases: list[dict[str, Any]], loose: list[ReportedRun], swept: set[str]) -> dict[str, Any]:
    """What a folder's runs were all given alike: the settings every sweep below it held fixed (its store's base:
    `--steps 6` given to two sweeps reported together) with one value, which every run found outside a sweep,
    with its config.json, shares too. Nothing for a folder of loose runs alone: no run says what it was given."""
    if not bases:
        return {}
    fixed = {k: v for k, v in bases[0].items()
             if k not in swept and k not in NOISE and all(k in b and b[k] == v for b in bases[1:])}
    return {k: v for k, v in fixed.items() if all(r.config.get(k) == v for r in loose if r.configured)}


def _metrics(folder: Path) -> Path | None:
    """A run folder's metrics.jsonl: in its tensorboard/, or beside its summary.json as the runs kept under
    benchmarks/data have it; None where it has none."""
    return next((m for m in (folder / "tensorboard" / "metrics.jsonl", folder / "metrics.jsonl") if m.is_file()),
                None)


def _read_losses(metrics: Path) -> tuple[tuple[int, float], ...] | None:
    """(step, train loss) as logged in `metrics`; None where it cannot be read. A line that is not a JSON object
    (the last one a crashed run was writing, followed by its resumed run's) is passed over, not the whole log."""
    try:
        text = metrics.read_text()
    except (OSError, ValueError):
        return None  # unreadable scalars: compared on the record's own losses only
    losses = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if (isinstance(row, dict) and isinstance(row.get("train/loss"), (int, float))
                and isinstance(row.get("step"), int)):
            losses.append((row["step"], float(row["train/loss"])))
    return tuple(losses)


def _inputs(run: ReportedRun, sweep_dir: Path) -> dict[str, str]:
    """What a run read that its settings do not say, as its folder's records give it: the data's digest
    (data.json's sha1) and a model of your own's file's (model.json's sha256). Found where its losses are."""
    places = [run.folder] if run.folder is not None else [sweep_dir / "runs" / run.name, sweep_dir / run.name]
    folder = next((p for p in places if (p / "data.json").is_file()), None)
    if folder is None:
        return {}
    found: dict[str, str] = {}
    for name, key in (("data.json", "sha1"), ("model.json", "sha256")):
        try:
            record = _read_json(folder / name) if (folder / name).is_file() else None
        except DataError:  # damaged: the run is reported, its inputs unknown (as a folder without them)
            continue
        if isinstance(record, dict) and isinstance(record.get(key), str):
            found[name.removesuffix(".json")] = record[key]
    return found


def _logged_losses(run: ReportedRun, sweep_dir: Path) -> tuple[tuple[int, float], ...] | None:
    """The run's logged train losses. A run read from a folder of runs has them in the folder its summary.json
    lies in and nowhere else: the record's `out` and the config's `train.out` name where it was first written,
    which may hold another run's (an earlier run of the same name), and so may a folder of its name beside it;
    which of those was found would depend on which parent folder is reported. A run of a sweep.db has them under
    the sweep's runs/, at the folder's own path, or where the record says it wrote (resolved from the working
    directory)."""
    places = [run.folder] if run.folder is not None else [
        sweep_dir / "runs" / run.name, sweep_dir / run.name,
        *(Path(p) for p in (run.rec.out, run.config.get("train.out")) if p)]
    metrics = next((m for m in map(_metrics, places) if m is not None), None)
    return None if metrics is None else _read_losses(metrics)


def load_runs(sweep_dir: Path, skip: Path | None = None,
              writing: bool = False) -> tuple[list[ReportedRun], dict[str, Any]]:
    """The runs in store order (path order for a plain folder of runs) and the sweep's meta."""
    if not sweep_dir.is_dir():
        what = "is a file, not a folder of runs" if sweep_dir.exists() else "no such directory"
        raise ShardbenchError(f"{sweep_dir}: {what}")
    runs, meta = _from_store(sweep_dir / "sweep.db", writing) if (sweep_dir / "sweep.db").exists() else ([], {})
    if not runs and meta.get("pending") and meta.get("running"):
        pending = meta["pending"]
        raise ShardbenchError(
            f"{sweep_dir}: no run recorded yet: the {_writer(meta)} writing it is still running its first of "
            f"{len(pending)} planned run{'' if len(pending) == 1 else 's'}; report it once a run has ended")
    if not runs and meta.get("pending"):
        pending = meta["pending"]
        raise ShardbenchError(
            f"{sweep_dir}: no run recorded yet: the sweep planned {len(pending)} run{'' if len(pending) == 1 else 's'} "
            f"({', '.join(pending[:5])}{', ...' if len(pending) > 5 else ''}) and was stopped before the first "
            f"ended; finish it with 'shardbench sweep --out {sweep_dir} --resume', then report it")
    if not runs:
        found = _from_folders(sweep_dir, skip or sweep_dir / "report")
        runs, meta = found.runs, {"sweeps": found.sweeps, "skipped": found.skipped, "base": found.base}
    if runs and not any(r.ok for r in runs) and all(r.error_kind == INCOMPLETE for r in runs):
        # Nothing but unfinished folders is nothing to report; they are named all the same.
        names = [r.name for r in runs]
        raise ShardbenchError(
            f"{sweep_dir}: no runs to report: {len(names)} run folder{'' if len(names) == 1 else 's'} without a "
            f"summary.json (unfinished, or stopped): {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}; "
            f"finish {'it' if len(names) == 1 else 'each'} with its train command and --resume, then report")
    if not runs:
        other = (f"; the config.json of {', '.join(meta['skipped'][:5])} is not a shardbench run's"
                 if meta.get("skipped") else "")
        raise ShardbenchError(f"{sweep_dir}: no runs to report (no runs in a sweep.db and no summary.json below "
                              f"it{other})")
    return [dataclasses.replace(r, losses=_logged_losses(r, sweep_dir), inputs=_inputs(r, sweep_dir)) if r.ok else r
            for r in runs], meta


PREDICTIONS = "plan-validation.json"  # written by `shardbench plan --validate DIR`


def with_predictions(runs: list[ReportedRun], sweep_dir: Path) -> list[ReportedRun]:
    """The runs with the planner's predictions of them, where `shardbench plan --validate` left some."""
    path = sweep_dir / PREDICTIONS
    if not path.exists():
        planned = plan_chart.tune_predictions(sweep_dir) or {}  # or those `shardbench tune` chose the runs by
        return [dataclasses.replace(r, predicted=planned.get(r.name)) for r in runs] if planned else runs
    saved = _read_json(path)
    predicted = saved.get("runs") if isinstance(saved, dict) else None
    if not isinstance(predicted, dict):
        raise ShardbenchError(f"{path} is not a plan validation (no 'runs' object): run shardbench plan --validate "
                              f"{sweep_dir} again, or remove it")
    return [dataclasses.replace(r, predicted=predicted.get(r.name)) for r in runs]


def unrecorded_values(pending: list[dict[str, Any]], swept: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The values a stopped sweep's runs not recorded yet would set, per field, that no recorded run has."""
    found: dict[str, list[Any]] = {}
    for overrides in pending:
        for key, value in overrides.items():
            if key not in NOISE and value not in swept.get(key, []) and value not in found.get(key, []):
                found.setdefault(key, []).append(value)
    return found


def swept_fields(runs: list[ReportedRun]) -> dict[str, list[Any]]:
    """Each swept field with its distinct values: numbers ascending, others in the order the runs first use them.
    A run folder without config.json gives only the few settings its record holds: it adds no value (no None) for
    the others."""
    fields: dict[str, list[Any]] = {}
    for key in dict.fromkeys(k for r in runs for k in r.overrides if k not in NOISE):
        values = list({json.dumps(v, sort_keys=True): v for v in
                       (r.overrides.get(key, r.config.get(key)) for r in runs
                        if key in r.overrides or key in r.config)}.values())
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        fields[key] = sorted(values) if numeric else values
    return fields


# ------------------------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class ReportPaths:
    """Where write_report put everything; charts maps a chart's name (e.g. "epoch_time") to its PNG."""

    directory: Path
    markdown: Path
    html: Path
    csv: Path  # runs.csv: the table's values as measured, for a spreadsheet or a data frame
    charts: dict[str, Path]
    clipped: dict[str, tuple[str, ...]] = dataclass_field(default_factory=dict)  # per chart: texts its edges cut
    incomplete: tuple[str, ...] = ()  # run folders without summary.json
    pending: tuple[str, ...] = ()  # a stopped sweep's planned runs that have not run
    skipped: tuple[str, ...] = ()  # folders below DIR whose config.json is not a run's (another tool's)
    differing: tuple[str, ...] = ()  # runs that should be the same computation but whose losses differ


def table_note(columns: tuple[Column, ...] | list[Column], runs: list[ReportedRun]) -> str:
    """The note under the runs table: what its figures are, for the columns and labels it shows."""
    keys = {c.key for c in columns}
    note = ("Throughput is the global batch over the median step, the same steady state as step time and MFU "
            "(the wall-clock rate, data loading and checkpoints included but not the train step's compilation, "
            "is the record's measurements.throughput.wall_examples_per_s). Byte figures are per device; comms are "
            "the bytes each device sends per training step on a ring, counted from the compiled step")
    if any(r.comms and not r.comms_sent for r in runs):
        note += " (\"payload\": the collectives' buffers, from a record written before bytes sent were kept)"
    note += (". Memory/device is the runtime peak where the backend reports one (\"peak\"), else XLA's compiled "
             "total: arguments + outputs − aliased + temporaries (\"compiled\").")
    if "epoch_s" in keys:
        note += (" Epoch time is the mean wall time per whole epoch, data loading included, evaluation excluded "
                 "('–' for a run that trained only part of one; the epoch chart projects it).")
    if keys & {"step_ms_predicted", "mem_mib_predicted"}:
        note += (" \"Predicted\" columns are the planner's predictions of the same runs (`shardbench plan "
                 "--validate`'s, or those `shardbench tune` chose them by).")
    return note


def wall_note(runs: list[ReportedRun]) -> str:
    """The table note's sentence on throughput figures marked "wall clock" ('' where none is)."""
    old = [r.name for r in runs if r.wall_rate and (r.images_per_s is not None or r.rate("units_per_s") is not None)]
    if not old:
        return ""
    return (f" Throughput marked \"wall clock\" ({', '.join(old)}) is not the batch over the median step: the "
            f"record, written before schema 2 and without a step time, has only the epochs' examples over their wall "
            f"time, data loading included.")


# Characters that Markdown reads as markup in running text: a backslash, code spans, emphasis, links, HTML tags
# (opened by "<"; a ">" inside a line, as in "float32 -> bfloat16", is plain text) and entities, strikethrough,
# and the table's own bars. Underscores are markup only at a word's edge (a_b__c is plain text), so a run name's
# inner underscores stay as they are.
MARKUP = re.compile(r"[\\`*\[\]<&~|]|_+")


def _escaped(found: re.Match[str]) -> str:
    text, start, end = found.string, found.start(), found.end()
    inner = found.group(0).startswith("_") and 0 < start and end < len(text) and text[start - 1].isalnum() \
        and text[end].isalnum()
    return found.group(0) if inner else "".join("\\" + c for c in found.group(0))


def md_text(text: str) -> str:
    """`text` as Markdown shows it literally on one line: an error message's "in <module>" is not read as an HTML
    tag (and dropped), nor "*args" as emphasis."""
    return MARKUP.sub(_escaped, text.replace("\n", " "))


def md_sentence(text: str) -> str:
    """A finding as Markdown shows it: its `code` spans as code, everything else literally (`md_text`)."""
    return "".join(part if part.startswith("`") and part.endswith("`") and len(part) > 1 else md_text(part)
                   for part in re.split(r"(`[^`\n]+`)", text))


def render_markdown(content: ReportContent) -> str:
    lines = [f"# {content.title}", "", content.source, "", "## What was swept", ""]
    lines += [f"- `{key}`: {md_text(text)}" for key, text in content.varied_text().items()] or [
        content.nothing_varied()]
    if content.unrecorded:
        lines += ["", content.unrecorded_text(lambda key: f"`{key}`", md_text)]
    if content.fixed:
        lines += ["", "Set the same for every run: " + ", ".join(f"`{k}` = {md_text(text)}"
                                                                  for k, text in content.fixed_text())]
    if content.findings:
        lines += ["", "## What the numbers say"]
        for heading, sentences in content.findings.items():
            lines += ["", f"### {md_text(heading)}", "", *(f"- {md_sentence(s)}" for s in sentences)]
    cols = content.columns
    lines += ["", "## Runs", "", "| " + " | ".join(c.label for c in cols) + " |",
              "|" + "|".join("---:" if c.numeric else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(md_text(c.text(run)) for c in cols) + " |" for run in content.runs]
    lines += ["", content.table_note]
    if content.failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- `{r.name}`: {md_text(r.error_kind or r.status)}: {md_text(r.error or 'no message')}"
                  for r in content.failed]
    lines += ["", "## Charts"]
    for chart in content.charts:
        title = md_text(chart.title)  # a run's name in a note or title is shown as written, never read as markup
        lines += ["", f"### {title}", "", f"![{title}]({chart.path.name})"]
        lines += ["", f"_{md_sentence(chart.note)}_"] if chart.note else []
    lines += [""] + [f"- {line}" for line in content.omitted] if content.omitted else []
    return "\n".join(lines) + "\n"


def _origin(meta: dict[str, Any]) -> str:
    """What a sweep's label names: 'preset lm-tiny', 'sweep preset strategies on vit-tiny', 'sweep file lm on
    lm-tiny', 'tune on vit-tiny' (a store from before the origin was kept: 'preset' and its label), and a model of
    your own ('preset vit-seed, with the model mymlp.py:build')."""
    label, origin, start = meta["preset"], meta.get("origin") or "preset", meta.get("base_preset")
    named = origin if origin == label else f"{origin} {label}"
    factory = (meta.get("base") or {}).get("model.factory")  # a model of your own: the preset gave the rest
    return (named + (f" on {start}" if origin != "preset" and start else "")
            + (f", with the model {Path(str(factory)).name}" if factory else ""))


def write_report(sweep_dir: Path, out_dir: Path | None = None, prices: PriceTable | None = None,
                 writing: bool = False) -> ReportPaths:
    """Write report.md, report.html and the charts into `out_dir` (default `<sweep_dir>/report`); `prices` (--prices)
    prices every run again (without it, each run's record says its cost). `writing`: the sweep or tune writing
    the folder reports it at its end (else a folder whose lock is held is reported as still running)."""
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep_dir / "report"
    runs, meta = load_runs(sweep_dir, skip=out, writing=writing)
    runs = with_costs(with_traces(with_bubbles(with_predictions(runs, sweep_dir)), sweep_dir), prices)
    writable_dir(out, "--out")
    swept = swept_fields(runs)
    complete = sum(r.ok for r in runs)
    preset = f" ({_origin(meta)})" if meta.get("preset") else ""
    below = ", ".join(f"`{name}`" for name in meta.get("sweeps", []))
    origin = (f"`sweep.db`{preset}" if "preset" in meta else
              f"the run folders below it{f' and the sweep.db of {below}' if below else ''}")
    count = f"{len(runs)} run{'' if len(runs) == 1 else 's'}"
    source = f"Read from {origin} in `{sweep_dir}`: {count}, {complete} complete, {len(runs) - complete} failed."
    pending = meta.get("pending") or []
    if pending:
        writer = _writer(meta)
        planned = (f"{len(pending)} planned run{'' if len(pending) == 1 else 's'} not recorded yet "
                   f"({', '.join(f'`{n}`' for n in pending[:5])}{', ...' if len(pending) > 5 else ''})")
        if meta.get("running"):
            source += f" The {writer} is still running: {planned}; this report shows the runs recorded so far."
        else:
            finish = ("`shardbench tune` with its flags and --resume" if writer == "tune" else
                      f"`shardbench sweep --out {sweep_dir} --resume`")
            source += f" The {writer} is unfinished: {planned}; {finish} finishes it."
    skipped = meta.get("skipped") or []
    if skipped:
        source += (f" Left out, as their config.json is not a shardbench run's: "
                   f"{', '.join(f'`{n}`' for n in skipped)}.")
    with staging.staged(out) as stage:  # no interruption leaves a half-written report (report.md comes last)
        charts, omitted = plots.write_charts(runs, stage)
        charts += plan_chart.write_chart(runs, stage)  # where the planner predicted these runs
        columns = shown(COLUMNS, runs)
        content = ReportContent(title=f"shardbench sweep report: {sweep_dir.resolve().name}", source=source,
                                runs=runs, columns=columns, swept=swept, findings=explain(runs, swept),
                                charts=charts, table_note=table_note(columns, runs) + wall_note(runs)
                                + cost_note(runs, prices) + runs_csv.NOTE,
                                omitted=tuple(omitted), base=meta.get("base") or {},
                                unrecorded=unrecorded_values(meta.get("pending_overrides") or [], swept))
        (stage / "report.md").write_text(render_markdown(content), encoding="utf-8")
        (stage / "report.html").write_text(html_page.render(content), encoding="utf-8")
        runs_csv.write_csv(content.runs, list(swept), stage / runs_csv.FILE)
        staging.publish(stage, out, last="report.md", stale=(*plots.FILES, plan_chart.FILE))
    markdown, page, table = out / "report.md", out / "report.html", out / runs_csv.FILE
    return ReportPaths(out, markdown, page, table, {c.name: out / c.path.name for c in content.charts},
                       {c.name: c.clipped for c in content.charts if c.clipped},
                       incomplete=tuple(r.name for r in content.runs if r.error_kind == INCOMPLETE),
                       pending=tuple(pending), skipped=tuple(skipped),
                       differing=tuple(f"{', '.join(eq.runs)} differ by {eq.largest:.1e} at {eq.where} "
                                       f"(tolerance {eq.tolerance:.0e}): see the report" for eq in differing(runs)))
