"""runs.csv: the report's table for a spreadsheet or a data frame. One row per run, failed runs included; the
values as measured (no thousands separators, no rounding, no units in the cells: each column's name gives its
unit), the swept settings as columns of their own, and the same columns for every sweep, so that a script reads
any report's file alike.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from shardbench.report.content import COLUMNS, ReportedRun
from shardbench.report.cost import cost

FILE = "runs.csv"
NOTE = f" Every value of this table, unrounded, is in `{FILE}` beside this report, for a spreadsheet or a data frame."

# Besides the table's columns, each after the one it qualifies: what the table writes inside a cell ("123.4
# (peak)", "0.11 (cache)"), and which price table priced the run's cost (the packaged one, or --prices FILE).
BESIDE = {"mem_mib": "memory_source", "compile_s": "compile_from_cache", "usd_epoch": "price_table"}


def header(swept: list[str]) -> list[str]:
    """run, status, the swept settings (dotted, as the flags name them), then every table column by its key (and
    BESIDE's), then the failed run's reason."""
    keys = [c.key for c in COLUMNS]
    rest = [name for key in keys[2:] for name in (key, BESIDE.get(key)) if name]
    return [*keys[:2], *swept, *rest, "error"]


def _cell(value: Any) -> Any:
    """A value as a CSV cell: empty for missing, JSON for a list or a mapping, the number's full precision."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True)
    return value


def row(run: ReportedRun, swept: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {c.key: c.value(run) for c in COLUMNS}
    values |= {key: run.overrides.get(key, run.config.get(key)) for key in swept}
    values["memory_source"] = run.memory[1] if run.memory[0] is not None else None
    values["compile_from_cache"] = run.compiled_from_cache if run.compile_s is not None else None
    priced = run.ok and cost(run).on_demand_usd is not None
    values["price_table"] = (cost(run).prices or "packaged") if priced else None
    values["error"] = None if run.ok else ": ".join(s for s in (run.error_kind, run.error) if s) or None
    return {key: _cell(value) for key, value in values.items()}


def write_csv(runs: list[ReportedRun], swept: list[str], path: Path) -> Path:
    """Write `runs` (in the report's order) to `path`."""
    fields = header(swept)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(row(run, swept) for run in runs)
    return path
