"""Gradient accumulation (`--train.grad-accum K`): one update from K microbatches, the same update as the whole
batch's, with one microbatch's activations alive at a time.

The batch is prepared whole first (augmentation, mixing of pairs and soft targets are drawn exactly as without
accumulation), then split into K microbatches that a `lax.scan` runs one after another: XLA frees a
microbatch's activations before the next starts. Each microbatch contributes its per-example loss *sums* and
their gradients (differentiated as the microbatch's mean, so that 16-bit gradients keep the scale they have
without accumulation, then multiplied by its target count in float32), summed over the microbatches in float32
and divided once by the whole batch's target count:
that is the full batch's mean over its targets, however the targets fall among the microbatches (a mean of
microbatch means would weight a microbatch of few targets as much as one of many).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from shardbench.tasks import Terms

Batch = dict[str, jax.Array]
# (params, model state, inputs, batch, dropout key) -> (per-example terms, model state after the call)
Forward = Callable[[Any, Any, jax.Array, Batch, jax.Array | None], tuple[Terms, Any]]


class Gradients(NamedTuple):
    """A batch's loss and the gradients of its training objective: `loss` the mean over its targets, `count` the
    targets, `correct` the right ones (None where accuracy means nothing), the model state after the batch; `moe`
    (with a mixture of experts): the batch's sums of the load-balancing loss and of the dropped assignments, and its
    example count."""

    loss: jax.Array
    count: jax.Array
    correct: jax.Array | None
    model_state: Any
    grads: Any
    moe: dict[str, jax.Array] | None = None


def moe_sums(t: Terms) -> dict[str, jax.Array] | None:
    """A batch's sums of its mixture's per-example terms, and its examples (None without experts)."""
    if t.moe is None:
        return None
    return {"aux": t.moe.aux.sum(), "dropped": t.moe.dropped.sum(),
            "examples": jnp.asarray(t.moe.aux.shape[0], jnp.float32)}


def targets(t: Terms) -> jax.Array:
    """A microbatch's target count, at least 1 (one whose targets are all masked divides its zero sum by 1),
    outside differentiation."""
    return jax.lax.stop_gradient(jnp.maximum(t.count.sum().astype(jnp.float32), 1.0))


def split(x: jax.Array, k: int) -> jax.Array:
    """(n, ...) -> (k, n/k, ...), microbatch j holding rows j, j+k, j+2k, ...: strided, so a batch laid over
    devices in contiguous blocks of a multiple of k rows gives each device its share of every microbatch
    without moving a row between devices."""
    return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def accumulate(forward: Forward, params: Any, model_state: Any, inputs: jax.Array, batch: Batch, k: int,
               drop_key: jax.Array | None, constrain: Callable[[Any], Any] = lambda g: g,
               aux_coef: float = 0.0) -> Gradients:
    """The gradients of the mean loss of (`inputs`, `batch`), prepared whole, run as `k` microbatches in a scan.

    The model state is threaded through the microbatches (a model's RNG streams advance per call); microbatch
    j's dropout key is `drop_key` folded with j, so each draws its own masks (the same in distribution as the
    whole batch's, not element for element). `constrain` lays the float32 accumulator out as the parameters
    (under jit: their shardings, so FSDP keeps 1/N of it per device)."""
    micro = (split(inputs, k), jax.tree.map(lambda x: split(x, k), batch), jnp.arange(k))

    def objective(p: Any, state: Any, x: jax.Array, b: Batch, key: jax.Array | None) -> tuple[jax.Array, Any]:
        # The microbatch's mean, as without accumulation: its sum's gradients are its target count times larger
        # in the parameters' and the compute dtype, where float16 overflows. They are multiplied back in float32.
        t, after = forward(p, state, x, b, key)
        return t.objective_sum(aux_coef) / targets(t), (t, after)

    scores: list[bool] = []  # whether the task counts right answers, learnt when the scan traces its body

    def body(carry: tuple[dict[str, Any], Any], xs: tuple[jax.Array, Batch, jax.Array]
             ) -> tuple[tuple[dict[str, Any], Any], None]:
        acc, state = carry
        x, b, j = xs
        key = None if drop_key is None else jax.random.fold_in(drop_key, j)
        (_, (t, after)), grads = jax.value_and_grad(objective, has_aux=True)(params, state, x, b, key)
        scores.append(t.correct is not None)
        step = {"grads": grads, "loss_sum": t.loss_sum.sum(), "count": t.count.sum(),
                "correct": jnp.zeros(()) if t.correct is None else t.correct.sum()}
        if t.moe is not None:
            step["moe"] = moe_sums(t)
        step["grads"] = jax.tree.map(lambda g: g.astype(jnp.float32) * targets(t), grads)
        acc = jax.tree.map(lambda a, d: a + d.astype(jnp.float32), acc, step)
        return ({**acc, "grads": constrain(acc["grads"])}, after), None

    zero = jnp.zeros((), jnp.float32)
    start = {"grads": constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)),
             "loss_sum": zero, "count": zero, "correct": zero}
    # Whether the model returns a mixture's terms is known once it is traced: trace one microbatch's terms.
    first = jax.eval_shape(lambda: forward(params, model_state, micro[0][0], jax.tree.map(lambda x: x[0], micro[1]),
                                           None)[0])
    if first.moe is not None:
        start["moe"] = {"aux": zero, "dropped": zero, "examples": zero}
    (acc, after), _ = jax.lax.scan(body, (start, model_state), micro)
    count = acc["count"]
    grads = jax.tree.map(lambda g, p: (g / count).astype(p.dtype), acc["grads"], params)
    return Gradients(acc["loss_sum"] / count, count, acc["correct"] if scores[0] else None, after, grads,
                     acc.get("moe"))
