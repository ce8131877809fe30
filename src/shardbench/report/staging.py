"""Writing a report's folder so that no interruption leaves a half-written report: every file is written into a
hidden folder inside it first, then moved into place, report.md last. A folder without report.md is an unfinished
report; one with it holds the files that report.md was written with."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = ".writing-"  # + the writer's process id


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_abandoned(out: Path) -> None:
    """Remove what writers that were killed left (their process is gone): a writer still running keeps its own."""
    for left in out.glob(f"{PREFIX}*"):
        pid = left.name[len(PREFIX):]
        if left.is_dir() and (not pid.isdigit() or not _alive(int(pid)) or int(pid) == os.getpid()):
            shutil.rmtree(left, ignore_errors=True)


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh hidden folder inside `out` to write the report's files into, removed whatever happens: the files
    `publish` moved out of it are in `out`, the rest are dropped."""
    _remove_abandoned(out)
    stage = out / f"{PREFIX}{os.getpid()}"
    stage.mkdir()
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def publish(stage: Path, out: Path, last: str, stale: Iterable[str]) -> None:
    """Move every file of `stage` into `out`, `last` after all the others, each move atomic (one filesystem).
    `out`'s earlier `last` goes first, and the `stale` files an earlier report made and this one did not (a chart
    left out this time), so that `out` holds no `last` while the files move or if the moves are cut short."""
    (out / last).unlink(missing_ok=True)
    made = {path.name for path in stage.iterdir()}
    for name in stale:
        if name not in made:
            (out / name).unlink(missing_ok=True)
    for path in sorted(stage.iterdir()):
        if path.name != last:
            os.replace(path, out / path.name)
    os.replace(stage / last, out / last)
