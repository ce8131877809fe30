"""Image-folder loader tests on small PNG/JPEG trees and tars made here; also the decoded-array cache."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardbench.data import imagefolder
from shardbench.data.imagefolder import load_imagefolder
from shardbench.data.sources import load_dataset, validate_spec
from shardbench.errors import ConfigError, DataError

CLASSES = ("cat", "dog", "frog")
SIZE = 8


def pixel(split: str, cls: int, i: int) -> tuple[int, int, int]:
    """A colour that identifies one image: R = split, G = class, B = index."""
    return ({"train": 10, "test": 20, "val": 30, "valid": 30}[split], 40 + cls, 60 + i)


def make_tree(root: Path, *, n: dict[str, int] | None = None, size: int = SIZE, fmt: str = "png") -> Path:
    """root/<split>/<class>/<image>, files named so that name order differs from creation order."""
    n = n or {"train": 6, "test": 2}
    for split, count in n.items():
        for c, cls in enumerate(CLASSES):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in reversed(range(count)):
                Image.new("RGB", (size, size), pixel(split, c, i)).save(d / f"img_{i:03d}.{fmt}")
    return root


def make_tar(tree: Path, dest: Path, *, wrapper: str | None = "wrapped") -> Path:
    mode = next((f"w:{c}" for c, ends in (("gz", ("gz", "tgz")), ("bz2", ("bz2", "tbz")), ("xz", ("xz", "txz")))
                 if dest.name.endswith(ends)), "w")
    with tarfile.open(dest, mode) as tf:
        tf.add(tree, arcname=wrapper or ".")
    return dest


def load(path: Path, tmp_path: Path, **kw: object) -> imagefolder.ImageDataset:
    args: dict = {"image_size": SIZE, "val_fraction": 0.25, "seed": 0, **kw}
    return load_imagefolder(path, tmp_path / "cache", **args)


def assert_same(a: imagefolder.ImageDataset, b: imagefolder.ImageDataset) -> None:
    assert a.class_names == b.class_names
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(a, split).images, getattr(b, split).images)
        np.testing.assert_array_equal(getattr(a, split).labels, getattr(b, split).labels)


def test_folder_pixels_labels_and_order(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    ds = load(tree, tmp_path, val_fraction=0.0)
    assert ds.class_names == CLASSES and ds.num_classes == 3
    assert ds.train.images.shape == (18, SIZE, SIZE, 3) and ds.train.images.dtype == np.uint8
    assert ds.train.labels.dtype == np.int32 and ds.train.labels.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    # Within a class the files come sorted by name: img_000, img_001, ...
    expected = [pixel("train", c, i) for c in range(3) for i in range(6)]
    assert [tuple(im[0, 0]) for im in ds.train.images] == expected
    assert [tuple(im[3, 5]) for im in ds.test.images] == [pixel("test", c, i) for c in range(3) for i in range(2)]


@pytest.mark.parametrize("name", ["tree.tar.gz", "tree.tgz", "tree.tar", "tree.tar.bz2", "tree.tar.xz", "tree.txz"])
@pytest.mark.parametrize("wrapper", ["cifar10-jpeg", None])
def test_tar_matches_folder(tmp_path: Path, name: str, wrapper: str | None) -> None:
    tree = make_tree(tmp_path / "tree")
    (tree / "README.md").write_text("not an image, beside the splits")
    (tree / "extras").mkdir()
    (tree / "extras" / "notes.txt").write_text("a folder that is no split is ignored")
    (tree / "train" / "cat" / ".DS_Store").write_bytes(b"\0junk")
    tar = make_tar(tree, tmp_path / name, wrapper=wrapper)
    assert_same(load(tar, tmp_path / "a"), load(tree, tmp_path / "b"))


def test_val_split_carved_by_seed_or_taken_from_folder(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", n={"train": 8, "test": 2})
    a, b, c = (load(tree, tmp_path, seed=s) for s in (0, 0, 1))
    assert (len(a.train), len(a.val), len(a.test)) == (18, 6, 6)
    assert_same(a, b)
    assert not np.array_equal(a.val.images, c.val.images)

    with_val = make_tree(tmp_path / "with_val", n={"train": 4, "test": 2, "valid": 3})
    ds = load(with_val, tmp_path)
    assert (len(ds.train), len(ds.val)) == (12, 9)
    assert tuple(ds.val.images[0, 0, 0]) == pixel("val", 0, 0)
    (with_val / "val").mkdir()
    with pytest.raises(DataError, match=r"has both val and valid folders"):
        load(with_val, tmp_path / "other-cache")


def test_resizes_and_converts_to_rgb(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", size=12, fmt="jpg")
    odd = tree / "train" / "cat" / "zz_gray.png"
    gray = Image.fromarray(np.tile(np.arange(0, 240, 20, dtype=np.uint8), (12, 1)), mode="L")
    gray.save(odd)
    ds = load(tree, tmp_path, val_fraction=0.0)
    assert ds.train.images.shape == (19, SIZE, SIZE, 3)
    want = np.asarray(gray.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(ds.train.images[6], want)
    # JPEG is lossy: solid colours come back within a few levels.
    assert np.abs(ds.train.images[0].astype(int) - pixel("train", 0, 0)).max() <= 4


def test_cache_hit_reads_nothing_and_keeps_the_seeded_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tar = make_tar(make_tree(tmp_path / "tree"), tmp_path / "tree.tar.gz")
    first = load(tar, tmp_path)
    monkeypatch.setattr(tarfile, "open", lambda *a, **k: pytest.fail("tar opened despite the cache"))
    monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("image decoded despite the cache"))
    assert_same(first, load(tar, tmp_path))
    # The cache holds the arrays from before the val split, so another seed still changes it.
    other = load(tar, tmp_path, seed=5)
    assert not np.array_equal(first.val.images, other.val.images)


def test_cache_notices_a_changed_image_and_rebuilds_a_corrupt_file(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    first = load(tree, tmp_path, val_fraction=0.0)
    img = tree / "test" / "dog" / "img_001.png"
    Image.new("RGB", (SIZE, SIZE), (1, 2, 3)).save(img)
    second = load(tree, tmp_path, val_fraction=0.0)
    assert tuple(second.test.images[3, 0, 0]) == (1, 2, 3) != tuple(first.test.images[3, 0, 0])

    for npz in (tmp_path / "cache").glob("imagefolder-*.npz"):
        npz.write_bytes(npz.read_bytes()[:100])
    assert_same(second, load(tree, tmp_path, val_fraction=0.0))
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_an_entry_decoded_from_an_earlier_state_of_a_folder_is_removed_and_no_other(tmp_path: Path) -> None:
    """A folder edited in place is decoded again; its earlier entry can never be read again and goes, while the
    entries of another folder, of the same folder at another image size and of another loader stay."""
    cache_dir = tmp_path / "cache"
    tree, other = make_tree(tmp_path / "tree"), make_tree(tmp_path / "other")
    load(tree, tmp_path), load(other, tmp_path), load(tree, tmp_path, image_size=SIZE // 2)
    (cache_dir / "cifar10-0123456789ab-00.npz").write_bytes(b"another loader's entry")
    kept = set(cache_dir.glob("*.npz"))
    assert len(kept) == 4
    first = set(cache_dir.glob("imagefolder-*.npz"))
    Image.new("RGB", (SIZE, SIZE), (1, 2, 3)).save(tree / "train" / "cat" / "img_000.png")
    load(tree, tmp_path)
    (new,) = set(cache_dir.glob("*.npz")) - kept
    (gone,) = kept - set(cache_dir.glob("*.npz"))
    assert gone in first and gone.name.rsplit("-", 1)[0] == new.name.rsplit("-", 1)[0]  # the same folder's
    assert len(list(cache_dir.glob("*.npz"))) == 4
    # An entry of the same path written since its last change is another copy's (a node's own copy of the data, in a
    # cache the nodes share): kept when the entry is decoded again. One written before the change goes.
    prefix = new.name.rsplit("-", 1)[0]
    since, before = cache_dir / f"{prefix}-{'1' * 32}.npz", cache_dir / f"{prefix}-{'2' * 32}.npz"
    since.write_bytes(new.read_bytes())
    before.write_bytes(new.read_bytes())
    os.utime(before, ns=(0, 0))
    new.write_bytes(b"damaged")
    load(tree, tmp_path)
    assert since.exists() and not before.exists() and new.exists()


def test_a_class_folder_added_empty_after_the_tree_was_cached_is_refused_as_if_never_cached(tmp_path: Path) -> None:
    """A new empty class folder changed no file, so the cached arrays were read and the run trained on the old
    classes, where the same tree uncached is refused: it now misses the cache and is refused the same way."""
    tree = make_tree(tmp_path / "tree")
    load(tree, tmp_path)
    (tree / "train" / "fish").mkdir()
    (tree / "test" / "fish").mkdir()
    with pytest.raises(DataError, match="class folder train/fish/ is empty"):
        load(tree, tmp_path)


def test_corrupt_image_is_named(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    (tree / "train" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DataError, match=r"tree/train/dog/broken.png: cannot be decoded as an image"):
        load(tree, tmp_path)
    # A file of no image format: Pillow's words without the address of its in-memory buffer ("cannot identify
    # image file <_io.BytesIO object at 0x7f...>").
    (tree / "train" / "dog" / "broken.png").write_text("notes")
    with pytest.raises(DataError) as err:
        load(tree, tmp_path)
    assert str(err.value).endswith("broken.png: cannot be decoded as an image (UnidentifiedImageError: cannot "
                                   "identify image file); replace or remove it"), str(err.value)
    tar = make_tar(tree, tmp_path / "t.tar.gz")
    with pytest.raises(DataError, match=r"t.tar.gz:wrapped/train/dog/broken.png: cannot be decoded"):
        load(tar, tmp_path)


def test_layout_errors(tmp_path: Path) -> None:
    no_test = make_tree(tmp_path / "no_test", n={"train": 2})
    with pytest.raises(DataError, match=r"no test/ folder \(found train\); expected <root>/train/<class>/<image>"):
        load(no_test, tmp_path)

    flat = make_tree(tmp_path / "flat", n={"train": 2, "test": 1})
    Image.new("RGB", (SIZE, SIZE)).save(flat / "test" / "loose.png")
    with pytest.raises(DataError, match=r"loose.png: is 1 level\(s\) below the split folder test/, expected exactly 2"):
        load(flat, tmp_path)

    empty = make_tree(tmp_path / "empty", n={"train": 2, "test": 1})
    (empty / "test" / "zebra").mkdir()
    Image.new("RGB", (SIZE, SIZE)).save(empty / "test" / "zebra" / "z.png")
    with pytest.raises(DataError, match=r"test/ classes differ from train/ \(missing \[\], extra \['zebra'\]\)"):
        load(empty, tmp_path)
    (empty / "train" / "zebra").mkdir()
    with pytest.raises(DataError, match=r"class folder train/zebra/ is empty; every class needs images"):
        load(empty, tmp_path)

    two_tops = tmp_path / "two_tops"
    make_tree(two_tops / "a", n={"train": 1, "test": 1})
    make_tree(two_tops / "b", n={"train": 1, "test": 1})
    with pytest.raises(DataError, match=r"no train/ or test/ folder \(found a, b\)"):
        load(two_tops, tmp_path)

    holder = tmp_path / "holder"  # a folder that holds the dataset's tar, given for the tar
    holder.mkdir()
    make_tar(make_tree(tmp_path / "inner", n={"train": 1, "test": 1}), holder / "data.tar.gz")
    with pytest.raises(DataError) as err:
        load(holder, tmp_path)
    assert str(err.value) == (f"{holder}: no train/ or test/ folder, but it holds data.tar.gz: give the archive "
                              f"itself, --data imagefolder:{holder / 'data.tar.gz'}")

    with pytest.raises(DataError, match=r"neither a folder nor a .tar, .tar.gz \(.tgz\), .tar.bz2 or .tar.xz archive"):
        load(tmp_path / "no_test" / "train" / "cat" / "img_000.png", tmp_path)


def test_a_plain_tar_whose_first_name_begins_as_bzip2_s_magic_is_read_as_a_tar(tmp_path: Path) -> None:
    """A plain tar begins with its first member's name (as GNU tar writes it: no pax header before it)."""
    tree = make_tree(tmp_path / "tree", n={"train": 1, "test": 1})
    tar = tmp_path / "data.tar"
    with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as tf:
        tf.add(tree, arcname="BZh91AY_data")
    assert tar.read_bytes().startswith(b"BZh91AY_data")
    assert_same(load(tar, tmp_path / "a"), load(tree, tmp_path / "b"))


@pytest.mark.parametrize("kind", ["zip", "zstd"])
def test_an_archive_of_another_kind_named_as_a_tar_is_named(tmp_path: Path, kind: str) -> None:
    """A zip (or a zstandard stream) renamed .tar is said to be one, not a tar that may be truncated."""
    import zipfile

    tree = make_tree(tmp_path / "tree", n={"train": 1, "test": 1})
    archive = tmp_path / "data.tar"
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as z:
            for f in sorted(tree.rglob("*.png")):
                z.write(f, f.relative_to(tree))
    else:  # a zstandard frame's magic number, then what zstd would write: the reader looks no further
        archive.write_bytes(bytes.fromhex("28b52ffd") + make_tar(tree, tmp_path / "t.tar").read_bytes())
    said = {"zip": "a zip archive", "zstd": "compressed with zstandard"}[kind]
    with pytest.raises(DataError) as err:
        load(archive, tmp_path)
    assert str(err.value) == (f"{archive}: is {said}, which this reader does not open: unpack it and give the "
                              f"folder, or repack it as a tar (tar czf data.tar.gz FOLDER)")


@pytest.mark.parametrize("name", ["cut.tar", "cut.tar.gz", "cut.tar.bz2", "cut.tar.xz"])
def test_truncated_tar_is_an_error_not_a_smaller_dataset(tmp_path: Path, name: str) -> None:
    tar = make_tar(make_tree(tmp_path / "ok", n={"train": 3, "test": 2}), tmp_path / name)
    data = tar.read_bytes()
    with tarfile.open(tmp_path / "ok.tar", "w") as tf:
        tf.add(tmp_path / "ok", arcname="wrapped")
    with tarfile.open(tmp_path / "ok.tar") as tf:
        header = tf.getmembers()[12].offset  # a cut right before a member header looks like a clean end
    cuts = [len(data) // 3, len(data) // 2, len(data) - 8] if not name.endswith("tar") else [header, header + 100, 2000]
    for cut in cuts:
        tar.write_bytes(data[:cut])
        with pytest.raises(DataError, match=rf"{name}: not a readable tar archive, it may be truncated"):
            load(tar, tmp_path / str(cut))
    if not name.endswith("tar"):  # a compressed stream damaged in its middle: each decompressor's own error
        middle = len(data) // 2
        tar.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 16]) + data[middle + 16:])
        with pytest.raises(DataError, match=rf"{name}: not a readable tar archive"):
            load(tar, tmp_path / "damaged")


def test_parallel_decode_matches_inline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tar = make_tar(make_tree(tmp_path / "tree"), tmp_path / "tree.tar")
    inline = load(tar, tmp_path / "a")
    monkeypatch.setattr(imagefolder, "_PARALLEL_MIN_FILES", 4)
    monkeypatch.setattr(imagefolder, "_CHUNK", 5)
    monkeypatch.setattr(imagefolder, "_num_workers", lambda: 2)
    pools: list[object] = []

    class CountingPool(imagefolder.ProcessPoolExecutor):
        def __init__(self, *args: object, **kwargs: object) -> None:
            pools.append(self)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(imagefolder, "ProcessPoolExecutor", CountingPool)
    assert_same(inline, load(tar, tmp_path / "b"))
    assert len(pools) == 1


def test_sigterm_while_decoding_stops_the_workers_too(tmp_path: Path) -> None:
    """SIGTERM (a scheduler's, kill's) while worker processes decode: by its default the process died at once
    and its workers ran on, orphaned. It now stops as Ctrl-C does: the workers end with it, and it exits 143
    with one line. The signal is sent from inside the decoding, the workers running."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    tar = make_tar(make_tree(tmp_path / "tree"), tmp_path / "tree.tar")
    child = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from shardbench.data import imagefolder
        from shardbench.errors import run_reported
        imagefolder._PARALLEL_MIN_FILES, imagefolder._CHUNK = 4, 5
        imagefolder._num_workers = lambda: 2
        finish = imagefolder._Decoder.finish
        def stopped(self):
            print(" ".join(map(str, self._pool._processes)), flush=True)  # the workers, running
            os.kill(os.getpid(), signal.SIGTERM)
            return finish(self)
        imagefolder._Decoder.finish = stopped
        sys.exit(run_reported(lambda: imagefolder.load_imagefolder(
            Path({str(tar)!r}), Path({str(tmp_path / "cache")!r}), image_size={SIZE}, val_fraction=0.0, seed=0)))
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its workers share its group, which is killed at the end
    try:
        stdout, stderr = proc.communicate(timeout=60)  # orphaned workers would hold its pipes open: a timeout
        assert proc.returncode == 143, (proc.returncode, stderr[-2000:])
        assert stderr.strip().splitlines()[-1] == "shardbench: stopped by SIGTERM", stderr
        workers = [int(p) for p in stdout.split()]
        assert len(workers) == 2

        def alive(pid: int) -> bool:
            try:
                with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped by init is gone too
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 10
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in workers if alive(p)]
    finally:  # nothing of a failed test left running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert not list((tmp_path / "cache").rglob("*.npz"))  # nothing cached from a stopped decoding


def test_a_name_a_tar_holds_twice_is_its_last_member_as_tar_x_leaves_it(tmp_path: Path) -> None:
    """`tar rf` appends a changed file under its name again: extracted, the archive holds the last. Both were
    read, the class one image larger, the old image beside the new. Now the last alone is the image."""
    tree = make_tree(tmp_path / "tree")
    tar = make_tar(tree, tmp_path / "updated.tar", wrapper=None)
    changed = tmp_path / "img_000.png"
    Image.new("RGB", (SIZE, SIZE), (200, 201, 202)).save(changed)
    with tarfile.open(tar, "a") as tf:
        tf.add(changed, arcname="./train/cat/img_000.png")
    before = load(tree, tmp_path / "folder", val_fraction=0.0)
    after = load(tar, tmp_path / "tar", val_fraction=0.0)
    assert len(after.train.labels) == len(before.train.labels)  # one image per name
    np.testing.assert_array_equal(after.train.labels, before.train.labels)
    assert tuple(after.train.images[0, 0, 0]) == (200, 201, 202)  # cat's img_000: the appended version
    np.testing.assert_array_equal(after.train.images[1:], before.train.images[1:])


def test_a_link_to_nothing_in_the_folder_is_named_as_such(tmp_path: Path) -> None:
    """A dangling symbolic link among the images was "<it> does not exist: create it, or give a path whose folder
    exists" with exit 6, as if the user had named a path: it is the dataset's, a data error naming the link."""
    import os

    tree = make_tree(tmp_path / "tree")
    os.symlink(tmp_path / "gone.png", tree / "train" / "cat" / "img_900.png")
    with pytest.raises(DataError) as err:
        load(tree, tmp_path)
    assert str(err.value) == (f"{tree / 'train' / 'cat' / 'img_900.png'}: is a link to {tmp_path / 'gone.png'}, "
                              f"which does not exist: remove the link or point it at the file it stands for")


def test_a_hidden_dangling_link_is_passed_over_and_a_link_loop_is_named(tmp_path: Path) -> None:
    """An editor's lock link (.#README.md, to a name that is no file) in the dataset's folder is passed over, as the
    reader passes over every hidden file: it was refused as a link to nothing by the cache's listing. A link to
    itself was a bare "Too many levels of symbolic links" (exit 6): a data error naming it."""
    import os

    tree = make_tree(tmp_path / "tree")
    plain = load(tree, tmp_path / "plain")
    os.symlink("root@host.1234:1700000000", tree / ".#README.md")
    os.symlink("gone", tree / "train" / ".#img_000.png")
    assert_same(load(tree, tmp_path / "locked"), plain)
    os.symlink("loop", tree / "train" / "cat" / "loop")
    with pytest.raises(DataError) as err:
        load(tree, tmp_path / "loop")
    assert str(err.value) == (f"{tree / 'train' / 'cat' / 'loop'}: cannot be read (Too many levels of symbolic "
                              f"links): remove it, or replace it with the file it stands for")


def test_imagefolder_spec(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    kw: dict = {"cache_dir": tmp_path / "cache", "image_size": SIZE, "val_fraction": 0.25, "seed": 0}
    ds = load_dataset(f"imagefolder:{tree}", num_classes=3, **kw)
    assert ds.class_names == CLASSES
    with pytest.raises(ConfigError, match=r"has 3 classes but the model is set up for 10; pass --model.num-classes 3"):
        load_dataset(f"imagefolder:{tree}", num_classes=10, **kw)
    # One class is no classification: said as such, not "pass --model.num-classes 1" (whose run scored 100%).
    one = tmp_path / "one"
    for split in ("train", "test"):
        shutil.copytree(tree / split / CLASSES[0], one / split / CLASSES[0])
    with pytest.raises(DataError, match=rf"^dataset imagefolder:one has 1 class \({CLASSES[0]}\): classifying needs "
                                        r"at least 2 to tell apart; give it a folder of images per class$"):
        load_dataset(f"imagefolder:{one}", num_classes=1, **kw)
    validate_spec(f"imagefolder:{tree}")
    with pytest.raises(DataError, match=r"dataset 'imagefolder:.*/nope': .*nope does not exist"):
        validate_spec(f"imagefolder:{tmp_path}/nope")


def test_a_tars_linked_members_are_read_as_the_images_they_name(tmp_path: Path) -> None:
    """A hard link (tar stores a second name of a file so) and a symbolic link to an earlier member: each is that
    image under its own name, as the folder they were made from reads it (both were dropped: 2 images short, one
    of them a class's whole share, without a word)."""
    import os

    tree = make_tree(tmp_path / "tree")
    cat, dog = tree / "train" / "cat", tree / "train" / "dog"
    os.link(cat / "img_000.png", dog / "img_900.png")
    os.symlink("../cat/img_001.png", tree / "train" / "frog" / "img_901.png")
    archive = make_tar(tree, tmp_path / "linked.tar", wrapper=None)
    with tarfile.open(archive) as tf:
        kinds = {m.name.split("/")[-1]: m for m in tf.getmembers()}
    assert kinds["img_901.png"].issym() and any(m.islnk() for m in kinds.values())
    assert_same(load(archive, tmp_path / "a", val_fraction=0.0), load(tree, tmp_path / "b", val_fraction=0.0))
    assert len(load(archive, tmp_path / "c", val_fraction=0.0).train.labels) == 3 * 6 + 2


def test_a_symlinked_class_folder_a_macosx_folder_and_an_upper_case_suffix_are_read(tmp_path: Path) -> None:
    """A class folder that is a link to one elsewhere is read through it (it was "empty"); the __MACOSX folder a
    Finder zip leaves beside its one top folder is not taken for a second one ("no train/ or test/ folder (found
    __MACOSX, data)"); DATA.TAR is a tar (refused as neither folder nor archive)."""
    import os

    tree = make_tree(tmp_path / "wrap" / "data")
    moved = tmp_path / "elsewhere" / "frog"
    moved.parent.mkdir()
    (tree / "train" / "frog").rename(moved)
    os.symlink(moved, tree / "train" / "frog")
    (tmp_path / "wrap" / "__MACOSX" / "data" / "train").mkdir(parents=True)
    (tmp_path / "wrap" / "__MACOSX" / "data" / "train" / "._img_000.png").write_bytes(b"\x00\x05\x16\x07")
    plain = make_tree(tmp_path / "plain" / "data")
    through = load(tmp_path / "wrap", tmp_path / "a", val_fraction=0.0)
    assert_same(through, load(plain, tmp_path / "b", val_fraction=0.0))
    upper = make_tar(plain, tmp_path / "DATA.TAR")
    assert_same(load(upper, tmp_path / "c", val_fraction=0.0), through)


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_an_image_of_more_than_8_bits_is_refused_not_clipped(tmp_path: Path, mode: str) -> None:
    """A 16-bit grey gradient (a scan, a medical image) came out 99.6% white: Pillow's convert("RGB") clips such
    samples. Each such file is refused, named, with its mode."""
    tree = make_tree(tmp_path / "tree")
    ramp = np.linspace(0, 60000, SIZE * SIZE).reshape(SIZE, SIZE)
    Image.fromarray(ramp.astype(np.float32 if mode == "F" else np.int32 if mode == "I" else np.uint16),
                    mode=mode if mode != "I;16" else None).save(tree / "train" / "cat" / "deep.tiff")
    with pytest.raises(DataError, match=rf"deep.tiff: a {mode} image \(16-bit or floating point samples\)"):
        load(tree, tmp_path, val_fraction=0.0)
