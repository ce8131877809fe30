"""The recipe's softer mixing and its other policies: mixing with a probability and only for the first part of
training, RandAugment and AutoAugment's ops against Pillow and torchvision's definitions, random erasing,
repeated augmentation, their one-line refusals, and one device's losses under fsdp+tp and fsdp as shard_map with
all of them on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from shardbench.config import DataConfig
from shardbench.data import policies, recipe
from shardbench.data.arrays import ImageArrays
from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD, normalize_float
from shardbench.data.epochs import steps_per_epoch
from shardbench.data.pipeline import make_batches
from shardbench.errors import ConfigError
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.train.loop import run
from shardbench.validation import validate

RNG = np.random.default_rng(11)
IMAGE = RNG.integers(0, 256, (32, 32, 3)).astype(np.uint8)
KEY = jax.random.key(3)


def _data(**fields: object) -> DataConfig:
    return dataclasses.replace(DataConfig(), **fields)


# ------------------------------------------------------------------------------------------ softer mixing
def test_mix_prob_mixes_that_share_of_pairs_and_leaves_the_rest_as_they_were() -> None:
    data = _data(augment=False, mixup=1.0, mix_prob=0.3)
    b = 4096
    images = jnp.asarray(RNG.integers(0, 256, (b, 4, 4, 3)).astype(np.uint8))
    labels = jnp.asarray(np.arange(b) % 10)  # the two images of a pair never share a label
    mixed = np.asarray(recipe.recipe_images(data, images, KEY, (0, b)))
    targets = np.asarray(recipe.soft_targets(data, labels, 10, 0.0, KEY, (0, b)))
    untouched = np.all(mixed.reshape(b, -1) == np.asarray(images, np.float32).reshape(b, -1), axis=1)
    pairs = untouched.reshape(-1, 2)
    assert np.all(pairs[:, 0] == pairs[:, 1])  # a pair is mixed or left whole together
    share = 1.0 - pairs[:, 0].mean()
    sigma = np.sqrt(0.3 * 0.7 / (b // 2))
    assert abs(share - 0.3) < 5 * sigma, share
    one_hot = np.eye(10, dtype=np.float32)[np.asarray(labels)]
    np.testing.assert_array_equal(targets[untouched], one_hot[untouched])
    assert np.all(np.abs(targets[~untouched] - one_hot[~untouched]).sum(axis=1) > 0)


def test_mix_until_stops_mixing_at_that_fraction_of_the_steps() -> None:
    data = _data(augment=False, mixup=1.0, cutmix=0.5, mix_until=0.6)
    b, steps = 64, 10  # mixing for steps 0..5 (round(0.6 x 10) = 6), none from step 6
    images = jnp.asarray(RNG.integers(0, 256, (b, 8, 8, 3)).astype(np.uint8))
    labels = jnp.asarray(np.arange(b) % 10)
    one_hot = np.eye(10, dtype=np.float32)[np.asarray(labels)]
    for step in range(steps):
        x = np.asarray(recipe.recipe_images(data, images, KEY, (0, b), (jnp.asarray(step), steps)))
        t = np.asarray(recipe.soft_targets(data, labels, 10, 0.0, KEY, (0, b), (jnp.asarray(step), steps)))
        if step < 6:
            assert not np.array_equal(x, np.asarray(images, np.float32)), step
            assert not np.array_equal(t, one_hot), step
        else:
            np.testing.assert_array_equal(x, np.asarray(images, np.float32))
            np.testing.assert_array_equal(t, one_hot)
    # Where the run's length is not known (a step compiled only to be measured) nothing is switched off.
    x = np.asarray(recipe.recipe_images(data, images, KEY, (0, b), (jnp.asarray(9), 0)))
    assert not np.array_equal(x, np.asarray(images, np.float32))


# ------------------------------------------------------------------------------- RandAugment and AutoAugment
def _apply(name: str, level: float, sign: float = 1.0, image: np.ndarray = IMAGE) -> np.ndarray:
    ops = recipe.ALL_OPS
    out = recipe.apply_op(jnp.asarray(image, jnp.float32), jnp.asarray(ops.index(name)), level, sign, ops,
                          recipe.TORCHVISION)
    return np.asarray(out)


@pytest.mark.parametrize(("name", "level", "pillow"), [
    ("sharpness", 0.7, lambda im: ImageEnhance.Sharpness(im).enhance(1.0 + 0.9 * 0.7)),
    ("sharpness", 0.5, lambda im: ImageEnhance.Sharpness(im).enhance(1.0 + 0.9 * 0.5)),
    ("equalize", 0.0, ImageOps.equalize),
    ("invert", 0.0, ImageOps.invert),
    ("autocontrast", 0.0, ImageOps.autocontrast),
    ("posterize", 7 / 9, lambda im: ImageOps.posterize(im, 5)),  # torchvision: 8 - round(7 / (9 / 4)) = 5 bits
    ("solarize", 2 / 9, lambda im: ImageOps.solarize(im, 255 * (1 - 2 / 9))),
    ("brightness", 0.6, lambda im: ImageEnhance.Brightness(im).enhance(1.0 + 0.9 * 0.6)),
])
def test_ops_match_pillow_at_torchvisions_strengths(name: str, level: float, pillow: object) -> None:
    """Each op at a level of torchvision's augmentation space against Pillow on the same uint8 image, within
    Pillow's rounding to whole levels."""
    low_contrast = (IMAGE // 2 + 40).astype(np.uint8)  # leaves equalize and autocontrast something to do
    for image in (IMAGE, low_contrast):
        want = np.asarray(pillow(Image.fromarray(image)), np.float32)  # type: ignore[operator]
        got = _apply(name, level, image=image)
        assert np.abs(got - want).max() <= 1.0, (name, np.abs(got - want).max())


def test_level_zero_is_the_identity_for_every_op_with_a_strength() -> None:
    for name in ("brightness", "saturation", "contrast", "sharpness", "rotate", "shear_x", "shear_y",
                 "translate_x", "translate_y", "posterize"):
        np.testing.assert_allclose(_apply(name, 0.0), IMAGE.astype(np.float32), atol=1e-3, err_msg=name)
    # RandAugment at magnitude 0 then changes an image only through the ops that have no strength.
    strengthless = {"identity", "autocontrast", "equalize", "solarize"}
    count = 2
    u = jnp.asarray([0.5, 0.9] * count)
    for i, name in enumerate(policies.RANDAUGMENT_OPS):
        if name in strengthless:
            continue
        u = jnp.asarray([(i + 0.5) / len(policies.RANDAUGMENT_OPS), 0.9] * count)
        out = recipe.rand_augment(jnp.asarray(IMAGE, jnp.float32), u, count, 0.0)
        np.testing.assert_allclose(np.asarray(out), IMAGE.astype(np.float32), atol=1e-3, err_msg=name)


def test_randaugment_applies_n_ops_at_the_magnitude() -> None:
    """Two ops, both translate_x at M = 15 towards +x: half of 150/331 of the side each, truncated to whole
    pixels, moving the content right as torchvision's affine does; the two together move it by their sum."""
    ops = policies.RANDAUGMENT_OPS
    u_op = (ops.index("translate_x") + 0.5) / len(ops)
    out = np.asarray(recipe.rand_augment(jnp.asarray(IMAGE, jnp.float32), jnp.asarray([u_op, 0.9, u_op, 0.9]),
                                         2, 15.0))
    shift = int(150 / 331 * 32 * 0.5)  # 7 pixels each
    once = _apply("translate_x", 0.5)
    np.testing.assert_array_equal(once[:, shift:], IMAGE[:, :32 - shift].astype(np.float32))
    np.testing.assert_array_equal(out[:, 2 * shift:], IMAGE[:, :32 - 2 * shift].astype(np.float32))
    assert np.all(out[:, :2 * shift] == recipe.FILL)  # what the shift uncovers is grey


def test_autoaugment_table_is_torchvisions_cifar10_policy() -> None:
    table = policies.AUTOAUGMENT_CIFAR10
    assert len(table) == 25 and all(len(pair) == 2 for pair in table)
    for pair in table:
        for name, probability, level in pair:
            assert name in policies.AUTOAUGMENT_OPS and name in recipe.ALL_OPS
            assert 0.0 <= probability <= 1.0 and (level is None or 0 <= level < policies.AUTOAUGMENT_BINS)
    assert table[0] == (("invert", 0.1, None), ("contrast", 0.2, 6))
    assert table[-1] == (("translate_y", 0.7, 9), ("autocontrast", 0.9, None))


def test_autoaugment_applies_a_sub_policy_with_its_probabilities() -> None:
    """Sub-policy 2 is sharpness (0.8, level 1) then sharpness (0.9, level 3): with both draws under their
    probabilities, the two sharpenings; with both over, the image itself; with a draw between the two, the op
    whose probability it is under."""
    k = (2 + 0.5) / 25
    x = jnp.asarray(IMAGE, jnp.float32)
    both = np.asarray(recipe.auto_augment(x, jnp.asarray([k, 0.1, 0.9, 0.1, 0.9])))
    want = _apply("sharpness", 3 / 9, image=_apply("sharpness", 1 / 9).round().astype(np.uint8))
    assert np.abs(both - want).max() <= 1.0
    neither = np.asarray(recipe.auto_augment(x, jnp.asarray([k, 0.95, 0.9, 0.95, 0.9])))
    np.testing.assert_array_equal(neither, IMAGE.astype(np.float32))
    # A draw of 0.85 lies between the two probabilities: each op is held to its own.
    second = np.asarray(recipe.auto_augment(x, jnp.asarray([k, 0.85, 0.9, 0.1, 0.9])))
    assert np.abs(second - _apply("sharpness", 3 / 9)).max() <= 1.0  # 0.85 > 0.8: the first op is skipped
    both_again = np.asarray(recipe.auto_augment(x, jnp.asarray([k, 0.1, 0.9, 0.85, 0.9])))
    assert np.abs(both_again - want).max() <= 1.0  # 0.85 <= 0.9: the second op applies


# --------------------------------------------------------------------------------------------- random erasing
def test_random_erasing_erases_one_box_of_the_drawn_size() -> None:
    h = w = 32
    zeros = jnp.zeros((h, w, 1))
    u = jnp.asarray(RNG.uniform(size=(400, 5)), jnp.float32)
    boxes = np.asarray(jax.vmap(lambda ui: recipe.erase(zeros, ui, jnp.ones((h, w, 1)), 1.0))(u))[..., 0]
    areas = boxes.mean(axis=(1, 2))
    for box in boxes:
        rows, cols = np.flatnonzero(box.any(axis=1)), np.flatnonzero(box.any(axis=0))
        assert rows.size and np.all(np.diff(rows) == 1) and np.all(np.diff(cols) == 1)  # one rectangle
        assert box.sum() == rows.size * cols.size
    # The box covers 2-33% of the image, less only where a side is clamped to the image less one pixel.
    assert areas.max() <= 1 / 3 + 0.02 and np.median(areas) >= 0.1
    assert np.mean((areas >= 0.02 - 1e-6) & (areas <= 1 / 3 + 0.02)) >= 0.95
    untouched = np.asarray(jax.vmap(lambda ui: recipe.erase(zeros, ui, jnp.ones((h, w, 1)), 0.0))(u))
    assert not untouched.any()


def test_the_mean_fill_is_zero_once_normalised_and_the_random_one_is_standard_normal() -> None:
    shape = (64, 8, 8, 3)
    mean_fill = recipe.erasing_fill(_data(erasing_fill="mean"), KEY, (0, 64), shape, CIFAR_MEAN, CIFAR_STD)
    np.testing.assert_allclose(np.asarray(normalize_float(mean_fill / 255.0, CIFAR_MEAN, CIFAR_STD, jnp.float32)),
                               0.0, atol=1e-6)
    noise = recipe.erasing_fill(_data(erasing_fill="random"), KEY, (0, 64), shape, CIFAR_MEAN, CIFAR_STD)
    z = np.asarray(normalize_float(noise / 255.0, CIFAR_MEAN, CIFAR_STD, jnp.float32))
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1.0) < 0.05
    # Drawn for the global batch: the second half's rows are what the whole batch's draw holds there.
    half = recipe.erasing_fill(_data(erasing_fill="random"), KEY, (32, 64), (32, 8, 8, 3), CIFAR_MEAN, CIFAR_STD)
    np.testing.assert_array_equal(np.asarray(half), np.asarray(noise)[32:])


# ---------------------------------------------------------------------------------- repeated augmentation
def test_repeated_augmentation_tiles_distinct_images_and_keeps_the_epoch_a_pass() -> None:
    n, batch, k = 40, 8, 2
    images = np.zeros((n, 4, 4, 3), np.uint8)
    arrays = ImageArrays(images, np.arange(n, dtype=np.int32))
    per_epoch = steps_per_epoch(n, batch, k)
    assert per_epoch == n // (batch // k) == 2 * steps_per_epoch(n, batch)
    seen = []
    for b in make_batches(arrays, global_batch=batch, seed=0, shuffle=True, num_steps=per_epoch, repeats=k):
        labels = b["label"].tolist()
        block = labels[:batch // k]
        copies = [labels[j * (batch // k):(j + 1) * (batch // k)] for j in range(k)]
        assert all(sorted(c) == sorted(block) for c in copies) and len(set(block)) == batch // k  # B/k rows each
        assert all(labels[i] != labels[i + 1] for i in range(0, batch, 2))  # mixing pairs: two images
        seen += block
    assert sorted(seen) == list(range(n))  # one epoch: every image once (as batch // k copies)


def test_copies_of_an_image_are_augmented_differently() -> None:
    data = _data(crop="pad", trivial_augment=True, random_erasing=0.5)
    block = RNG.integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    batch = jnp.asarray(np.concatenate([block, block]))
    out = np.asarray(recipe.recipe_images(data, batch, KEY, (0, 8)))
    for i in range(4):
        assert not np.array_equal(out[i], out[i + 4]), i


# ----------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("overrides", "says"), [
    ({"data.trivial_augment": True, "data.autoaugment": True}, "are two op policies"),
    ({"data.randaugment": 2, "data.autoaugment": True}, "are two op policies"),
    ({"data.mix_prob": 0.5}, "--data.mix-prob 0.5 shapes mixing, which is off"),
    ({"data.mix_until": 0.6}, "--data.mix-until 0.6 shapes mixing, which is off"),
    ({"data.repeat_augment": 3, "train.batch_size": 32}, "must be a multiple of 3"),
    ({"data.erasing_fill": "zeros", "data.random_erasing": 0.25}, "unknown --data.erasing-fill 'zeros'"),
    ({"data.randaugment_magnitude": 31.0}, "randaugment-magnitude"),
])
def test_recipe_knobs_that_cannot_work_are_one_line(overrides: dict[str, object], says: str) -> None:
    cfg = override(get_preset("vit-tiny"), overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_knobs_for_images_are_refused_for_other_models() -> None:
    for flag, overrides in (("--data.autoaugment", {"data.autoaugment": True}),
                            ("--data.repeat-augment", {"data.repeat_augment": 2})):
        with pytest.raises(ConfigError, match=flag):
            validate(override(get_preset("lm-tiny"), overrides))


# ----------------------------------------------------------------------------------- one device's losses
def _losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]


KNOBS = {"data.crop": "pad", "data.autoaugment": True, "data.random_erasing": 0.5, "data.mixup": 1.0,
         "data.cutmix": 0.5, "data.mix_prob": 0.5, "data.mix_until": 0.5, "data.repeat_augment": 2,
         "train.label_smoothing": 0.1}


# vit-cifar-cct's model pieces: the convolutional tokenizer (16x16 images: 64 tokens) and sequence pooling.
CCT_MODEL = {"model.stem": "conv", "model.pool": "sequence", "data.image_size": 16}


@pytest.mark.slow
def test_every_strategy_trains_on_the_same_images_with_every_knob(micro) -> None:
    """AutoAugment, random erasing, mixing with a probability and for half the steps, repeated augmentation, on a
    ViT with CCT's convolutional tokenizer and sequence pooling: one device's losses under fsdp+tp (2-D) and
    fsdp as shard_map, step by step, through the switch-off at step 2 of 4. (Data parallelism under jit is
    fsdp+tp's data axis at another size: tests/test_recipe.py runs the whole recipe under dp.)"""
    knobs = {**KNOBS, **CCT_MODEL}
    out = micro().train.out
    run(micro(**knobs, **{"parallel.strategy": "single", "train.out": out + "-single"}))
    base = _losses(Path(out + "-single"))
    assert len(base) == 4
    for name, overrides in {"fsdp_tp": {"parallel.strategy": "fsdp+tp", "parallel.mesh": "4x2"},
                            "fsdp_shard_map": {"parallel.strategy": "fsdp", "parallel.mesh": "8",
                                               "parallel.spmd": "shard_map"}}.items():
        run(micro(**knobs, **overrides, **{"train.out": out + "-" + name}))
        assert _losses(Path(out + "-" + name)) == pytest.approx(base, rel=2e-5, abs=2e-6), name
    # The knobs change what is trained on: without them the losses differ.
    run(micro(**CCT_MODEL, **{"parallel.strategy": "single", "train.out": out + "-plain"}))
    assert _losses(Path(out + "-plain")) != pytest.approx(base, rel=1e-3)
