"""What a training step needs to know about a model besides its parameters: how a batch becomes the
model's input, what the loss is, and how much work one example is. One `Task` per model kind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jax

from shardbench.config import Config

Batch = dict[str, jax.Array]


class Rows(NamedTuple):
    """Where a (per-device) batch sits in the global batch: its first row and the global row count.
    Per-example randomness is drawn for the global batch and sliced, so every SPMD style draws the same.
    In training, also where it sits in the run: its step (traced) of the run's `steps` (0: not known, as for
    a step compiled only to be measured), for augmentation that changes over training."""

    offset: jax.Array | int
    total: int
    step: jax.Array | int = 0
    steps: int = 0


class MoETerms(NamedTuple):
    """Per example, from a model with a mixture of experts: its load-balancing loss (summed over the blocks) and
    its token-to-expert assignments dropped over capacity."""

    aux: jax.Array
    dropped: jax.Array


class Terms(NamedTuple):
    """Per-example sums: loss over the example's targets, how many targets, and how many were right
    (None where accuracy means nothing, as for regression). Means are taken over the global batch. `moe`: a
    mixture of experts' own terms (None without one)."""

    loss_sum: jax.Array
    count: jax.Array
    correct: jax.Array | None
    moe: MoETerms | None = None

    def objective_sum(self, aux_coef: float) -> jax.Array:
        """What training minimises, summed (divided by the targets' count it is the mean): the loss, plus with
        experts `aux_coef` x each example's load-balancing loss weighted by its targets, so that the mean adds
        `aux_coef` x the batch's mean load-balancing loss however the batch is split."""
        total = self.loss_sum.sum()
        return total if self.moe is None else total + aux_coef * (self.moe.aux * self.count).sum()


@dataclass(frozen=True)
class Task:
    kind: str  # the model.kind it serves
    unit: str  # what one example holds for throughput: 'images', 'tokens' or 'examples'
    check: Callable[[Config], None]  # shape checks that need no devices: one-line ConfigError
    inputs: Callable[[Config, Batch, jax.Array, bool, Rows], jax.Array]  # (cfg, batch, key, train, rows)
    terms: Callable[[jax.Array, Batch], Terms]  # (model outputs, batch)
    train_flops_per_example: Callable[[Config], int]
    units_per_example: Callable[[Config], int]
    formula: str  # the FLOPs formula, for the record
    perplexity: bool = False  # report exp(loss) as well (language models)
    # The batch as the loss sees it in training, drawn from the same key as `inputs` (cfg, batch, key, rows):
    # e.g. soft targets for mixed images and label smoothing. None: the batch as it is.
    targets: Callable[[Config, Batch, jax.Array, Rows], Batch] | None = None
