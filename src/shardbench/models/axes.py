"""Logical axis names shared by the models (declared in `shardbench.axis_names`), and the hooks through which
activations are constrained and a stack of layers is run.

Models name the dimensions of their parameters and activations ('batch', 'embed', 'heads', ...).
They never see a mesh: the parallel layer installs a constraint function while it traces a step, and may install a
stack runner (a pipeline over stages) that takes over running the stacked layers, and a sequence split (context
parallelism) that takes over attention and says in which order the sequence is laid out.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax
import numpy as np

from shardbench.axis_names import (  # noqa: F401 - the models' vocabulary, re-exported here
    Axes, BATCH, SEQ, NORM_SEQ, EMBED, MLP, HEADS, KV, LAYERS, NORM, CLASSES, PATCH, VOCAB, FEATURES, EXPERT,
)

Constraint = Callable[[jax.Array, Axes], jax.Array]

_constraint: contextvars.ContextVar[Constraint | None] = contextvars.ContextVar("shardbench_constraint", default=None)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
    """Ask the parallel layer (if any is active) to lay `x` out by its logical axes."""
    fn = _constraint.get()
    return x if fn is None else fn(x, axes)


@contextlib.contextmanager
def constraints(fn: Constraint | None) -> Iterator[None]:
    """Install `fn` as the activation constraint while a step is traced."""
    token = _constraint.set(fn)
    try:
        yield
    finally:
        _constraint.reset(token)


# run(x, layers) runs a block over `layers` (a pytree whose leaves share a leading 'layers' dim) and returns the
# output; a runner is handed that and the whole stack, and may call it on slices of it (one per stage).
RunStack = Callable[[jax.Array, Any], jax.Array]
StackRunner = Callable[[RunStack, jax.Array, Any], jax.Array]

_stack_runner: contextvars.ContextVar[StackRunner | None] = contextvars.ContextVar("shardbench_stack_runner",
                                                                                    default=None)


def run_stack(run: RunStack, x: jax.Array, layers: Any) -> jax.Array:
    """`run(x, layers)`, or the installed runner's way of running the stack (a pipeline) if one is installed."""
    runner = _stack_runner.get()
    return run(x, layers) if runner is None else runner(run, x, layers)


@contextlib.contextmanager
def stack_runner(fn: StackRunner | None) -> Iterator[None]:
    """Install `fn` to run every stack of layers traced meanwhile (models run theirs through `run_stack`)."""
    token = _stack_runner.set(fn)
    try:
        yield
    finally:
        _stack_runner.reset(token)


class SequenceSplit(Protocol):
    """What the parallel layer installs while it traces a step whose sequence is split over devices (context
    parallelism): the order in which a model should lay out its sequence, and how attention is computed over it."""

    def order(self, length: int) -> np.ndarray | None:
        """The true position of each row of the sequence as the model should lay it out, or None (in order)."""
        ...

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
               precision: jax.lax.Precision) -> jax.Array:
        """Softmax attention over (batch, seq, heads, head_dim) q/k/v laid out in `order`'s order."""
        ...


_sequence_split: contextvars.ContextVar[SequenceSplit | None] = contextvars.ContextVar("shardbench_sequence_split",
                                                                                       default=None)


def sequence_order(length: int) -> np.ndarray | None:
    """The order a model lays its sequence of `length` rows out in (None: as given). A model whose attention
    is causal and goes through `run_attention` must embed its tokens in this order, with their true positions, and
    give its outputs back in token order (`shardbench.models.lm`)."""
    split = _sequence_split.get()
    return None if split is None else split.order(length)


def run_attention(plain: Callable[[jax.Array, jax.Array, jax.Array], jax.Array], q: jax.Array, k: jax.Array,
                  v: jax.Array, *, causal: bool, precision: jax.lax.Precision) -> jax.Array:
    """`plain(q, k, v)`, or the installed split's attention over a sequence split over devices."""
    split = _sequence_split.get()
    return plain(q, k, v) if split is None else split.attend(q, k, v, causal=causal, precision=precision)


@contextlib.contextmanager
def sequence_split(split: SequenceSplit | None) -> Iterator[None]:
    """Install `split` for every attention and sequence traced meanwhile."""
    token = _sequence_split.set(split)
    try:
        yield
    finally:
        _sequence_split.reset(token)
