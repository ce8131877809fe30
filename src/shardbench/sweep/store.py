"""The sweep store: one SQLite file (`<sweep_dir>/sweep.db`) with a row per finished run and the sweep's meta.

Every `add` commits at once, so a sweep killed at any moment keeps every run it had finished.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    error_kind TEXT,
    error TEXT,
    overrides_json TEXT NOT NULL,
    config_json TEXT NOT NULL,
    record_json TEXT,
    started REAL,
    finished REAL,
    wall_s REAL,
    position INTEGER
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""

STATUSES = ("complete", "failed")
ERROR_KINDS = ("config", "data", "diverged", "timeout", "killed", "oom", "crash")


@dataclass(frozen=True)
class RunRow:
    """One finished run of a sweep, complete or failed."""

    name: str  # unique within a sweep, e.g. "mesh_4_2_batch_1024"
    status: str  # "complete" | "failed"
    error_kind: str | None  # failed runs: one of ERROR_KINDS
    error: str | None  # failed runs: the one-line message
    overrides: dict[str, Any]  # the swept fields of this run, e.g. {"parallel.mesh": "4x2"}
    config: dict[str, Any]  # flattened full configuration {"section.field": value}
    record: dict[str, Any] | None  # the run's summary.json when complete
    started: float  # unix time
    finished: float
    wall_s: float  # the run's process wall time, start-up included


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class Store:
    """Opens (or creates) a sweep database; rows come back in the order they were added."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A generous busy timeout: a report reading the file while the sweep writes must wait, not fail.
        self._db = sqlite3.connect(self.path, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._db.commit()

    def add(self, row: RunRow) -> None:
        if row.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {row.status!r}")
        if row.status == "failed" and row.error_kind not in ERROR_KINDS:
            raise ValueError(f"error_kind must be one of {ERROR_KINDS}, got {row.error_kind!r}")
        with self._db:  # one transaction, committed on exit
            # A re-added name moves to the end: position records the order of adding, not of planning.
            self._db.execute(
                "INSERT OR REPLACE INTO runs (name, status, error_kind, error, overrides_json, config_json, "
                "record_json, started, finished, wall_s, position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "(SELECT COALESCE(MAX(position), -1) + 1 FROM runs))",
                (row.name, row.status, row.error_kind, row.error, _dump(row.overrides), _dump(row.config),
                 None if row.record is None else _dump(row.record), row.started, row.finished, row.wall_s),
            )

    def names(self) -> set[str]:
        return {name for (name,) in self._db.execute("SELECT name FROM runs")}

    def runs(self) -> list[RunRow]:
        rows = self._db.execute(
            "SELECT name, status, error_kind, error, overrides_json, config_json, record_json, started, finished, "
            "wall_s FROM runs ORDER BY position"
        )
        return [
            RunRow(name=name, status=status, error_kind=kind, error=error, overrides=json.loads(overrides),
                   config=json.loads(config), record=None if record is None else json.loads(record),
                   started=started, finished=finished, wall_s=wall_s)
            for name, status, kind, error, overrides, config, record, started, finished, wall_s in rows
        ]

    def set_meta(self, key: str, value: Any) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, _dump(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        found = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if found is None else json.loads(found[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
