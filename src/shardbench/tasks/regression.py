"""Regression with the deep MLP: float inputs, mean squared error over the outputs (the seed's loss)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from shardbench.config import Config
from shardbench.models.mlp import flops_per_example
from shardbench.tasks.base import Batch, Rows, Task, Terms


def check(cfg: Config) -> None:
    """Every shape is valid: the width, depth and sizes only have to be positive."""


def inputs(cfg: Config, batch: Batch, key: jax.Array, train: bool, rows: Rows) -> jax.Array:
    return batch["inputs"].astype(jnp.dtype(cfg.precision.dtype))


def terms(outputs: jax.Array, batch: Batch) -> Terms:
    err = jnp.square(outputs - batch["targets"].astype(jnp.float32)).mean(-1)
    return Terms(err, jnp.ones(err.shape, jnp.float32), None)


TASK = Task(
    kind="mlp", unit="examples", check=check, inputs=inputs, terms=terms,
    train_flops_per_example=lambda cfg: flops_per_example(cfg.model)["train"],
    units_per_example=lambda cfg: 1,
    formula="3 x batch x 2*(I*W + (L-1)*W^2 + W*C) (matmul FLOPs; backward = 2 x forward)",
)
