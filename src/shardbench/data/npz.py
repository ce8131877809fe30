"""`--data arrays:PATH.npz`: your own arrays for any task.

The file holds `x_train`, `y_train`, `x_test`, `y_test` and optionally `x_val`, `y_val` (without them, a
seeded `--data.val-fraction` of train is held out). What the arrays must be depends on the task:
- images to classes (`vit`, `--task classify`): x uint8 (N, H, W, 3), y integer class ids (N,);
- next-token (`lm`, `--task next-token`): x integer token ids (N, seq_len + 1); y is not used (give zeros);
- regression (`mlp`, `--task regress`): x float (N, features), y float (N, outputs).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from shardbench.data.arrays import Columns, Dataset, ImageArrays, ImageDataset, split_train_val
from shardbench.errors import DataError

REQUIRED = ("x_train", "y_train", "x_test", "y_test")
KEYS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")  # the arrays read; any others are ignored
NUMERIC_KINDS = "biuf"  # numpy dtype kinds a step can take: bool, signed and unsigned integers, floats
KIND_NAMES = {"U": "text", "S": "bytes", "c": "complex numbers", "M": "dates", "m": "time spans",
              "V": "records", "O": "Python objects"}


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise DataError(f"arrays:{path} does not exist: give the path of an .npz file (numpy.savez)") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        detail = (str(err).splitlines() or [type(err).__name__])[0][:200] or type(err).__name__
        raise DataError(f"arrays:{path} is empty, truncated or not an .npz file ({detail}): write it with "
                        f"numpy.savez") from None
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise DataError(f"arrays:{path} lacks {', '.join(missing)}: it needs x_train, y_train, x_test, y_test "
                        f"(and optionally x_val, y_val); it has {', '.join(sorted(arrays)) or 'nothing'}")
    if ("x_val" in arrays) != ("y_val" in arrays):
        raise DataError(f"arrays:{path} has only one of x_val and y_val: give both, or neither")
    for key in KEYS:
        if key in arrays:
            _check_array(path, key, arrays[key])
    for split in ("train", "val", "test"):
        if f"x_{split}" in arrays and len(arrays[f"x_{split}"]) != len(arrays[f"y_{split}"]):
            raise DataError(f"arrays:{path}: x_{split} has {len(arrays[f'x_{split}'])} rows but y_{split} has "
                            f"{len(arrays[f'y_{split}'])}")
    return arrays


def _check_array(path: Path, key: str, value: np.ndarray) -> None:
    """One array of the file holds numbers, one row per example: a 0-d array (`np.savez(y_train=3)`) or text
    labels would otherwise fail inside numpy, or be converted without a word (text "1.5" read as 1.5)."""
    if value.ndim == 0:
        raise DataError(f"arrays:{path}: {key} is a single {value.dtype} value (a 0-d array), not one row per "
                        f"example: save an array of shape (N, ...)")
    if value.dtype.kind not in NUMERIC_KINDS:
        what = KIND_NAMES.get(value.dtype.kind, value.dtype.kind)
        raise DataError(f"arrays:{path}: {key} is {value.dtype} ({what}): every array must hold bool, integer or "
                        f"float numbers (uint8 images, integer labels or token ids, float values)")
    if value.dtype.kind in "fc" and not np.isfinite(value).all():
        # A NaN in x_train was "loss became nan at step 1" (exit 3), blaming training; one in x_test a complete
        # record with a test loss of NaN.
        at = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
        where = ", ".join(map(str, at))
        raise DataError(f"arrays:{path}: {key}[{where}] is {value[at].item()!r}: every value must be a finite number; "
                        f"replace or drop that row")


def _check_labels(name: str, key: str, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """One split's labels as int32 class ids, or one line naming the key: one label per image, integers (a float
    array only where every value is whole, so that 2.7 is never truncated to class 2), in [0, num_classes). The
    range is checked before the cast, so that 2**32 does not wrap around to class 0."""
    if labels.ndim != 1:
        raise DataError(f"{name}: {key} is {labels.shape}: labels must be class ids, one per image (N,)")
    if labels.dtype.kind == "f":
        whole = np.isfinite(labels) & (labels == np.floor(labels))
        if not whole.all():
            at = int(np.argmin(whole))
            raise DataError(f"{name}: {key}[{at}] is {labels[at].item()!r}, not a class id: labels must be whole numbers "
                            f"(integers, or floats such as 3.0)")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{name}: {key} holds {labels.min()} to {labels.max()}: labels must be class ids in "
                        f"[0, {num_classes}) (--model.num-classes), one per image")
    return labels.astype(np.int32)


def _column_splits(arrays: dict[str, np.ndarray], x_key: str, y_key: str | None, val_fraction: float,
                   seed: int) -> tuple[Columns, Columns, Columns]:
    """(train, val, test) as columns named `x_key` (and `y_key`); val is held out of train when not given."""
    def split(name: str) -> Columns:
        x = arrays[f"x_{name}"]
        return Columns({x_key: x} if y_key is None else {x_key: x, y_key: arrays[f"y_{name}"]})

    train, test = split("train"), split("test")
    if "x_val" in arrays:
        return train, split("val"), test
    n_val = int(round(len(train) * val_fraction))
    order = np.random.Generator(np.random.PCG64(seed)).permutation(len(train))
    return train.take(np.sort(order[n_val:])), train.take(np.sort(order[:n_val])), test


def _kind(value: np.ndarray) -> str:
    """An array's kind of number: signed and unsigned integers are one (uint16 train tokens, int64 test ones)."""
    return "i" if value.dtype.kind == "u" else value.dtype.kind


def _check_splits_alike(arrays: dict[str, np.ndarray], name: str, *, exact_dtype: bool) -> None:
    """Every split's inputs (x_*) have x_train's dtype (`exact_dtype`, as images must: uint16 test images are not
    uint8 ones) or its kind of dtype (integers signed or not, floats) and its shape past the rows, and its targets (y_*)
    y_train's shape past the rows: a test split of another image size or sequence length is one line here, naming
    it, not an error inside a step."""
    for prefix in ("x_", "y_"):
        first = arrays[f"{prefix}train"]
        for key in (k for k in KEYS if k.startswith(prefix) and k in arrays):
            value = arrays[key]
            same_dtype = value.dtype == first.dtype if exact_dtype else _kind(value) == _kind(first)
            if value.shape[1:] != first.shape[1:] or (prefix == "x_" and not same_dtype):
                raise DataError(f"{name}: {key} is {value.dtype} {value.shape} but {prefix}train is {first.dtype} "
                                f"{first.shape}: every split must have its shape past the rows (and its inputs' "
                                f"dtype)")


def load_arrays(path: Path, kind: str, *, num_classes: int, seq_len: int, vocab_size: int, input_dim: int,
                val_fraction: float, seed: int) -> ImageDataset | Dataset:
    """The dataset in `path` for a model of kind `kind` ('vit', 'lm' or 'mlp'), checked against the model."""
    arrays = _read(path)
    x = arrays["x_train"]
    name = f"arrays:{path.name}"
    if kind == "vit" and (x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3 or x.shape[1] != x.shape[2]):
        raise DataError(f"{name}: images to classify must be uint8 (N, H, W, 3) with H = W, got x_train "
                        f"{x.dtype} {x.shape}")
    _check_splits_alike(arrays, name, exact_dtype=kind == "vit")
    if kind == "vit":
        arrays.update({k: _check_labels(name, k, arrays[k], num_classes) for k in KEYS
                       if k.startswith("y_") and k in arrays})
        if "x_val" in arrays:
            train, val = ImageArrays(x, arrays["y_train"]), ImageArrays(arrays["x_val"], arrays["y_val"])
        else:
            train, val = split_train_val(ImageArrays(x, arrays["y_train"]), val_fraction, seed)
        return ImageDataset(name, train, val, ImageArrays(arrays["x_test"], arrays["y_test"]),
                            tuple(str(i) for i in range(num_classes)))

    if kind == "lm":
        if not np.issubdtype(x.dtype, np.integer) or x.ndim != 2 or x.shape[1] != seq_len + 1:
            raise DataError(f"{name}: token sequences must be integers (N, --model.seq-len + 1 = {seq_len + 1}), got "
                            f"{x.dtype} {x.shape}")
        for key, tokens in arrays.items():
            outside = (tokens < 0) | (tokens >= vocab_size) if key.startswith("x_") else None
            if outside is not None and outside.any():
                row, col = (int(i[0]) for i in np.nonzero(outside))
                bad = int(tokens[row, col])
                mend = ("ids are never negative" if bad < 0 else
                        f"--model.vocab-size {int(tokens.max()) + 1} or more takes every id of {key}")
                raise DataError(f"{name}: {key}[{row}, {col}] is token id {bad}, outside --model.vocab-size's [0, "
                                f"{vocab_size}): {mend}")
        arrays.update({k: v.astype(np.int32) for k, v in arrays.items() if k.startswith("x_")})
        train, val, test = _column_splits(arrays, "tokens", None, val_fraction, seed)
        return Dataset(name, train, val, test, {"vocab_size": vocab_size})
    if x.ndim != 2 or x.shape[1] != input_dim or arrays["y_train"].ndim != 2 \
            or arrays["y_train"].shape[1] != num_classes:
        raise DataError(f"{name}: regression needs x (N, --model.input-dim = {input_dim}) and y (N, "
                        f"--model.num-classes = {num_classes}), got {x.shape} and {arrays['y_train'].shape}")
    arrays.update({k: v.astype(np.float32) for k, v in arrays.items()})
    train, val, test = _column_splits(arrays, "inputs", "targets", val_fraction, seed)
    return Dataset(name, train, val, test, {"outputs": num_classes})
