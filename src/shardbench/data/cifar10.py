"""CIFAR-10 from the official python release (cifar-10-python.tar.gz): download, md5 check, parse.

The tarball is read in memory (never extracted); the parsed arrays are cached with `cache`.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import http.client
import io
import logging
import os
import pickle
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shardbench.data import cache
from shardbench.data.arrays import ImageArrays, ImageDataset, split_train_val
from shardbench.errors import DataError

log = logging.getLogger(__name__)

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
TARBALL_NAME = "cifar-10-python.tar.gz"
FOLDER_NAME = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
IMAGE_SIZE = 32
# Bump when the parsing changes, so old cache files are not reused.
_LOADER_VERSION = 1
_CHUNK = 1 << 20


def file_md5(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# The other releases of the same page (www.cs.toronto.edu/~kriz/cifar.html), by their published md5: the same
# images in another format, which this loader does not read.
OTHER_RELEASES = {"c32a1d4ab5d03f1284b67883e8d87530": "binary release (cifar-10-binary.tar.gz)",
                  "70270af85842c9e89bb428ec9976c926": "MATLAB release (cifar-10-matlab.tar.gz)"}


def check_md5(path: Path, md5: str) -> None:
    got = file_md5(path)
    if got in OTHER_RELEASES and md5 == MD5:
        raise DataError(f"{path}: is CIFAR-10's {OTHER_RELEASES[got]}; shardbench reads the python release, "
                        f"{TARBALL_NAME} (md5 {MD5}): give that file, or leave out the PATH to download it")
    if got != md5 and md5 == MD5 and _holds_images(path):  # an image-folder tar, such as cifar10-jpeg.tar.gz
        raise DataError(f"{path}: holds image files, not CIFAR-10's python release ({TARBALL_NAME}, md5 {MD5}): "
                        f"read it as an image folder, --data imagefolder:{path}")
    if got != md5:
        raise DataError(f"{path}: md5 {got} does not match the expected {md5}; delete it and download again")


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def _holds_images(path: Path, members: int = 64) -> bool:
    """Whether `path` is a tar (compressed or not) with an image among its first `members` files: never the python
    release, whose members are pickled batches."""
    try:
        with tarfile.open(path, "r:*") as tf:
            for i, member in enumerate(tf):
                if member.name.lower().endswith(_IMAGE_SUFFIXES):
                    return True
                if i + 1 >= members:
                    break
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        return False
    return False


def _unreachable(url: str, e: Exception) -> DataError:
    reason = getattr(e, "reason", None) or e
    return DataError(f"could not download {url} ({reason}): the URL could not be reached; "
                     "download it elsewhere and pass the local copy with --data cifar10:PATH")


def _fetch(url: str, out: BinaryIO, where: Path) -> str:
    """Streams `url` into `out` (the file `where`); returns the md5 of what was received."""
    h = hashlib.md5()
    try:
        resp = urllib.request.urlopen(url, timeout=60)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise _unreachable(url, e) from e
    with resp:
        while True:
            try:
                chunk = resp.read(_CHUNK)
            except (http.client.HTTPException, OSError) as e:  # connection dropped mid-way
                raise _unreachable(url, e) from e
            if not chunk:
                return h.hexdigest()
            h.update(chunk)
            try:
                out.write(chunk)
            except OSError as e:
                raise DataError(f"{where}: could not write the download ({e.strerror}); "
                                "free some disk space or choose another cache directory") from e


def download(url: str, dest: Path, md5: str) -> Path:
    """Downloads `url` to `dest`, checking its md5; `dest` only ever appears complete and verified."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as dest, so the final os.replace is an atomic rename on one filesystem.
    fd, tmp = cache.temp_beside(dest, ".part")
    try:
        log.info("downloading %s to %s", url, dest)
        with os.fdopen(fd, "wb") as out:
            got = _fetch(url, out, tmp)
        if got != md5:
            raise DataError(
                f"{url}: downloaded file has md5 {got}, expected {md5}; it was discarded, "
                "try again or pass a verified local copy with --data cifar10:PATH"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles only what the CIFAR batch files contain (dicts, lists, bytes, numpy arrays).

    A plain pickle.load would run arbitrary code from a user-supplied file.
    """

    # Taken from numpy's own reduce output: the module moved (numpy.core -> numpy._core in 2.0)
    # but both spellings appear in pickles.
    _RECONSTRUCT = np.zeros(1).__reduce__()[0]
    _SCALAR = np.float64(0).__reduce__()[0]
    _ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
        ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy.core.multiarray", "scalar"): _SCALAR,
        ("numpy._core.multiarray", "scalar"): _SCALAR,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        # Python 3 pickles of bytes at protocol 2 go through _codecs.encode.
        ("_codecs", "encode"): codecs.encode,
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}") from None


def _unpickle(f: BinaryIO, where: str) -> dict[bytes, Any]:
    try:
        obj = _SafeUnpickler(f, encoding="bytes").load()
    except Exception as e:  # any failure inside a corrupt pickle means the same thing to the user
        raise DataError(f"{where}: not a readable CIFAR-10 pickle ({type(e).__name__}: {e}); "
                        "replace it with a copy from the official cifar-10-python.tar.gz") from e
    if not isinstance(obj, dict):
        raise DataError(f"{where}: holds a {type(obj).__name__}, expected the CIFAR-10 batch dict")
    # The official Python 2 pickles give bytes keys; a file re-pickled under Python 3 gives str.
    return {(k.encode() if isinstance(k, str) else k): v for k, v in obj.items()}


def _parse_batch(d: dict[bytes, Any], where: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3072) channel-major rows -> uint8 (N, 32, 32, 3) HWC images and int32 labels."""
    data, labels = d.get(b"data"), d.get(b"labels")
    if data is None or labels is None:
        raise DataError(f"{where}: missing b'data' or b'labels'; expected an official CIFAR-10 batch file")
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * IMAGE_SIZE * IMAGE_SIZE:
        raise DataError(f"{where}: data has dtype {data.dtype} and shape {data.shape}; expected uint8 (N, 3072)")
    labels_arr = np.asarray(labels, dtype=np.int64)
    if labels_arr.shape != (data.shape[0],):
        raise DataError(f"{where}: {labels_arr.size} labels for {data.shape[0]} images; expected one label per image")
    if labels_arr.size and (labels_arr.min() < 0 or labels_arr.max() >= num_classes):
        raise DataError(f"{where}: labels span {labels_arr.min()}..{labels_arr.max()}; expected 0..{num_classes - 1}")
    # Rows are R plane, G plane, B plane, each 32x32 row-major: reshape to CHW then move C last.
    images = np.ascontiguousarray(data.reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1))
    return images, labels_arr.astype(np.int32)


def _parse_all(read: Callable[[str], dict[bytes, Any]], where: Callable[[str], str]) -> dict[str, np.ndarray]:
    meta = read(META_FILE)
    names = meta.get(b"label_names")
    if not isinstance(names, list) or not names:
        raise DataError(f"{where(META_FILE)}: no b'label_names' list; expected the official batches.meta")
    class_names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    parts = [_parse_batch(read(name), where(name), len(class_names)) for name in TRAIN_FILES]
    test_images, test_labels = _parse_batch(read(TEST_FILE), where(TEST_FILE), len(class_names))
    return {
        "train_images": np.concatenate([p[0] for p in parts]),
        "train_labels": np.concatenate([p[1] for p in parts]),
        "test_images": test_images,
        "test_labels": test_labels,
        "class_names": np.array(class_names),
    }


def _parse_tarball(path: Path) -> dict[str, np.ndarray]:
    wanted = {*TRAIN_FILES, TEST_FILE, META_FILE}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base in wanted and base not in found:
                    f = tf.extractfile(member)
                    assert f is not None  # isfile() members always have a file object
                    found[base] = f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"{path}: not a readable tar archive ({e}); expected {TARBALL_NAME}") from e
    missing = sorted(wanted - found.keys())
    if missing:
        raise DataError(f"{path}: missing {', '.join(missing)}; expected {FOLDER_NAME}/ with "
                        f"{', '.join(TRAIN_FILES)}, {TEST_FILE} and {META_FILE}")
    return _parse_all(lambda name: _unpickle(io.BytesIO(found[name]), f"{path}:{name}"),
                      lambda name: f"{path}:{name}")


def _checked_parse_tarball(path: Path, md5: str) -> dict[str, np.ndarray]:
    check_md5(path, md5)
    return _parse_tarball(path)


def _batches_folder(path: Path) -> Path:
    """The folder holding data_batch_1..: `path` itself or its cifar-10-batches-py child."""
    for candidate in (path, path / FOLDER_NAME):
        if (candidate / TRAIN_FILES[0]).exists() or (candidate / META_FILE).exists():
            return candidate
    raise DataError(f"{path}: no CIFAR-10 batch files found; expected {TARBALL_NAME}, "
                    f"a {FOLDER_NAME} folder or its parent")


def _parse_folder(folder: Path) -> dict[str, np.ndarray]:
    def read(name: str) -> dict[bytes, Any]:
        file = folder / name
        if not file.is_file():
            raise DataError(f"{file}: missing; expected {FOLDER_NAME}/ with "
                            f"{', '.join(TRAIN_FILES)}, {TEST_FILE} and {META_FILE}")
        with file.open("rb") as f:
            return _unpickle(f, str(file))

    return _parse_all(read, lambda name: str(folder / name))


def load_cifar10(
    source: Path | None,
    cache_dir: Path,
    *,
    val_fraction: float,
    seed: int,
    url: str = URL,
    md5: str = MD5,
) -> ImageDataset:
    """CIFAR-10 from `source` (tarball, batches folder or its parent), or downloaded into `cache_dir`.

    A tarball's md5 is checked whenever it is parsed; a cache hit for the same file (same path,
    size and mtime) skips the check because it was done when the cache was written.
    """
    if source is None:
        source = cache_dir / TARBALL_NAME
        if not source.exists():
            download(url, source, md5)
    if not source.exists():
        raise DataError(f"{source}: does not exist; expected {TARBALL_NAME} or a {FOLDER_NAME} folder")

    build: Callable[[], dict[str, np.ndarray]]
    if source.is_dir():
        key_path, extra = _batches_folder(source), ""
        build = functools.partial(_parse_folder, key_path)
    else:
        # The expected md5 is part of the key: a cache entry only vouches for the md5 it checked.
        key_path, extra = source, md5
        build = functools.partial(_checked_parse_tarball, source, md5)

    arrays = cache.cached_arrays(
        key_path, cache_dir, loader="cifar10", version=_LOADER_VERSION, image_size=IMAGE_SIZE, build=build,
        extra=extra,
        required=("train_images", "train_labels", "test_images", "test_labels", "class_names"),
    )
    train, val = split_train_val(ImageArrays(arrays["train_images"], arrays["train_labels"]), val_fraction, seed)
    return ImageDataset(
        name="cifar10",
        train=train,
        val=val,
        test=ImageArrays(arrays["test_images"], arrays["test_labels"]),
        class_names=tuple(str(n) for n in arrays["class_names"]),
    )
