"""The sweep store: one SQLite file (`<sweep_dir>/sweep.db`) with a row per finished run and the sweep's meta,
and, for a sweep whose runs are cluster jobs, each run's latest job and its state.

Every `add` commits at once, so a sweep killed at any moment keeps every run it had finished.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from shardbench.errors import ConfigError, DataError, FileFault

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
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    submitted REAL,
    updated REAL
);
"""

STATUSES = ("complete", "failed")
# Every kind runner.classify and slurm.row_for give (runner.EXIT_KINDS, slurm_jobs.KILLED_KINDS) must be here.
ERROR_KINDS = ("config", "data", "diverged", "processes", "timeout", "killed", "oom", "crash")


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


@dataclass(frozen=True)
class JobRow:
    """The latest cluster job of a run (sweeps with `--executor slurm`): its id and the state last seen."""

    name: str
    job_id: str  # SLURM's id, "123" or "123_4" for an element of a job array
    state: str  # SLURM's state word (PENDING, RUNNING, COMPLETED, TIMEOUT, ...), or SUBMITTED
    reason: str | None  # SLURM's reason or note, when it gave one
    submitted: float  # unix time
    updated: float  # when the state was last read


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _open_to_read(path: Path) -> sqlite3.Connection:
    """A sweep database opened only to read it (a report of a sweep in a folder it cannot write to: a read-only
    copy, another user's runs): no switch to WAL and no tables created, which are writes. SQLite's read-only mode
    first; where even that cannot open the file (a WAL database in a folder where SQLite cannot make its
    shared-memory file), the file as it stands (`immutable`: rows a killed sweep left in its -wal file alone are not
    seen then). A database with no -wal file beside it (no connection open, every write checkpointed into the file)
    is read as the file stands at once: SQLite's read-only mode would leave a -wal and a -shm file beside it, which
    it may not delete. An empty database reads as a sweep with no runs."""
    failure: sqlite3.Error | None = None
    wal = path.with_name(path.name + "-wal")
    for mode in ("mode=ro", "immutable=1") if wal.exists() else ("immutable=1",):
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True, timeout=30.0)
        except sqlite3.Error as err:
            failure = err
            continue
        try:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError as err:  # cannot open or lock it this way: the next way
            db.close()
            failure = err
            continue
        except sqlite3.DatabaseError as err:
            db.close()
            raise DataError(f"{path} is not a sweep database ({err})") from None
        if not tables:
            db.close()
            db = sqlite3.connect(":memory:")
            db.executescript(SCHEMA)
        elif not {"runs", "meta"} <= tables:
            db.close()
            raise DataError(f"{path} is not a sweep database (its tables are {', '.join(sorted(tables))})")
        return db
    raise DataError(f"{path}: cannot open it to read ({failure})")


class Store:
    """Opens (or creates) a sweep database; rows come back in the order they were added. `read_only`: only to read
    an existing one (a report), changing nothing in it or beside it."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only:
            self._db = _open_to_read(self.path)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A generous busy timeout: a report reading the file while the sweep writes must wait, not fail.
        self._db = sqlite3.connect(self.path, timeout=30.0)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(SCHEMA)
            self._db.commit()
        except sqlite3.OperationalError as err:  # a database it cannot write to (or lock): not a damaged one
            self._db.close()
            raise FileFault(f"{self.path}: cannot write to it ({err}): give --out a folder you can write to") from None
        except sqlite3.DatabaseError as err:
            self._db.close()
            raise DataError(f"{self.path} is not a sweep database ({err}): remove it, or give --out a new folder "
                            f"for the sweep") from None

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

    def set_job(self, name: str, job_id: str, state: str, reason: str | None = None,
                submitted: float | None = None) -> None:
        """Record a run's job (a new submission replaces the run's earlier job) or its latest state."""
        now = time.time()
        with self._db:
            self._db.execute(
                "INSERT INTO jobs (name, job_id, state, reason, submitted, updated) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET job_id = excluded.job_id, state = excluded.state, "
                "reason = excluded.reason, submitted = COALESCE(?, jobs.submitted), updated = excluded.updated",
                (name, job_id, state, reason, submitted if submitted is not None else now, now, submitted),
            )

    def drop_job(self, name: str) -> None:
        """Forget a run's job: the run was recorded since by a run here (a SLURM sweep resumed locally), so the job's
        state is no longer the run's."""
        with self._db:
            self._db.execute("DELETE FROM jobs WHERE name = ?", (name,))

    def jobs(self) -> dict[str, JobRow]:
        """{run name: its latest job}."""
        rows = self._db.execute("SELECT name, job_id, state, reason, submitted, updated FROM jobs")
        return {name: JobRow(name, job_id, state, reason, submitted, updated)
                for name, job_id, state, reason, submitted, updated in rows}

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


# The lock file of a folder a sweep or a tune is writing: the writer holds an exclusive flock on it while it runs,
# and the kernel lets go of it when the process ends, however it ends. A copied or finished folder's lock file is
# held by no one.
LOCK = ".lock"


def lock_runs(out: Path, command: str) -> IO[str]:
    """Hold `out` for one sweep or tune: a second one there is refused in one line while this one runs. The
    handle holds the lock; closing it, or the process ending, lets go. A report reading whether the folder is in
    use holds the lock for an instant: a writer starting in that instant tries again, for up to half a second."""
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / LOCK, "w")
    for _ in range(10):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            time.sleep(0.05)
    handle.close()
    raise ConfigError(f"--out {out}: a sweep or tune is running there (it holds {out / LOCK}); {command} again "
                      f"with --resume once it has ended, or choose another --out")


def in_use(out: Path) -> bool:
    """Whether a sweep or tune is writing `out` now (it holds the folder's lock)."""
    try:
        handle = open(out / LOCK)
    except OSError:
        return False  # no lock file: no sweep or tune ever held the folder
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False  # a file system without locks: say nothing of a writer
        return False
