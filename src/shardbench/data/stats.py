"""Per-channel normalisation statistics of an image dataset, computed from its own training split.

CIFAR-10 keeps its published figures (the seeds' and everyone's); any other image dataset (an image folder,
your own arrays, the synthetic images) is normalised with the mean and standard deviation of its own
training images, computed once and cached beside the decoded arrays, keyed by what the split holds.
"""

from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path

import numpy as np

from shardbench.data.arrays import hash_rows
from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD
from shardbench.jsonfile import read_json_dict, write_json_atomic

Stats = tuple[tuple[float, float, float], tuple[float, float, float]]
CIFAR10: Stats = (CIFAR_MEAN, CIFAR_STD)
CACHE_NAME = "image-stats.json"
_CHUNK = 4096  # images per pass, so that the float copy stays small
log = logging.getLogger(__name__)


def channel_stats(images: np.ndarray) -> Stats:
    """Mean and standard deviation of each channel of uint8 images (N, H, W, C), on the [0, 1] scale."""
    total = np.zeros(images.shape[-1], np.float64)
    squares = np.zeros(images.shape[-1], np.float64)
    for start in range(0, len(images), _CHUNK):
        part = images[start:start + _CHUNK].astype(np.float64) / 255.0
        total += part.sum(axis=(0, 1, 2))
        squares += np.square(part).sum(axis=(0, 1, 2))
    count = max(images.shape[0] * images.shape[1] * images.shape[2], 1)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 1e-12))
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)  # type: ignore[return-value]


def fingerprint(images: np.ndarray) -> str:
    """Identifies a training split by its shape and every byte of it (a sample would miss an edited image, or
    another split of the same files: about 0.3 s for CIFAR-10's 45,000 training images)."""
    digest = hashlib.sha1(repr(images.shape).encode())
    hash_rows(digest, images)
    return digest.hexdigest()


def _entry(value: object, channels: int) -> Stats | None:
    """A cached [[mean...], [std...]] as Stats, or None where it is not one (an edited or damaged file): `channels`
    finite means and finite stds above zero, which the images are divided by."""
    try:
        mean, std = (tuple(float(v) for v in part) for part in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return None
    if len(mean) != channels or len(std) != channels or not all(math.isfinite(v) for v in mean + std) or min(std) <= 0:
        return None
    return mean, std  # type: ignore[return-value]


def cached_stats(cache_dir: Path, name: str, images: np.ndarray) -> Stats:
    """`images`' statistics, from `<cache_dir>/image-stats.json` when this split was seen before."""
    path = cache_dir / CACHE_NAME
    key = f"{name}|{fingerprint(images)}"
    known = read_json_dict(path)
    if key in known:
        found = _entry(known[key], images.shape[-1])
        if found is not None:
            return found
        log.warning("%s: the entry for %s is not a mean and a positive std per channel; computing it again",
                    path, name)
    stats = channel_stats(images)
    write_json_atomic(path, {**known, key: [list(stats[0]), list(stats[1])]})
    return stats
