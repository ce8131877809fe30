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
from dataclasses import dataclass
from pathlib import Path

from shardbench.errors import writable_dir

RUNS = Path("runs")


def stamped(name: str) -> Path:
    """runs/<name>-<YYYYmmdd-HHMMSS>, the local time now: a name, not yet a folder."""
    return RUNS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass(frozen=True)
class Claim:
    """A folder a command made for its output: `path`, and `top`, the outermost folder the claim made on the way
    (`path` itself, or a parent such as runs/ that did not exist yet)."""

    path: Path
    top: Path


def claim(base: Path) -> Claim:
    """Make the folder `base`, or, where it exists already, the first of base-2, base-3, ... that does not: the
    folder was made by this call (os.mkdir refuses one that exists), so no other command holds it. One line
    naming the folder where its parent cannot be written (`errors.writable_dir`)."""
    top = base
    while not top.parent.exists() and top.parent != top.parent.parent:
        top = top.parent
    writable_dir(base.parent, "--out")
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return Claim(path, top if top != base else path)
    raise AssertionError("unreachable")  # itertools.count never ends


@contextlib.contextmanager
def released_on_error(claimed: Claim | None) -> Iterator[None]:
    """Where the block raises, remove what `claim` made if nothing was written into it yet (a command refused
    after naming its folder leaves no folder behind, runs/ included where the claim made it); a folder that holds
    anything is kept. None: nothing was claimed (--out was given)."""
    try:
        yield
    except BaseException:
        folder = claimed.path if claimed is not None else None
        while folder is not None:
            try:
                folder.rmdir()  # only an empty folder: rmdir refuses any other
            except OSError:
                break
            folder = None if folder == claimed.top else folder.parent
        raise
