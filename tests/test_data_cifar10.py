"""CIFAR-10 loader tests on small files in the official python-release format, made here."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import pickle
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shardbench.data import cifar10
from shardbench.data.arrays import ImageArrays, split_train_val
from shardbench.data.cifar10 import download, load_cifar10
from shardbench.data.sources import load_dataset, validate_spec
from shardbench.errors import ConfigError, DataError

PER_BATCH = 12
NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


def _batch(first_id: int, n: int) -> dict[bytes, object]:
    """n images whose R plane is a row-major ramp, G plane the image id and B plane 200."""
    data = np.empty((n, 3072), dtype=np.uint8)
    for k in range(n):
        data[k, :1024] = np.arange(1024) % 251
        data[k, 1024:2048] = (first_id + k) % 256
        data[k, 2048:] = 200
    labels = [(first_id + k) % 10 for k in range(n)]
    return {b"batch_label": b"fake", b"labels": labels, b"data": data,
            b"filenames": [f"img{first_id + k}.png".encode() for k in range(n)]}


def make_batches_folder(root: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(5):
        (folder / f"data_batch_{i + 1}").write_bytes(pickle.dumps(_batch(i * PER_BATCH, PER_BATCH), protocol=2))
    (folder / "test_batch").write_bytes(pickle.dumps(_batch(1000, PER_BATCH), protocol=2))
    meta = {b"label_names": NAMES, b"num_cases_per_batch": PER_BATCH, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder


def make_tarball(root: Path) -> tuple[Path, str]:
    folder = make_batches_folder(root / "src")
    tar_path = root / "cifar-10-python.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tf:
        tf.add(folder, arcname="cifar-10-batches-py")
    return tar_path, hashlib.md5(tar_path.read_bytes()).hexdigest()


@pytest.fixture
def tarball(tmp_path: Path) -> tuple[Path, str]:
    return make_tarball(tmp_path / "data")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture
def server(tarball: tuple[Path, str]) -> Iterator[str]:
    """Base URL of a real HTTP server on 127.0.0.1 serving the tarball's folder."""
    handler = functools.partial(_QuietHandler, directory=str(tarball[0].parent))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_tarball_pixels_come_back_hwc(tarball: tuple[Path, str], tmp_path: Path) -> None:
    path, md5 = tarball
    ds = load_cifar10(path, tmp_path / "cache", val_fraction=0.0, seed=0, md5=md5)
    assert ds.train.images.shape == (5 * PER_BATCH, 32, 32, 3) and ds.train.images.dtype == np.uint8
    assert ds.test.images.shape == (PER_BATCH, 32, 32, 3) and ds.test.labels.dtype == np.int32
    assert len(ds.val) == 0 and ds.num_classes == 10 and ds.class_names[1] == "automobile"
    img = ds.train.images[5]
    np.testing.assert_array_equal(img[..., 0], (np.arange(1024) % 251).reshape(32, 32))
    assert (img[..., 1] == 5).all() and (img[..., 2] == 200).all()
    np.testing.assert_array_equal(ds.train.labels[:12], np.arange(12) % 10)
    assert (ds.test.images[:, 0, 0, 1] == (1000 + np.arange(PER_BATCH)) % 256).all()


def test_folder_parent_and_tarball_agree(tarball: tuple[Path, str], tmp_path: Path) -> None:
    path, md5 = tarball
    folder = path.parent / "src" / "cifar-10-batches-py"
    loads = [load_cifar10(p, tmp_path / "cache", val_fraction=0.25, seed=3, md5=md5)
             for p in (path, folder, folder.parent)]
    for ds in loads[1:]:
        for split in ("train", "val", "test"):
            np.testing.assert_array_equal(getattr(ds, split).images, getattr(loads[0], split).images)
            np.testing.assert_array_equal(getattr(ds, split).labels, getattr(loads[0], split).labels)
    assert (len(loads[0].train), len(loads[0].val)) == (45, 15)


def test_split_sizes_and_seed() -> None:
    arrays = ImageArrays(np.zeros((50_000, 1, 1, 3), np.uint8), np.arange(50_000, dtype=np.int32))
    train, val = split_train_val(arrays, 0.1, seed=0)
    assert (len(train), len(val)) == (45_000, 5_000)
    assert sorted(np.concatenate([train.labels, val.labels]).tolist()) == list(range(50_000))
    again, other = split_train_val(arrays, 0.1, seed=0)[1], split_train_val(arrays, 0.1, seed=1)[1]
    np.testing.assert_array_equal(val.labels, again.labels)
    assert not np.array_equal(val.labels, other.labels)


def test_wrong_md5_of_a_given_tarball(tarball: tuple[Path, str], tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"md5 [0-9a-f]{32} does not match the expected 0{32}"):
        load_cifar10(tarball[0], tmp_path / "cache", val_fraction=0.1, seed=0, md5="0" * 32)


def test_an_image_folder_tar_given_as_cifar10_is_pointed_at_imagefolder(tmp_path: Path) -> None:
    """A tar of JPEGs (the image-folder form of CIFAR-10, cifar10-jpeg.tar.gz) given as cifar10:PATH was "md5 ...
    does not match ...; delete it and download again": a file of the user's own, and not a damaged download. The
    line says what it holds and how to read it."""
    import io
    import tarfile

    from PIL import Image

    from shardbench.data.cifar10 import MD5, TARBALL_NAME

    given = tmp_path / "cifar10-jpeg.tar.gz"
    with tarfile.open(given, "w:gz") as tf:
        for name in ("cifar10/train/cat/0.jpg", "cifar10/test/cat/1.jpg"):
            data = io.BytesIO()
            Image.new("RGB", (32, 32)).save(data, format="JPEG")
            info = tarfile.TarInfo(name)
            info.size = len(data.getvalue())
            tf.addfile(info, io.BytesIO(data.getvalue()))
    with pytest.raises(DataError) as err:
        load_cifar10(given, tmp_path / "cache", val_fraction=0.1, seed=0)
    assert str(err.value) == (f"{given}: holds image files, not CIFAR-10's python release ({TARBALL_NAME}, md5 "
                              f"{MD5}): read it as an image folder, --data imagefolder:{given}")


def test_missing_and_corrupt_files_are_named(tmp_path: Path) -> None:
    folder = make_batches_folder(tmp_path / "data")
    (folder / "data_batch_3").write_bytes(b"\x80\x02 this is not a pickle")
    with pytest.raises(DataError, match=r"data_batch_3: not a readable CIFAR-10 pickle"):
        load_cifar10(folder, tmp_path / "cache", val_fraction=0.1, seed=0)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DataError, match=r"data_batch_3: missing"):
        load_cifar10(folder, tmp_path / "cache", val_fraction=0.1, seed=0)


def test_pickles_cannot_run_code(tmp_path: Path) -> None:
    folder = make_batches_folder(tmp_path / "data")

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("echo pwned",))

    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Evil()}, protocol=2))
    with pytest.raises(DataError, match=r"test_batch: not a readable CIFAR-10 pickle .*refusing"):
        load_cifar10(folder, tmp_path / "cache", val_fraction=0.1, seed=0)


def test_another_release_of_cifar10_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The binary (or MATLAB) release given for the python one was "md5 ... does not match ...: delete it and
    download again", which does not help with a file of one's own: the line names the release it is and the one
    to give. (A file with the binary release's published md5 cannot be made here: a small file's md5 stands in
    for it in the table of releases.)"""
    from shardbench.data import cifar10

    other = tmp_path / "cifar-10-binary.tar.gz"
    other.write_bytes(b"the binary release's bytes")
    monkeypatch.setattr(cifar10, "OTHER_RELEASES", {cifar10.file_md5(other): "binary release (cifar-10-binary.tar.gz)"})
    with pytest.raises(DataError) as err:
        load_cifar10(other, tmp_path / "cache", val_fraction=0.1, seed=0)
    assert str(err.value) == (f"{other}: is CIFAR-10's binary release (cifar-10-binary.tar.gz); shardbench reads the "
                              f"python release, cifar-10-python.tar.gz (md5 c58f30108f718f92721af3b95e74349a): give "
                              f"that file, or leave out the PATH to download it")


def test_download_checks_md5_and_lands_atomically(server: str, tarball: tuple[Path, str], tmp_path: Path) -> None:
    path, md5 = tarball
    dest_dir = tmp_path / "downloads"
    dest = download(f"{server}/{path.name}", dest_dir / path.name, md5)
    assert dest.read_bytes() == path.read_bytes()
    assert os.listdir(dest_dir) == [path.name]
    assert _mode(dest) == _created_mode(tmp_path)  # readable by those who share the cache, as any file made here

    bad = dest_dir / "bad.tar.gz"
    with pytest.raises(DataError, match=r"md5 .* expected f{32}; it was discarded"):
        download(f"{server}/{path.name}", bad, "f" * 32)
    assert sorted(os.listdir(dest_dir)) == [path.name]  # no file and no leftover temp file


def test_download_reports_unreachable_url(tmp_path: Path, server: str) -> None:
    dest_dir = tmp_path / "downloads"
    with pytest.raises(DataError, match=r"could not be reached; .*--data cifar10:PATH"):
        download(f"{server}/no-such-file.tar.gz", dest_dir / "x.tar.gz", "0" * 32)
    with pytest.raises(DataError, match=r"could not download http://127.0.0.1:9/x"):
        download("http://127.0.0.1:9/x", dest_dir / "x.tar.gz", "0" * 32)
    assert os.listdir(dest_dir) == []


def test_no_source_downloads_into_the_cache_then_reuses_it(
    server: str, tarball: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, md5 = tarball
    cache_dir = tmp_path / "cache"
    first = load_cifar10(None, cache_dir, val_fraction=0.1, seed=0, url=f"{server}/{path.name}", md5=md5)
    assert (cache_dir / "cifar-10-python.tar.gz").read_bytes() == path.read_bytes()

    # A second run needs neither the network nor the tarball: the parsed arrays are cached.
    monkeypatch.setattr(cifar10, "download", lambda *a: pytest.fail("downloaded twice"))
    monkeypatch.setattr(tarfile, "open", lambda *a, **k: pytest.fail("tarball read despite the cache"))
    second = load_cifar10(None, cache_dir, val_fraction=0.1, seed=0, url="http://127.0.0.1:9/x", md5=md5)
    np.testing.assert_array_equal(first.train.images, second.train.images)
    np.testing.assert_array_equal(first.val.labels, second.val.labels)


def test_corrupt_cache_file_is_rebuilt(tarball: tuple[Path, str], tmp_path: Path) -> None:
    path, md5 = tarball
    cache_dir = tmp_path / "cache"
    first = load_cifar10(path, cache_dir, val_fraction=0.1, seed=0, md5=md5)
    (npz,) = cache_dir.glob("cifar10-*.npz")
    npz.write_bytes(b"PK\x03\x04 truncated")
    second = load_cifar10(path, cache_dir, val_fraction=0.1, seed=0, md5=md5)
    np.testing.assert_array_equal(first.test.images, second.test.images)
    with np.load(npz) as rebuilt:
        assert "train_images" in rebuilt.files


def test_cached_tarball_with_wrong_md5(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "cifar-10-python.tar.gz").write_bytes(b"partial download")
    with pytest.raises(DataError, match=r"cifar-10-python.tar.gz: md5 .* delete it and download again"):
        load_cifar10(None, cache_dir, val_fraction=0.1, seed=0)


def test_sources_spec(tarball: tuple[Path, str], tmp_path: Path) -> None:
    # The folder form: the spec carries no md5, and this tarball would fail the official one.
    path = tarball[0].parent / "src" / "cifar-10-batches-py"
    kw = dict(cache_dir=tmp_path / "cache", image_size=32, val_fraction=0.1, seed=0)
    ds = load_dataset(f"cifar10:{path}", num_classes=10, **kw)  # type: ignore[arg-type]
    assert ds.name == "cifar10" and len(ds.train) == 54
    with pytest.raises(ConfigError,
                       match=r"has 10 classes but the model is set up for 100; pass --model.num-classes 10"):
        load_dataset(f"cifar10:{path}", num_classes=100, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"cifar10 images are 32x32 .* --data.image-size 32"):
        load_dataset("cifar10", num_classes=10, **{**kw, "image_size": 64})  # type: ignore[arg-type]
    want = r"^unknown dataset 'foo': use cifar10, cifar10:PATH, imagefolder:PATH or synthetic \(images\), tokens-uniform"
    with pytest.raises(ConfigError, match=want):
        load_dataset("foo", num_classes=10, **kw)  # type: ignore[arg-type]
    validate_spec(f"cifar10:{path}")
    validate_spec("cifar10")
    with pytest.raises(DataError, match=r"does not exist"):
        validate_spec(f"cifar10:{tmp_path}/nope.tar.gz")
    with pytest.raises(ConfigError, match=r"empty PATH"):
        validate_spec("cifar10:")
    with pytest.raises(ConfigError, match=r"unknown dataset 'synthetic:x'"):
        validate_spec("synthetic:x")


def test_python2_pickles_and_old_numpy_names() -> None:
    """The official files are Python 2 pickles (str keys -> bytes) naming numpy.core.multiarray."""
    py2 = b"\x80\x02}(U\x06labels](K\x01K\x02eu."  # {'labels': [1, 2]} as Python 2 writes it
    assert cifar10._unpickle(io.BytesIO(py2), "x") == {b"labels": [1, 2]}
    arr = np.arange(6, dtype=np.uint8).reshape(2, 3)
    blob = pickle.dumps({"data": arr}, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in blob
    np.testing.assert_array_equal(cifar10._unpickle(io.BytesIO(blob), "x")[b"data"], arr)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _created_mode(folder: Path) -> int:
    """The mode a file this process creates gets (0666 less the umask), from a file made the ordinary way."""
    probe = folder / "probe"
    probe.write_bytes(b"")
    return _mode(probe)


def test_a_cache_file_is_readable_by_whoever_may_read_a_file_made_here(tmp_path: Path) -> None:
    """mkstemp makes its file 0600: renamed into place as it is, the decoded dataset would be unreadable to the
    other users of a shared cache, and each of them would decode it again on every run."""
    from shardbench.data.cache import load_arrays, save_arrays

    old = os.umask(0o022)
    try:
        save_arrays(tmp_path / "x.npz", {"a": np.arange(3)})
        assert _mode(tmp_path / "x.npz") == _created_mode(tmp_path) == 0o644
    finally:
        os.umask(old)
    np.testing.assert_array_equal(load_arrays(tmp_path / "x.npz")["a"], np.arange(3))

