"""`--data arrays:PATH.npz` feeds every task, and image datasets normalise with their own statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardbench.data.sources import load_for
from shardbench.data.stats import CACHE_NAME, channel_stats
from shardbench.errors import DataError
from shardbench.train.loop import run
from shardbench.preflight import check_run


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


@pytest.mark.slow
def test_arrays_feed_a_classifier_and_are_normalised_with_their_own_statistics(micro, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = _images(rng, 200) // 2  # darker than CIFAR-10: its own statistics differ from the published ones
    path = _npz(tmp_path / "mine.npz", x_train=x, y_train=rng.integers(0, 10, 200), x_test=_images(rng, 40),
                y_test=rng.integers(0, 10, 40))
    cfg = micro(**{"data.dataset": f"arrays:{path}", "data.val_fraction": 0.1, "train.steps": 2})
    ds = load_for(cfg, tmp_path / "cache")
    assert (len(ds.train), len(ds.val), len(ds.test)) == (180, 20, 40)
    mean, std = channel_stats(ds.train.images)
    exact = ds.train.images.astype(np.float64) / 255
    assert mean == pytest.approx(exact.mean(axis=(0, 1, 2)), abs=1e-9)
    assert std == pytest.approx(exact.std(axis=(0, 1, 2)), abs=1e-9)
    assert ds.norm == (mean, std) and ds.info["normalization"]["source"] == "computed from its training split"
    # Cached: a second load reads the figures back instead of computing them.
    cache = tmp_path / "cache" / CACHE_NAME
    known = json.loads(cache.read_text())
    (key,) = known
    known[key] = [[0.25, 0.25, 0.25], [0.5, 0.5, 0.5]]
    cache.write_text(json.dumps(known))
    assert load_for(cfg, tmp_path / "cache").norm == ((0.25, 0.25, 0.25), (0.5, 0.5, 0.5))
    summary = run(cfg)
    assert summary["dataset"]["normalization"]["mean"] == [0.25, 0.25, 0.25] and summary["steps"] == 2


def test_arrays_feed_a_language_model_and_a_regression(micro, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    tokens = _npz(tmp_path / "tokens.npz", x_train=rng.integers(0, 64, (100, 17)), y_train=np.zeros(100),
                  x_test=rng.integers(0, 64, (20, 17)), y_test=np.zeros(20), x_val=rng.integers(0, 64, (10, 17)),
                  y_val=np.zeros(10))
    lm = micro(**{"model.kind": "lm", "data.dataset": f"arrays:{tokens}", "model.vocab_size": 64,
                  "model.seq_len": 16})
    ds = load_for(lm, tmp_path / "cache")
    assert (len(ds.train), len(ds.val), len(ds.test)) == (100, 10, 20)
    assert ds.train.columns()["tokens"].dtype == np.int32
    values = _npz(tmp_path / "values.npz", x_train=rng.standard_normal((64, 256)), y_train=rng.standard_normal((64, 10)),
                  x_test=rng.standard_normal((16, 256)), y_test=rng.standard_normal((16, 10)))
    mlp = micro(**{"model.kind": "mlp", "data.dataset": f"arrays:{values}", "model.input_dim": 256,
                   "data.val_fraction": 0.25})
    reg = load_for(mlp, tmp_path / "cache")
    assert (len(reg.train), len(reg.val)) == (48, 16) and set(reg.train.columns()) == {"inputs", "targets"}


@pytest.mark.parametrize(("arrays", "message"), [
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8)}, "lacks y_train, x_test, y_test"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.float32), "y_train": np.zeros(4), "x_test": np.zeros((2, 32, 32, 3)),
      "y_test": np.zeros(2)}, "images to classify must be uint8 (N, H, W, 3)"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.full(4, 12), "x_test": np.zeros((2, 32, 32, 3),
      np.uint8), "y_test": np.zeros(2)}, "labels must be class ids in [0, 10)"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.zeros(3), "x_test": np.zeros((2, 32, 32, 3),
      np.uint8), "y_test": np.zeros(2)}, "x_train has 4 rows but y_train has 3"),
])
def test_bad_arrays_are_named_before_training(micro, tmp_path: Path, arrays: dict, message: str) -> None:
    path = _npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_run(micro(**{"data.dataset": f"arrays:{path}"}))


def test_cifar10_keeps_its_published_statistics(micro, tmp_path: Path) -> None:
    from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD
    from shardbench.data.sources import normalized
    from shardbench.data.synthetic import make_synthetic

    ds = make_synthetic(64, 16, image_size=32, num_classes=10, seed=0, val_fraction=0.0)
    assert normalized(ds, "cifar10", tmp_path).norm == (CIFAR_MEAN, CIFAR_STD)
    assert normalized(ds, "synthetic", tmp_path).norm == channel_stats(ds.train.images)


def test_cached_statistics_follow_every_image_of_the_split(tmp_path: Path) -> None:
    """The statistics cache knows a split by all of its bytes: whiten 30 of 72 training images (none of them the
    first or last, which a sample would look at) and the statistics are computed again, not read back stale."""
    from shardbench.data.stats import cached_stats

    images = np.random.default_rng(0).integers(0, 100, (72, 8, 8, 3), dtype=np.uint8)
    assert cached_stats(tmp_path, "mine", images) == channel_stats(images)
    edited = images.copy()
    edited[5:35] = 255
    assert cached_stats(tmp_path, "mine", edited) == channel_stats(edited) != channel_stats(images)
    assert cached_stats(tmp_path, "mine", images) == channel_stats(images)  # both splits are kept, each its own


@pytest.mark.parametrize(("arrays", "overrides", "message"), [
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.zeros(4), "x_test": np.zeros((2, 40, 40, 3),
      np.uint8), "y_test": np.zeros(2)}, {}, "x_test is uint8 (2, 40, 40, 3) but x_train is uint8 (4, 32, 32, 3)"),
    ({"x_train": np.zeros((4, 40, 40, 3), np.uint8), "y_train": np.zeros(4), "x_test": np.zeros((2, 40, 40, 3),
      np.uint8), "y_test": np.zeros(2)}, {}, "has 40x40 images but the model expects 32x32; pass --data.image-size 40"),
    ({"x_train": np.zeros((4, 17), np.int32), "y_train": np.zeros(4), "x_test": np.full((2, 17), 600, np.int32),
      "y_test": np.zeros(2)}, {"model.kind": "lm", "model.seq_len": 16, "model.vocab_size": 512},
     "token ids must be in [0, 512) (--model.vocab-size) in every split"),
])
def test_every_split_is_checked_against_the_model(micro, tmp_path: Path, arrays: dict, overrides: dict,
                                                  message: str) -> None:
    path = _npz(tmp_path / "bad.npz", **arrays)
    cfg = micro(**{"data.dataset": f"arrays:{path}", **overrides})
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_for(cfg, tmp_path / "cache")
