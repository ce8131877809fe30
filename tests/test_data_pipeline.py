"""Host pipeline tests (order, epochs, resume, process slicing, eval padding) and synthetic data."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from shardbench.data.arrays import ImageArrays
from shardbench.data.epochs import eval_steps, steps_per_epoch
from shardbench.data.pipeline import BatchSource, make_batches
from shardbench.data.sources import load_dataset
from shardbench.data.synthetic import make_synthetic
from shardbench.errors import ConfigError

N, B = 103, 10


@pytest.fixture
def arrays() -> ImageArrays:
    """Example i has label i and pixel (0, 0) = i, so batches show exactly which examples they hold."""
    images = np.zeros((N, 2, 2, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(N)
    return ImageArrays(images, np.arange(N, dtype=np.int32))


def take(it: object, n: int) -> list[dict[str, np.ndarray]]:
    return list(itertools.islice(it, n))  # type: ignore[call-overload]


def ids(batches: list[dict[str, np.ndarray]]) -> list[int]:
    return [int(i) for b in batches for i in b["label"][b["mask"]]]


def test_step_counts() -> None:
    assert (steps_per_epoch(N, B), eval_steps(N, B)) == (10, 11)
    assert (steps_per_epoch(100, 10), eval_steps(100, 10), eval_steps(0, 10)) == (10, 10, 0)


def test_batch_contents_and_types(arrays: ImageArrays) -> None:
    (batch,) = take(make_batches(arrays, global_batch=B, seed=0, shuffle=True), 1)
    assert batch["image"].shape == (B, 2, 2, 3) and batch["image"].dtype == np.uint8
    assert batch["label"].dtype == np.int32 and batch["mask"].dtype == np.bool_ and batch["mask"].all()
    np.testing.assert_array_equal(batch["image"][:, 0, 0, 0], batch["label"])


def test_seeded_order_and_epochs_are_permutations(arrays: ImageArrays) -> None:
    a = ids(take(make_batches(arrays, global_batch=B, seed=7, shuffle=True), 30))
    assert a == ids(take(make_batches(arrays, global_batch=B, seed=7, shuffle=True), 30))
    assert a != ids(take(make_batches(arrays, global_batch=B, seed=8, shuffle=True), 30))
    epochs = [a[e * 100:(e + 1) * 100] for e in range(3)]
    for e, epoch in enumerate(epochs):
        assert len(set(epoch)) == 100  # N // B * B distinct examples, remainder dropped
        want = np.random.Generator(np.random.PCG64([7, e])).permutation(N)[:100]
        assert epoch == want.tolist()
    assert epochs[0] != epochs[1]
    assert ids(take(make_batches(arrays, global_batch=B, seed=7, shuffle=False, repeat=True), 12)) == (
        list(range(100)) + list(range(20))
    )


def test_resume_continues_the_same_stream(arrays: ImageArrays) -> None:
    full = take(make_batches(arrays, global_batch=B, seed=3, shuffle=True), 25)
    resumed = list(make_batches(arrays, global_batch=B, seed=3, shuffle=True, start_step=13, num_steps=12))
    assert len(resumed) == 12
    for x, y in zip(full[13:], resumed):
        for k in ("image", "label", "mask"):
            np.testing.assert_array_equal(x[k], y[k])


def test_process_slices_concatenate_to_the_global_batch(arrays: ImageArrays) -> None:
    one = take(make_batches(arrays, global_batch=B, seed=1, shuffle=True), 15)
    parts = [take(make_batches(arrays, global_batch=B, seed=1, shuffle=True, process_index=p, process_count=2), 15)
             for p in range(2)]
    for step, whole in enumerate(one):
        assert parts[0][step]["label"].shape == (B // 2,)
        for k in ("image", "label", "mask"):
            np.testing.assert_array_equal(np.concatenate([parts[0][step][k], parts[1][step][k]]), whole[k])
    with pytest.raises(ConfigError, match=r"global batch size 10 does not divide by the 3 processes"):
        make_batches(arrays, global_batch=B, seed=1, shuffle=True, process_count=3)


@pytest.mark.parametrize("process_count", [1, 2])
def test_eval_pass_counts_every_example_once(arrays: ImageArrays, process_count: int) -> None:
    seen: list[int] = []
    masks = 0
    for p in range(process_count):
        batches = list(make_batches(arrays, global_batch=B, seed=0, shuffle=False,
                                    process_index=p, process_count=process_count))
        assert len(batches) == eval_steps(N, B)
        seen += ids(batches)
        masks += sum(int(b["mask"].sum()) for b in batches)
        last = batches[-1]
        assert last["label"].shape == (B // process_count,)
        assert not last["image"][~last["mask"]].any()  # padding rows are zeros
    assert sorted(seen) == list(range(N)) and masks == N


def test_eval_num_steps_and_start(arrays: ImageArrays) -> None:
    assert len(list(make_batches(arrays, global_batch=B, seed=0, shuffle=False, num_steps=4))) == 4
    tail = list(make_batches(arrays, global_batch=B, seed=0, shuffle=False, start_step=9, num_steps=50))
    assert ids(tail) == list(range(90, N))


def test_invalid_batches(arrays: ImageArrays) -> None:
    with pytest.raises(ConfigError, match=r"global batch size 200 is larger than the 103 training examples"):
        make_batches(arrays, global_batch=200, seed=0, shuffle=True)
    # At the boundary: a batch of every example is one, a batch of one more is refused.
    (whole,) = take(make_batches(arrays, global_batch=N, seed=0, shuffle=True), 1)
    assert sorted(ids([whole])) == list(range(N))
    with pytest.raises(ConfigError, match=r"global batch size 104 is larger than the 103 training examples"):
        make_batches(arrays, global_batch=N + 1, seed=0, shuffle=True)
    with pytest.raises(ConfigError, match=r"process index 2 of 2 processes is invalid"):
        BatchSource(arrays, global_batch=B, seed=0, shuffle=True, repeat=True, process_index=2, process_count=2)


def test_abandoned_stream_stops_its_thread(arrays: ImageArrays) -> None:
    before = threading.active_count()
    it = make_batches(arrays, global_batch=B, seed=0, shuffle=True, prefetch=4)
    take(it, 3)
    it.close()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before


def test_synthetic_is_seeded_and_learnable() -> None:
    kw = dict(image_size=32, num_classes=10, val_fraction=0.1)
    a = make_synthetic(2000, 500, seed=0, **kw)  # type: ignore[arg-type]
    b = make_synthetic(2000, 500, seed=0, **kw)  # type: ignore[arg-type]
    c = make_synthetic(2000, 500, seed=1, **kw)  # type: ignore[arg-type]
    assert (len(a.train), len(a.val), len(a.test)) == (1800, 200, 500) and a.num_classes == 10
    assert a.train.images.shape == (1800, 32, 32, 3) and a.train.images.dtype == np.uint8
    np.testing.assert_array_equal(a.train.images, b.train.images)
    assert not np.array_equal(a.train.images, c.train.images)
    # Learnable: nearest class mean over 180 examples per class is far above chance (0.1)...
    x = a.train.images.reshape(len(a.train), -1).astype(np.float32)
    means = np.stack([x[a.train.labels == k].mean(0) for k in range(10)])
    xt = a.test.images.reshape(len(a.test), -1).astype(np.float32)
    dist = (xt**2).sum(1)[:, None] - 2 * xt @ means.T + (means**2).sum(1)[None]
    assert (dist.argmin(1) == a.test.labels).mean() > 0.5
    # ...but no single pixel gives the class away.
    first = xt[:, 0]
    by_class = [first[a.test.labels == k].mean() for k in range(10)]
    assert np.std(by_class) < np.std(first) / 2


def test_synthetic_makes_cifar_sized_splits() -> None:
    """CIFAR-10's sizes in generated images, the validation split taken from the training set. (How fast they
    are made is a benchmark's question, not a timed test's: under the full suite's load it varied past 5 s.)"""
    ds = make_synthetic(50_000, 10_000, image_size=32, num_classes=10, seed=0, val_fraction=0.1)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (45_000, 5_000, 10_000)


def test_synthetic_spec(tmp_path: Path) -> None:
    ds = load_dataset("synthetic", cache_dir=tmp_path, image_size=8, num_classes=4, val_fraction=0.2, seed=0,
                      synthetic_train=200, synthetic_test=50)
    assert (len(ds.train), len(ds.val), len(ds.test), ds.image_size, ds.num_classes) == (160, 40, 50, 8, 4)
    assert not list(tmp_path.iterdir())  # nothing to cache for generated data
