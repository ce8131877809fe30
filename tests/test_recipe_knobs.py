"""The recipe's new knobs where tests/test_recipe_policies.py leaves off: the geometric and colour ops of
torchvision's space against Pillow (shears about the top-left corner, whole-pixel shifts, rotation, contrast and
colour), AutoAugment's whole CIFAR-10 table as torchvision spells it, random erasing's box drawn by drawn and its
fill through the whole recipe, repeated augmentation split over processes, and every new knob slicing its draws
from the global batch."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageEnhance

from shardbench.config import DataConfig
from shardbench.data import policies, recipe
from shardbench.data.arrays import ImageArrays
from shardbench.data.augment import normalize_float
from shardbench.data.epochs import steps_per_epoch
from shardbench.data.pipeline import make_batches

RNG = np.random.default_rng(23)
IMAGE = RNG.integers(0, 256, (32, 32, 3)).astype(np.uint8)
YY, XX = np.mgrid[0:32, 0:32]
# A smooth image: bilinear sampling by Pillow and by the recipe then differ only by Pillow's rounding.
SMOOTH = np.stack([YY * 8, XX * 8, (YY + XX) * 4], -1).clip(0, 255).astype(np.uint8)
GREY = 128.0


def _tv(name: str, level: float, sign: float, image: np.ndarray) -> np.ndarray:
    """Op `name` of torchvision's space (AutoAugment's and RandAugment's) at `level` towards `sign`."""
    ops = recipe.ALL_OPS
    return np.asarray(recipe.apply_op(jnp.asarray(image, jnp.float32), jnp.asarray(ops.index(name)), level, sign,
                                      ops, recipe.TORCHVISION))


@pytest.mark.parametrize(("name", "enhance"), [("contrast", ImageEnhance.Contrast), ("saturation", ImageEnhance.Color)])
def test_contrast_and_colour_match_pillow_at_torchvisions_strengths(name: str, enhance: type) -> None:
    """Factor 1 +- 0.9 x level, as torchvision's _augmentation_space; within Pillow's rounding (its grey is
    integer, its contrast mean rounded to a whole level)."""
    for level, sign in [(1.0, 1.0), (1.0, -1.0), (4 / 9, 1.0)]:
        want = np.asarray(enhance(Image.fromarray(IMAGE)).enhance(1.0 + 0.9 * level * sign), np.float32)
        got = _tv(name, level, sign, IMAGE)
        assert np.abs(got - want).max() <= 1.5, (name, level, sign, np.abs(got - want).max())


@pytest.mark.parametrize("name", ["shear_x", "shear_y"])
def test_shears_are_pillows_about_the_top_left_corner(name: str) -> None:
    """torchvision shears about the corner (center=[0, 0]), as AutoAugment's PIL code (1, m, 0, 0, 1, 0): Pillow's
    affine transform with the same m, bilinear, grey outside. Where the source lies inside the image, within
    Pillow's rounding; more than a pixel outside, the grey fill. A shear about the centre is 0.3 x 16 = 4.8 pixels
    off at the strongest level and fails both."""
    for level, sign in [(1.0, 1.0), (1.0, -1.0), (5 / 9, 1.0)]:
        m = 0.3 * level * sign
        data = (1, m, 0, 0, 1, 0) if name == "shear_x" else (1, 0, 0, m, 1, 0)
        want = np.asarray(Image.fromarray(SMOOTH).transform((32, 32), Image.AFFINE, data, resample=Image.BILINEAR,
                                                             fillcolor=(128, 128, 128)), np.float32)
        got = _tv(name, level, sign, SMOOTH)
        source = XX + m * (YY + 0.5) if name == "shear_x" else YY + m * (XX + 0.5)  # pixel-centre coordinates
        inside, outside = (source >= 0) & (source <= 31), (source < -1) | (source > 32)
        assert inside.sum() > 800 and outside.sum() > 50
        assert np.abs(got - want)[inside].max() <= 1.0, (level, sign)
        np.testing.assert_array_equal(got[outside], GREY)


def test_translations_are_whole_pixels_and_rotation_is_pillows() -> None:
    """Translate: int(150/331 x 32 x level) pixels (14 at level 1, torchvision's int()), towards the sign, grey
    where uncovered. Rotate: Pillow's rotate by 30 x level degrees (counter-clockwise for +), inside the image."""
    for level, shift in [(1.0, 14), (5 / 9, 8)]:
        assert int(150 / 331 * 32 * level) == shift
        right = np.full((32, 32, 3), GREY, np.float32)
        right[:, shift:] = IMAGE[:, :32 - shift]
        np.testing.assert_array_equal(_tv("translate_x", level, 1.0, IMAGE), right)
        left = np.full((32, 32, 3), GREY, np.float32)
        left[:, :32 - shift] = IMAGE[:, shift:]
        np.testing.assert_array_equal(_tv("translate_x", level, -1.0, IMAGE), left)
        down = np.full((32, 32, 3), GREY, np.float32)
        down[shift:] = IMAGE[:32 - shift]
        np.testing.assert_array_equal(_tv("translate_y", level, 1.0, IMAGE), down)
    inner = (slice(6, 26), slice(6, 26))
    for level, sign in [(1.0, 1.0), (1.0, -1.0)]:
        want = np.asarray(Image.fromarray(SMOOTH).rotate(30.0 * level * sign, resample=Image.BILINEAR,
                                                         fillcolor=(128, 128, 128)), np.float32)
        assert np.abs(_tv("rotate", level, sign, SMOOTH)[inner] - want[inner]).max() <= 1.01, sign


# torchvision's AutoAugmentPolicy.CIFAR10, in its spelling, typed from its source.
TORCHVISION_CIFAR10 = [
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)), (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)), (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)), (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)), (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)), (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)), (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)), (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)), (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)), (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)), (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)), (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)), (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
]
TV_NAMES = {"Invert": "invert", "Contrast": "contrast", "Rotate": "rotate", "TranslateX": "translate_x",
            "TranslateY": "translate_y", "Sharpness": "sharpness", "ShearY": "shear_y", "AutoContrast": "autocontrast",
            "Equalize": "equalize", "Posterize": "posterize", "Color": "saturation", "Brightness": "brightness",
            "Solarize": "solarize"}


def test_autoaugment_table_is_torchvisions_row_by_row() -> None:
    want = tuple(tuple((TV_NAMES[n], p, level) for n, p, level in pair) for pair in TORCHVISION_CIFAR10)
    assert policies.AUTOAUGMENT_CIFAR10 == want
    assert set(policies.AUTOAUGMENT_OPS) == {"identity", *TV_NAMES.values()}
    ops, probs, levels = (np.asarray(a) for a in recipe._policy_table())
    assert ops.shape == probs.shape == levels.shape == (25, 2)
    # Levels as torchvision's 10 bins: level L is L/9 of the strongest setting; ops without one at 0.
    assert levels[1, 1] == pytest.approx(1.0) and levels[0, 0] == 0.0 and levels[6, 0] == pytest.approx(3 / 9)


def _erase_all(u: np.ndarray, fill: np.ndarray, probability: float, image: np.ndarray) -> np.ndarray:
    erase = jax.vmap(lambda ui: recipe.erase(jnp.asarray(image), ui, jnp.asarray(fill), probability))
    return np.asarray(erase(jnp.asarray(u, jnp.float32)))


def test_random_erasing_puts_one_box_of_the_drawn_size_filled_with_the_fill() -> None:
    """With probability 1, every image: exactly one rectangle differs, holding the fill's pixels there. Its sides
    are the drawn area x aspect's (log-uniform in [0.3, 3.33]) rounded, clamped to the side less one pixel
    (erase's docstring): so its share is the drawn one in [0.02, 1/3] up to half a pixel on each side, less where
    clamped; never a whole side. With probability 0 nothing changes; at 0.25, a quarter of the images."""
    h = w = 32
    n = 600
    u = RNG.uniform(size=(n, 5)).astype(np.float32)
    u[:, 0] = 0.5  # erase
    image = RNG.uniform(0, 255, (h, w, 3)).astype(np.float32)
    fill = RNG.normal(500.0, 10.0, (h, w, 3)).astype(np.float32)  # nothing of the image looks like it
    out = _erase_all(u, fill, 1.0, image)
    drawn = 0.02 + (1 / 3 - 0.02) * u[:, 1].astype(np.float64)
    aspect = np.exp(math.log(0.3) + (math.log(1 / 0.3) - math.log(0.3)) * u[:, 2].astype(np.float64))
    clamped = 0
    for i in range(n):
        box = (out[i] != image).any(-1)
        rows, cols = np.flatnonzero(box.any(1)), np.flatnonzero(box.any(0))
        eh, ew = rows.size, cols.size
        assert box.sum() == eh * ew and np.all(np.diff(rows) == 1) and np.all(np.diff(cols) == 1), i
        np.testing.assert_array_equal(out[i][box], fill[box])
        np.testing.assert_array_equal(out[i][~box], image[~box])
        assert 1 <= eh <= h - 1 and 1 <= ew <= w - 1
        # placed uniformly: top over the h - eh + 1 rows it can start at by u[3], left likewise by u[4]
        assert rows[0] <= u[i, 3] * (h - eh + 1) + 1e-4 and u[i, 3] * (h - eh + 1) < rows[0] + 1 + 1e-4, i
        assert cols[0] <= u[i, 4] * (w - ew + 1) + 1e-4 and u[i, 4] * (w - ew + 1) < cols[0] + 1 + 1e-4, i
        sh, sw = math.sqrt(drawn[i] * h * w * aspect[i]), math.sqrt(drawn[i] * h * w / aspect[i])
        if sh + 0.5 < h - 1 and sw + 0.5 < w - 1:
            assert abs(eh - sh) <= 0.5 + 1e-3 and abs(ew - sw) <= 0.5 + 1e-3, i
            assert (sh - 0.5) * (sw - 0.5) <= eh * ew <= (sh + 0.5) * (sw + 0.5)
        else:
            clamped += 1
            assert eh * ew <= drawn[i] * h * w + 0.5 * (sh + sw) + 0.25
        assert 0.014 <= eh * ew / (h * w) <= 1 / 3 + 0.02
    assert 0 < clamped < n // 4
    np.testing.assert_array_equal(_erase_all(u, fill, 0.0, image), np.broadcast_to(image, out.shape))
    u[:, 0] = RNG.uniform(size=n)
    erased = (_erase_all(u, fill, 0.25, image) != image).any(axis=(1, 2, 3))
    assert abs(erased.mean() - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n)


def test_the_mean_fill_through_the_recipe_is_zero_once_normalised() -> None:
    """recipe_images with erasing on every image (no crop shift, no flip) and the mean fill: once normalised with
    the statistics it was given, each image holds one box of exact zeros, the rest as normalising it alone."""
    data = DataConfig(crop="pad", crop_pad=0, flip=False, random_erasing=1.0, erasing_fill="mean")
    images = RNG.integers(0, 256, (8, 32, 32, 3)).astype(np.uint8)
    mean, std = (0.3, 0.5, 0.7), (0.2, 0.25, 0.3)
    out = recipe.recipe_images(data, jnp.asarray(images), jax.random.key(5), (0, 8), mean=mean, std=std)
    z = np.asarray(normalize_float(out / 255.0, mean, std, jnp.float32))
    plain = np.asarray(normalize_float(jnp.asarray(images, jnp.float32) / 255.0, mean, std, jnp.float32))
    for i in range(8):
        box = np.abs(z[i] - plain[i]).max(-1) > 1e-4
        assert 0.01 < box.mean() <= 1 / 3 + 0.02
        np.testing.assert_allclose(z[i][box], 0.0, atol=1e-5)
        np.testing.assert_allclose(z[i][~box], plain[i][~box], atol=1e-5)


def test_repeated_batches_split_over_processes_and_evaluation_ignores_repeats() -> None:
    """k = 2, global batch 8 over 2 processes: each process's rows are its half of [a b c d | the same in another
    order] (the copies of an image on different processes); 43 examples make 43 // 4 = 10 steps an epoch (3
    dropped), each kept example once; the second copy pairs images differently for mixing (not every step can:
    4 images have 3 pairings); an evaluation pass sees every example once whatever `repeats` says."""
    n, batch, k = 43, 8, 2
    arrays = ImageArrays(np.zeros((n, 2, 2, 3), np.uint8), np.arange(n, dtype=np.int32))
    per_epoch = steps_per_epoch(n, batch, k)
    assert per_epoch == 10
    kw = {"global_batch": batch, "seed": 4, "shuffle": True, "num_steps": per_epoch, "repeats": k, "prefetch": 0}
    whole = [b["label"].tolist() for b in make_batches(arrays, **kw)]
    parts = [[b["label"].tolist() for b in make_batches(arrays, **kw, process_index=i, process_count=2)]
             for i in range(2)]
    seen, repaired = [], 0
    for step, labels in enumerate(whole):
        assert sorted(labels[:4]) == sorted(labels[4:]) and len(set(labels[:4])) == 4
        assert parts[0][step] + parts[1][step] == labels
        pairs = [{labels[i], labels[i + 1]} for i in range(0, batch, 2)]
        assert all(len(p) == 2 for p in pairs)
        repaired += pairs[2] not in pairs[:2]
        seen += labels[:4]
    assert len(seen) == 40 == len(set(seen))
    assert repaired >= 3  # 2/3 of the steps on average
    # The next epoch is another order of the same images.
    later = [b["label"].tolist() for b in make_batches(arrays, **kw, start_step=per_epoch)]
    assert [x[:4] for x in later] != [x[:4] for x in whole]
    evaluated = [b["label"][b["mask"]].tolist() for b in make_batches(arrays, global_batch=batch, seed=0, shuffle=False,
                                                                       repeats=k, prefetch=0)]
    assert sorted(sum(evaluated, [])) == list(range(n))


@pytest.mark.slow
@pytest.mark.parametrize("policy", [{"autoaugment": True}, {"randaugment": 2, "randaugment_magnitude": 12.0}])
def test_every_new_knob_slices_its_draws_from_the_global_batch(policy: dict[str, object]) -> None:
    """A program holding rows 4..7 of 8 augments and mixes them as the whole batch's program does, with an op
    policy, erasing filled with noise, mixing with a probability and before a fraction of the steps (a traced
    step, as in training), so every strategy sees the same images and targets."""
    data = dataclasses.replace(DataConfig(crop="pad", crop_pad=4, random_erasing=0.5, erasing_fill="random",
                                          mixup=1.0, cutmix=0.5, mix_prob=0.5, mix_until=0.5), **policy)
    images = jnp.asarray(RNG.integers(0, 256, (8, 32, 32, 3)), jnp.uint8)
    labels = jnp.asarray(RNG.integers(0, 10, (8,)))
    key, progress = jax.random.key(9), (jnp.asarray(3), 10)
    images_fn = jax.jit(lambda x, offset: recipe.recipe_images(data, x, key, (offset, 8), progress))
    whole = images_fn(images, 0)
    part = images_fn(images[4:], 4)
    np.testing.assert_allclose(np.asarray(part), np.asarray(whole)[4:], rtol=1e-6, atol=1e-4)
    soft = recipe.soft_targets(data, labels, 10, 0.1, key, (0, 8), progress)
    soft_part = recipe.soft_targets(data, labels[4:], 10, 0.1, key, (4, 8), progress)
    np.testing.assert_allclose(np.asarray(soft_part), np.asarray(soft)[4:], rtol=1e-6)
