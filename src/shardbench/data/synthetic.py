"""A synthetic, learnable image dataset: per-class smooth colour patterns under heavy noise.

Needs no files, so demos and benchmarks run anywhere; accuracy still rises as a model trains.
"""

from __future__ import annotations

import numpy as np

from shardbench.data.arrays import ImageArrays, ImageDataset, split_train_val
from shardbench.errors import ConfigError

# Side of the random per-class template before it is upsampled: 4x4 keeps it low-frequency.
_TEMPLATE_SIZE = 4
# Weight of the class template out of 256; the rest is uniform noise. At 20/256 a single pixel
# says little about the class, so a model must pool over many pixels to learn it.
_SIGNAL = 20
# Images are built in chunks so the uint16 temporaries stay cache-sized.
_CHUNK = 4096


def _interp_matrix(out_size: int, in_size: int) -> np.ndarray:
    """(out, in) linear-interpolation weights with half-pixel centres (bilinear upsampling)."""
    src = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
    src = np.clip(src, 0, in_size - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, in_size - 1)
    w = src - lo
    m = np.zeros((out_size, in_size))
    m[np.arange(out_size), lo] += 1 - w
    m[np.arange(out_size), hi] += w
    return m


def _templates(rng: np.random.Generator, num_classes: int, image_size: int) -> np.ndarray:
    """uint16 (K, S, S, 3) smooth colour patterns in [0, 255]."""
    small = rng.random((num_classes, _TEMPLATE_SIZE, _TEMPLATE_SIZE, 3))
    up = _interp_matrix(image_size, _TEMPLATE_SIZE)
    big = np.einsum("yh,khwc,xw->kyxc", up, small, up)
    return np.round(big * 255).astype(np.uint16)


def _images(rng: np.random.Generator, templates: np.ndarray, labels: np.ndarray) -> np.ndarray:
    n, (size, _, _) = len(labels), templates.shape[1:]
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    signal = templates * np.uint16(_SIGNAL)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        noise = rng.integers(0, 256, size=(stop - start, size, size, 3), dtype=np.uint8)
        # Integer blend (signal*a + noise*(256-a)) / 256 stays in [0, 255] and avoids floats.
        mixed = signal[labels[start:stop]] + noise.astype(np.uint16) * np.uint16(256 - _SIGNAL)
        out[start:stop] = (mixed >> 8).astype(np.uint8)
    return out


def make_synthetic(
    num_train: int,
    num_test: int,
    *,
    image_size: int,
    num_classes: int,
    seed: int,
    val_fraction: float,
) -> ImageDataset:
    """`num_train` (before the val split) and `num_test` images, deterministic in `seed`."""
    if num_train < 1 or num_test < 1 or image_size < 1 or num_classes < 2:
        raise ConfigError(
            f"synthetic data needs num_train, num_test, image_size >= 1 and num_classes >= 2; "
            f"got {num_train}, {num_test}, {image_size}, {num_classes}"
        )
    rng = np.random.Generator(np.random.PCG64(seed))
    templates = _templates(rng, num_classes, image_size)
    train_labels = rng.integers(0, num_classes, size=num_train).astype(np.int32)
    test_labels = rng.integers(0, num_classes, size=num_test).astype(np.int32)
    train_all = ImageArrays(_images(rng, templates, train_labels), train_labels)
    test = ImageArrays(_images(rng, templates, test_labels), test_labels)
    train, val = split_train_val(train_all, val_fraction, seed)
    return ImageDataset(
        name="synthetic",
        train=train,
        val=val,
        test=test,
        class_names=tuple(f"class_{i}" for i in range(num_classes)),
    )
