"""In-memory datasets: a split is named arrays sharing their leading (example) dimension.

`Columns` holds any such split (token sequences, regression rows); `ImageArrays` is the image split
(uint8 images and int32 labels) that the image loaders produce and check. Both give the input pipeline
the same two things: their length and `columns()`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shardbench.errors import ConfigError, DataError


@dataclass(frozen=True)
class ImageArrays:
    """One split: `images` uint8 (N, H, W, 3), `labels` int32 (N,)."""

    images: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        # Every loader funnels through here, so a wrong dtype or shape is caught once, at load
        # time, instead of surfacing as a confusing error inside a jitted step.
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or self.images.shape[-1] != 3:
            raise DataError(
                f"images have dtype {self.images.dtype} and shape {self.images.shape}; "
                "expected uint8 with shape (N, H, W, 3)"
            )
        if self.labels.dtype != np.int32 or self.labels.shape != (self.images.shape[0],):
            raise DataError(
                f"labels have dtype {self.labels.dtype} and shape {self.labels.shape}; "
                f"expected int32 with shape ({self.images.shape[0]},)"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, indices: np.ndarray) -> ImageArrays:
        """The examples at `indices`, in that order (copies)."""
        return ImageArrays(images=self.images[indices], labels=self.labels[indices])

    def columns(self) -> dict[str, np.ndarray]:
        return {"image": self.images, "label": self.labels}


class Split(Protocol):
    """What the input pipeline reads: a number of examples and their named arrays."""

    def __len__(self) -> int: ...

    def columns(self) -> Mapping[str, np.ndarray]: ...


@dataclass(frozen=True)
class Columns:
    """One split of any kind: named arrays with the same number of rows."""

    data: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        rows = {name: a.shape[0] for name, a in self.data.items()}
        if len(set(rows.values())) > 1:
            raise DataError(f"a split's arrays disagree on the number of examples: {rows}")

    def __len__(self) -> int:
        return int(next(iter(self.data.values())).shape[0]) if self.data else 0

    def columns(self) -> Mapping[str, np.ndarray]:
        return self.data

    def take(self, indices: np.ndarray) -> Columns:
        return Columns({k: v[indices] for k, v in self.data.items()})


@dataclass(frozen=True)
class Dataset:
    """A named dataset of non-image examples with train/val/test splits; `info` says what a model should
    know about it (e.g. the vocabulary, or the best loss any model can reach on it and why)."""

    name: str
    train: Columns
    val: Columns
    test: Columns
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageDataset:
    """A named dataset with train/val/test splits that share one image size and class list."""

    name: str
    train: ImageArrays
    val: ImageArrays
    test: ImageArrays
    class_names: tuple[str, ...]
    # Per-channel (mean, std) on the [0, 1] scale that the model's inputs are normalised with, and whence.
    norm: tuple[tuple[float, ...], tuple[float, ...]] = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
    norm_source: str = "CIFAR-10's customary statistics (the seed notebook's; see shardbench.data.augment)"

    @property
    def info(self) -> dict[str, Any]:
        return {"classes": len(self.class_names), "image_size": self.image_size,
                "normalization": {"mean": list(self.norm[0]), "std": list(self.norm[1]), "source": self.norm_source}}

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_size(self) -> int:
        """Side length of the (square) images."""
        return int(self.train.images.shape[1])


_HASH_ROWS = 4096  # rows hashed per pass, so that a non-contiguous split's copy stays small


def hash_rows(digest: Any, array: np.ndarray) -> None:
    """Feed `array`'s dtype, shape and every byte, in row order, to `digest` (a hashlib object)."""
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    for start in range(0, len(array), _HASH_ROWS):
        digest.update(np.ascontiguousarray(array[start:start + _HASH_ROWS]).tobytes())


def fingerprint(dataset: Dataset | ImageDataset) -> str:
    """What every split of `dataset` holds, as one sha1: each column's name, dtype, shape and bytes (a fraction of a
    second for CIFAR-10). A resumed run compares it with its first start's (`shardbench.rundir`)."""
    digest = hashlib.sha1()
    for name, split in (("train", dataset.train), ("val", dataset.val), ("test", dataset.test)):
        for column, array in sorted(split.columns().items()):
            digest.update(f"{name}/{column}".encode())
            hash_rows(digest, array)
    return digest.hexdigest()


def split_sizes(dataset: Dataset | ImageDataset) -> dict[str, int]:
    """How many examples (sequences, for tokens) each split holds, for the run record."""
    return {"train": len(dataset.train), "val": len(dataset.val), "test": len(dataset.test)}


def split_train_val(
    arrays: ImageArrays, val_fraction: float, seed: int
) -> tuple[ImageArrays, ImageArrays]:
    """Carves a seeded random `val_fraction` of `arrays` off as validation; returns (train, val).

    Both parts keep the original relative order of their examples, so only the seed decides
    which examples land where (50,000 at 0.1 gives exactly 45,000 / 5,000).
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction is {val_fraction}; it must be in [0, 1)")
    n = len(arrays)
    n_val = int(round(n * val_fraction))
    perm = np.random.Generator(np.random.PCG64(seed)).permutation(n)
    val_idx = np.sort(perm[:n_val])
    train_idx = np.sort(perm[n_val:])
    return arrays.take(train_idx), arrays.take(val_idx)
