"""The train and eval steps, in the SPMD style `--spmd` names; state donated, shardings fixed up front.

- `jit` (here): one global program; XLA partitions it from the shardings of the state and the batch.
- `shard_map` and `pmap`: see `shardbench.train.spmd`, which also picks the style.

Every style computes the same thing from the same pieces: the task turns a batch into the model's input
(on the device: image augmentation runs inside the step) and the model's output into per-example loss
terms; the mean is over the global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from shardbench.config import Config
from shardbench.models.axes import constraints
from shardbench.parallel.rules import Layout
from shardbench.tasks import Rows, Task, Terms
from shardbench.train.optim import ema_params
from shardbench.train.state import ModelSpec, TrainState

Batch = dict[str, jax.Array]
HostBatch = dict[str, np.ndarray]
Metrics = dict[str, jax.Array]


@dataclass(frozen=True)
class Steps:
    """The compiled-on-first-call functions a loop needs, and how its data and state are laid out.

    `adopt` turns a train state in its canonical layout (what `init_state` makes and checkpoints hold)
    into the style's own (pmap stacks one copy per device); `release` turns it back."""

    train: Callable[[Any, Batch], tuple[Any, Metrics]]
    evaluate: Callable[[Any, Batch], Metrics]
    place: Callable[[HostBatch], Batch]
    adopt: Callable[[TrainState], Any] = lambda state: state
    release: Callable[[Any], TrainState] = lambda state: state


@dataclass(frozen=True)
class StepParts:
    """What every style shares: the task's loss on a (local or global) batch, keys and the optimizer."""

    cfg: Config
    task: Task
    spec: ModelSpec
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    total_steps: int = 0  # the run's length, which the task sees with each training step (0: not known)

    def keys(self, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(augmentation key, dropout key): a pure function of (seed, step), so a resumed run draws the same."""
        base = jax.random.key(self.cfg.train.seed)
        aug, drop = jax.random.split(jax.random.fold_in(base, step))
        return aug, drop

    def terms(self, params: Any, model_state: Any, batch: Batch, step: jax.Array, *, train: bool, rows: Rows,
              drop_key: jax.Array | None = None, fold: jax.Array | None = None) -> tuple[Terms, Any]:
        """Per-example loss terms of `batch` under `params` and the model's other variables as the call left
        them; `rows` places the batch in the global one, `fold` makes the model's own RNG streams per device."""
        aug_key, default_drop = self.keys(step)
        if train:
            rows = rows._replace(step=step, steps=self.total_steps)
        inputs = self.task.inputs(self.cfg, batch, aug_key, train, rows)
        if train and self.task.targets is not None:
            batch = self.task.targets(self.cfg, batch, aug_key, rows)
        # A model of your own always gets the step's key (its own layers decide whether to drop anything).
        use_dropout = self.spec.custom or (train and (self.cfg.model.dropout > 0 or self.cfg.model.drop_path > 0))
        key = (default_drop if drop_key is None else drop_key) if use_dropout else None
        if not self.spec.custom:
            return self.task.terms(self.spec.apply(params, model_state, inputs, key)[0], batch), model_state
        outputs, after = self.spec.apply(params, model_state, inputs, key, train=train, fold=fold)
        return self.task.terms(outputs, batch), after

    def mean_loss(self, params: Any, model_state: Any, batch: Batch, step: jax.Array, rows: Rows,
                  drop_key: jax.Array | None = None,
                  fold: jax.Array | None = None) -> tuple[jax.Array, tuple[Terms, Any]]:
        """The training objective of `batch` (mean over its targets), its terms and the model's other
        variables after the step: differentiate this with respect to `params`."""
        t, after = self.terms(params, model_state, batch, step, train=True, rows=rows, drop_key=drop_key, fold=fold)
        return t.loss_sum.sum() / t.count.sum(), (t, after)

    @staticmethod
    def eval_params(state: TrainState) -> Any:
        """What evaluation scores: the weights' moving average where the optimizer keeps one (--optim.ema)."""
        ema = ema_params(state.opt_state)
        return state.params if ema is None else jax.tree.map(lambda e, p: e.astype(p.dtype), ema, state.params)

    def apply_update(self, state: TrainState, grads: Any, model_state: Any) -> TrainState:
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state, model_state)

    def train_metrics(self, state: TrainState, loss: jax.Array, correct: jax.Array | None, count: jax.Array,
                      grads: Any) -> Metrics:
        metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), "lr": self.schedule(state.step)}
        if correct is not None:
            metrics["accuracy"] = correct / count
        return metrics


def eval_sums(terms: Terms, mask: jax.Array) -> Metrics:
    """Sums over the real (unpadded) examples of a batch: the loop divides them once per split."""
    m = mask.astype(jnp.float32)
    sums = {"loss_sum": (terms.loss_sum * m).sum(), "count": (terms.count * m).sum()}
    if terms.correct is not None:
        sums["correct"] = (terms.correct * m).sum()
    return sums


def jit_steps(parts: StepParts, layout: Layout, shardings: TrainState, batch_keys: tuple[str, ...]) -> Steps:
    """The global program: the batch is split over data by its sharding, parameters by theirs."""
    global_batch = parts.cfg.train.batch_size

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        with constraints(layout.constrain):
            (loss, (t, model_state)), grads = jax.value_and_grad(parts.mean_loss, has_aux=True)(
                state.params, state.model_state, batch, state.step, Rows(0, global_batch))
        correct = None if t.correct is None else t.correct.sum()
        metrics = parts.train_metrics(state, loss, correct, t.count.sum(), grads)
        return parts.apply_update(state, grads, model_state), metrics

    def eval_step(state: TrainState, batch: Batch) -> Metrics:
        with constraints(layout.constrain):
            t, _ = parts.terms(parts.eval_params(state), state.model_state, batch, state.step, train=False,
                               rows=Rows(0, batch["mask"].shape[0]))
        return eval_sums(t, batch["mask"])

    batch_sharding = layout.batch_sharding()
    batch_shardings = {k: batch_sharding for k in (*batch_keys, "mask")}
    train = jax.jit(train_step, in_shardings=(shardings, batch_shardings),
                    out_shardings=(shardings, layout.replicated), donate_argnums=0)
    evaluate = jax.jit(eval_step, in_shardings=(shardings, batch_shardings), out_shardings=layout.replicated)
    return Steps(train=train, evaluate=evaluate, place=lambda b: place_batch(b, batch_sharding))


def place_batch(batch: HostBatch, sharding: jax.sharding.Sharding) -> Batch:
    """Host numpy batch (this process's rows) -> global arrays laid out with the batch sharding."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
