"""The jitted train and eval steps: one `jax.jit` each, state donated, shardings fixed up front.

Batches arrive as uint8 images; augmentation and normalisation run on the device inside the step,
so the host pipeline only gathers bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from shardbench.config import Config
from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD, augment, normalize
from shardbench.models.axes import constraints
from shardbench.parallel.rules import Layout
from shardbench.train.state import ModelSpec, TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@dataclass(frozen=True)
class Steps:
    """The compiled-on-first-call functions a loop needs."""

    train: Callable[[TrainState, Batch], tuple[TrainState, Metrics]]
    evaluate: Callable[[TrainState, Batch], Metrics]
    batch_sharding: jax.sharding.Sharding


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example cross-entropy, always in float32."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def make_steps(cfg: Config, spec: ModelSpec, layout: Layout, tx: optax.GradientTransformation,
               shardings: TrainState, schedule: optax.Schedule) -> Steps:
    dtype = jnp.dtype(cfg.precision.dtype)
    data = cfg.data
    base_key = jax.random.key(cfg.train.seed)
    use_dropout = cfg.model.dropout > 0

    def prepare(images: jax.Array, key: jax.Array, train: bool) -> jax.Array:
        if train and data.augment:
            return augment(images, key, scale=data.crop_scale, ratio=data.crop_ratio, flip=data.flip,
                           mean=CIFAR_MEAN, std=CIFAR_STD, dtype=dtype)
        return normalize(images, CIFAR_MEAN, CIFAR_STD, dtype)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        # Randomness is a pure function of (seed, step): a resumed run draws the same numbers.
        aug_key, drop_key = jax.random.split(jax.random.fold_in(base_key, state.step))
        with constraints(layout.constrain):
            images = prepare(batch["image"], aug_key, train=True)

            def loss_fn(params: Any) -> tuple[jax.Array, jax.Array]:
                logits = spec.apply(params, images, drop_key if use_dropout else None)
                return cross_entropy(logits, batch["label"]).mean(), logits

            (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss,
            "accuracy": (logits.argmax(-1) == batch["label"]).mean(),
            "grad_norm": optax.global_norm(grads),
            "lr": schedule(state.step),
        }
        return TrainState(state.step + 1, params, opt_state), metrics

    def eval_step(state: TrainState, batch: Batch) -> Metrics:
        with constraints(layout.constrain):
            logits = spec.apply(state.params, prepare(batch["image"], base_key, train=False), None)
        mask = batch["mask"].astype(jnp.float32)
        return {
            "loss_sum": (cross_entropy(logits, batch["label"]) * mask).sum(),
            "correct": ((logits.argmax(-1) == batch["label"]) * mask).sum(),
            "count": mask.sum(),
        }

    batch_sharding = layout.batch_sharding()
    batch_shardings = {"image": batch_sharding, "label": batch_sharding, "mask": batch_sharding}
    train = jax.jit(train_step, in_shardings=(shardings, batch_shardings),
                    out_shardings=(shardings, layout.replicated), donate_argnums=0)
    evaluate = jax.jit(eval_step, in_shardings=(shardings, batch_shardings), out_shardings=layout.replicated)
    return Steps(train=train, evaluate=evaluate, batch_sharding=batch_sharding)


def place_batch(batch: dict[str, Any], sharding: jax.sharding.Sharding) -> Batch:
    """Host numpy batch (this process's rows) -> global arrays laid out with the batch sharding."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
