"""The CIFAR recipe's on-device augmentations (issue 16): random crop of a zero-padded image, a TrivialAugment-
style op per image, and mixup / cutmix between the two images of a pair. All run inside the jitted train step
on float32 images in [0, 255]; every draw is made for the global batch and sliced to the rows a program holds
(`rows`), so every strategy and SPMD style augments each image the same way.

TrivialAugment (Müller and Hutter, 2021): each image gets one op, chosen uniformly, at a magnitude drawn
uniformly. The ops here are the ones that vectorise without a data-dependent branch: every op is applied to
every image with parameters that make it the identity unless it was the one chosen.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from shardbench.config import DataConfig
from shardbench.data.augment import draws, resized_crop_flip

OPS = ("identity", "brightness", "contrast", "saturation", "solarize", "posterize", "autocontrast", "rotate",
       "shear_x", "shear_y", "translate_x", "translate_y")
# Strength at magnitude 1 (TrivialAugment's "wide" ranges, rotation and translation as in RandAugment).
ENHANCE = 0.99  # brightness, contrast, saturation factors in [0.01, 1.99]
ROTATE_DEG = 30.0
SHEAR = 0.3
TRANSLATE = 0.3  # of the image side
POSTERIZE_BITS = (2, 8)  # bits kept: 8 (identity) down to 2
FILL = 128.0  # grey where a geometric op uncovers the image
UNIFORMS = 8  # per image: 5 for the crop and flip (3 for the padded one), then op, magnitude, sign


def pad_crop_flip(image: jax.Array, u: jax.Array, pad: int, flip: bool) -> jax.Array:
    """A (H, W, C) crop at a uniform integer offset of the image zero-padded by `pad` on every side, mirrored
    when u[2] < 0.5 (and `flip`). Exact: shifting by one-hot matrices moves whole pixels."""
    h, w = image.shape[0], image.shape[1]
    dy = jnp.floor(u[0] * (2 * pad + 1)).astype(jnp.int32) - pad
    dx = jnp.floor(u[1] * (2 * pad + 1)).astype(jnp.int32) - pad
    wy = jax.nn.one_hot(jnp.arange(h) + dy, h, dtype=image.dtype)  # an index off the image: a zero row
    wx = jax.nn.one_hot(jnp.arange(w) + dx, w, dtype=image.dtype)
    if flip:
        wx = jnp.where(u[2] < 0.5, wx[::-1], wx)
    return jnp.einsum("oh,hwc,pw->opc", wy, image, wx, precision=jax.lax.Precision.HIGHEST)


def _gray(x: jax.Array) -> jax.Array:
    """ITU-R 601 luma, as Pillow's convert('L')."""
    return (x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114)[..., None]


def _blend(base: jax.Array, x: jax.Array, factor: jax.Array) -> jax.Array:
    """Pillow's ImageEnhance: base + factor x (x - base), clipped."""
    return jnp.clip(base + factor * (x - base), 0.0, 255.0)


def _affine(image: jax.Array, matrix: jax.Array) -> jax.Array:
    """Output pixel p (row, column, about the centre) samples the input at matrix @ p, bilinearly, grey outside.
    The identity matrix returns the image exactly."""
    h, w = image.shape[0], image.shape[1]
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    rr, cc = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32) - cy, jnp.arange(w, dtype=jnp.float32) - cx,
                          indexing="ij")
    src = jnp.einsum("ij,jhw->ihw", matrix[:, :2], jnp.stack([rr, cc])) + matrix[:, 2, None, None]
    coords = [src[0] + cy, src[1] + cx]
    return jnp.stack([jax.scipy.ndimage.map_coordinates(image[..., c], coords, order=1, mode="constant",
                                                        cval=FILL) for c in range(image.shape[-1])], -1)


def trivial_augment(image: jax.Array, u: jax.Array) -> jax.Array:
    """One op of `OPS` on a float32 (H, W, C) image in [0, 255]: u = (op, magnitude, sign) uniforms."""
    op = jnp.minimum(jnp.floor(u[0] * len(OPS)).astype(jnp.int32), len(OPS) - 1)
    signed = u[1] * jnp.where(u[2] < 0.5, -1.0, 1.0)

    def chosen(name: str) -> jax.Array:
        return op == OPS.index(name)

    x = image
    x = _blend(jnp.zeros_like(x), x, jnp.where(chosen("brightness"), 1.0 + ENHANCE * signed, 1.0))
    x = _blend(jnp.mean(_gray(x)), x, jnp.where(chosen("contrast"), 1.0 + ENHANCE * signed, 1.0))
    x = _blend(_gray(x), x, jnp.where(chosen("saturation"), 1.0 + ENHANCE * signed, 1.0))
    threshold = jnp.where(chosen("solarize"), 256.0 * (1.0 - u[1]), 256.0)
    x = jnp.where(x >= threshold, 255.0 - x, x)
    lo_bits, hi_bits = POSTERIZE_BITS
    bits = jnp.where(chosen("posterize"), hi_bits - jnp.round(u[1] * (hi_bits - lo_bits)), 8.0)
    step = 2.0 ** (8.0 - bits)
    x = jnp.where(chosen("posterize"), jnp.floor(x / step) * step, x)
    lo, hi = x.min(axis=(0, 1)), x.max(axis=(0, 1))
    stretched = jnp.where(hi > lo, (x - lo) * 255.0 / jnp.maximum(hi - lo, 1e-6), x)
    x = jnp.where(chosen("autocontrast"), jnp.clip(stretched, 0.0, 255.0), x)
    # A positive angle turns the image counter-clockwise, as Pillow's rotate does.
    angle = jnp.where(chosen("rotate"), -math.radians(ROTATE_DEG) * signed, 0.0)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    shear_x = jnp.where(chosen("shear_x"), SHEAR * signed, 0.0)
    shear_y = jnp.where(chosen("shear_y"), SHEAR * signed, 0.0)
    ty = jnp.where(chosen("translate_y"), TRANSLATE * image.shape[0] * signed, 0.0)
    tx = jnp.where(chosen("translate_x"), TRANSLATE * image.shape[1] * signed, 0.0)
    # Rows then columns: rotation about the centre, then the shears, then the shift (in pixels).
    rotation = jnp.stack([jnp.stack([cos, -sin]), jnp.stack([sin, cos])])
    shear = jnp.stack([jnp.stack([1.0, shear_y]), jnp.stack([shear_x, 1.0])])
    linear = rotation @ shear
    matrix = jnp.concatenate([linear, -jnp.stack([ty, tx])[:, None]], axis=1)  # a positive shift moves it down, right
    geometric = chosen("rotate") | chosen("shear_x") | chosen("shear_y") | chosen("translate_x") | \
        chosen("translate_y")
    return jnp.where(geometric, _affine(x, matrix), x)


def _swap(x: jax.Array) -> jax.Array:
    """Each row's pair partner (rows 2k and 2k+1 exchanged), by a reshape: a batch split over devices in even
    shares swaps without moving anything between them (a gather by index could)."""
    b = x.shape[0]
    return x.reshape(b // 2, 2, *x.shape[1:])[:, ::-1].reshape(x.shape)


def _first(x: jax.Array) -> jax.Array:
    """Each row replaced by its pair's first row."""
    b = x.shape[0]
    pairs = x.reshape(b // 2, 2, *x.shape[1:])
    return jnp.broadcast_to(pairs[:, :1], pairs.shape).reshape(x.shape)


def _pairs(u: jax.Array, lam: jax.Array, cutmix: float, h: int, w: int
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """For every row: (use CutMix?, its box as an (B, h, w) mask, the weight of the row's own label), from its
    pair's first row's draws."""
    u, lam = _first(u), _first(lam)
    # The box: sqrt(1 - lam) of each side, centred uniformly, clipped to the image; the same box in both.
    cut_h, cut_w = jnp.sqrt(1.0 - lam) * h, jnp.sqrt(1.0 - lam) * w
    cy, cx = u[:, 1] * h, u[:, 2] * w
    y0, y1 = jnp.round(jnp.clip(cy - cut_h / 2, 0, h)), jnp.round(jnp.clip(cy + cut_h / 2, 0, h))
    x0, x1 = jnp.round(jnp.clip(cx - cut_w / 2, 0, w)), jnp.round(jnp.clip(cx + cut_w / 2, 0, w))
    rows, cols = jnp.arange(h)[None, :, None], jnp.arange(w)[None, None, :]
    box = ((rows >= y0[:, None, None]) & (rows < y1[:, None, None])
           & (cols >= x0[:, None, None]) & (cols < x1[:, None, None]))
    use_cut = u[:, 0] < cutmix
    return use_cut, box, jnp.where(use_cut, 1.0 - box.mean(axis=(1, 2)), lam)


def mix_pairs(images: jax.Array, u: jax.Array, lam: jax.Array, cutmix: float) -> tuple[jax.Array, jax.Array]:
    """Mix the two images of each pair (rows 2k and 2k+1: the caller keeps pairs on one program). Per pair,
    with probability `cutmix` each image gets the same box of its partner, covering about 1 - lam of it
    (CutMix), else each becomes lam x itself + (1 - lam) x its partner (mixup). `u` holds (choice, box y,
    box x) uniforms and `lam` the weight, per row; a pair uses its first row's. Returns the images and the
    weight of each image's own label (its partner's label gets the rest)."""
    h, w = images.shape[1], images.shape[2]
    use_cut, box, own = _pairs(u, lam, cutmix, h, w)
    other = _swap(images)
    weight = own[:, None, None, None]
    blended = weight * images + (1.0 - weight) * other
    cut = jnp.where(box[..., None], other, images)
    return jnp.where(use_cut[:, None, None, None], cut, blended), own


def uses_recipe(data: DataConfig) -> bool:
    """Whether training images go through this recipe rather than the seed's crop and flip
    (`shardbench.data.augment.augment`, kept bit for bit as it was)."""
    return data.crop != "resized" or data.trivial_augment or data.mixup > 0


def _keys(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(per-image augmentation, pair mixing, mixing weights) keys from the step's augmentation key."""
    a, b, c = jax.random.split(key, 3)
    return a, b, c


def mix_draws(data: DataConfig, key: jax.Array, rows: tuple[jax.Array | int, int], count: int
              ) -> tuple[jax.Array, jax.Array]:
    """(per-row (choice, box y, box x) uniforms, per-row Beta(alpha, alpha) weights) for `count` rows."""
    _, k_mix, k_lam = _keys(key)
    offset, total = rows
    u = draws(k_mix, total, offset, count, 3)
    if data.mixup == 1.0:  # Beta(1, 1) is the uniform: no rejection-sampling loop to compile (+39% on a CPU)
        lam = jax.random.uniform(k_lam, (total,), dtype=jnp.float32)
    else:
        lam = jax.random.beta(k_lam, data.mixup, data.mixup, (total,), dtype=jnp.float32)
    return u, jax.lax.dynamic_slice_in_dim(lam, jnp.asarray(offset, jnp.int32), count)


def recipe_images(data: DataConfig, images_u8: jax.Array, key: jax.Array,
                  rows: tuple[jax.Array | int, int]) -> jax.Array:
    """Training images through the recipe, as float32 in [0, 255]: the crop (padded, or resized as the seed's)
    and flip, TrivialAugment, then mixing within pairs."""
    offset, total = rows
    b = images_u8.shape[0]
    x = images_u8.astype(jnp.float32)
    if data.augment:
        u = draws(_keys(key)[0], total, offset, b, UNIFORMS)
        if data.crop == "pad":
            x = jax.vmap(lambda im, ui: pad_crop_flip(im, ui, data.crop_pad, data.flip))(x, u[:, :3])
        else:
            scale, ratio = tuple(map(float, data.crop_scale)), tuple(map(float, data.crop_ratio))
            x = jax.vmap(lambda im, ui: resized_crop_flip(im, ui, scale, ratio, data.flip))(x, u[:, :5])
        if data.trivial_augment:
            x = jax.vmap(trivial_augment)(x, u[:, 5:8])
    if data.mixup > 0:
        u_mix, lam = mix_draws(data, key, rows, b)
        x, _ = mix_pairs(x, u_mix, lam, data.cutmix)
    return x


def soft_targets(data: DataConfig, labels: jax.Array, classes: int, smoothing: float, key: jax.Array,
                 rows: tuple[jax.Array | int, int]) -> jax.Array:
    """(B, classes) float32 targets: each image's label, mixed with its partner's by the weight its pixels
    were mixed with (the same draws as `recipe_images`), then smoothed."""
    target = jax.nn.one_hot(labels, classes, dtype=jnp.float32)
    if data.mixup > 0:
        b = labels.shape[0]
        u_mix, lam = mix_draws(data, key, rows, b)
        own = _pairs(u_mix, lam, data.cutmix, data.image_size, data.image_size)[2]
        target = own[:, None] * target + (1.0 - own[:, None]) * _swap(target)
    return (1.0 - smoothing) * target + smoothing / classes
