"""Tasks: per model kind, how batches become inputs, the loss, and the work per example."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from shardbench import validation
from shardbench.config import Config
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
    it has them (FLOPs otherwise come from XLA's cost analysis: `train_flops_per_example` gives None)."""
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
        "XLA's cost analysis of the compiled step (a loop body counts once: scanned layers are undercounted)",
    )


def validate(cfg: Config) -> None:
    """Every check that needs neither devices nor data: the configuration's values, then the model kind's
    shapes (heads dividing the width, ...); one-line ConfigError."""
    validation.validate(cfg)
    get_task(cfg).check(cfg)


__all__ = ["TASKS", "Rows", "Task", "Terms", "for_data", "get_task", "validate"]
