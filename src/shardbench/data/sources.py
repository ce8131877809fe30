"""The `--data` option: parsing a dataset spec and loading it, checked against the model's shape."""

from __future__ import annotations

from pathlib import Path

from shardbench.data.arrays import ImageDataset
from shardbench.data.cifar10 import IMAGE_SIZE as CIFAR10_IMAGE_SIZE
from shardbench.data.cifar10 import load_cifar10
from shardbench.data.imagefolder import load_imagefolder
from shardbench.data.synthetic import make_synthetic
from shardbench.errors import DataError

SPEC_HELP = "use cifar10, cifar10:PATH, imagefolder:PATH or synthetic"
_PATH_KINDS = ("cifar10", "imagefolder")


def _parse(spec: str) -> tuple[str, Path | None]:
    """(kind, path or None); raises DataError for anything that is not a known spec."""
    kind, sep, rest = spec.partition(":")
    if not sep and kind in ("cifar10", "synthetic"):
        return kind, None
    if sep and kind in _PATH_KINDS:
        if not rest:
            raise DataError(f"dataset '{spec}' has an empty PATH; use {kind}:PATH with a file or folder")
        return kind, Path(rest).expanduser()
    raise DataError(f"unknown dataset '{spec}': {SPEC_HELP}")


def validate_spec(spec: str) -> None:
    """Checks the spec's syntax and that its PATH exists, without reading any data."""
    kind, path = _parse(spec)
    if path is not None and not path.exists():
        raise DataError(f"dataset '{spec}': {path} does not exist; give an existing file or folder after '{kind}:'")


def _check_shape(ds: ImageDataset, *, image_size: int, num_classes: int) -> None:
    if ds.num_classes != num_classes:
        raise DataError(
            f"dataset {ds.name} has {ds.num_classes} classes but the model is set up for {num_classes}; "
            f"pass --model.num-classes {ds.num_classes}"
        )
    if ds.image_size != image_size:
        raise DataError(f"dataset {ds.name} has {ds.image_size}x{ds.image_size} images but the model "
                        f"expects {image_size}x{image_size}; pass --data.image-size {ds.image_size}")


def load_dataset(
    spec: str,
    *,
    cache_dir: Path,
    image_size: int,
    num_classes: int,
    val_fraction: float,
    seed: int,
    synthetic_train: int = 50_000,
    synthetic_test: int = 10_000,
) -> ImageDataset:
    """Loads the dataset named by the `--data` value `spec`, matching `image_size`/`num_classes`."""
    kind, path = _parse(spec)
    if kind == "cifar10":
        # Checked before any download: CIFAR-10 images are always 32x32.
        if image_size != CIFAR10_IMAGE_SIZE:
            raise DataError(f"cifar10 images are {CIFAR10_IMAGE_SIZE}x{CIFAR10_IMAGE_SIZE} but the model "
                            f"expects {image_size}x{image_size}; pass --data.image-size 32")
        ds = load_cifar10(path, cache_dir, val_fraction=val_fraction, seed=seed)
    elif kind == "imagefolder":
        assert path is not None  # _parse guarantees a path for imagefolder
        ds = load_imagefolder(path, cache_dir, image_size=image_size, val_fraction=val_fraction, seed=seed)
    else:
        ds = make_synthetic(synthetic_train, synthetic_test, image_size=image_size,
                            num_classes=num_classes, seed=seed, val_fraction=val_fraction)
    _check_shape(ds, image_size=image_size, num_classes=num_classes)
    return ds
