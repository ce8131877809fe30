"""The `--data` option: parsing a dataset spec and loading it, checked against the model's kind and shape.

Image datasets (cifar10, imagefolder, synthetic) feed the ViT; token datasets (tokens-uniform, text) the
language model; regression the MLP.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shardbench.config import TASK_KINDS, Config
from shardbench.data.arrays import Dataset, ImageDataset
from shardbench.data.cifar10 import IMAGE_SIZE as CIFAR10_IMAGE_SIZE
from shardbench.data.cifar10 import load_cifar10
from shardbench.data.imagefolder import load_imagefolder
from shardbench.data.npz import load_arrays
from shardbench.data.regression import regression
from shardbench.data.stats import cached_stats
from shardbench.data.synthetic import make_synthetic
from shardbench.data.tokens import BYTE_VOCAB, text_tokens, uniform_tokens
from shardbench.errors import ConfigError, DataError

SPEC_HELP = "use cifar10, cifar10:PATH, imagefolder:PATH or synthetic (images), tokens-uniform or text:PATH " \
            "(language model), regression (MLP), or arrays:PATH.npz (any)"
_PATH_KINDS = ("cifar10", "imagefolder", "text", "arrays")
_FILE_KINDS = {"text": "text", "arrays": ".npz"}  # the PATH kinds that read one file, never a folder
ANY = "any"  # a dataset kind that feeds every kind of model (your own arrays)
# Dataset kind -> the model kind it feeds, and whether it needs a PATH.
DATASETS: dict[str, str] = {
    "cifar10": "vit", "imagefolder": "vit", "synthetic": "vit", "tokens-uniform": "lm", "text": "lm",
    "regression": "mlp", "arrays": ANY,
}


def _parse(spec: str) -> tuple[str, Path | None]:
    """(kind, path or None); raises ConfigError for anything that is not a known spec (a mistyped choice, as
    for any other flag: exit 2)."""
    kind, sep, rest = spec.partition(":")
    if not sep and kind in ("cifar10", "synthetic", "tokens-uniform", "regression"):
        return kind, None
    if sep and kind in _PATH_KINDS:
        if not rest:
            raise ConfigError(f"dataset '{spec}' has an empty PATH; use {kind}:PATH with a file or folder")
        return kind, Path(rest).expanduser()
    raise ConfigError(f"unknown dataset '{spec}': {SPEC_HELP}")


def validate_spec(spec: str) -> None:
    """Checks the spec's syntax and that its PATH exists, without reading any data."""
    kind, path = _parse(spec)
    if path is not None and not path.exists():
        raise DataError(f"dataset '{spec}': {path} does not exist; give an existing file or folder after '{kind}:'")
    if kind in _FILE_KINDS and path is not None and path.is_dir():  # read as a file, it failed as a path (exit 6)
        raise DataError(f"dataset '{spec}': {path} is a folder; give a {_FILE_KINDS[kind]} file after '{kind}:'")


def _check_shape(ds: ImageDataset, *, image_size: int, num_classes: int) -> None:
    if ds.num_classes < 2:  # before the class count, whose advice would be --model.num-classes 1
        raise DataError(f"dataset {ds.name} has {ds.num_classes} class ({', '.join(ds.class_names) or 'none'}): "
                        f"classifying needs at least 2 to tell apart; give it a folder of images per class")
    # the data are whole, the configuration asks for another shape of them: a flag mends it (exit 2, not 4)
    if ds.num_classes != num_classes:
        raise ConfigError(
            f"dataset {ds.name} has {ds.num_classes} classes but the model is set up for {num_classes}; "
            f"pass --model.num-classes {ds.num_classes}"
        )
    if ds.image_size != image_size:
        raise ConfigError(f"dataset {ds.name} has {ds.image_size}x{ds.image_size} images but the model "
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
    if DATASETS[kind] != "vit":
        raise DataError(f"dataset '{spec}' holds no images: {SPEC_HELP}")
    if kind == "cifar10":
        check_known_shape(spec, image_size)  # before any download
        ds = load_cifar10(path, cache_dir, val_fraction=val_fraction, seed=seed)
    elif kind == "imagefolder":
        assert path is not None  # _parse guarantees a path for imagefolder
        ds = load_imagefolder(path, cache_dir, image_size=image_size, val_fraction=val_fraction, seed=seed)
    else:
        ds = make_synthetic(synthetic_train, synthetic_test, image_size=image_size,
                            num_classes=num_classes, seed=seed, val_fraction=val_fraction)
    _check_shape(ds, image_size=image_size, num_classes=num_classes)
    return ds


def check_known_shape(spec: str, image_size: int) -> None:
    """A dataset whose image size is known without reading it (CIFAR-10's are always 32x32) against the model's."""
    kind, _ = _parse(spec)
    if kind == "cifar10" and image_size != CIFAR10_IMAGE_SIZE:
        raise ConfigError(f"cifar10 images are {CIFAR10_IMAGE_SIZE}x{CIFAR10_IMAGE_SIZE} but the model "
                          f"expects {image_size}x{image_size}; pass --data.image-size 32")


def check_model_kind(spec: str, model_kind: str, task: str = "") -> None:
    """A dataset feeds one kind of model: say which datasets fit if it is the wrong one. A model of your own is
    named by its `task` (whose data it shares), not by a built-in kind its user never chose."""
    kind, _ = _parse(spec)
    if DATASETS[kind] not in (model_kind, ANY):
        fits = ", ".join(k + (":PATH" if k in _PATH_KINDS and k != "cifar10" else "")
                         for k, m in DATASETS.items() if m in (model_kind, ANY))
        if task:
            feeds = next((t for t, m in TASK_KINDS.items() if m == DATASETS[kind]), DATASETS[kind])
            raise ConfigError(f"--data {spec} is a dataset for --task {feeds}, not --task {task}: give --data, one "
                              f"of {fits}")
        raise ConfigError(f"--data {spec} is a dataset for the {DATASETS[kind]} model, not {model_kind}: "
                          f"use one of {fits}")


CIFAR10_TRAIN = 50_000  # the official training split's images


def known_train_rows(cfg: Config) -> int | None:
    """The training split's size where the configuration alone gives it (the generated datasets, and CIFAR-10 as
    downloaded), held-out validation taken off as every loader takes it; None where only the data can say."""
    d = cfg.data
    kind, path = _parse(d.dataset)
    if path is not None or kind not in ("synthetic", "tokens-uniform", "regression", "cifar10"):
        return None
    rows = CIFAR10_TRAIN if kind == "cifar10" else d.synthetic_train
    return rows - int(round(rows * d.val_fraction))


def load_for(cfg: Config, cache_dir: Path) -> ImageDataset | Dataset:
    """The dataset `cfg.data.dataset` names, checked against the model `cfg.model` describes."""
    d, m = cfg.data, cfg.model
    check_model_kind(d.dataset, m.kind, m.task if m.factory else "")
    kind, path = _parse(d.dataset)
    if kind == "tokens-uniform":
        return uniform_tokens(d.synthetic_train, d.synthetic_test, seq_len=m.seq_len, vocab_size=m.vocab_size,
                              seed=cfg.train.seed, val_fraction=d.val_fraction)
    if kind == "text":
        assert path is not None
        if m.vocab_size < BYTE_VOCAB:
            raise ConfigError(f"--data {d.dataset} is byte-level text (256 token ids) but --model.vocab-size is "
                              f"{m.vocab_size}: pass --model.vocab-size 256")
        return text_tokens(path, seq_len=m.seq_len, val_fraction=d.val_fraction)
    if kind == "arrays":
        assert path is not None
        found = load_arrays(path, m.kind, num_classes=m.num_classes, seq_len=m.seq_len, vocab_size=m.vocab_size,
                            input_dim=m.input_dim, val_fraction=d.val_fraction, seed=cfg.train.seed)
        if isinstance(found, ImageDataset):
            _check_shape(found, image_size=d.image_size, num_classes=m.num_classes)
        return normalized(found, kind, cache_dir)
    if kind == "regression":
        return regression(d.synthetic_train, d.synthetic_test, input_dim=m.input_dim, outputs=m.num_classes,
                          seed=cfg.train.seed, val_fraction=d.val_fraction)
    return normalized(load_dataset(d.dataset, cache_dir=cache_dir, image_size=d.image_size,
                                   num_classes=m.num_classes, val_fraction=d.val_fraction, seed=cfg.train.seed,
                                   synthetic_train=d.synthetic_train, synthetic_test=d.synthetic_test),
                      kind, cache_dir)


def normalized(ds: ImageDataset | Dataset, kind: str, cache_dir: Path) -> ImageDataset | Dataset:
    """An image dataset with the statistics its images are normalised with: CIFAR-10's customary ones, or
    those of its own training split (computed once, cached)."""
    if not isinstance(ds, ImageDataset) or kind == "cifar10":
        return ds
    stats = cached_stats(cache_dir, ds.name, ds.train.images)
    return dataclasses.replace(ds, norm=stats, norm_source="computed from its training split")
