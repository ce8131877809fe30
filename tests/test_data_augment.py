"""On-device augmentation tests: identity cases, flips, crop boxes, bilinear resize vs Pillow."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from shardbench.data import augment as aug
from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD, augment, normalize
from shardbench.errors import ConfigError


@pytest.fixture(scope="module")
def images() -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).integers(0, 256, (16, 20, 20, 3), dtype=np.uint8))


def test_normalize_values() -> None:
    x = jnp.zeros((1, 1, 2, 3), jnp.uint8).at[0, 0, 1].set(255)
    out = np.asarray(normalize(x, CIFAR_MEAN, CIFAR_STD, jnp.float32))
    np.testing.assert_allclose(out[0, 0, 0], -np.array(CIFAR_MEAN) / CIFAR_STD, rtol=1e-6)
    np.testing.assert_allclose(out[0, 0, 1], (1 - np.array(CIFAR_MEAN)) / CIFAR_STD, rtol=1e-6)
    assert normalize(x, CIFAR_MEAN, CIFAR_STD, jnp.bfloat16).dtype == jnp.bfloat16


def test_full_crop_without_flip_is_normalize(images: jax.Array) -> None:
    f = jax.jit(functools.partial(augment, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False,
                                  mean=CIFAR_MEAN, std=CIFAR_STD))
    out = f(images, jax.random.key(0))
    np.testing.assert_allclose(np.asarray(out), np.asarray(normalize(images, CIFAR_MEAN, CIFAR_STD)), atol=1e-5)


def test_flip_only_mirrors_about_half(images: jax.Array) -> None:
    x = jnp.tile(images, (16, 1, 1, 1))  # 256 images
    out = np.asarray(augment(x, jax.random.key(1), scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=True))
    plain = np.asarray(normalize(x))
    mirrored = plain[:, :, ::-1]
    same = np.abs(out - plain).max(axis=(1, 2, 3)) < 1e-5
    flipped = np.abs(out - mirrored).max(axis=(1, 2, 3)) < 1e-5
    assert (same ^ flipped).all()
    # Half of 256 with a standard deviation of 8: the seeded draw lands within 26 of 128 (3 deviations), and a
    # flip drawn with another probability (0.3, 0.7) lands outside.
    assert abs(int(flipped.sum()) - 128) <= 26, int(flipped.sum())


@pytest.mark.parametrize("shape", [(16, 20, 20, 3), (4, 12, 20, 3)])
def test_shapes_dtypes_and_determinism(shape: tuple[int, ...]) -> None:
    images = jnp.asarray(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8))
    f = jax.jit(functools.partial(augment, dtype=jnp.bfloat16))
    a, b, c = f(images, jax.random.key(2)), f(images, jax.random.key(2)), f(images, jax.random.key(3))
    assert a.shape == images.shape and a.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert not np.array_equal(np.asarray(a, np.float32), np.asarray(c, np.float32))


def test_crops_only_mix_pixels_of_the_image(images: jax.Array) -> None:
    out = np.asarray(augment(images, jax.random.key(4), scale=(0.3, 0.6), ratio=(0.5, 2.0)))
    raw = out * np.array(CIFAR_STD) + np.array(CIFAR_MEAN)  # back to [0, 1]
    x = np.asarray(images) / 255.0
    assert (raw.min(axis=(1, 2)) >= x.min(axis=(1, 2)) - 1e-5).all()
    assert (raw.max(axis=(1, 2)) <= x.max(axis=(1, 2)) + 1e-5).all()


def test_crop_boxes_follow_scale_and_ratio() -> None:
    h, w = 32, 32
    u = jax.random.uniform(jax.random.key(5), (2000, 5))
    top, left, ch, cw = (np.asarray(v) for v in
                         jax.vmap(lambda ui: aug._crop_box(ui, h, w, (0.25, 0.5), (0.75, 1.333)))(u))
    assert (top >= 0).all() and (left >= 0).all() and (top + ch <= h).all() and (left + cw <= w).all()
    area = ch * cw / (h * w)
    assert area.min() > 0.2 and area.max() < 0.56  # (0.25, 0.5) up to whole-pixel rounding
    assert np.abs(area.mean() - 0.375) < 0.02
    assert ((cw / ch > 0.6) & (cw / ch < 1.6)).all()
    assert len(set(top.tolist())) > 10 and len(set(left.tolist())) > 10  # positions vary
    # Every position is drawn, the last one (flush with the bottom or right edge) included.
    assert (top == h - ch).any() and (left == w - cw).any() and (top == 0).any() and (left == 0).any()
    # The ratio is width over height: a range that is not its own reciprocal tells the two apart. (1.5, 2) up to
    # whole-pixel rounding on a 64 x 64 image; height over width would be (0.5, 0.67).
    top, left, ch, cw = (np.asarray(v) for v in
                         jax.vmap(lambda ui: aug._crop_box(ui, 64, 64, (0.25, 0.5), (1.5, 2.0)))(u))
    assert ((cw / ch > 1.4) & (cw / ch < 2.1)).all(), (float((cw / ch).min()), float((cw / ch).max()))


@pytest.mark.parametrize("box", [(3, 5, 10, 14), (0, 0, 32, 32), (20, 2, 12, 7)])
def test_crop_resize_matches_pillow_bilinear(box: tuple[int, int, int, int]) -> None:
    """torchvision's RandomResizedCrop = crop the box, then bilinear resize (same as Pillow upscaling)."""
    top, left, ch, cw = box
    img = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    want = np.asarray(Image.fromarray(img).crop((left, top, left + cw, top + ch))
                      .resize((32, 32), Image.Resampling.BILINEAR), dtype=np.float32)
    wy = aug._resize_weights(jnp.float32(top), jnp.float32(ch), 32, 32)
    wx = aug._resize_weights(jnp.float32(left), jnp.float32(cw), 32, 32)
    got = np.asarray(jnp.einsum("oh,hwc,pw->opc", wy, jnp.asarray(img, jnp.float32), wx,
                                precision=jax.lax.Precision.HIGHEST))
    assert np.abs(got - want).max() <= 1.0  # Pillow rounds to uint8 with fixed-point weights


def test_invalid_ranges(images: jax.Array) -> None:
    with pytest.raises(ConfigError, match=r"crop scale \(0.0, 1.0\) is invalid"):
        augment(images, jax.random.key(0), scale=(0.0, 1.0))
    with pytest.raises(ConfigError, match=r"crop ratio \(2.0, 1.0\) is invalid"):
        augment(images, jax.random.key(0), ratio=(2.0, 1.0))
