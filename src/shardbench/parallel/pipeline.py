"""Pipeline parallelism as one SPMD program (MaxText's way): the stacked layers are split into S stages over the
`stage` mesh axis, the batch into M microbatches, and the stack runs as iterations in which every stage hands its
last output to the next stage (a shift of the buffer along the stage dim, which XLA lowers to a
collective-permute) and then computes, all stages at once (a vmap over the stage dim).

- gpipe: M + S - 1 iterations; autodiff through the loop gives the backward: every microbatch's forward, then
  every backward, so the residuals of all M microbatches are alive at once.
- circular (MaxText's `num_pipeline_repeats`): the stack splits into S x R chunks, stage s holding chunks s, s+S,
  s+2S, ...; each microbatch loops through the stages R times, R x M + S - 1 iterations of one chunk each.
- 1f1b: this module's runner runs its forward (evaluation); the train step's gradients are written by hand in
  `shardbench.train.one_f_one_b`.

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
import numpy as np

from shardbench.config import ParallelConfig
from shardbench.models.axes import BATCH, LAYERS, Constraint, RunStack, StackRunner, stack_runner
from shardbench.parallel.mesh import STAGE
from shardbench.parallel.rules import Layout


def uses_pipeline(layout: Layout) -> bool:
    """A strategy that places stacked layers over the stage axis runs them as a pipeline."""
    return STAGE in layout.strategy.axes


def microbatch_count(microbatches: int, layout: Layout) -> int:
    """--parallel.microbatches, where 0 means one per stage."""
    return microbatches or layout.shape.stage


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The idle fraction, counted in iterations of equal work: (S-1)/(M+S-1) for GPipe and 1F1B (each stage idles
    S - 1 of M + S - 1 forward slots, and as many backward ones), (S-1)/(R*M+S-1) for circular with R repeats
    (iterations of one chunk, 1/R of a stage's layers)."""
    return (stages - 1) / (repeats * microbatches + stages - 1)


def stack_work(schedule: str, stages: int, microbatches: int, repeats: int = 1) -> float:
    """What one step's single SPMD program computes on each stage, in units of the useful work (each stage's
    layers forward and backward, a backward costing two forwards, for the M microbatches): GPipe (M+S-1)/M, its
    idle stages computing on placeholders; circular (R*M+S-1)/(R*M) x 4/3, each chunk's forward recomputed in the
    backward; 1F1B 2(M+S-1)/M x 4/3, every one of its 2(M+S-1) ticks running a forward and a backward with its
    recomputed forward (under vmap both are computed, and the tick keeps one). Without --model.remat, and leaving
    out the layers outside the stack (1F1B also runs the head every tick)."""
    m, s_, r = microbatches, stages, repeats
    if schedule == "1f1b":
        return 2 * (m + s_ - 1) / m * 4 / 3
    if schedule == "circular" and r > 1:  # at R = 1 the circular schedule runs GPipe's program
        return (r * m + s_ - 1) / (r * m) * 4 / 3
    return (m + s_ - 1) / m


def schedule_repeats(parallel: ParallelConfig) -> int:
    """R of the bubble: --parallel.repeats under the circular schedule, 1 otherwise."""
    return parallel.repeats if parallel.schedule == "circular" else 1


def stage_order(depth: int, stages: int, repeats: int) -> np.ndarray:
    """The layer each stored position holds: stored [S, R, L/(S*R)] so that stage s's block (the 'layers' dim over
    stage, contiguous) holds chunks s, s+S, s+2S, ... of the stack; `np.arange(depth)` when R is 1."""
    chunk = depth // (stages * repeats)
    order = np.arange(depth).reshape(repeats, stages, chunk).swapaxes(0, 1)
    return order.reshape(depth)


def stage_layers(stage: int, depth: int, stages: int, repeats: int) -> list[int]:
    """The layers (in the model's order) that stage `stage` holds."""
    per = depth // stages
    return sorted(stage_order(depth, stages, repeats)[stage * per:(stage + 1) * per].tolist())


def store_in_stage_order(params: Any, axes: Any, stages: int, repeats: int) -> Any:
    """Stacked parameters permuted into `stage_order` (the identity when R is 1): the circular schedule's stages
    then hold their chunks where the 'layers' dim's placement over stage puts them, and nothing moves per step."""
    if repeats == 1:
        return params

    def permute(a: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
        if LAYERS not in names:
            return a
        dim = names.index(LAYERS)
        return jnp.take(a, jnp.asarray(stage_order(a.shape[dim], stages, repeats)), axis=dim)

    return jax.tree.map(permute, params, axes)


def stack_depth(layers: Any) -> int:
    """The shared leading dim of the stack's arrays."""
    return next(leaf.shape[0] for leaf in jax.tree.leaves(layers))


def pipeline_runner(stages: int, microbatches: int, constrain: Constraint, repeats: int = 1) -> StackRunner:
    """A stack runner: GPipe (`repeats` 1) or circular over `stages` stages and (at most) `microbatches`
    microbatches; `constrain` lays arrays out by logical axes (the layout's), where 'layers' maps to the stage
    axis. With repeats, the stack arrives in `stage_order` (`store_in_stage_order`)."""

    def run_pipeline(run: RunStack, x: jax.Array, layers: Any) -> jax.Array:
        depth, batch, rest = stack_depth(layers), x.shape[0], x.shape[1:]
        # An evaluation batch need not divide by M (the checks hold the training batch to it): as many
        # microbatches as divide it. The result is the same; only the bubble grows. Circular needs M >= S.
        m = math.gcd(microbatches, batch)
        if repeats > 1 and m < stages:
            m = next((d for d in range(stages, batch + 1) if batch % d == 0), 0)
            if not m:  # fewer examples than stages: the layers one after another, in the model's order
                order = np.argsort(stage_order(depth, stages, repeats))
                return run(x, jax.tree.map(lambda a: a[order], layers))
        size = batch // m
        free = (None,) * len(rest)
        # [L, ...] -> [S, R, L/(S R), ...]: stage s holds the block its devices already hold (the 'layers' dim is
        # placed over stage), so the reshape moves nothing: layers s*L/S .. (s+1)*L/S - 1 for GPipe, chunks
        # s, s+S, ... for circular (stored so). Stage s runs its chunk r in a microbatch's r-th pass.
        staged = jax.tree.map(lambda a: a.reshape(stages, repeats, depth // stages // repeats, *a.shape[1:]),
                              layers)
        # Microbatch i takes rows i, i + M, i + 2M, ...: rows from every data shard, so each microbatch stays split
        # over the data axis (M divides each shard's rows).
        chunks = constrain(x.reshape(size, m, *rest).swapaxes(0, 1), (None, BATCH, *free))
        first = jnp.arange(stages).reshape(stages, *(1,) * x.ndim) == 0

        def compute(shifted: jax.Array, t: jax.Array) -> jax.Array:
            # spmd_axis_name: the constraints the block makes on its activations name stage for the vmapped dim
            # instead of leaving it to XLA (which, on the MLP, compiles the same collectives either way).
            shifted = constrain(shifted, (LAYERS, BATCH, *free))
            if repeats == 1:
                chunk_of = jax.tree.map(lambda a: a[:, 0], staged)
                return jax.vmap(run, spmd_axis_name=STAGE)(shifted, chunk_of)
            # Stage s works on pass (t - s) // M of a microbatch: its chunk of that pass.
            passes = jnp.clip((t - jnp.arange(stages)) // m, 0, repeats - 1)

            # Recomputed in the backward from the iteration's input (MaxText saves its 'iteration_input' so):
            # autodiff would otherwise keep every iteration's slice of the weights, R x M + S - 1 copies of a
            # chunk, as the residuals of the model's scan over the chunk's layers.
            @jax.checkpoint
            def one(h: jax.Array, held: Any, r: jax.Array) -> jax.Array:
                return run(h, jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, r, 0, keepdims=False), held))

            return jax.vmap(one, spmd_axis_name=STAGE)(shifted, staged, passes)

        def iteration(carry: tuple[jax.Array, jax.Array], t: jax.Array
                      ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
            # Stage s takes what stage s - 1 computed last iteration, stage 0 microbatch t (during the drain,
            # t >= M, the last one again, whose result nobody reads). A roll, which XLA partitions into one
            # collective-permute around the ring (its wrap, last stage to stage 0, is sent and overwritten); a
            # concatenate of slices compiled to three all-to-alls, a pad and a slice to three permutes.
            state, looped = carry
            chunk = jax.lax.dynamic_index_in_dim(chunks, jnp.minimum(t, m - 1), 0)
            if repeats > 1:
                # Circular: from its second pass on, microbatch t mod M comes back from the last stage, which
                # finished its previous pass M - S + 1 iterations ago and left it in `looped`.
                back = jax.lax.dynamic_index_in_dim(looped, t % m, 0)
                chunk = jnp.where(t < m, chunk, back)
            state = constrain(compute(jnp.where(first, chunk, jnp.roll(state, 1, axis=0)), t),
                              (LAYERS, BATCH, *free))
            if repeats > 1:
                done = t - (stages - 1)  # the microbatch pass the last stage just finished
                kept = jnp.where(done >= 0, state[stages - 1], jax.lax.dynamic_index_in_dim(looped, done % m, 0,
                                                                                            keepdims=False))
                looped = jax.lax.dynamic_update_index_in_dim(looped, kept, done % m, 0)
            return (state, looped), state

        state = constrain(jnp.zeros((stages, size, *rest), x.dtype), (LAYERS, BATCH, *free))
        looped = jnp.zeros((m if repeats > 1 else 0, size, *rest), x.dtype)
        # Every iteration's buffer, each stage's part where it was computed: gathering the last stage's outputs
        # once after the loop moves them in one collective instead of one per iteration.
        _, states = jax.lax.scan(iteration, (state, looped), jnp.arange(repeats * m + stages - 1))
        # The last stage finishes microbatch i's last pass at iteration (R-1)*M + i + S - 1; back to the batch's
        # own row order.
        start = (repeats - 1) * m + stages - 1
        return states[start:, stages - 1].swapaxes(0, 1).reshape(batch, *rest)

    return run_pipeline


@contextlib.contextmanager
def pipelined(layout: Layout, parallel: ParallelConfig) -> Iterator[None]:
    """While tracing a step: run the model's stacked layers as a pipeline where the layout has stages (1F1B's
    forward as GPipe's: its train step writes the gradients itself)."""
    if not uses_pipeline(layout):
        yield
        return
    runner = pipeline_runner(layout.shape.stage, microbatch_count(parallel.microbatches, layout), layout.constrain,
                             schedule_repeats(parallel))
    with stack_runner(runner):
        yield
