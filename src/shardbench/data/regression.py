"""Synthetic regression data for the deep MLP: Gaussian inputs and targets from a fixed random
two-layer teacher plus noise, so a model can learn it and the best possible loss is known."""

from __future__ import annotations

import numpy as np

from shardbench.data.arrays import Columns, Dataset
from shardbench.errors import DataError

TEACHER_WIDTH = 64
NOISE_STD = 0.1
_CHUNK = 4096


def regression(num_train: int, num_test: int, *, input_dim: int, outputs: int, seed: int,
               val_fraction: float) -> Dataset:
    """x ~ N(0, 1)^input_dim; y = tanh(x A / sqrt(I)) B / sqrt(H) * s + N(0, 0.1^2), with the teacher A, B
    drawn once from `seed` and s chosen so the noiseless targets have unit variance. The mean squared
    error of the best predictor is the noise variance, 0.01."""
    if num_train < 1 or num_test < 1:
        raise DataError(f"regression needs at least one train and one test row; got {num_train} and {num_test}: "
                        f"raise --data.synthetic-train / --data.synthetic-test")
    rng = np.random.Generator(np.random.PCG64([seed, 0x5E6]))
    a = rng.standard_normal((input_dim, TEACHER_WIDTH)).astype(np.float32) / np.sqrt(input_dim)
    b = rng.standard_normal((TEACHER_WIDTH, outputs)).astype(np.float32) / np.sqrt(TEACHER_WIDTH)
    total = num_train + num_test
    x = np.empty((total, input_dim), np.float32)
    y = np.empty((total, outputs), np.float32)
    for start in range(0, total, _CHUNK):
        stop = min(start + _CHUNK, total)
        x[start:stop] = rng.standard_normal((stop - start, input_dim), dtype=np.float32)
        y[start:stop] = np.tanh(x[start:stop] @ a) @ b
    y /= max(float(y[:num_train].std()), 1e-6)
    y += NOISE_STD * rng.standard_normal(y.shape, dtype=np.float32)
    n_val = int(round(num_train * val_fraction))
    cut = num_train - n_val

    def split(lo: int, hi: int) -> Columns:
        return Columns({"inputs": x[lo:hi], "targets": y[lo:hi]})

    return Dataset(
        name="regression", train=split(0, cut), val=split(cut, num_train), test=split(num_train, total),
        info={"outputs": outputs, "loss_floor": NOISE_STD**2,
              "loss_floor_note": f"targets carry N(0, {NOISE_STD}^2) noise, so no model's mean squared error can "
                                 f"beat {NOISE_STD**2:.3g} on held-out rows"},
    )
