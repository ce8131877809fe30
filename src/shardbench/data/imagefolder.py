"""Image-folder datasets (`<split>/<class>/<image>`) from a directory or a tar, decoded with Pillow.

Tars are read member by member in memory, never extracted; decoded arrays are cached with `cache`.
"""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import multiprocessing
import os
import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from shardbench.data import cache
from shardbench.data.arrays import ImageArrays, ImageDataset, split_train_val
from shardbench.errors import DataError
from shardbench.subprocs import terminated_as_interrupt

log = logging.getLogger(__name__)

# Bump when decoding or layout rules change, so old cache files are not reused.
_LOADER_VERSION = 2  # 2: a tar's linked members are read (they were dropped), high-bit images refused
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
_ARCHIVES = "a .tar, .tar.gz (.tgz), .tar.bz2 or .tar.xz archive"
# A tar's compression, by its file's first bytes (whatever its name says); none of these: a plain tar, whose first
# bytes are its first member's name (bzip2's is checked to its block's magic, as "BZh" could begin a name).
_DECOMPRESS = {rb"\x1f\x8b": gzip.open, rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)": bz2.open, rb"\xfd7zXZ\x00": lzma.open}
_NOT_READ = {rb"PK\x03\x04": "a zip archive", rb"\x28\xb5\x2f\xfd": "compressed with zstandard",
             rb"7z\xbc\xaf\x27\x1c": "a 7-Zip archive"}
_VAL_NAMES = ("val", "valid", "validation")
_SPLITS = ("train", "test", *_VAL_NAMES)
_EXPECTED = ("expected <root>/train/<class>/<image> and <root>/test/<class>/<image> "
             "(optionally <root>/val/...), possibly inside one top-level folder")
# Decoding in worker processes pays off only past their start-up cost (~0.5 s); small trees
# (tests, toy datasets) are decoded inline.
_PARALLEL_MIN_FILES = 2048
_CHUNK = 512


@dataclass
class _File:
    """One file of the tree: its path parts, a name for messages, its bytes or disk path, and
    its position among the decoded files (-1 until it is handed to the decoder)."""

    parts: tuple[str, ...]
    where: str
    data: bytes | None = None
    path: Path | None = None
    index: int = -1

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.path is not None  # every _File is built with one of the two
        return self.path.read_bytes()


def _hidden(parts: Iterable[str]) -> bool:
    return any(cache.passed_over(p) for p in parts)


def _walk_folder(root: Path) -> Iterator[_File | tuple[str, ...]]:
    """Yields every file (as _File) and every directory (as its path parts) under `root`."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):  # a class folder may be a link
        rel = Path(dirpath).relative_to(root).parts
        for d in dirnames:
            yield rel + (d,)
        for name in filenames:
            path = Path(dirpath) / name
            yield _File(parts=rel + (name,), where=str(path), path=path)


def _walk_tar(path: Path) -> Iterator[_File | tuple[str, ...]]:
    """Like _walk_folder for a tar; each member's bytes are read in memory, nothing is extracted."""
    try:
        with path.open("rb") as f:
            magic = f.read(10)
        if kind := next((k for m, k in _NOT_READ.items() if re.match(m, magic)), None):
            raise DataError(f"{path}: is {kind}, which this reader does not open: unpack it and give the folder, or "
                            f"repack it as a tar (tar czf data.tar.gz FOLDER)")
        opener = next((o for m, o in _DECOMPRESS.items() if re.match(m, magic)), Path.open)
        # A forward-only stream ("r|") is ~1.5x faster than random access over gzip; GzipFile
        # (rather than "r|gz") raises on a truncated file instead of just stopping, as do bz2's and lzma's.
        with opener(path, "rb") as raw:
            with tarfile.open(fileobj=raw, mode="r|") as tf:
                read: dict[str, bytes] = {}  # every file's bytes by its normalised name: what links point at
                for member in tf:
                    parts = tuple(p for p in member.name.split("/") if p not in ("", "."))
                    if member.isdir():
                        yield parts
                    elif member.isfile():
                        f = tf.extractfile(member)
                        assert f is not None  # isfile() members always have a file object
                        read["/".join(parts)] = data = f.read()
                        if not _hidden(parts):
                            yield _File(parts=parts, where=f"{path}:{member.name}", data=data)
                    elif (member.islnk() or member.issym()) and not _hidden(parts):
                        # A hard link (tar stores a second name of a file so) or a symbolic link to an earlier
                        # member is that member's image under this name; they were dropped without a word.
                        yield _File(parts=parts, where=f"{path}:{member.name}",
                                    data=_link_target(read, parts, member, path))
                end = tf.offset
            raw.read()  # to the end: checks the gzip trailer and finds the total size
            # tarfile takes a header cut short for the end of the archive, which would load a
            # truncated download as a smaller dataset: insist on the end-of-archive block.
            if raw.tell() < end + 512:
                raise tarfile.ReadError(f"archive ends at byte {raw.tell()} without its end-of-archive block")
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as e:
        raise DataError(f"{path}: not a readable tar archive, it may be truncated ({e}); {_EXPECTED}") from e


def _link_target(read: dict[str, bytes], parts: tuple[str, ...], member: tarfile.TarInfo, path: Path) -> bytes:
    """The bytes of the earlier member a link member names: a hard link by its name in the archive, a symbolic one
    relative to the link's own folder."""
    base = [] if member.islnk() else list(parts[:-1])
    for p in member.linkname.split("/"):
        if p == "..":
            base = base[:-1]
        elif p not in ("", "."):
            base.append(p)
    target = "/".join(base)
    if target not in read:
        raise DataError(f"{path}:{member.name} links to {member.linkname}, which is not a file stored before it in "
                        f"the archive; store the image itself there (tar without -h keeps links as links)")
    return read[target]


def _find_root(files: list[_File], dirs: set[tuple[str, ...]], source: Path) -> tuple[str, ...]:
    """The prefix under which train/ and test/ live: () or one wrapping top-level folder."""
    tops = {f.parts[0] for f in files if len(f.parts) > 1} | {d[0] for d in dirs if d}
    tops = {t for t in tops if not _hidden((t,))}
    if "train" in tops or "test" in tops:
        return ()
    if len(tops) == 1:
        return (next(iter(tops)),)
    archives = sorted(f.parts[0] for f in files if len(f.parts) == 1 and f.parts[0].lower().endswith(_TAR_SUFFIXES))
    if not tops and archives:  # a folder that holds the dataset's tar, not its images
        raise DataError(f"{source}: no train/ or test/ folder, but it holds {archives[0]}: give the archive itself, "
                        f"--data imagefolder:{Path(source) / archives[0]}")
    found = ", ".join(sorted(tops)) or "nothing"
    raise DataError(f"{source}: no train/ or test/ folder (found {found}); {_EXPECTED}")


def _group(
    files: list[_File], dirs: set[tuple[str, ...]], root: tuple[str, ...], source: Path
) -> dict[str, dict[str, list[_File]]]:
    """split -> class -> files (sorted by name), with the layout rules enforced."""
    n = len(root)
    tree: dict[str, dict[str, list[_File]]] = {}
    for d in dirs:
        if d[:n] == root and len(d) in (n + 1, n + 2) and not _hidden(d):
            classes = tree.setdefault(d[n], {})
            if len(d) == n + 2:
                classes.setdefault(d[n + 1], [])
    # A tar may hold a name twice (`tar rf` appends a changed file): the last is the file, as `tar -x` leaves it.
    for f in {f.parts: f for f in files}.values():
        rest = f.parts[n:]
        if f.parts[:n] != root or len(rest) == 1 or rest[0] not in _SPLITS or _hidden(f.parts):
            continue  # outside the root, a README beside the splits, or a folder that is no split
        if len(rest) != 3:
            # rest[0] is the split; split/<file> or split/<class>/<sub>/<file> are both wrong.
            raise DataError(f"{f.where}: is {len(rest) - 1} level(s) below the split folder "
                            f"{rest[0]}/, expected exactly 2 (<split>/<class>/<image>)")
        tree.setdefault(rest[0], {}).setdefault(rest[1], []).append(f)

    present_val = [v for v in _VAL_NAMES if v in tree]
    if len(present_val) > 1:
        raise DataError(f"{source}: has both {' and '.join(present_val)} folders; keep only one validation split")
    splits: dict[str, dict[str, list[_File]]] = {}
    for split, name in (("train", "train"), ("test", "test"), ("val", present_val[0] if present_val else None)):
        if name is None:
            continue
        if name not in tree:
            found = ", ".join(sorted(tree)) or "no split folders"
            raise DataError(f"{source}: no {name}/ folder (found {found}); {_EXPECTED}")
        classes = tree[name]
        if not classes:
            raise DataError(f"{source}: {name}/ has no class folders; {_EXPECTED}")
        for cls, members in classes.items():
            if not members:
                raise DataError(f"{source}: class folder {name}/{cls}/ is empty; every class needs images")
            members.sort(key=lambda f: f.parts[-1])
        splits[split] = classes
    return splits


# Pillow's modes of more than 8 bits per sample (16-bit PNG/TIFF greys open as I;16 or I, float TIFFs as F).
HIGH_BIT_MODES = frozenset({"I", "F", "I;16", "I;16L", "I;16B", "I;16N", "I;16S", "I;32", "I;32B", "I;32L"})


def _decode(file: _File, image_size: int) -> np.ndarray:
    try:
        rgb = Image.open(io.BytesIO(file.read()))
        rgb.load()
        if rgb.mode in HIGH_BIT_MODES:  # convert("RGB") clips them: a 16-bit scan came out 99.6% white
            raise DataError(f"{file.where}: a {rgb.mode} image (16-bit or floating point samples), which this reader "
                            f"would clip to 8 bits; convert the images to 8 bits per channel (L, RGB, RGBA or P), "
                            f"scaled as you mean them")
        # convert() copies even when the mode is already RGB; skipping it saves ~10% per image.
        if rgb.mode != "RGB":
            rgb = rgb.convert("RGB")
        if rgb.size != (image_size, image_size):
            rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
        return np.asarray(rgb, dtype=np.uint8)
    except DataError:
        raise
    except Exception as e:  # Pillow raises OSError, ValueError, SyntaxError... for broken files
        said = re.sub(r" ?<[^<>]* object at 0x[0-9a-fA-F]+>", "", str(e))  # Pillow names its in-memory buffer
        raise DataError(f"{file.where}: cannot be decoded as an image ({type(e).__name__}: {said}); "
                        "replace or remove it") from e


def _decode_chunk(files: list[_File], image_size: int) -> tuple[np.ndarray, dict[int, str]]:
    """Decodes `files`; failures are returned, not raised, because a file may turn out to lie
    outside the layout (a stray notes.txt) once the whole tree is known."""
    images = np.zeros((len(files), image_size, image_size, 3), dtype=np.uint8)
    errors: dict[int, str] = {}
    for i, f in enumerate(files):
        try:
            images[i] = _decode(f, image_size)
        except DataError as e:
            errors[i] = str(e)
    return images, errors


def _num_workers() -> int:
    # One core stays with this process, which reads the tar (single-threaded) meanwhile.
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(16, cpus - 1))


class _Decoder:
    """Decodes candidate images in chunks, in worker processes once there are enough of them,
    so that decoding overlaps the (single-threaded) scan of a tar."""

    def __init__(self, image_size: int) -> None:
        self._image_size = image_size
        self._pending: list[_File] = []
        self._chunks: list[tuple[list[_File], Future[tuple[np.ndarray, dict[int, str]]] | None]] = []
        self._pool: ProcessPoolExecutor | None = None
        self._workers = _num_workers()
        self.count = 0

    def add(self, f: _File) -> None:
        f.index = self.count
        self.count += 1
        self._pending.append(f)
        if self._pool is None and self._workers and self.count >= _PARALLEL_MIN_FILES:
            # spawn, not fork: the parent may already run JAX's threads, which fork would break.
            self._pool = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"))
        if self._pool is not None and len(self._pending) >= _CHUNK:
            self._submit()

    def _submit(self) -> None:
        files, self._pending = self._pending, []
        fut = self._pool.submit(_decode_chunk, files, self._image_size) if self._pool else None
        self._chunks.append((files, fut))

    def finish(self) -> tuple[np.ndarray, dict[int, str]]:
        """All decoded images in `add` order, and the error message of each failed index."""
        if self._pending:
            self._submit()
        parts: list[np.ndarray] = []
        errors: dict[int, str] = {}
        start = 0
        for files, fut in self._chunks:
            result = None
            if fut is not None:
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    # Workers can die when the main module cannot be re-imported (e.g. a script
                    # piped through stdin); decoding here is slower but still correct.
                    log.warning("image decoding workers failed; decoding in this process instead")
            images, errs = result if result is not None else _decode_chunk(files, self._image_size)
            parts.append(images)
            errors.update({start + i: msg for i, msg in errs.items()})
            start += len(files)
        empty = np.zeros((0, self._image_size, self._image_size, 3), dtype=np.uint8)
        return (np.concatenate(parts) if parts else empty), errors

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _class_difference(split: str, train: list[str], other: list[str], source: Path) -> DataError:
    missing, extra = sorted(set(train) - set(other)), sorted(set(other) - set(train))
    return DataError(f"{source}: {split}/ classes differ from train/ (missing {missing}, extra {extra}); "
                     "every split needs the same class folders")


def _decode_tree(source: Path, image_size: int) -> dict[str, np.ndarray]:
    """Reads and decodes every split of the tree at `source` (folder or tar)."""
    files: list[_File] = []
    dirs: set[tuple[str, ...]] = set()
    decoder = _Decoder(image_size)
    # SIGTERM stops the decoding as Ctrl-C does, so that `close` ends the worker processes (by its default the
    # process died at once, and its workers ran on, orphaned).
    with terminated_as_interrupt():
        try:
            for entry in _walk_folder(source) if source.is_dir() else _walk_tar(source):
                if isinstance(entry, tuple):
                    dirs.add(entry)
                    continue
                files.append(entry)
                # Only files at least <split>/<class>/<image> deep can be images of the dataset;
                # they are decoded before the layout is known so decoding overlaps the scan.
                if len(entry.parts) >= 3 and not _hidden(entry.parts):
                    decoder.add(entry)
            splits = _group(files, dirs, _find_root(files, dirs, source), source)
            class_names = sorted(splits["train"])
            for split in ("test", "val"):
                if split in splits and sorted(splits[split]) != class_names:
                    raise _class_difference(split, class_names, sorted(splits[split]), source)
            all_images, errors = decoder.finish()
        finally:
            decoder.close()

    out: dict[str, np.ndarray] = {"class_names": np.array(class_names)}
    for split, classes in splits.items():
        order = [f for cls in class_names for f in classes[cls]]
        for f in order:
            if f.index in errors:
                raise DataError(errors[f.index])
        out[f"{split}_images"] = all_images[np.array([f.index for f in order], dtype=np.int64)]
        out[f"{split}_labels"] = np.concatenate(
            [np.full(len(classes[c]), i, dtype=np.int32) for i, c in enumerate(class_names)]
        )
    return out


def load_imagefolder(
    path: Path, cache_dir: Path, *, image_size: int, val_fraction: float, seed: int
) -> ImageDataset:
    """The image-folder dataset at `path` (a folder, or a tar: plain or compressed), resized to image_size.

    Without a val/ (valid/, validation/) split, `val_fraction` of train is carved off with the
    seed; the cache holds the arrays from before that split, so changing the seed still works.
    """
    if not path.exists():
        raise DataError(f"{path}: does not exist; expected a folder or {_ARCHIVES}")
    if not path.is_dir() and not path.name.lower().endswith(_TAR_SUFFIXES):
        raise DataError(f"{path}: is neither a folder nor {_ARCHIVES}; {_EXPECTED}")
    arrays = cache.cached_arrays(
        path, cache_dir, loader="imagefolder", version=_LOADER_VERSION, image_size=image_size,
        build=lambda: _decode_tree(path, image_size),
        required=("class_names", "train_images", "train_labels", "test_images", "test_labels"),
    )
    train_all = ImageArrays(arrays["train_images"], arrays["train_labels"])
    if "val_images" in arrays:
        train, val = train_all, ImageArrays(arrays["val_images"], arrays["val_labels"])
    else:
        train, val = split_train_val(train_all, val_fraction, seed)
    return ImageDataset(
        name=f"imagefolder:{path.name}",
        train=train,
        val=val,
        test=ImageArrays(arrays["test_images"], arrays["test_labels"]),
        class_names=tuple(str(n) for n in arrays["class_names"]),
    )
