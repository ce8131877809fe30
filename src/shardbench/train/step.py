"""What one train step and one eval step compute, whatever the SPMD style: `StepParts` (the task turns a
batch into the model's input, on the device: image augmentation runs inside the step; the model's output into
per-example loss terms; their mean over the global batch; gradients; the optimizer update) and `Steps`, the
compiled functions a loop calls. How they are compiled and laid out over devices, one function per `--spmd`
style, and `make_steps`, which picks one, are in `shardbench.train.spmd`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from shardbench.config import Config
from shardbench.measure.collect import CompiledStep
from shardbench.measure.timing import CompileTimes, compile_timed
from shardbench.tasks import Rows, Task, Terms
from shardbench.optim import ema_params, global_norm
from shardbench.models.spec import ModelSpec
from shardbench.train.accum import Gradients, accumulate, moe_sums
from shardbench.train.state import TrainState

Batch = dict[str, jax.Array]
HostBatch = dict[str, np.ndarray]
Metrics = dict[str, jax.Array]


@dataclass(frozen=True)
class Steps:
    """The functions a loop needs, and how its data and state are laid out: `train` compiled ahead with its
    compile times (`compile`), or on its first call where no one asked.

    `adopt` turns a train state in its canonical layout (what `init_state` makes and checkpoints hold)
    into the style's own (pmap stacks one copy per device); `release` turns it back."""

    train: Callable[[Any, Batch], tuple[Any, Metrics]]
    evaluate: Callable[[Any, Batch], Metrics]
    place: Callable[[HostBatch], Batch]
    adopt: Callable[[TrainState], Any] = lambda state: state
    release: Callable[[Any], TrainState] = lambda state: state
    compile_times: CompileTimes | None = None  # lowering and compilation of `train`, once compiled
    # Where the step hands its gradients to the optimizer, where the strategy places them apart from the
    # parameters (ZeRO-2's slices; `train.state.gradient_shardings`); None: laid out as the parameters.
    gradient_shardings: Any = None

    def compile(self, state: Any, batch: Batch) -> Steps:
        """These steps with `train` lowered and compiled for `state` and `batch`, each phase timed apart from
        the steps; the compiled program is what they call, and what the measurements read (memory, HLO)."""
        compiled, times = compile_timed(self.train, state, batch)
        return replace(self, train=compiled, compile_times=times)

    @property
    def compiled(self) -> CompiledStep | None:
        """The compiled train program as the measurements read it, or None before `compile`."""
        if self.compile_times is None:
            return None
        return CompiledStep(self.train, self.compile_times, self.gradient_shardings)


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

    def prepare(self, batch: Batch, step: jax.Array, *, train: bool, rows: Rows) -> tuple[jax.Array, Batch]:
        """The model's inputs and the batch as the loss sees it (soft targets where images are mixed or labels
        smoothed), drawn for the whole (local) batch: accumulation splits them into microbatches only after."""
        aug_key, _ = self.keys(step)
        if train:
            rows = rows._replace(step=step, steps=self.total_steps)
        inputs = self.task.inputs(self.cfg, batch, aug_key, train, rows)
        if train and self.task.targets is not None:
            batch = self.task.targets(self.cfg, batch, aug_key, rows)
        return inputs, batch

    def forward(self, params: Any, model_state: Any, inputs: jax.Array, batch: Batch, step: jax.Array, *,
                train: bool, drop_key: jax.Array | None = None,
                fold: jax.Array | None = None) -> tuple[Terms, Any]:
        """Per-example loss terms of prepared `inputs` against `batch`, and the model's other variables as the
        call left them; `fold` makes the model's own RNG streams per device."""
        _, default_drop = self.keys(step)
        # A model of your own always gets the step's key (its own layers decide whether to drop anything).
        use_dropout = self.spec.custom or (train and (self.cfg.model.dropout > 0 or self.cfg.model.drop_path > 0))
        key = (default_drop if drop_key is None else drop_key) if use_dropout else None
        if not self.spec.custom:
            return self.task.terms(self.spec.apply(params, model_state, inputs, key)[0], batch), model_state
        outputs, after = self.spec.apply(params, model_state, inputs, key, train=train, fold=fold)
        return self.task.terms(outputs, batch), after

    def terms(self, params: Any, model_state: Any, batch: Batch, step: jax.Array, *, train: bool, rows: Rows,
              drop_key: jax.Array | None = None, fold: jax.Array | None = None) -> tuple[Terms, Any]:
        """Per-example loss terms of `batch` under `params` and the model's other variables as the call left
        them; `rows` places the batch in the global one, `fold` makes the model's own RNG streams per device."""
        inputs, batch = self.prepare(batch, step, train=train, rows=rows)
        return self.forward(params, model_state, inputs, batch, step, train=train, drop_key=drop_key, fold=fold)

    def mean_loss(self, params: Any, model_state: Any, batch: Batch, step: jax.Array, rows: Rows,
                  drop_key: jax.Array | None = None,
                  fold: jax.Array | None = None) -> tuple[jax.Array, tuple[Terms, Any]]:
        """The training objective of `batch` (mean over its targets), its terms and the model's other
        variables after the step: differentiate this with respect to `params`."""
        t, after = self.terms(params, model_state, batch, step, train=True, rows=rows, drop_key=drop_key, fold=fold)
        return t.objective_sum(self.cfg.model.aux_loss_coef) / t.count.sum(), (t, after)

    def gradients(self, params: Any, model_state: Any, batch: Batch, step: jax.Array, rows: Rows,
                  drop_key: jax.Array | None = None, fold: jax.Array | None = None,
                  constrain: Callable[[Any], Any] = lambda g: g,
                  by_schedule: Callable[..., Gradients] | None = None) -> Gradients:
        """The mean loss of a (local or global) training batch and its gradients, the batch in one pass, or in
        `--train.grad-accum` microbatches one after another (`shardbench.train.accum`); `constrain` lays out
        the accumulator as the parameters. `by_schedule`: a pipeline schedule that writes the backward itself
        (1F1B), called as `accumulate` is."""
        k = self.cfg.train.grad_accum
        if k == 1 and by_schedule is None:
            (_, (t, after)), grads = jax.value_and_grad(self.mean_loss, has_aux=True)(
                params, model_state, batch, step, rows, drop_key, fold)
            # The loss reported is the task's (a mixture's load-balancing loss is reported apart, in `moe`).
            return Gradients(t.loss_sum.sum() / t.count.sum(), t.count.sum(),
                             None if t.correct is None else t.correct.sum(), after, grads, moe_sums(t))
        inputs, prepared = self.prepare(batch, step, train=True, rows=rows)
        drop = self.keys(step)[1] if drop_key is None else drop_key

        def forward(p: Any, state: Any, x: jax.Array, b: Batch, key: jax.Array | None) -> tuple[Terms, Any]:
            return self.forward(p, state, x, b, step, train=True, drop_key=key, fold=fold)

        if by_schedule is not None:
            return by_schedule(forward, params, model_state, inputs, prepared, like_params=constrain)
        return accumulate(forward, params, model_state, inputs, prepared, k, drop, constrain,
                          self.cfg.model.aux_loss_coef)

    @staticmethod
    def eval_params(state: TrainState) -> Any:
        """What evaluation scores: the weights' moving average where the optimizer keeps one (--optim.ema)."""
        ema = ema_params(state.opt_state)
        return state.params if ema is None else jax.tree.map(lambda e, p: e.astype(p.dtype), ema, state.params)

    def apply_update(self, state: TrainState, grads: Any, model_state: Any) -> TrainState:
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state, model_state)

    def train_metrics(self, state: TrainState, loss: jax.Array, correct: jax.Array | None, count: jax.Array,
                      grads: Any, moe: dict[str, jax.Array] | None = None) -> Metrics:
        metrics = {"loss": loss, "grad_norm": global_norm(grads), "lr": self.schedule(state.step)}
        if correct is not None:
            metrics["accuracy"] = correct / count
        if moe is not None:  # the batch's mean load-balancing loss and its assignments dropped over capacity
            metrics["moe_aux_loss"] = moe["aux"] / moe["examples"]
            metrics["moe_dropped"] = moe["dropped"]
        return metrics


def eval_sums(terms: Terms, mask: jax.Array) -> Metrics:
    """Sums over the real (unpadded) examples of a batch: the loop divides them once per split."""
    m = mask.astype(jnp.float32)
    sums = {"loss_sum": (terms.loss_sum * m).sum(), "count": (terms.count * m).sum()}
    if terms.correct is not None:
        sums["correct"] = (terms.correct * m).sum()
    return sums


def place_batch(batch: HostBatch, sharding: jax.sharding.Sharding) -> Batch:
    """Host numpy batch (this process's rows) -> global arrays laid out with the batch sharding."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
