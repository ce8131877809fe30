"""The output folder of a command given no --out: runs/<name>-<time>, made by the command that names it.

Names are stamped to the second, so two commands started in the same second (two `train`s with other flags, a
script's loop) name the same folder. Each takes the folder by making it: where another process made it first,
the next of <name>-<time>-2, -3, ... is made instead, so no two commands ever write into one folder.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

from shardbench.errors import writable_dir

RUNS = Path("runs")


def stamped(name: str) -> Path:
    """runs/<name>-<YYYYmmdd-HHMMSS>, the local time now: a name, not yet a folder."""
    return RUNS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def claim(base: Path) -> Path:
    """Make the folder `base`, or, where it exists already, the first of base-2, base-3, ... that does not: the
    folder returned was made by this call (os.mkdir refuses one that exists), so no other command holds it.
    One line naming the folder where its parent cannot be written (`errors.writable_dir`)."""
    writable_dir(base.parent, "--out")
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")  # itertools.count never ends


@contextlib.contextmanager
def released_on_error(claimed: Path | None) -> Iterator[None]:
    """Where the block raises, remove the folder `claim` made if nothing was written into it yet (a command
    refused after naming it leaves no folder behind); one that holds anything is kept. None: nothing was claimed
    (--out was given)."""
    try:
        yield
    except BaseException:
        if claimed is not None:
            with contextlib.suppress(OSError):
                claimed.rmdir()  # only an empty folder: rmdir refuses any other
        raise
