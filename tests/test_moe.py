"""The mixture of experts (lm-moe) and expert parallelism: routing on tiny arrays against a hand count (which
token goes to which expert's slot, which drop at a given capacity, the load-balancing loss), the experts' output
against a token-by-token loop, the FLOPs of the active experts, the refusals, the all-to-alls of an ep step
counted in its HLO, and every ep strategy trained against one device (loss and gradient norm at every step, plain
SGD), with no drops and with drops (counted the same as on one device).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardbench.models.lm import flops_per_example
from shardbench.models.moe import capacity, experts_mlp, route
from shardbench.parsing import override
from shardbench.presets import get_preset

# Four tokens, two experts: each row's probabilities, chosen so that the first choices are e0, e0, e1, e0.
PROBS = np.array([[0.8, 0.2], [0.6, 0.4], [0.3, 0.7], [0.9, 0.1]], np.float32)
LOGITS = jnp.asarray(np.log(PROBS))[None]  # one group; softmax(log p) = p


def test_capacity_is_the_factor_times_the_tokens_share() -> None:
    assert capacity(4, 2, 1, 0.5) == 1  # ceil(0.5 x 4 x 1 / 2)
    assert capacity(4, 2, 2, 0.5) == 2
    assert capacity(64, 8, 2, 1.25) == 20  # lm-moe: ceil(1.25 x 64 x 2 / 8)
    assert capacity(3, 8, 1, 1.0) == 1  # never 0 slots


def test_top1_routing_by_hand() -> None:
    """One slot per expert: t0 takes e0's, t2 takes e1's; t1 and t3 (also for e0) are dropped."""
    r = route(LOGITS, top_k=1, slots=1)
    want = np.zeros((1, 4, 2, 1), np.float32)
    want[0, 0, 0, 0] = 0.8
    want[0, 2, 1, 0] = 0.7
    np.testing.assert_allclose(r.combine, want, rtol=1e-6)
    np.testing.assert_array_equal(r.dispatch, want > 0)
    assert float(r.dropped[0]) == 2
    # f = (3/4, 1/4) of the first choices, P = mean probabilities (0.65, 0.35): 2 x (0.4875 + 0.0875)
    np.testing.assert_allclose(r.aux, [1.15], rtol=1e-6)
    # With room for everyone (3 slots), nothing drops and t3 takes e0's third slot, after t0 and t1.
    r = route(LOGITS, top_k=1, slots=3)
    assert float(r.dropped[0]) == 0
    assert [float(r.combine[0, t, 0, c]) for t, c in ((0, 0), (1, 1), (3, 2))] == pytest.approx([0.8, 0.6, 0.9])


def test_top2_routing_fills_first_choices_before_second_ones() -> None:
    """Two slots per expert. First choices in token order: e0 <- t0 (slot 0), t1 (slot 1), t3 (dropped); e1 <- t2
    (slot 0). Then second choices: e1 <- t0 (slot 1), t1 and t3 dropped; e0 <- t2 dropped. 4 of 8 dropped."""
    r = route(LOGITS, top_k=2, slots=2)
    want = np.zeros((1, 4, 2, 2), np.float32)
    want[0, 0, 0, 0], want[0, 1, 0, 1], want[0, 2, 1, 0], want[0, 0, 1, 1] = 0.8, 0.6, 0.7, 0.2
    np.testing.assert_allclose(r.combine, want, rtol=1e-6)
    assert float(r.dropped[0]) == 4
    # Every assignment counts for f before capacity: e0 and e1 are chosen 4 times each of 8, so 2 x (0.5 x 0.65 +
    # 0.5 x 0.35) = 1.
    np.testing.assert_allclose(r.aux, [1.0], rtol=1e-6)


def test_experts_output_is_each_tokens_gated_sum_of_its_experts() -> None:
    """With room for every token, each token's output is sum over its k experts of gate x expert(h), by a loop."""
    g, t, m, h, e, k = 2, 5, 4, 6, 3, 2
    keys = jax.random.split(jax.random.key(0), 6)
    p = {"router_kernel": jax.random.normal(keys[0], (m, e)), "expert1_kernel": jax.random.normal(keys[1], (e, m, h)),
         "expert1_bias": jax.random.normal(keys[2], (e, h)), "expert2_kernel": jax.random.normal(keys[3], (e, h, m)),
         "expert2_bias": jax.random.normal(keys[4], (e, m))}
    x = jax.random.normal(keys[5], (g, t, m))
    out, aux, dropped = experts_mlp(x, p, top_k=k, capacity_factor=e / k, precision=jax.lax.Precision.HIGHEST)
    assert np.asarray(dropped).tolist() == [0, 0]
    probs = np.asarray(jax.nn.softmax(jnp.einsum("gtm,me->gte", x, p["router_kernel"],
                                                 precision=jax.lax.Precision.HIGHEST), -1))
    want = np.zeros((g, t, m), np.float32)
    q = {name: np.asarray(v, np.float64) for name, v in p.items()}
    for a in range(g):
        for b in range(t):
            for ex in np.argsort(-probs[a, b])[:k]:
                hidden = np.asarray(jax.nn.gelu(x[a, b] @ q["expert1_kernel"][ex] + q["expert1_bias"][ex]))
                want[a, b] += probs[a, b, ex] * (hidden @ q["expert2_kernel"][ex] + q["expert2_bias"][ex])
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    assert aux.shape == (g,)


def test_flops_count_the_active_experts() -> None:
    """lm-moe by hand: T=64, E=256, M=512, 4 blocks, 8 experts, top-2, V=512."""
    cfg = get_preset("lm-moe").model
    t, e, m, layers, x, k, v = 64, 256, 512, 4, 8, 2, 512
    attention = 8 * t * e * e + 4 * t * t * e
    experts = 4 * t * k * e * m + 2 * t * e * x  # the k active experts' two matmuls, and the router
    forward = layers * (attention + experts) + 2 * t * e * v
    assert flops_per_example(cfg) == {"forward": forward, "train": 3 * forward}
    dense = flops_per_example(override(get_preset("lm-moe"), {"model.num_experts": 0}).model)["forward"]
    assert forward - dense == layers * (4 * t * e * m + 2 * t * e * x)  # top-2 does two experts' work, plus routing
