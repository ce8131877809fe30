"""`--data arrays:PATH.npz` feeds every task, and image datasets normalise with their own statistics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from shardbench.data.arrays import fingerprint
from shardbench.data.sources import load_for
from shardbench.data.stats import CACHE_NAME, channel_stats
from shardbench.errors import ConfigError, DataError
from shardbench.parsing import override
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
    assert summary["dataset"]["examples"] == {"train": 180, "val": 20, "test": 40}  # 200 with a tenth held out


@pytest.mark.slow
def test_resume_on_data_that_changed_since_is_refused_in_one_line(micro, tmp_path: Path) -> None:
    """A run keeps what its data held when it started (data.json); --resume on the same file with one image
    changed (the same shapes, the same configuration) is refused before anything is compiled or written, and a
    run from before data.json was kept is not checked."""
    rng = np.random.default_rng(2)
    x, y = _images(rng, 80), rng.integers(0, 10, 80)
    path = _npz(tmp_path / "mine.npz", x_train=x, y_train=y, x_test=x[:32], y_test=y[:32])
    cfg = micro(**{"data.dataset": f"arrays:{path}", "data.val_fraction": 0.0, "train.steps": 2,
                   "train.checkpoint_every": 1})
    run(cfg)
    out = tmp_path / "run"
    assert json.loads((out / "data.json").read_text())["sha1"] == fingerprint(load_for(cfg, tmp_path / "cache"))
    (out / "summary.json").unlink()  # as if it had stopped after its last checkpoint
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    edited = x.copy()
    edited[5, 0, 0, 0] ^= 1
    _npz(path, x_train=edited, y_train=y, x_test=x[:32], y_test=y[:32])
    resumed = override(cfg, {"train.resume": True})
    with pytest.raises(ConfigError, match=r"^--resume: .* was trained on other examples than .*mine.* holds now "
                                          r"\(sha1 [0-9a-f]{12}\.\.\. then, [0-9a-f]{12}\.\.\. now\): resume "
                                          r"with the data it was trained on, or start a new run with another --out$"):
        run(resumed)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    (out / "data.json").unlink()  # a run from before data.json: not checked
    assert check_run(resumed).data_fingerprint != json.loads(before[out / "data.json"])["sha1"]


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
    # No training rows: the data is what to mend, not "--batch-size 8 is larger than the 0 training examples".
    ({"x_train": np.zeros((0, 32, 32, 3), np.uint8), "y_train": np.zeros(0), "x_test": np.zeros((2, 32, 32, 3),
      np.uint8), "y_test": np.zeros(2)}, "arrays:bad.npz's training split holds no examples"),
])
def test_bad_arrays_are_named_before_training(micro, tmp_path: Path, arrays: dict, message: str) -> None:
    path = _npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_run(micro(**{"data.dataset": f"arrays:{path}"}))


def test_an_empty_test_split_is_refused_where_the_run_evaluates(micro, tmp_path: Path) -> None:
    """No test rows with evaluation on: the run ended complete with no test score and no word. Without
    evaluation nothing reads the split, and the run goes ahead."""
    path = _npz(tmp_path / "bad.npz", x_train=np.zeros((40, 32, 32, 3), np.uint8), y_train=np.zeros(40),
                x_test=np.zeros((0, 32, 32, 3), np.uint8), y_test=np.zeros(0))
    with pytest.raises(DataError, match=re.escape(
            "arrays:bad.npz's test split holds no examples, so the run would have no test score: give it rows, or "
            "train without evaluation (--no-train.eval)")):
        check_run(micro(**{"data.dataset": f"arrays:{path}", "train.eval": True}))
    assert check_run(micro(**{"data.dataset": f"arrays:{path}", "train.eval": False})).steps_per_epoch == 1

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


@pytest.mark.parametrize("entry", [[1, 2], [[0.5, 0.5, 0.5], [0, 0, 0]], [[0.5, 0.5], [0.2, 0.2]], "x", None,
                                   [[0.5, 0.5, 0.5], [0.2, "nan", 0.2]]],
                         ids=["numbers", "zero-std", "two-channels", "text", "null", "nan"])
def test_a_damaged_statistics_entry_is_computed_again(tmp_path: Path, entry: object) -> None:
    """An edited or damaged entry in image-stats.json was trusted: [1, 2] stopped the run with an internal error
    (a TypeError), a zero std made the first loss nan, reported as a run that diverged. It is computed again and
    the file mended."""
    import json

    from shardbench.data.stats import CACHE_NAME, cached_stats

    images = np.random.default_rng(0).integers(0, 100, (72, 8, 8, 3), dtype=np.uint8)
    cached_stats(tmp_path, "mine", images)
    path = tmp_path / CACHE_NAME
    (key,) = json.loads(path.read_text())
    path.write_text(json.dumps({key: entry}))
    assert cached_stats(tmp_path, "mine", images) == channel_stats(images)
    assert _stats_entry(json.loads(path.read_text())[key]) == channel_stats(images)  # mended


def _stats_entry(value: list[list[float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return tuple(value[0]), tuple(value[1])


@pytest.mark.parametrize(("arrays", "overrides", "message"), [
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.zeros(4), "x_test": np.zeros((2, 40, 40, 3),
      np.uint8), "y_test": np.zeros(2)}, {}, "x_test is uint8 (2, 40, 40, 3) but x_train is uint8 (4, 32, 32, 3)"),
    ({"x_train": np.zeros((4, 17), np.int32), "y_train": np.zeros(4), "x_test": np.full((2, 17), 600, np.int32),
      "y_test": np.zeros(2)}, {"model.kind": "lm", "model.seq_len": 16, "model.vocab_size": 512},
     "x_test[0, 0] is token id 600, outside --model.vocab-size's [0, 512): --model.vocab-size 601 or more takes "
     "every id of x_test"),
    ({"x_train": np.zeros((4, 17), np.int32), "y_train": np.zeros(4), "x_test": np.zeros((2, 17), np.int32),
      "y_test": np.zeros(2)} | {"x_train": np.array([[0] * 16 + [-3]] * 4, np.int32)},
     {"model.kind": "lm", "model.seq_len": 16, "model.vocab_size": 512},
     "x_train[0, 16] is token id -3, outside --model.vocab-size's [0, 512): ids are never negative"),
    # Arrays that are no rows of numbers: named by key and file, not a TypeError or ValueError inside numpy.
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.array(3, np.int64), "x_test": np.zeros(
      (2, 32, 32, 3), np.uint8), "y_test": np.zeros(2)}, {},
     "bad.npz: y_train is a single int64 value (a 0-d array), not one row per example: save an array of shape"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.zeros(4), "x_test": np.array(0, np.uint8),
      "y_test": np.zeros(2)}, {}, "bad.npz: x_test is a single uint8 value (a 0-d array)"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.array(["cat", "dog", "cat", "dog"]),
      "x_test": np.zeros((2, 32, 32, 3), np.uint8), "y_test": np.zeros(2)}, {},
     "bad.npz: y_train is <U3 (text): every array must hold bool, integer or float numbers"),
    ({"x_train": np.zeros((4, 256)), "y_train": np.zeros((4, 10)), "x_test": np.zeros((2, 256)),
      "y_test": np.full((2, 10), "1.5")}, {"model.kind": "mlp", "model.input_dim": 256},
     "bad.npz: y_test is <U3 (text): every array must hold bool, integer or float numbers"),
    ({"x_train": np.zeros((4, 256)), "y_train": np.zeros((4, 10), np.complex64), "x_test": np.zeros((2, 256)),
      "y_test": np.zeros((2, 10))}, {"model.kind": "mlp", "model.input_dim": 256},
     "bad.npz: y_train is complex64 (complex numbers)"),
    # A value that is no finite number, named by key and place: a NaN in x_train was "loss became nan at step 1"
    # (exit 3, blaming training), one in x_test a complete record with a test loss of NaN.
    ({"x_train": np.zeros((4, 256)), "y_train": np.zeros((4, 10)), "x_test": np.array([[0.0] * 256, [0.0] * 255 + [
      np.nan]]), "y_test": np.zeros((2, 10))}, {"model.kind": "mlp", "model.input_dim": 256},
     "bad.npz: x_test[1, 255] is nan: every value must be a finite number; replace or drop that row"),
    ({"x_train": np.full((4, 256), np.inf, np.float32), "y_train": np.zeros((4, 10)), "x_test": np.zeros((2, 256)),
      "y_test": np.zeros((2, 10))}, {"model.kind": "mlp", "model.input_dim": 256},
     "bad.npz: x_train[0, 0] is inf: every value must be a finite number"),
    # Labels: whole numbers only (2.7 is not truncated to class 2), in range before the cast (2**32 is not class 0).
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.array([0.0, 1.0, 2.7, 3.0]),
      "x_test": np.zeros((2, 32, 32, 3), np.uint8), "y_test": np.zeros(2)}, {},
     "arrays:bad.npz: y_train[2] is 2.7, not a class id: labels must be whole numbers (integers, or floats such as "
     "3.0)"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.zeros(4), "x_test": np.zeros((2, 32, 32, 3),
      np.uint8), "y_test": np.array([1.0, np.nan])}, {},
     "bad.npz: y_test[1] is nan: every value must be a finite number"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.array([0, 1, 2**32, 3]),
      "x_test": np.zeros((2, 32, 32, 3), np.uint8), "y_test": np.zeros(2)}, {},
     "arrays:bad.npz: y_train holds 0 to 4294967296: labels must be class ids in [0, 10)"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.zeros((4, 1)), "x_test": np.zeros((2, 32, 32, 3),
      np.uint8), "y_test": np.zeros((2, 1))}, {},
     "arrays:bad.npz: y_train is (4, 1): labels must be class ids, one per image (N,)"),
    # Images: every split x_train's dtype exactly (uint16 is not uint8), the split and the file named.
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint8), "y_train": np.zeros(4), "x_test": np.zeros((2, 32, 32, 3),
      np.uint16), "y_test": np.zeros(2)}, {}, "arrays:bad.npz: x_test is uint16 (2, 32, 32, 3) but x_train is uint8 "
                                              "(4, 32, 32, 3)"),
    ({"x_train": np.zeros((4, 32, 32, 3), np.uint16), "y_train": np.zeros(4), "x_test": np.zeros((2, 32, 32, 3),
      np.uint8), "y_test": np.zeros(2)}, {}, "arrays:bad.npz: images to classify must be uint8 (N, H, W, 3) with "
                                             "H = W, got x_train uint16 (4, 32, 32, 3)"),
])
def test_every_split_is_checked_against_the_model(micro, tmp_path: Path, arrays: dict, overrides: dict,
                                                  message: str) -> None:
    path = _npz(tmp_path / "bad.npz", **arrays)
    cfg = micro(**{"data.dataset": f"arrays:{path}", **overrides})
    with pytest.raises(DataError, match=re.escape(message)):
        load_for(cfg, tmp_path / "cache")


def test_whole_images_of_another_size_than_the_model_takes_are_the_configurations_to_mend(micro,
                                                                                         tmp_path: Path) -> None:
    """Exit 2 (a configuration that cannot run), not 4 (a corrupt file): the file is whole, a flag mends it."""
    path = _npz(tmp_path / "big.npz", x_train=np.zeros((4, 40, 40, 3), np.uint8), y_train=np.zeros(4),
                x_test=np.zeros((2, 40, 40, 3), np.uint8), y_test=np.zeros(2))
    with pytest.raises(ConfigError, match=re.escape("has 40x40 images but the model expects 32x32; pass "
                                                    "--data.image-size 40")):
        load_for(micro(**{"data.dataset": f"arrays:{path}"}), tmp_path / "cache")


def test_token_splits_of_any_integer_dtype_load_alike(micro, tmp_path: Path) -> None:
    """Token ids saved as uint16 for train (as tokenizers' outputs often are) and int64 for test: both are integers
    of the vocabulary, read as int32; float test tokens are still refused."""
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 64, (30, 17))
    path = _npz(tmp_path / "tokens.npz", x_train=tokens[:20].astype(np.uint16), y_train=np.zeros(20),
                x_test=tokens[20:], y_test=np.zeros(10))
    lm = {"model.kind": "lm", "model.vocab_size": 64, "model.seq_len": 16}
    ds = load_for(micro(**lm, **{"data.dataset": f"arrays:{path}"}), tmp_path / "cache")
    assert ds.test.columns()["tokens"].dtype == ds.train.columns()["tokens"].dtype == np.int32
    np.testing.assert_array_equal(ds.test.columns()["tokens"], tokens[20:])
    floats = _npz(tmp_path / "floats.npz", x_train=tokens[:20].astype(np.uint16), y_train=np.zeros(20),
                  x_test=tokens[20:].astype(np.float32), y_test=np.zeros(10))
    with pytest.raises(DataError, match=re.escape("x_test is float32 (10, 17) but x_train is uint16 (20, 17)")):
        load_for(micro(**lm, **{"data.dataset": f"arrays:{floats}"}), tmp_path / "cache")


def test_labels_saved_as_whole_floats_are_class_ids(micro, tmp_path: Path) -> None:
    """`np.savez(y_train=np.zeros(n))` saves float64 labels: whole values are taken as the class ids they are."""
    path = _npz(tmp_path / "floats.npz", x_train=np.zeros((4, 32, 32, 3), np.uint8), y_train=np.array([0., 9., 3., 1.]),
                x_test=np.zeros((2, 32, 32, 3), np.uint8), y_test=np.array([2., 5.]), x_val=np.zeros((1, 32, 32, 3),
                np.uint8), y_val=np.array([True]))
    ds = load_for(micro(**{"data.dataset": f"arrays:{path}"}), tmp_path / "cache")
    assert ds.train.labels.tolist() == [0, 9, 3, 1] and ds.test.labels.tolist() == [2, 5]
    assert ds.val.labels.tolist() == [1] and ds.train.labels.dtype == np.int32
