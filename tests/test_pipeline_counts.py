"""Pipeline microbatches whose target counts differ still give the whole batch's mean loss and gradients: 1F1B,
which differentiates each microbatch from its own mean and weighs it back by its count
(`shardbench.train.one_f_one_b`), and GPipe and circular (`shardbench.parallel.pipeline`), alone and under
gradient accumulation (`shardbench.train.accum`), against `jax.value_and_grad` of the whole batch's mean on one
device.

No built-in task gives an example a target count of its own (the LM counts seq_len per window, the others 1, a
model's own `loss` keeps its task's count, and training batches are never padded), so the training runs of
tests/test_pipeline_equivalence.py all split into microbatches of equal counts, where a mean of the microbatches'
means, or one microbatch's count given to another's gradients, is the right answer too. Here a stacked model of
our own scores only the outputs each row marks valid, as padded tokens would be, and its microbatches hold
different numbers of targets.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardbench.models.axes import run_stack, stack_runner
from shardbench.parallel.pipeline import pipeline_runner, stage_order
from shardbench.tasks import Terms
from shardbench.train.accum import accumulate, split
from shardbench.train.one_f_one_b import one_f_one_b_gradients

ROWS, FEATURES, HIDDEN, OUTPUTS, DEPTH = 16, 5, 8, 3, 4


def no_layout(x: jax.Array, axes: Any) -> jax.Array:
    return x


def forward(p: dict[str, Any], state: Any, x: jax.Array, b: dict[str, jax.Array],
            key: jax.Array | None) -> tuple[Terms, Any]:
    """An embedding, a stack of DEPTH tanh layers run through `run_stack` (what a pipeline splits into stages), a
    head; squared error on the outputs each row marks valid (0 to 3 targets a row, like padded tokens)."""

    def run(h: jax.Array, layers: dict[str, jax.Array]) -> jax.Array:
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w["w"] + w["b"]), None), h, layers)[0]

    h = run_stack(run, jnp.tanh(x @ p["embed"]), p["stack"])
    out = h @ p["head"]
    err = jnp.square(out - b["y"]) * b["valid"]
    right = ((jnp.abs(out - b["y"]) < 1) * b["valid"]).sum(-1)
    return Terms(err.sum(-1), b["valid"].sum(-1), right), state


def data(microbatches: int) -> tuple[dict[str, Any], jax.Array, dict[str, jax.Array]]:
    rng = np.random.default_rng(0)
    params = {"embed": rng.normal(size=(FEATURES, HIDDEN)) / np.sqrt(FEATURES),
              "stack": {"w": rng.normal(size=(DEPTH, HIDDEN, HIDDEN)) / np.sqrt(HIDDEN),
                        "b": rng.normal(size=(DEPTH, HIDDEN)) * 0.1},
              "head": rng.normal(size=(HIDDEN, OUTPUTS)) / np.sqrt(HIDDEN)}
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    x = jnp.asarray(rng.normal(size=(ROWS, FEATURES)), jnp.float32)
    # Microbatch j holds rows j, j+M, ... (`split`): row r's count is picked by r % M, so that every microbatch
    # holds a different number of targets, the first the most (4 microbatches: 12, 9, 5 and 2; 2: 17 and 5).
    per_row = {4: [3, 2, 1, 1, 3, 3, 2, 0, 3, 2, 1, 1, 3, 2, 1, 0], 2: [3, 1] * 4 + [2, 0, 1, 1, 0, 0, 2, 0]}
    counts = np.array(per_row[microbatches])
    valid = (np.arange(OUTPUTS)[None, :] < counts[:, None]).astype(np.float32)
    batch = {"y": jnp.asarray(rng.normal(size=(ROWS, OUTPUTS)), jnp.float32), "valid": jnp.asarray(valid)}
    in_each = split(batch["valid"], microbatches).sum((1, 2))
    assert len(set(np.asarray(in_each).tolist())) == microbatches, in_each  # every microbatch its own count
    return params, x, batch


def whole_batch(params: dict[str, Any], x: jax.Array, batch: dict[str, jax.Array]
                ) -> tuple[jax.Array, dict[str, Any]]:
    """The reference: the whole batch's mean over its targets and its gradients, no stages, no microbatches."""

    def mean(p: dict[str, Any]) -> jax.Array:
        t, _ = forward(p, {}, x, batch, None)
        return t.loss_sum.sum() / t.count.sum()

    return jax.value_and_grad(mean)(params)


def held_to_the_whole_batch(got: Any, params: dict[str, Any], x: jax.Array, batch: dict[str, jax.Array],
                            microbatches: int, what: str) -> None:
    want_loss, want_grads = whole_batch(params, x, batch)
    np.testing.assert_allclose(got.loss, want_loss, rtol=1e-6, err_msg=f"{what}: loss")
    flat_got, flat_want = jax.tree_util.tree_flatten_with_path(got.grads)[0], jax.tree.leaves(want_grads)
    for (path, g), w in zip(flat_got, flat_want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7, err_msg=f"{what}: gradient {jax.tree_util.keystr(path)}")
    assert float(got.count) == float(batch["valid"].sum()), what
    t, _ = forward(params, {}, x, batch, None)
    assert float(got.correct) == float(t.correct.sum()), what
    # The data can tell: the microbatches' means weighed alike give gradients well off the whole batch's.
    parts = [jax.tree.map(lambda a, j=j: split(a, microbatches)[j], batch) for j in range(microbatches)]
    means = [whole_batch(params, split(x, microbatches)[j], parts[j])[1] for j in range(microbatches)]
    alike = jax.tree.map(lambda *g: sum(g) / microbatches, *means)
    off = max(float(jnp.abs(a - w).max() / jnp.abs(w).max()) for a, w in
              zip(jax.tree.leaves(alike), jax.tree.leaves(want_grads)))
    assert off > 0.05, off


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (2, 2)])
def test_1f1b_weighs_each_microbatch_by_its_own_target_count(stages: int, microbatches: int) -> None:
    """1F1B's hand-written backward: every layer's gradients (the stack's on each stage, the embedding's
    before it, the head's after) are the whole batch's, with microbatches of 12, 9, 5 and 2 targets (or, 2 of
    them, 17 and 5)."""
    params, x, batch = data(microbatches)
    got = jax.jit(lambda p: one_f_one_b_gradients(forward, p, {}, x, batch, stages, microbatches, no_layout))(params)
    held_to_the_whole_batch(got, params, x, batch, microbatches, f"1f1b, {stages} stages x {microbatches}")


@pytest.mark.parametrize(("repeats", "accum"), [(1, 1), (2, 1), (1, 2)])
def test_gpipe_and_circular_weigh_each_microbatch_by_its_own_target_count(repeats: int, accum: int) -> None:
    """GPipe (and circular, 2 repeats) over 2 stages of 4 microbatches differentiates the whole batch's mean
    through the stack runner, alone and in 2 accumulated parts (`--train.grad-accum 2`), each split again by the
    pipeline; the accumulated parts' counts differ too (17 targets and 11)."""
    params, x, batch = data(4)
    runner = pipeline_runner(2, 4 // accum, no_layout, repeats)

    def staged(p: dict[str, Any], state: Any, x_: jax.Array, b: dict[str, jax.Array],
               key: jax.Array | None) -> tuple[Terms, Any]:
        with stack_runner(runner):
            return forward(p, state, x_, b, key)

    if repeats > 1:  # circular: the stack stored in stage order (here chunk s of stage s, then chunk s + 2)
        order = jnp.asarray(stage_order(DEPTH, 2, repeats))
        stored = {**params, "stack": jax.tree.map(lambda a: a[order], params["stack"])}
    else:
        stored = params
    got = jax.jit(lambda p: accumulate(staged, p, {}, x, batch, accum, None))(stored)
    if repeats > 1:
        back = jnp.argsort(jnp.asarray(stage_order(DEPTH, 2, repeats)))
        got = got._replace(grads={**got.grads, "stack": jax.tree.map(lambda a: a[back], got.grads["stack"])})
    held_to_the_whole_batch(got, params, x, batch, 4, f"{'circular' if repeats > 1 else 'gpipe'}, accum {accum}")
