"""In-memory image datasets: uint8 image/label arrays per split, and the seeded train/val split."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ImageDataset:
    """A named dataset with train/val/test splits that share one image size and class list."""

    name: str
    train: ImageArrays
    val: ImageArrays
    test: ImageArrays
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_size(self) -> int:
        """Side length of the (square) images."""
        return int(self.train.images.shape[1])


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
