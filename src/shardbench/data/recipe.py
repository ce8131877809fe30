"""The CIFAR recipe's on-device augmentations: random crop of a zero-padded image, one of three op policies
(TrivialAugment, RandAugment, AutoAugment's CIFAR-10 policy), random erasing, and mixup / CutMix between the
two images of a pair (with a probability, and only for the first part of training where asked). All run inside
the jitted train step on float32 images in [0, 255]; every draw is made for the global batch and sliced to the
rows a program holds (`rows`), so every strategy and SPMD style augments each image the same way.

TrivialAugment (Müller and Hutter, 2021): each image gets one op, chosen uniformly, at a magnitude drawn
uniformly. RandAugment (Cubuk et al., 2020): N ops in a row, each drawn uniformly, all at one magnitude M.
AutoAugment (Cubuk et al., 2019): one of the 25 sub-policies found for CIFAR-10, each of its two ops applied with
its own probability at its own level (`shardbench.data.policies`). The ops here are the ones that vectorise
without a data-dependent branch: every op of a policy's list is applied to every image with parameters that make
it the identity unless it was the one chosen; an op outside the list is not computed at all. Ops work on float
pixels without rounding to whole levels between two ops (Pillow rounds after each; equalize and sharpness round
their own input). Geometric ops sample bilinearly and fill with grey (128), as the AutoAugment paper's code fills;
torchvision's AutoAugment and RandAugment default to nearest sampling and a black fill.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardbench.config import DataConfig
from shardbench.data import policies
from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD, draws, resized_crop_flip

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
# Every op `apply_op` knows: TrivialAugment's, then the three that only RandAugment and AutoAugment use.
ALL_OPS = (*OPS, "invert", "sharpness", "equalize")
# Random erasing (timm's RandomErasing): the box's share of the image and its aspect ratio (log-uniform).
ERASE_AREA = (0.02, 1.0 / 3.0)
ERASE_ASPECT = (0.3, 1.0 / 0.3)
ERASE_UNIFORMS = 5  # per image: erase?, area, aspect, top, left
# Where step and run length are not known (a step compiled only to be measured): nothing is switched off.
Progress = tuple[jax.Array | int, int]


class AugmentSpace(NamedTuple):
    """Each op's strongest setting (at level 1). Level 0 is the identity for every op that has a level, except
    solarize where `solarize_from` is 255 (torchvision's: pixels at 255 are inverted even at level 0)."""

    enhance: float  # brightness, contrast, saturation, sharpness: factor 1 +- enhance
    rotate_deg: float
    shear: float
    translate: float  # of the image side
    whole_pixels: bool  # translations truncated to whole pixels (torchvision's int())
    posterize_bits: tuple[int, int]  # (fewest, most) bits kept; level 0 keeps the most
    solarize_from: float  # the solarize threshold at level 0, falling linearly to 0 at level 1
    shear_from_corner: bool = False  # shear about the top-left corner (torchvision's center=[0, 0]), not the centre


# TrivialAugment's ranges as this recipe has always used them (shears about the centre).
TRIVIAL = AugmentSpace(ENHANCE, ROTATE_DEG, SHEAR, TRANSLATE, False, POSTERIZE_BITS, 256.0)
# torchvision's AutoAugment and RandAugment ranges (_augmentation_space), shearing as its _apply_op does: about the
# image's top-left corner, as the AutoAugment paper's PIL code (1, level, 0, 0, 1, 0).
TORCHVISION = AugmentSpace(0.9, 30.0, 0.3, 150.0 / 331.0, True, (4, 8), 255.0, True)


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


def _sharpness_base(x: jax.Array) -> jax.Array:
    """Pillow's ImageFilter.SMOOTH (3x3 kernel [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13, rounded) inside the image,
    the border kept: what ImageEnhance.Sharpness blends away from."""
    h, w = x.shape[0], x.shape[1]
    total = sum(x[dy:dy + h - 2, dx:dx + w - 2] for dy in range(3) for dx in range(3))
    inner = jnp.round((total + 4.0 * x[1:-1, 1:-1]) / 13.0)
    return x.at[1:-1, 1:-1].set(inner)


def _equalize(x: jax.Array) -> jax.Array:
    """Pillow's ImageOps.equalize per channel, on the image rounded to whole levels: level v becomes
    (step // 2 + pixels below v) // step, step = (pixels - pixels at the top level) // 255; a channel whose step
    is 0 (one level, or nearly) is left as it was. A histogram by scatter-add: no sort, no data-dependent loop."""
    h, w, c = x.shape
    levels = jnp.clip(jnp.round(x), 0.0, 255.0).astype(jnp.int32).reshape(h * w, c)
    hist = jax.vmap(lambda v: jnp.zeros(256, jnp.int32).at[v].add(1), in_axes=1, out_axes=1)(levels)  # (256, c)
    top = jnp.take_along_axis(hist, levels.max(axis=0)[None], axis=0)[0]
    step = (h * w - top) // 255
    below = jnp.cumsum(hist, axis=0) - hist
    lut = jnp.minimum((step // 2 + below) // jnp.maximum(step, 1), 255)
    out = jnp.take_along_axis(lut, levels, axis=0).astype(x.dtype).reshape(h, w, c)
    return jnp.where(step > 0, out, x)


def apply_op(image: jax.Array, op: jax.Array, level: jax.Array | float, sign: jax.Array | float,
             ops: tuple[str, ...], space: AugmentSpace) -> jax.Array:
    """Op number `op` of `ops` on a float32 (H, W, C) image in [0, 255], at `level` in [0, 1] of its strongest
    setting in `space`, towards `sign` (+1 or -1) where it has a direction. Every op of `ops` is computed with
    parameters that make it the identity unless it is the chosen one."""
    signed = level * sign

    def chosen(name: str) -> jax.Array:
        return op == ops.index(name) if name in ops else jnp.asarray(False)

    x = image
    if "brightness" in ops:
        x = _blend(jnp.zeros_like(x), x, jnp.where(chosen("brightness"), 1.0 + space.enhance * signed, 1.0))
    if "contrast" in ops:
        x = _blend(jnp.mean(_gray(x)), x, jnp.where(chosen("contrast"), 1.0 + space.enhance * signed, 1.0))
    if "saturation" in ops:
        x = _blend(_gray(x), x, jnp.where(chosen("saturation"), 1.0 + space.enhance * signed, 1.0))
    if "solarize" in ops:
        threshold = jnp.where(chosen("solarize"), space.solarize_from * (1.0 - level), 256.0)
        x = jnp.where(x >= threshold, 255.0 - x, x)
    if "posterize" in ops:
        lo_bits, hi_bits = space.posterize_bits
        bits = jnp.where(chosen("posterize"), hi_bits - jnp.round(level * (hi_bits - lo_bits)), 8.0)
        step = 2.0 ** (8.0 - bits)
        x = jnp.where(chosen("posterize"), jnp.floor(x / step) * step, x)
    if "autocontrast" in ops:
        lo, hi = x.min(axis=(0, 1)), x.max(axis=(0, 1))
        stretched = jnp.where(hi > lo, (x - lo) * 255.0 / jnp.maximum(hi - lo, 1e-6), x)
        x = jnp.where(chosen("autocontrast"), jnp.clip(stretched, 0.0, 255.0), x)
    if "invert" in ops:
        x = jnp.where(chosen("invert"), 255.0 - x, x)
    if "sharpness" in ops:
        sharp = _blend(_sharpness_base(x), x, 1.0 + space.enhance * signed)
        x = jnp.where(chosen("sharpness"), sharp, x)
    if "equalize" in ops:
        x = jnp.where(chosen("equalize"), _equalize(x), x)
    geometric_ops = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
    if not any(name in ops for name in geometric_ops):
        return x
    # A positive angle turns the image counter-clockwise, as Pillow's rotate does.
    angle = jnp.where(chosen("rotate"), -math.radians(space.rotate_deg) * signed, 0.0)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    shear_x = jnp.where(chosen("shear_x"), space.shear * signed, 0.0)
    shear_y = jnp.where(chosen("shear_y"), space.shear * signed, 0.0)
    ty = jnp.where(chosen("translate_y"), space.translate * image.shape[0] * signed, 0.0)
    tx = jnp.where(chosen("translate_x"), space.translate * image.shape[1] * signed, 0.0)
    if space.whole_pixels:
        ty, tx = jnp.trunc(ty), jnp.trunc(tx)
    if space.shear_from_corner:  # about the image's top-left corner, half a pixel outside the first pixel's centre
        ty, tx = ty - shear_y * image.shape[1] / 2.0, tx - shear_x * image.shape[0] / 2.0
    # Rows then columns: rotation about the centre, then the shears, then the shift (in pixels).
    rotation = jnp.stack([jnp.stack([cos, -sin]), jnp.stack([sin, cos])])
    shear = jnp.stack([jnp.stack([1.0, shear_y]), jnp.stack([shear_x, 1.0])])
    linear = rotation @ shear
    matrix = jnp.concatenate([linear, -jnp.stack([ty, tx])[:, None]], axis=1)  # a positive shift moves it down, right
    geometric = chosen("rotate") | chosen("shear_x") | chosen("shear_y") | chosen("translate_x") | \
        chosen("translate_y")
    return jnp.where(geometric, _affine(x, matrix), x)


def _sign(u: jax.Array) -> jax.Array:
    return jnp.where(u < 0.5, -1.0, 1.0)


def trivial_augment(image: jax.Array, u: jax.Array) -> jax.Array:
    """One op of `OPS` on a float32 (H, W, C) image in [0, 255]: u = (op, magnitude, sign) uniforms."""
    op = jnp.minimum(jnp.floor(u[0] * len(OPS)).astype(jnp.int32), len(OPS) - 1)
    return apply_op(image, op, u[1], _sign(u[2]), OPS, TRIVIAL)


def rand_augment(image: jax.Array, u: jax.Array, count: int, magnitude: float) -> jax.Array:
    """RandAugment: `count` ops of `policies.RANDAUGMENT_OPS` in a row, each drawn uniformly (with replacement),
    all at `magnitude` / 30 of their strongest setting (torchvision's ranges); u = (op, sign) uniforms per op."""
    ops = policies.RANDAUGMENT_OPS
    x = image
    for i in range(count):
        op = jnp.minimum(jnp.floor(u[2 * i] * len(ops)).astype(jnp.int32), len(ops) - 1)
        x = apply_op(x, op, magnitude / policies.RANDAUGMENT_MAX, _sign(u[2 * i + 1]), ops, TORCHVISION)
    return x


def _policy_table() -> tuple[jax.Array, jax.Array, jax.Array]:
    """AutoAugment's CIFAR-10 policy as (25, 2) arrays: op numbers in AUTOAUGMENT_OPS, probabilities, levels."""
    table = policies.AUTOAUGMENT_CIFAR10
    ops = [[policies.AUTOAUGMENT_OPS.index(name) for name, _, _ in pair] for pair in table]
    probs = [[p for _, p, _ in pair] for pair in table]
    levels = [[(level or 0) / (policies.AUTOAUGMENT_BINS - 1) for _, _, level in pair] for pair in table]
    return jnp.asarray(ops, jnp.int32), jnp.asarray(probs, jnp.float32), jnp.asarray(levels, jnp.float32)


def auto_augment(image: jax.Array, u: jax.Array) -> jax.Array:
    """AutoAugment's CIFAR-10 policy on one image: a sub-policy drawn uniformly, then each of its two ops applied
    when its uniform is at most the op's probability (as torchvision), at the op's level, towards a drawn sign;
    u = (sub-policy, then apply and sign per op) uniforms."""
    ops, probs, levels = _policy_table()
    k = jnp.minimum(jnp.floor(u[0] * ops.shape[0]).astype(jnp.int32), ops.shape[0] - 1)
    x = image
    for j in range(2):
        op = jnp.where(u[1 + 2 * j] <= probs[k, j], ops[k, j], 0)  # 0: identity
        x = apply_op(x, op, levels[k, j], _sign(u[2 + 2 * j]), policies.AUTOAUGMENT_OPS, TORCHVISION)
    return x


def erase(image: jax.Array, u: jax.Array, fill: jax.Array, probability: float) -> jax.Array:
    """Random erasing (Zhong et al., 2020; timm's RandomErasing) of one (H, W, C) image: with `probability`
    (u[0] < it), a box of ERASE_AREA of the image at a log-uniform ERASE_ASPECT, placed uniformly, takes `fill`'s
    pixels. timm retries boxes that do not fit; clamping the sides to the image less one pixel instead needs no
    loop. u = (erase?, area, aspect, top, left) uniforms."""
    h, w = image.shape[0], image.shape[1]
    area = h * w * (ERASE_AREA[0] + (ERASE_AREA[1] - ERASE_AREA[0]) * u[1])
    log_lo, log_hi = math.log(ERASE_ASPECT[0]), math.log(ERASE_ASPECT[1])
    aspect = jnp.exp(log_lo + (log_hi - log_lo) * u[2])
    eh = jnp.clip(jnp.round(jnp.sqrt(area * aspect)), 1, h - 1)
    ew = jnp.clip(jnp.round(jnp.sqrt(area / aspect)), 1, w - 1)
    top, left = jnp.floor(u[3] * (h - eh + 1)), jnp.floor(u[4] * (w - ew + 1))
    rows, cols = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
    box = (rows >= top) & (rows < top + eh) & (cols >= left) & (cols < left + ew) & (u[0] < probability)
    return jnp.where(box[..., None], fill, image)


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
    return (data.crop != "resized" or data.trivial_augment or data.randaugment > 0 or data.autoaugment
            or data.random_erasing > 0 or data.mixup > 0)


def _keys(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(per-image augmentation, pair mixing, mixing weights) keys from the step's augmentation key. Draws added
    later fold a number into one of these, so the draws of a configuration without them stay as they were."""
    a, b, c = jax.random.split(key, 3)
    return a, b, c


def mixing_on(data: DataConfig, key: jax.Array, rows: tuple[jax.Array | int, int], count: int,
              progress: Progress) -> jax.Array | None:
    """Per row, whether its pair is mixed at all: with probability `data.mix_prob` (a pair follows its first
    row's draw), and only while the step is below `data.mix_until` of the run's steps (a traced comparison: one
    program for the whole run). None where every pair is mixed (the defaults: no draw, no comparison)."""
    offset, total = rows
    step, steps = progress
    on = None
    if data.mix_prob < 1.0:
        on = draws(jax.random.fold_in(_keys(key)[1], 1), total, offset, count, 1)[:, 0] < data.mix_prob
    if data.mix_until < 1.0 and steps > 0:
        during = jnp.broadcast_to(jnp.asarray(step) < round(data.mix_until * steps), (count,))
        on = during if on is None else on & during
    return on


def mix_draws(data: DataConfig, key: jax.Array, rows: tuple[jax.Array | int, int], count: int,
              progress: Progress = (0, 0)) -> tuple[jax.Array, jax.Array]:
    """(per-row (choice, box y, box x) uniforms, per-row Beta(alpha, alpha) weights) for `count` rows. A pair
    left unmixed (`mixing_on`) gets weight 1: mixup then returns each image itself and CutMix an empty box, so
    images and soft targets, which both come from here, stay in agreement."""
    _, k_mix, k_lam = _keys(key)
    offset, total = rows
    u = draws(k_mix, total, offset, count, 3)
    if data.mixup == 1.0:  # Beta(1, 1) is the uniform: no rejection-sampling loop to compile (+39% on a CPU)
        lam = jax.random.uniform(k_lam, (total,), dtype=jnp.float32)
    else:
        lam = jax.random.beta(k_lam, data.mixup, data.mixup, (total,), dtype=jnp.float32)
    lam = jax.lax.dynamic_slice_in_dim(lam, jnp.asarray(offset, jnp.int32), count)
    on = mixing_on(data, key, rows, count, progress)
    return u, lam if on is None else jnp.where(on, lam, 1.0)


def policy_uniforms(data: DataConfig) -> int:
    """Uniforms per image the op policy draws: RandAugment (op, sign) per op, AutoAugment (sub-policy, then
    apply and sign per op); TrivialAugment's come with the crop's (`UNIFORMS`)."""
    if data.randaugment > 0:
        return 2 * data.randaugment
    return 5 if data.autoaugment else 0


def erasing_fill(data: DataConfig, key: jax.Array, rows: tuple[jax.Array | int, int], shape: tuple[int, ...],
                 mean: tuple[float, ...], std: tuple[float, ...]) -> jax.Array:
    """What an erased box holds, in [0, 255] units: `mean`, the dataset's mean (0 once normalised), or `random`,
    a standard normal per pixel and channel once normalised (timm's mode 'pixel'), drawn for the global batch."""
    m = jnp.asarray(mean, jnp.float32) * 255.0
    if data.erasing_fill == "mean":
        return jnp.broadcast_to(m, shape)
    offset, total = rows
    noise = jax.random.normal(jax.random.fold_in(_keys(key)[0], 3), (total, *shape[1:]), dtype=jnp.float32)
    noise = jax.lax.dynamic_slice_in_dim(noise, jnp.asarray(offset, jnp.int32), shape[0])
    return m + noise * (jnp.asarray(std, jnp.float32) * 255.0)


def recipe_images(data: DataConfig, images_u8: jax.Array, key: jax.Array, rows: tuple[jax.Array | int, int],
                  progress: Progress = (0, 0), mean: tuple[float, ...] = CIFAR_MEAN,
                  std: tuple[float, ...] = CIFAR_STD) -> jax.Array:
    """Training images through the recipe, as float32 in [0, 255] (erased boxes may leave that range): the crop
    (padded, or resized as the seed's) and flip, the op policy (TrivialAugment, RandAugment or AutoAugment),
    random erasing, then mixing within pairs. `progress` = (step, the run's steps) decides `data.mix_until`;
    `mean` and `std` (the dataset's, in [0, 1]) are what erasing fills with."""
    offset, total = rows
    b = images_u8.shape[0]
    x = images_u8.astype(jnp.float32)
    if data.augment:
        k_aug = _keys(key)[0]
        u = draws(k_aug, total, offset, b, UNIFORMS)
        if data.crop == "pad":
            x = jax.vmap(lambda im, ui: pad_crop_flip(im, ui, data.crop_pad, data.flip))(x, u[:, :3])
        else:
            scale, ratio = tuple(map(float, data.crop_scale)), tuple(map(float, data.crop_ratio))
            x = jax.vmap(lambda im, ui: resized_crop_flip(im, ui, scale, ratio, data.flip))(x, u[:, :5])
        if data.trivial_augment:
            x = jax.vmap(trivial_augment)(x, u[:, 5:8])
        if policy_uniforms(data):
            u_op = draws(jax.random.fold_in(k_aug, 1), total, offset, b, policy_uniforms(data))
            if data.randaugment > 0:
                x = jax.vmap(lambda im, ui: rand_augment(im, ui, data.randaugment, data.randaugment_magnitude))(
                    x, u_op)
            else:
                x = jax.vmap(auto_augment)(x, u_op)
        if data.random_erasing > 0:
            u_erase = draws(jax.random.fold_in(k_aug, 2), total, offset, b, ERASE_UNIFORMS)
            fill = erasing_fill(data, key, rows, x.shape, mean, std)
            x = jax.vmap(lambda im, ui, f: erase(im, ui, f, data.random_erasing))(x, u_erase, fill)
    if data.mixup > 0:
        u_mix, lam = mix_draws(data, key, rows, b, progress)
        x, _ = mix_pairs(x, u_mix, lam, data.cutmix)
    return x


def soft_targets(data: DataConfig, labels: jax.Array, classes: int, smoothing: float, key: jax.Array,
                 rows: tuple[jax.Array | int, int], progress: Progress = (0, 0)) -> jax.Array:
    """(B, classes) float32 targets: each image's label, mixed with its partner's by the weight its pixels
    were mixed with (the same draws as `recipe_images`, `progress` included), then smoothed."""
    target = jax.nn.one_hot(labels, classes, dtype=jnp.float32)
    if data.mixup > 0:
        b = labels.shape[0]
        u_mix, lam = mix_draws(data, key, rows, b, progress)
        own = _pairs(u_mix, lam, data.cutmix, data.image_size, data.image_size)[2]
        target = own[:, None] * target + (1.0 - own[:, None]) * _swap(target)
    return (1.0 - smoothing) * target + smoothing / classes
