"""Gradient accumulation's arithmetic on its own (`shardbench.train.accum`): microbatches whose target counts
differ still give the whole batch's mean loss and gradients, and the split into microbatches keeps every
device's rows on it. The training runs under every layout are in test_equivalence.py."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shardbench.tasks import Terms
from shardbench.train.accum import accumulate, split

ROWS, FEATURES, OUTPUTS, K = 16, 5, 3, 4


def forward(p: dict[str, jax.Array], state: Any, x: jax.Array, b: dict[str, jax.Array],
            key: jax.Array | None) -> tuple[Terms, Any]:
    """Squared error on the outputs each row marks valid: rows have 0 to 3 targets, like padded tokens."""
    err = jnp.square(x @ p["w"] + p["b"] - b["y"]) * b["valid"]
    right = (jnp.abs(x @ p["w"] - b["y"]) < 1).astype(jnp.float32).sum(-1)
    return Terms(err.sum(-1), b["valid"].sum(-1), right), state


def data() -> tuple[dict[str, jax.Array], jax.Array, dict[str, jax.Array]]:
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(FEATURES, OUTPUTS)), jnp.float32), "b": jnp.zeros(OUTPUTS)}
    x = jnp.asarray(rng.normal(size=(ROWS, FEATURES)), jnp.float32)
    # Microbatch j holds rows j, j+4, ...: give them 12, 8, 4 and 1 targets, so their means weigh differently.
    counts = np.array([3, 2, 1, 0] * 4)
    counts[3] = 1
    valid = (np.arange(OUTPUTS)[None, :] < counts[:, None]).astype(np.float32)
    batch = {"y": jnp.asarray(rng.normal(size=(ROWS, OUTPUTS)), jnp.float32), "valid": jnp.asarray(valid)}
    return params, x, batch


def test_microbatches_with_different_target_counts_give_the_whole_batchs_mean_and_gradients() -> None:
    params, x, batch = data()

    def whole(p: dict[str, jax.Array]) -> jax.Array:
        t, _ = forward(p, {}, x, batch, None)
        return t.loss_sum.sum() / t.count.sum()

    want_loss, want_grads = jax.value_and_grad(whole)(params)
    got = jax.jit(lambda p: accumulate(forward, p, {}, x, batch, K, None))(params)
    np.testing.assert_allclose(got.loss, want_loss, rtol=1e-6)
    for name in params:
        np.testing.assert_allclose(got.grads[name], want_grads[name], rtol=1e-5, atol=1e-7, err_msg=name)
    assert float(got.count) == float(batch["valid"].sum()) == 25
    t, _ = forward(params, {}, x, batch, None)
    assert float(got.correct) == float(t.correct.sum())

    # The data can tell: the plain mean of the microbatches' means is 2% off, far beyond the tolerance above.
    parts = jax.tree.map(lambda a: split(a, K), batch)
    means = [whole_of(params, split(x, K)[j], {name: v[j] for name, v in parts.items()}) for j in range(K)]
    assert abs(np.mean(means) - float(want_loss)) > 0.01 * float(want_loss)


def whole_of(p: dict[str, jax.Array], x: jax.Array, b: dict[str, jax.Array]) -> float:
    t, _ = forward(p, {}, x, b, None)
    return float(t.loss_sum.sum() / t.count.sum())


def test_microbatch_j_holds_rows_j_j_plus_k_and_so_on() -> None:
    """Strided: a device holding a contiguous block of a multiple of K rows holds its share of every one."""
    rows = split(jnp.arange(ROWS), K)
    assert rows.shape == (K, ROWS // K)
    for j in range(K):
        assert rows[j].tolist() == list(range(j, ROWS, K))
