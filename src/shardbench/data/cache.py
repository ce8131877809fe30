"""On-disk cache of decoded dataset arrays (.npz), keyed by the source file's identity.

Decoding 60,000 JPEGs takes seconds; loading the cached arrays takes a fraction of that.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from shardbench.errors import DataError

log = logging.getLogger(__name__)


def passed_over(name: str) -> bool:
    """Whether a dataset folder's readers pass over a file or folder of this name: .DS_Store, macOS ._* resource
    forks, an editor's lock link (.#notes.md), the __MACOSX folder a Finder zip unpacks beside its contents and the
    like are never data."""
    return name.startswith(".") or name == "__MACOSX"


def _tree_listing(root: Path) -> list[str]:
    """(relative path, size, mtime_ns) of every file under `root`, and every folder's relative path, sorted; what
    the readers pass over (`passed_over`) is left out, as they leave it.

    A directory's own mtime only changes when its direct entries do, so an edited image deep
    in the tree would go unnoticed without listing the files themselves; a folder is listed itself so that a new
    empty one (an image folder's class without images, which the reader refuses) changes the listing too.
    """
    rows = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):  # as the reader walks it
        dirnames[:] = sorted(name for name in dirnames if not passed_over(name))
        rows.extend(f"{os.path.relpath(os.path.join(dirpath, name), root)}/" for name in dirnames)
        for name in sorted(filenames):
            if passed_over(name):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:  # listed, so a link whose target is gone
                raise DataError(f"{full}: is a link to {os.readlink(full)}, which does not exist: remove the link "
                                f"or point it at the file it stands for") from None
            except OSError as e:  # a link to itself, or round a circle of links (ELOOP), unreadable
                raise DataError(f"{full}: cannot be read ({e.strerror}): remove it, or replace it with the file it "
                                f"stands for") from None
            rows.append(f"{os.path.relpath(full, root)}\0{st.st_size}\0{st.st_mtime_ns}")
    return rows


def _digest(*parts: str) -> hashlib._Hash:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h


def cache_key(source: Path, *, loader: str, version: int, image_size: int, extra: str = "") -> str:
    """sha256 over the resolved path, size and mtime_ns of `source`, the image size, loader and `extra`."""
    resolved = source.resolve()
    st = resolved.stat()
    h = _digest(loader, str(version), str(image_size), extra, str(resolved), str(st.st_size), str(st.st_mtime_ns))
    if resolved.is_dir():
        for row in _tree_listing(resolved):
            h.update(row.encode())
            h.update(b"\n")
    return h.hexdigest()


def source_id(source: Path, *, loader: str, image_size: int, extra: str = "") -> str:
    """What a cache entry was decoded from, whatever its contents then: the resolved path, the loader, the image size
    and `extra`. An entry of one source with another key, written before the source last changed, was decoded from
    an earlier state of it: no run can ask for it again."""
    return _digest(loader, str(image_size), extra, str(source.resolve())).hexdigest()[:12]


def cache_file(cache_dir: Path, loader: str, source: str, key: str) -> Path:
    return cache_dir / f"{loader}-{source}-{key[:32]}.npz"


def newest_change_ns(source: Path) -> int:
    """When `source` last changed, as far as its files say: its own mtime_ns, and a folder's files' newest."""
    resolved = source.resolve()
    times = [resolved.stat().st_mtime_ns]
    if resolved.is_dir():
        times += [int(row.rsplit("\0", 1)[1]) for row in _tree_listing(resolved) if "\0" in row]
    return max(times)


def remove_stale(path: Path, changed_ns: int) -> list[Path]:
    """Deletes the entries of `path`'s source (see `source_id`) other than `path` that were written before the
    source last changed (`changed_ns`), and returns them. An entry written since is another copy's of the same path
    (a cluster node's own copy of the data, in a cache they share), or another shardbench version's: kept."""
    loader_source = path.name.rsplit("-", 1)[0]
    removed = []
    for p in path.parent.glob(f"{loader_source}-*.npz"):
        if p == path:
            continue
        with contextlib.suppress(OSError):  # gone already, or another user's in a shared cache: theirs to remove
            if p.stat().st_mtime_ns < changed_ns:
                p.unlink()  # a run still reading it has it open: its arrays are read at once
                removed.append(p)
    return removed


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays stored at `path`, or None if it is missing or unreadable (then it is rebuilt)."""
    if not path.is_file():
        return None
    try:
        # allow_pickle=False: a cache file is data, never code; object arrays are refused.
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        log.warning("ignoring unreadable cache file %s (%s); rebuilding it", path, e)
        return None


def temp_beside(path: Path, suffix: str) -> tuple[int, Path]:
    """An open new file (its descriptor and path) in `path`'s folder, to be renamed onto `path` once complete. It
    is created as any file of this process is (0666 less the umask, applied by the system), not 0600 as mkstemp
    makes it, so that the others sharing a cache can read what it becomes."""
    while True:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> bool:
    """Writes `arrays` as an uncompressed .npz via a temp file and os.replace (atomic); whether it was written.

    A failure to write (read-only or full disk) only costs the next run its speed-up, so it
    is logged rather than raised.
    """
    tmp_name: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = temp_beside(path, ".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp_name, path)
        tmp_name = None
        return True
    except OSError as e:
        log.warning("could not write the cache file %s (%s); continuing without it", path, e)
        return False
    finally:
        if tmp_name is not None:
            tmp_name.unlink(missing_ok=True)


def cached_arrays(
    source: Path,
    cache_dir: Path,
    *,
    loader: str,
    version: int,
    image_size: int,
    build: Callable[[], dict[str, np.ndarray]],
    required: tuple[str, ...] = (),
    extra: str = "",
) -> dict[str, np.ndarray]:
    """The arrays for `source` from the cache, or from `build()` (then stored for next time).

    A cached file lacking any of the `required` names counts as corrupt and is rebuilt.
    """
    path = cache_file(
        cache_dir, loader, source_id(source, loader=loader, image_size=image_size, extra=extra),
        cache_key(source, loader=loader, version=version, image_size=image_size, extra=extra),
    )
    arrays = load_arrays(path)
    if arrays is not None and all(name in arrays for name in required):
        log.info("loaded decoded arrays from the cache %s", path)
        return arrays
    arrays = build()
    if save_arrays(path, arrays) and (stale := remove_stale(path, newest_change_ns(source))):
        log.info("removed %d cache file(s) decoded from an earlier state of %s: %s", len(stale), source,
                 ", ".join(p.name for p in stale))
    return arrays
