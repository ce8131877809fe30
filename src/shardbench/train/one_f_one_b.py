"""The 1F1B pipeline schedule (PipeDream-flush, Megatron's and torchtitan's default) for the jit train step: stage
s runs S-1-s warm-up forwards, then alternates one forward and one backward, then drains its backwards, so at
most S - s microbatches are between their forward and their backward on stage s (GPipe: all M).

Autodiff through a forward loop cannot give this order (microbatch 0's backward needs its loss before the later
forwards have run), so the gradients are written here, with the stack-runner hook cutting the model in three:
`pre` (what runs before `run_stack`: the embedding) is the model traced with a runner that keeps the stack's
input and returns it; the stack; `post(h)` (the head and the loss of one microbatch) is the model traced with a
runner that returns h, the part before the stack left as dead code that XLA removes.

The stack runs as a scan over 2(M+S-1) ticks, all stages at once under a vmap over the stage dim (placed on the
stage axis), as GPipe's iterations do. Stage s does microbatch i's forward at tick s+i during its warm-up
(i <= S-1-s), at tick s+2i after, and its backward at tick 2S-1-s+2i: one tick after stage s+1's, so the input
cotangents move one stage back per tick, as the activations move one forward. A stage keeps the inputs of the
microbatches between its forward and its backward (a ring of S) and recomputes its forward inside the backward
(`jax.vjp`), as Megatron's full activation recompute does. The last stage runs `post` and its vjp in the tick it
finishes a microbatch's forward; stage 0's input cotangents go through `pre`'s vjp after the loop.

Under vmap every stage computes a forward and a backward (with its recomputed forward) in every tick and keeps
what the schedule gives it (a select), and `post` runs every tick: 2(M+S-1) ticks of three passes over a stage,
where GPipe runs M+S-1 forward and M+S-1 backward iterations. A per-stage program (shard_map over stage, with
lax.cond) would run only the scheduled one.

Each microbatch's backward starts from its mean (cotangent 1 / its target count), as gradient accumulation's
do (`train.accum`): in a 16-bit compute dtype its cotangents keep the scale they have without microbatches.
Its gradients are multiplied back by its count in the float32 accumulators, and the stack's input and layers get
the whole batch's mean as their cotangents before `pre`'s vjp.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from shardbench.models.axes import BATCH, LAYERS, Constraint, RunStack, stack_runner
from shardbench.config import ParallelConfig
from shardbench.parallel.mesh import STAGE
from shardbench.parallel.pipeline import microbatch_count, uses_pipeline
from shardbench.parallel.rules import Layout
from shardbench.train.accum import Batch, Forward, Gradients, split, targets


def forward_ticks(t: jax.Array, stages: int, m: int) -> tuple[jax.Array, jax.Array]:
    """Per stage: the microbatch whose forward it runs at tick `t`, and whether it runs one."""
    s = jnp.arange(stages)
    warm, steady = t - s, (t - s) // 2
    in_warm = (warm >= 0) & (warm <= stages - 1 - s) & (warm < m)
    in_steady = ((t - s) % 2 == 0) & (steady >= stages - s) & (steady < m)
    return jnp.where(in_warm, warm, steady), in_warm | in_steady


def backward_ticks(t: jax.Array, stages: int, m: int) -> tuple[jax.Array, jax.Array]:
    """Per stage: the microbatch whose backward it runs at tick `t`, and whether it runs one."""
    since = t - (2 * stages - 1 - jnp.arange(stages))
    return since // 2, (since >= 0) & (since % 2 == 0) & (since // 2 < m)


def ticks(stages: int, m: int) -> int:
    """The schedule's length: stage 0 runs the last backward at 2S-1 + 2(M-1)."""
    return 2 * (m + stages - 1)


def _at(a: jax.Array, i: jax.Array) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


def _put(a: jax.Array, value: jax.Array, i: jax.Array, ok: jax.Array) -> jax.Array:
    """`a` with row i set to `value` where `ok`."""
    return jax.lax.dynamic_update_index_in_dim(a, jnp.where(ok, value, _at(a, i)), i, 0)


def _where_stage(ok: jax.Array, new: Any, old: Any) -> Any:
    """Per stage (the leading dim), `new` where `ok`, else `old`."""
    return jax.tree.map(lambda n, o: jnp.where(ok.reshape(-1, *(1,) * (n.ndim - 1)), n, o), new, old)


def one_f_one_b_gradients(forward: Forward, params: Any, model_state: Any, inputs: jax.Array, batch: Batch,
                          stages: int, microbatches: int, constrain: Constraint,
                          like_params: Any = lambda g: g) -> Gradients:
    """The mean loss of (`inputs`, `batch`) and its gradients, the stack run in the 1F1B order over `stages`
    stages and `microbatches` microbatches; `constrain` lays arrays out by logical axes (the layout's),
    `like_params` lays a tree like the parameters out as they are."""
    s_, m = stages, microbatches
    kept: list[tuple[RunStack, jax.Array, Any]] = []

    def keep(run: RunStack, x: jax.Array, layers: Any) -> jax.Array:
        kept.append((run, x, layers))
        return x

    def pre(p: Any) -> tuple[tuple[jax.Array, Any], Any]:
        with stack_runner(keep):
            _, after = forward(p, model_state, inputs, batch, None)
        if len(kept) != 1:
            raise ValueError(f"1f1b cuts a model at its one stack of layers; this one ran {len(kept)}")
        _, x, layers = kept[0]
        return (x, layers), after

    (x, layers), pre_vjp, after = jax.vjp(pre, params, has_aux=True)
    run = kept[0][0]
    depth = jax.tree.leaves(layers)[0].shape[0]
    staged = jax.tree.map(lambda a: a.reshape(s_, depth // s_, *a.shape[1:]), layers)
    size, rest = x.shape[0] // m, x.shape[1:]
    free = (None,) * len(rest)
    chunks = constrain(split(x, m), (None, BATCH, *free))
    micro_inputs, micro_batch = split(inputs, m), jax.tree.map(lambda a: split(a, m), batch)
    last = jnp.arange(s_) == s_ - 1

    def stage(held: Any, h: jax.Array) -> jax.Array:
        return run(h, held)

    def stage_backward(held: Any, h: jax.Array, g: jax.Array) -> tuple[Any, jax.Array]:
        return jax.vjp(stage, held, h)[1](g)

    def post(p: Any, h: jax.Array, i: jax.Array) -> tuple[jax.Array, Any]:
        with stack_runner(lambda _run, _x, _layers: h):
            terms, _ = forward(p, model_state, _at(micro_inputs, i), jax.tree.map(lambda a: _at(a, i), micro_batch),
                               None)
        return terms.loss_sum.sum(), terms

    scores: list[bool] = []  # whether the task counts right answers, learnt when the scan traces its body

    def tick(carry: dict[str, Any], t: jax.Array) -> tuple[dict[str, Any], None]:
        c = dict(carry)
        # Arrivals: stage 0 takes its next microbatch, stage s what stage s-1 finished last tick, into the ring
        # slot i mod S (free by then: microbatch i-S's backward ran before).
        i_f, ok_f = forward_ticks(t, s_, m)
        i_in, ok_in = (jnp.roll(v, 1) for v in forward_ticks(t - 1, s_, m))
        i_in, ok_in = i_in.at[0].set(i_f[0]), ok_in.at[0].set(ok_f[0])
        arriving = jnp.roll(c["sent"], 1, axis=0).at[0].set(_at(chunks, jnp.clip(i_f[0], 0, m - 1)))
        ring = jax.vmap(_put)(c["ring"], arriving, i_in % s_, ok_in)
        c["ring"] = constrain(ring, (LAYERS, None, BATCH, *free))
        # Forward: each stage its scheduled microbatch (from the ring).
        h = jax.vmap(_at)(c["ring"], i_f % s_)
        y = jax.vmap(stage, spmd_axis_name=STAGE)(staged, constrain(h, (LAYERS, BATCH, *free)))
        c["sent"] = constrain(y, (LAYERS, BATCH, *free))
        # The last stage's finished microbatch: its loss, and the cotangent its backward starts from next tick.
        i_post = jnp.clip(i_f[s_ - 1], 0, m - 1)
        loss_sum, post_vjp, terms = jax.vjp(lambda p, o: post(p, o, i_post), params, y[s_ - 1], has_aux=True)
        c_post = targets(terms)
        d_params, d_out = post_vjp((1.0 / c_post).astype(loss_sum.dtype))
        d_params = jax.tree.map(lambda d: d.astype(jnp.float32) * c_post, d_params)
        done = ok_f[s_ - 1]
        c["counts"] = _put(c["counts"], c_post, i_post, done)
        scores.append(terms.correct is not None)
        sums = {"loss_sum": loss_sum, "count": terms.count.sum(),
                "correct": jnp.zeros(()) if terms.correct is None else terms.correct.sum()}
        c["sums"] = jax.tree.map(lambda a, d: a + jnp.where(done, d, 0).astype(jnp.float32), c["sums"], sums)
        c["d_post"] = like_params(jax.tree.map(lambda a, d: a + jnp.where(done, d, 0).astype(jnp.float32),
                                               c["d_post"], d_params))
        # Backward: each stage its scheduled microbatch, its forward recomputed from the ring; the cotangent from
        # the next stage's backward last tick (the last stage: from post's).
        i_b, ok_b = backward_ticks(t, s_, m)
        g = jnp.where(last.reshape(-1, *(1,) * (y.ndim - 1)), c["post_grad"][None],
                      jnp.roll(c["returned"], -1, axis=0))
        h_b = jax.vmap(_at)(c["ring"], i_b % s_)
        d_held, d_h = jax.vmap(stage_backward, spmd_axis_name=STAGE)(
            staged, constrain(h_b, (LAYERS, BATCH, *free)), constrain(g, (LAYERS, BATCH, *free)))
        scale = c["counts"][jnp.clip(i_b, 0, m - 1)]  # each stage's microbatch's target count
        c["d_staged"] = _where_stage(ok_b, jax.tree.map(
            lambda a, d: a + d.astype(jnp.float32) * scale.reshape(-1, *(1,) * (d.ndim - 1)), c["d_staged"],
            d_held), c["d_staged"])
        c["returned"] = constrain(d_h, (LAYERS, BATCH, *free))
        c["post_grad"] = d_out
        c["d_chunks"] = _put(c["d_chunks"], d_h[0], jnp.clip(i_b[0], 0, m - 1), ok_b[0])
        return c, None

    zero = jnp.zeros((), jnp.float32)
    activations = constrain(jnp.zeros((s_, size, *rest), x.dtype), (LAYERS, BATCH, *free))
    start = {
        "ring": constrain(jnp.zeros((s_, s_, size, *rest), x.dtype), (LAYERS, None, BATCH, *free)),
        "sent": activations, "returned": activations, "post_grad": jnp.zeros((size, *rest), x.dtype),
        "d_staged": jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), staged),
        "d_post": like_params(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)),
        "d_chunks": jnp.zeros_like(chunks), "sums": {"loss_sum": zero, "count": zero, "correct": zero},
        "counts": jnp.ones((m,), jnp.float32),
    }
    end, _ = jax.lax.scan(tick, start, jnp.arange(ticks(s_, m)))
    sums = end["sums"]
    count = sums["count"]
    # The stack's input and layers get the whole batch's mean as their cotangents (each microbatch's at its own
    # mean so far, weighed by its share of the targets), so the part before the stack differentiates in 16 bits
    # at the scale it has without microbatches.
    d_layers = jax.tree.map(lambda d, a: (d / count).reshape(a.shape).astype(a.dtype), end["d_staged"], layers)
    share = (end["counts"] / count).reshape(m, *(1,) * (chunks.ndim - 1))
    d_x = (end["d_chunks"].astype(jnp.float32) * share).astype(x.dtype).swapaxes(0, 1).reshape(x.shape)
    (d_pre,) = pre_vjp((d_x, d_layers))
    grads = like_params(jax.tree.map(lambda a, b, p: (a.astype(jnp.float32) + b / count).astype(p.dtype),
                                     d_pre, end["d_post"], params))
    return Gradients(sums["loss_sum"] / count, count, sums["correct"] if scores[0] else None, after, grads)


def hand_written_backward(layout: Layout, parallel: ParallelConfig) -> Callable[..., Any] | None:
    """For `StepParts.gradients`: 1F1B's gradients (this module) where the layout has
    stages and the schedule is 1f1b; None where autodiff through the runner gives the schedule's backward."""
    if not uses_pipeline(layout) or parallel.schedule != "1f1b":
        return None
    return functools.partial(one_f_one_b_gradients, stages=layout.shape.stage,
                             microbatches=microbatch_count(parallel.microbatches, layout), constrain=layout.constrain)
