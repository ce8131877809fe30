"""On-device augmentation in JAX (RandomResizedCrop + horizontal flip) and normalisation.

Meant to run inside the jitted train step on the uint8 batch, so the host only ships bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from shardbench.errors import ConfigError

# The per-channel CIFAR-10 statistics the seed notebook (and most CIFAR code) uses. The mean is the training
# images'; the std is not their pixel std, (0.247, 0.243, 0.261), but the widely copied figure below, kept so that
# runs compare with the seed's: CIFAR-10 inputs come out with a std of about 1.2, not 1.
CIFAR_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR_STD: tuple[float, float, float] = (0.2023, 0.1994, 0.2010)


def normalize(
    images_u8: jax.Array,
    mean: Sequence[float] = CIFAR_MEAN,
    std: Sequence[float] = CIFAR_STD,
    dtype: DTypeLike = jnp.float32,
) -> jax.Array:
    """(x / 255 - mean) / std per channel, computed in float32 and returned as `dtype`."""
    x = images_u8.astype(jnp.float32) / 255.0
    return normalize_float(x, mean, std, dtype)


def normalize_float(x: jax.Array, mean: Sequence[float], std: Sequence[float], dtype: DTypeLike) -> jax.Array:
    m = jnp.asarray(mean, dtype=jnp.float32)
    s = jnp.asarray(std, dtype=jnp.float32)
    return ((x - m) / s).astype(dtype)


def draws(key: jax.Array, total: int, offset: jax.Array | int, rows: int, count: int) -> jax.Array:
    """(rows, count) uniforms: the rows offset.. of one (total, count) draw for the global batch, so that a
    program holding some rows of the batch draws for them what the whole batch's program does."""
    u = jax.random.uniform(key, (total, count), dtype=jnp.float32)
    return jax.lax.dynamic_slice_in_dim(u, jnp.asarray(offset, jnp.int32), rows)


def _crop_box(
    u: jax.Array, h: int, w: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[jax.Array, ...]:
    """(top, left, height, width) of one torchvision-style RandomResizedCrop box, from 4 uniforms.

    torchvision retries up to 10 samples that do not fit and then falls back to a centre crop;
    clamping the sampled size into the image instead gives the same boxes whenever they fit and
    needs no data-dependent loop.
    """
    area = h * w * (scale[0] + (scale[1] - scale[0]) * u[0])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = jnp.exp(log_lo + (log_hi - log_lo) * u[1])
    # Integer sizes and offsets, as torchvision crops whole pixels.
    cw = jnp.clip(jnp.round(jnp.sqrt(area * aspect)), 1, w)
    ch = jnp.clip(jnp.round(jnp.sqrt(area / aspect)), 1, h)
    # Uniform integer in [0, h - ch]: u < 1, so the floor never reaches h - ch + 1.
    top = jnp.floor(u[2] * (h - ch + 1))
    left = jnp.floor(u[3] * (w - cw + 1))
    return top, left, ch, cw


def _resize_weights(offset: jax.Array, size: jax.Array, out_size: int, in_size: int) -> jax.Array:
    """(out_size, in_size) bilinear weights resizing the span [offset, offset+size) to out_size.

    Half-pixel centres and edge clamping as in torch's bilinear resize (align_corners=False),
    so sampling never leaves the crop; a full-size span gives the identity matrix exactly.
    """
    src = (jnp.arange(out_size, dtype=jnp.float32) + 0.5) * (size / out_size) - 0.5
    src = jnp.clip(src, 0.0, size - 1.0) + offset
    lo = jnp.floor(src)
    frac = (src - lo)[:, None]
    lo_i = lo.astype(jnp.int32)
    hi_i = jnp.minimum(lo_i + 1, in_size - 1)
    return jax.nn.one_hot(lo_i, in_size) * (1.0 - frac) + jax.nn.one_hot(hi_i, in_size) * frac


def resized_crop_flip(
    image: jax.Array, u: jax.Array, scale: tuple[float, float], ratio: tuple[float, float], flip: bool
) -> jax.Array:
    """One float32 (H, W, C) image in [0, 255] and its 5 uniforms: crop, resize back, maybe mirror."""
    h, w = image.shape[0], image.shape[1]
    top, left, ch, cw = _crop_box(u, h, w, scale, ratio)
    wy = _resize_weights(top, ch, h, h)
    wx = _resize_weights(left, cw, w, w)
    if flip:
        # Mirroring the output equals reversing the rows of the column-sampling matrix.
        wx = jnp.where(u[4] < 0.5, wx[::-1], wx)
    # Separable resize as two small matmuls: fast on CPU and accelerators, unlike a gather.
    # HIGHEST keeps float32 exact on GPUs that would otherwise use TF32.
    return jnp.einsum("oh,hwc,pw->opc", wy, image, wx, precision=jax.lax.Precision.HIGHEST)


def augment(
    images_u8: jax.Array,
    key: jax.Array,
    *,
    scale: tuple[float, float] = (0.9, 1.0),
    ratio: tuple[float, float] = (0.9, 1.1),
    flip: bool = True,
    mean: Sequence[float] = CIFAR_MEAN,
    std: Sequence[float] = CIFAR_STD,
    dtype: DTypeLike = jnp.float32,
    rows: tuple[jax.Array | int, int] | None = None,
) -> jax.Array:
    """Per-image RandomResizedCrop(scale, ratio) to the same size, random flip (p=0.5), normalize.

    `images_u8` is uint8 (B, H, W, C); the result has the same shape and `dtype`. Deterministic
    given `key`; jit- and vmap-friendly (no Python loop over images). `rows` = (offset, total) says that
    these B images are rows offset.. of a global batch of `total`: the draws are made for the global batch
    and sliced, so a per-device program augments each image exactly as the global one does.
    """
    if not 0.0 < scale[0] <= scale[1] <= 1.0:
        raise ConfigError(f"crop scale {scale} is invalid; it must satisfy 0 < low <= high <= 1")
    if not 0.0 < ratio[0] <= ratio[1]:
        raise ConfigError(f"crop ratio {ratio} is invalid; it must satisfy 0 < low <= high")
    offset, total = (0, images_u8.shape[0]) if rows is None else rows
    return _augment_batch(
        images_u8, key, jnp.asarray(offset, jnp.int32), (float(scale[0]), float(scale[1])),
        (float(ratio[0]), float(ratio[1])), bool(flip), tuple(float(m) for m in mean),
        tuple(float(s) for s in std), jnp.dtype(dtype), int(total),
    )


# Jitted on its own so that eager calls compile once instead of op by op; inside a jitted train
# step it is simply inlined.
@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7, 8, 9))
def _augment_batch(
    images_u8: jax.Array,
    key: jax.Array,
    offset: jax.Array,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: bool,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    dtype: np.dtype,
    total: int,
) -> jax.Array:
    # One draw for the whole batch (area, ratio, top, left, flip per image): far less code to
    # compile than splitting a key per image.
    u = draws(key, total, offset, images_u8.shape[0], 5)
    x = images_u8.astype(jnp.float32)
    out = jax.vmap(lambda im, ui: resized_crop_flip(im, ui, scale, ratio, flip))(x, u)
    return normalize_float(out / 255.0, mean, std, dtype)
