"""Pipeline parallelism with the GPipe schedule, as one SPMD program (MaxText's way): the stacked layers are
split into S stages over the `stage` mesh axis, the batch into M microbatches, and the stack runs as M + S - 1
iterations in which every stage hands its last output to the next stage (a shift of the buffer along the stage
dim, which XLA lowers to a collective-permute) and then computes, all stages at once (a vmap over the stage
dim). Autodiff through the loop gives GPipe's backward: every microbatch's forward, then every backward.

The models never see this: they run their stacked layers through `shardbench.models.axes.run_stack`, and the jit
step installs `pipeline_runner` in its place while it traces.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from shardbench.models.axes import BATCH, LAYERS, Constraint, RunStack, StackRunner, stack_runner
from shardbench.parallel.mesh import STAGE
from shardbench.parallel.rules import Layout


def uses_pipeline(layout: Layout) -> bool:
    """A strategy that places stacked layers over the stage axis runs them as a pipeline."""
    return STAGE in layout.strategy.axes


def microbatch_count(microbatches: int, layout: Layout) -> int:
    """--parallel.microbatches, where 0 means one per stage."""
    return microbatches or layout.shape.stage


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle fraction: each stage idles S - 1 of the M + S - 1 iterations (filling and draining)."""
    return (stages - 1) / (microbatches + stages - 1)


def stack_depth(layers: Any) -> int:
    """The shared leading dim of the stack's arrays."""
    return next(leaf.shape[0] for leaf in jax.tree.leaves(layers))


def pipeline_runner(stages: int, microbatches: int, constrain: Constraint) -> StackRunner:
    """A stack runner: GPipe over `stages` stages and (at most) `microbatches` microbatches; `constrain` lays
    arrays out by logical axes (the layout's), where 'layers' maps to the stage axis."""

    def run_pipeline(run: RunStack, x: jax.Array, layers: Any) -> jax.Array:
        depth, batch, rest = stack_depth(layers), x.shape[0], x.shape[1:]
        # An evaluation batch need not divide by M (the checks hold the training batch to it): as many
        # microbatches as divide it. The result is the same; only the bubble grows.
        m = math.gcd(microbatches, batch)
        size = batch // m
        free = (None,) * len(rest)
        # [L, ...] -> [S, L/S, ...]: stage s holds layers s*L/S .. (s+1)*L/S - 1, the block its devices already
        # hold (the 'layers' dim is placed over stage), so the reshape moves nothing.
        staged = jax.tree.map(lambda a: a.reshape(stages, depth // stages, *a.shape[1:]), layers)
        # Microbatch i takes rows i, i + M, i + 2M, ...: rows from every data shard, so each microbatch stays split
        # over the data axis (M divides each shard's rows).
        chunks = constrain(x.reshape(size, m, *rest).swapaxes(0, 1), (None, BATCH, *free))
        first = jnp.arange(stages).reshape(stages, *(1,) * x.ndim) == 0

        def iteration(state: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
            # Stage s takes what stage s - 1 computed last iteration, stage 0 microbatch t (during the drain,
            # t >= M, the last one again, whose result nobody reads). A roll, which XLA partitions into one
            # collective-permute around the ring (its wrap, last stage to stage 0, is sent and overwritten); a
            # concatenate of slices compiled to three all-to-alls, a pad and a slice to three permutes.
            chunk = jax.lax.dynamic_index_in_dim(chunks, jnp.minimum(t, m - 1), 0)
            shifted = jnp.where(first, chunk, jnp.roll(state, 1, axis=0))
            shifted = constrain(shifted, (LAYERS, BATCH, *free))
            # spmd_axis_name: the constraints the block makes on its activations name stage for the vmapped dim
            # instead of leaving it to XLA (which, on the MLP, compiles the same collectives either way).
            state = constrain(jax.vmap(run, spmd_axis_name=STAGE)(shifted, staged), (LAYERS, BATCH, *free))
            return state, state

        state = constrain(jnp.zeros((stages, size, *rest), x.dtype), (LAYERS, BATCH, *free))
        # Every iteration's buffer, each stage's part where it was computed: gathering the last stage's outputs
        # once after the loop moves them in one collective instead of one per iteration.
        _, states = jax.lax.scan(iteration, state, jnp.arange(m + stages - 1))
        # The last stage finishes microbatch i at iteration i + S - 1; back to the batch's own row order.
        return states[stages - 1:, stages - 1].swapaxes(0, 1).reshape(batch, *rest)

    return run_pipeline


@contextlib.contextmanager
def pipelined(layout: Layout, microbatches: int) -> Iterator[None]:
    """While tracing a step: run the model's stacked layers as a pipeline where the layout has stages."""
    if not uses_pipeline(layout):
        yield
        return
    with stack_runner(pipeline_runner(layout.shape.stage, microbatch_count(microbatches, layout), layout.constrain)):
        yield
