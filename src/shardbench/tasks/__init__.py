"""Tasks: per model kind, how batches become inputs, the loss, and the work per example."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from shardbench import validation
from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.models import check_kind
from shardbench.tasks import language, regression, vision
from shardbench.tasks.base import Batch, Rows, Task, Terms

TASKS: dict[str, Task] = {t.kind: t for t in (vision.TASK, language.TASK, regression.TASK)}


def get_task(cfg: Config) -> Task:
    check_kind(cfg.model.kind)
    if cfg.model.factory:
        return custom_task(cfg)
    return TASKS[cfg.model.kind]


def for_data(task: Task, dataset: object) -> Task:
    """The task with what it needs to know of its dataset: an image task normalises with the dataset's own
    statistics (CIFAR-10's customary ones, or those of its training split)."""
    norm = getattr(dataset, "norm", None)
    if task.kind != "vit" or norm is None:
        return task
    return dataclasses.replace(task, inputs=functools.partial(task.inputs, mean=tuple(norm[0]), std=tuple(norm[1])))


def custom_task(cfg: Config) -> Task:
    """A model of your own: the task of the kind its `--task` shares data with, without that kind's shape
    checks and FLOPs formula, and with the file's `loss(outputs, batch)` and `flops_per_example(cfg)` where
    it has them (FLOPs otherwise come from XLA's count of the model on one device, `ModelSpec.traced_train_flops`:
    `train_flops_per_example` gives None)."""
    from shardbench.models import custom

    plugin = custom.load(cfg.model.factory)
    base = TASKS[cfg.model.kind]
    terms = base.terms
    if plugin.loss is not None:
        user_loss, base_terms = plugin.loss, base.terms

        def terms(outputs: jax.Array, batch: Batch) -> Terms:
            own = base_terms(outputs, batch)
            loss = jnp.asarray(user_loss(outputs, batch), jnp.float32)
            return Terms(loss.reshape(own.loss_sum.shape), own.count, own.correct)

    flops = plugin.flops_per_example
    return dataclasses.replace(
        base, check=lambda c: None, terms=terms,
        train_flops_per_example=(lambda c: int(flops(c))) if flops else (lambda c: None),
        formula=f"flops_per_example(cfg) of {plugin.source}" if flops else
        "XLA's cost analysis of the model's forward and backward on one device, unsharded (flops.traced_per_step; "
        "a loop body counts once: scanned layers are undercounted)",
    )


def example_batch(cfg: Config, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
    """`rows` examples as the input pipeline hands them to the step, abstract: uint8 images and int32 labels,
    int32 token windows (seq_len + 1), float32 regression pairs. What a model file's `loss` is traced on."""
    m = cfg.model
    if m.kind == "lm":
        return {"tokens": jax.ShapeDtypeStruct((rows, m.seq_len + 1), jnp.int32)}
    if m.kind == "mlp":
        return {"inputs": jax.ShapeDtypeStruct((rows, m.input_dim), jnp.float32),
                "targets": jax.ShapeDtypeStruct((rows, m.num_classes), jnp.float32)}
    size = cfg.data.image_size
    return {"image": jax.ShapeDtypeStruct((rows, size, size, 3), jnp.uint8),
            "label": jax.ShapeDtypeStruct((rows,), jnp.int32)}


def check_own_functions(cfg: Config, task: Task, outputs: tuple[Any, Any]) -> None:
    """A model of your own: the file's `loss` and `flops_per_example`, which the run would otherwise first call
    mid-way (the header, the first step), are tried now, before the run folder is made. `loss` is traced
    (never compiled) on the model's traced `outputs` (training's, evaluation's, as `spec.check_outputs` gives
    them) with the batch each sees; `flops_per_example(cfg)` is called once. A failure or a wrong result is one
    line (ConfigError) naming the function and what it must return."""
    from shardbench.models import custom

    plugin = custom.load(cfg.model.factory)
    if plugin.loss is not None:
        for train, out in zip((True, False), outputs):
            _check_loss(cfg, task, plugin.loss, out, train)
    if plugin.flops_per_example is not None:
        _check_flops(cfg, plugin.flops_per_example)


# What the file's `loss` must give, said last in its refusals (a long one loses its end, not its cause).
LOSS_MUST = "it must return one float loss per example, shape (batch,)"


def _check_loss(cfg: Config, task: Task, loss: Any, out: jax.ShapeDtypeStruct, train: bool) -> None:
    """Trace `loss(out, batch)` on the batch the step gives it: in training with the task's soft targets where
    the run makes them, in evaluation with the padding mask. It must give a float array of shape (rows,)."""
    from shardbench.models.spec import first_line

    rows, mode = out.shape[0], "" if train else " in evaluation mode"
    batch: dict[str, Any] = example_batch(cfg, rows)
    if train and task.targets is not None:
        batch = jax.eval_shape(lambda b: task.targets(cfg, b, jax.random.key(0), Rows(0, rows)), batch)
    if not train:
        batch = {**batch, "mask": jax.ShapeDtypeStruct((rows,), jnp.bool_)}
    held = ", ".join(f"{k} {tuple(v.shape)} {jnp.dtype(v.dtype).name}" for k, v in batch.items())
    returned: list[str] = []

    def call(o: jax.Array, b: Batch) -> jax.Array | None:
        value = loss(o, b)
        if isinstance(value, (jax.Array, numbers.Number)) or hasattr(value, "__array__"):
            return jnp.asarray(value)
        returned.append(type(value).__name__)
        return None

    spec = cfg.model.factory
    try:
        got = jax.eval_shape(call, out, batch)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's code: one line (Ctrl-C stays an interrupt)
        raise ConfigError(f"--model {spec}: loss(outputs, batch) failed{mode}: {first_line(err)[:150]} (given "
                          f"outputs {tuple(out.shape)} and a batch of {held}; {LOSS_MUST})") from None
    if returned:
        raise ConfigError(f"--model {spec}: loss(outputs, batch) returned a {returned[0]}{mode}, not an array; "
                          f"{LOSS_MUST}")
    if tuple(got.shape) != (rows,):
        raise ConfigError(f"--model {spec}: loss(outputs, batch) returned shape {tuple(got.shape)}{mode} for a batch "
                          f"of {rows}: {LOSS_MUST} = ({rows},), summed over an example's targets, not averaged "
                          f"over the batch")
    if not jnp.issubdtype(got.dtype, jnp.floating):
        raise ConfigError(f"--model {spec}: loss(outputs, batch) returned {jnp.dtype(got.dtype).name} losses{mode}, "
                          f"which no gradient flows through: {LOSS_MUST} (e.g. float32)")


def _check_flops(cfg: Config, flops: Any) -> None:
    """Call `flops_per_example(cfg)` once: it must give a finite number of at least 1 (the header, MFU and the
    run record use it, rounded down to a whole count)."""
    from shardbench.models.spec import first_line

    must = "it must return the training FLOPs of one example (forward + backward), a number of at least 1"
    spec = cfg.model.factory
    try:
        value = flops(cfg)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's code: one line (Ctrl-C stays an interrupt)
        raise ConfigError(f"--model {spec}: flops_per_example(cfg) failed: {first_line(err)[:150]} ({must})") from None
    number = not isinstance(value, bool) and (isinstance(value, numbers.Real) or getattr(value, "shape", None) == ())
    try:
        counts = number and math.isfinite(float(value)) and float(value) >= 1
    except (TypeError, ValueError):
        counts = False
    if not counts:
        raise ConfigError(f"--model {spec}: flops_per_example(cfg) returned {value!r:.60} ({type(value).__name__}): "
                          f"{must}")


def validate(cfg: Config) -> None:
    """Every check that needs neither devices nor data: the configuration's values, then the model kind's
    shapes (heads dividing the width, ...); one-line ConfigError."""
    validation.validate(cfg)
    get_task(cfg).check(cfg)


__all__ = ["TASKS", "Rows", "Task", "Terms", "check_own_functions", "example_batch", "for_data", "get_task",
           "validate"]
