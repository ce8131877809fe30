"""The mixture of experts (lm-moe) and expert parallelism: routing on tiny arrays against a hand count (which
token goes to which expert's slot, which drop at a given capacity, the load-balancing loss), routing and the LM
causal where capacity binds (later tokens move no earlier token's slot or logits), the experts' output
against a token-by-token loop, the FLOPs of the active experts, the refusals, the all-to-alls of an ep step
counted in its HLO, and every ep strategy trained against one device (loss and gradient norm at every step, plain
SGD), with no drops and with drops (counted the same as on one device).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from shardbench import config as config_lib
from shardbench.data.pipeline import make_batches
from shardbench.errors import ConfigError
from shardbench.measure.comms import count_collectives
from shardbench.models import build_model
from shardbench.models.lm import flops_per_example
from shardbench.models.moe import MoEOutputs, capacity, experts_mlp, route
from shardbench.parsing import override
from shardbench.preflight import check_run, check_runnable
from shardbench.presets import get_preset
from shardbench.tasks import Rows
from shardbench.train.loop import run
from conftest import lowered_train_step

# Four tokens, two experts: each row's probabilities, chosen so that the first choices are e0, e0, e1, e0.
PROBS = np.array([[0.8, 0.2], [0.6, 0.4], [0.3, 0.7], [0.9, 0.1]], np.float32)
LOGITS = jnp.asarray(np.log(PROBS))[None]  # one group; softmax(log p) = p


def test_capacity_is_the_factor_times_the_tokens_share() -> None:
    assert capacity(4, 2, 1, 0.5) == 1  # ceil(0.5 x 4 x 1 / 2)
    assert capacity(4, 2, 2, 0.5) == 2
    assert capacity(64, 8, 2, 1.25) == 20  # lm-moe: ceil(1.25 x 64 x 2 / 8)
    assert capacity(3, 8, 1, 1.0) == 1  # never 0 slots
    assert capacity(100, 11, 1, 1.1) == 10  # ceil(110 / 11), though 1.1 x 100 / 11 is 10.000000000000002 in floats


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


def test_top2_routing_fills_each_tokens_choices_before_later_tokens() -> None:
    """Two slots per expert, filled in (token, choice) order: t0's e0 (slot 0) and e1 (slot 0), t1's e0 (slot 1)
    and e1 (slot 1); then t2's first choice e1 and second e0, and t3's e0 and e1, all over capacity. 4 of 8
    dropped. (GShard's (choice, token) order gave e1's two slots to t2's first choice and t0's second, dropping
    t1's second: a later token took an earlier token's slot.)"""
    r = route(LOGITS, top_k=2, slots=2)
    want = np.zeros((1, 4, 2, 2), np.float32)
    want[0, 0, 0, 0], want[0, 0, 1, 0], want[0, 1, 0, 1], want[0, 1, 1, 1] = 0.8, 0.2, 0.6, 0.4
    np.testing.assert_allclose(r.combine, want, rtol=1e-6)
    np.testing.assert_array_equal(r.dispatch, want > 0)
    assert float(r.dropped[0]) == 4
    # Every assignment counts for f before capacity: e0 and e1 are chosen 4 times each of 8, so 2 x (0.5 x 0.65 +
    # 0.5 x 0.35) = 1.
    np.testing.assert_allclose(r.aux, [1.0], rtol=1e-6)
    # Three slots: t2 takes e1's slot 2 (its first choice) and e0's slot 2 (its second); t3, last, drops both.
    r = route(LOGITS, top_k=2, slots=3)
    want = np.zeros((1, 4, 2, 3), np.float32)
    for (tok, ex, slot), gate in {(0, 0, 0): 0.8, (0, 1, 0): 0.2, (1, 0, 1): 0.6, (1, 1, 1): 0.4, (2, 1, 2): 0.7,
                                  (2, 0, 2): 0.3}.items():
        want[0, tok, ex, slot] = gate
    np.testing.assert_allclose(r.combine, want, rtol=1e-6)
    assert float(r.dropped[0]) == 2


def test_routing_is_causal() -> None:
    """Where capacity binds, a token's slots (and drops) depend on it and the tokens before it only: new router
    logits for the rows after p leave rows 0..p routed as before, in token order and laid out head-tail."""
    from shardbench.parallel.context import head_tail_order

    tokens, experts, k = 16, 8, 2
    slots = capacity(tokens, experts, k, 1.0)
    a, b = jax.random.normal(jax.random.key(1), (2, 8, tokens, experts))
    order = head_tail_order(tokens, 4)
    for p in range(tokens - 1):
        changed = a.at[:, p + 1:].set(b[:, p + 1:])
        want, got = route(a, k, slots), route(changed, k, slots)
        assert float(want.dropped.sum()) > 0 and float(got.dropped.sum()) > 0  # capacity binds
        for name in ("combine", "dispatch"):
            np.testing.assert_array_equal(getattr(got, name)[:, :p + 1], getattr(want, name)[:, :p + 1],
                                          err_msg=f"{name}: rows 0..{p}")
        laid_out = route(changed[:, order], k, slots, order)  # rows at true positions 0..p keep their routing too
        np.testing.assert_array_equal(laid_out.combine[:, np.argsort(order)][:, :p + 1], want.combine[:, :p + 1],
                                      err_msg=f"head-tail: rows 0..{p}")


def test_the_lm_with_experts_is_causal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny LM with experts, 4 slots per expert for its average share of a sequence's 32 assignments (factor
    1, so some drop): new tokens after position p leave the logits, and every block's routing, at positions 0..p as they
    were. (Filled first choices first, a later token's first choice took an earlier token's second choice's slot.)
    The token embeddings are drawn at the scale of the position table: at init (0.02) the positions drown them,
    so every sequence routes alike whatever its tokens, and no change of tokens moves a slot."""
    import shardbench.models.moe as moe

    cfg = override(get_preset("lm-moe"), {**TINY, "model.capacity_factor": 1.0})
    model = build_model(cfg, nnx.Rngs(0))
    model.token_embed.value = jax.random.normal(jax.random.key(2), model.token_embed.value.shape)
    routed: list[np.ndarray] = []  # each block's dispatch [B, T, E, C], in the order the blocks run

    def recording(*args, **kwargs):
        r = route(*args, **kwargs)
        jax.debug.callback(lambda d: routed.append(np.asarray(d)), r.dispatch, ordered=True)
        return r

    monkeypatch.setattr(moe, "route", recording)
    seq, vocab, layers = TINY["model.seq_len"], 512, TINY["model.num_layers"]
    tokens = np.random.default_rng(0).integers(0, vocab, (8, seq))

    def forward(x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], float]:
        routed.clear()
        out = model(jnp.asarray(x))
        assert isinstance(out, MoEOutputs)
        logits, dropped = np.asarray(out.logits), float(out.dropped.sum())
        jax.effects_barrier()
        assert len(routed) == layers, len(routed)
        return logits, list(routed), dropped

    want_logits, want_routing, dropped = forward(tokens)
    assert dropped > 0, "capacity must bind for the test to mean anything"
    for p in (3, 7, 11):
        changed = tokens.copy()
        changed[:, p + 1:] = (tokens[:, p + 1:] + 1 + np.arange(seq - p - 1)) % vocab
        logits, routing, _ = forward(changed)
        assert not np.array_equal(logits[:, p + 1:], want_logits[:, p + 1:])  # the change reaches the model
        for layer, (got, want) in enumerate(zip(routing, want_routing)):
            np.testing.assert_array_equal(got[:, :p + 1], want[:, :p + 1], err_msg=f"block {layer}'s routing, 0..{p}")
        np.testing.assert_array_equal(logits[:, :p + 1], want_logits[:, :p + 1], err_msg=f"logits at 0..{p}")


def test_a_sequence_laid_out_head_tail_routes_as_in_order() -> None:
    """Context parallelism lays a sequence out in head-tail chunks: slots still go to earlier tokens first, so
    every row keeps the slot (and the drop) it has with the sequence in order."""
    from shardbench.parallel.context import head_tail_order

    tokens, experts, k = 16, 8, 2
    order = head_tail_order(tokens, 4)  # 0-1, 14-15, 2-3, 12-13, ...: later tokens ahead of earlier ones
    logits = jax.random.normal(jax.random.key(0), (3, tokens, experts))
    slots = capacity(tokens, experts, k, 0.5)
    want, got = route(logits, k, slots), route(logits[:, order], k, slots, order)
    assert float(want.dropped.sum()) > 0  # capacity binds: which tokens keep their slots matters
    for name in ("combine", "dispatch"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name)[:, order], err_msg=name)
    np.testing.assert_array_equal(got.dropped, want.dropped)
    np.testing.assert_allclose(got.aux, want.aux, rtol=1e-6)


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


TINY = {"model.embed_dim": 32, "model.num_heads": 4, "model.mlp_dim": 16, "model.num_layers": 2,
        "model.seq_len": 16, "model.num_experts": 8, "model.top_k": 2, "train.batch_size": 16,
        "model.capacity_factor": 4.0}  # capacity ceil(4 x 16 x 2 / 8) = 16 = every token of a sequence: no drops


def tiny(tmp: Path, name: str, **overrides: object) -> config_lib.Config:
    base = {"train.steps": 3, "train.progress": False, "train.checkpoint_every": 0, "train.log_every": 1,
            "train.eval": False, "train.out": str(tmp / name), "data.cache_dir": str(tmp / "cache"),
            "train.compile_cache": "off", "data.synthetic_train": 256, "data.synthetic_test": 64,
            "optim.optimizer": "sgd", "optim.momentum": 0.0, "optim.lr": 0.05, "optim.schedule": "constant",
            "optim.warmup_steps": 0, "optim.grad_clip": 0.0, "optim.ema": 0.0}
    return override(get_preset("lm-moe"), {**base, **TINY, **overrides})


@pytest.mark.parametrize(("overrides", "words"), [
    ({"parallel.strategy": "ep", "parallel.mesh": "expert=8", "model.num_experts": 0},
     "has none .*: use --preset lm-moe or --model.num-experts N, or a strategy without ep$"),
    # the vit's blocks take no experts: --model.num-experts, advised to it, was refused next
    ({"parallel.strategy": "ep", "parallel.mesh": "expert=8", "model.num_experts": 0, "model.kind": "vit",
      "data.dataset": "synthetic"},
     "has none .*: only the lm's blocks take experts \\(--model.num-experts\\), not the vit's: use --preset lm-moe, "
     "or a strategy without ep$"),
    ({"model.top_k": 9}, "--model.top-k 9"),
    ({"parallel.strategy": "ep", "parallel.mesh": "expert=8", "model.num_experts": 12},
     "model.num_experts = 12 is not divisible by the expert axis"),
    ({"parallel.strategy": "pp", "parallel.mesh": "stage=2", "parallel.devices": 2}, "pipeline stages"),
    ({"parallel.strategy": "dp", "parallel.mesh": "8", "parallel.spmd": "shard_map"}, "--spmd jit"),
    # pmap's own refusal of ep and zero1 advised another strategy or shard_map, which a mixture refuses in turn
    ({"parallel.strategy": "ep", "parallel.mesh": "expert=8", "parallel.spmd": "pmap"},
     "a mixture of experts runs under --spmd jit only .*: use --spmd jit$"),
    ({"parallel.strategy": "zero1", "parallel.mesh": "8", "parallel.spmd": "pmap"},
     "a mixture of experts runs under --spmd jit only .*: use --spmd jit$"),
    ({"model.kind": "vit"}, "--model.num-experts 8 puts"),
])
def test_refused_in_one_line_before_compiling(tmp_path: Path, overrides: dict[str, object], words: str) -> None:
    cfg = tiny(tmp_path, "refused", **{"parallel.devices": 8, **overrides})
    with pytest.raises(ConfigError, match=words.replace("+", r"\+")) as caught:
        check_runnable(cfg)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_no_all_to_all_where_the_experts_are_whole(tmp_path: Path) -> None:
    """dp keeps every expert on every device: its step has no all-to-all. (Under ep, two all-to-alls per MoE block
    forward and three backward, counted in test_ep_trains_as_one_device's dp+ep run, whose record counts them in
    its compiled step.)"""
    cfg = tiny(tmp_path, "hlo", **{"parallel.strategy": "dp", "parallel.mesh": "8", "parallel.devices": 8})
    report = count_collectives(lowered_train_step(cfg).compile().as_text())
    assert "all-to-all" not in report.by_kind, report.by_kind


def one_device(cfg: config_lib.Config) -> tuple[list[float], list[float], list[float]]:
    """(loss, gradient norm, dropped assignments) per step on one device: the objective (cross-entropy plus the
    coefficient times the mean load-balancing loss) differentiated by `jax.grad`, SGD by hand."""
    checked = check_run(cfg)
    task, b, coef = checked.task, cfg.train.batch_size, cfg.model.aux_loss_coef
    with jax.threefry_partitionable(False):
        graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(cfg.train.seed)), nnx.Param)

    def objective(p: nnx.State, batch: dict[str, jax.Array]) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        outputs = nnx.merge(graphdef, p)(task.inputs(cfg, batch, jax.random.key(0), False, Rows(0, b)))
        assert isinstance(outputs, MoEOutputs)
        terms = task.terms(outputs, batch)
        loss = terms.loss_sum.sum() / terms.count.sum()
        return loss + coef * outputs.aux.mean(), (loss, outputs.dropped.sum())

    grad = jax.jit(jax.value_and_grad(objective, has_aux=True), device=jax.devices()[0])
    losses, norms, drops = [], [], []
    for host in make_batches(checked.dataset.train, global_batch=b, seed=cfg.train.seed, shuffle=True, num_steps=3):
        (_, (loss, dropped)), g = grad(params, {k: jnp.asarray(v) for k, v in host.items()})
        losses.append(float(loss))
        drops.append(float(dropped))
        norms.append(float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(g)))))
        params = jax.tree.map(lambda p, d: p - 0.05 * d, params, g)
    return losses, norms, drops


def logged(out: Path) -> dict[str, list[float]]:
    rows = [json.loads(line) for line in (out / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/loss" in r]
    return {k: [r[f"train/{k}"] for r in rows] for k in ("loss", "grad_norm", "moe_dropped")}


# Every ep strategy against one device with room for every token, and dp+ep with capacity for 2 of 4 per expert
# (capacity factor 0.5: ceil(0.5 x 16 x 2 / 8) = 2 slots for the 4 assignments an expert gets on average).
# dp+ep also accumulates 2 microbatches per update (each sequence is its own group, so the routing is the whole
# batch's, and the load-balancing loss adds up over the microbatches as over the batch).
EP_CASES = [("ep", "expert=8", 4.0, 1), ("dp+ep", "data=2,expert=4", 4.0, 1), ("fsdp+ep", "data=2,expert=4", 4.0, 1),
            ("ep+tp", "expert=4,model=2", 4.0, 1), ("dp+ep", "data=2,expert=4", 0.5, 1),
            ("dp+ep", "data=2,expert=4", 0.5, 2)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    tmp, done = tmp_path_factory.mktemp("reference"), {}

    def get(factor: float) -> tuple[list[float], list[float], list[float]]:
        if factor not in done:
            done[factor] = one_device(tiny(tmp, f"ref{factor}", **{"model.capacity_factor": factor,
                                                                     "parallel.strategy": "single",
                                                                     "parallel.mesh": "none"}))
            losses, norms, _ = done[factor]
            # SGD steps whose gradients are far from zero: a factor on them would move every later loss.
            assert min(norms) > 0.01 and abs(losses[-1] - losses[0]) > 1e-4 * losses[0]
        return done[factor]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "mesh", "factor", "accum"), EP_CASES,
                         ids=[f"{s}-{m}-cf{f}" + (f"-accum{k}" if k > 1 else "") for s, m, f, k in EP_CASES])
def test_ep_trains_as_one_device(tmp_path: Path, reference, strategy: str, mesh: str, factor: float,
                                 accum: int) -> None:
    want_loss, want_norm, want_drops = reference(factor)
    summary = run(tiny(tmp_path, "run", **{"parallel.strategy": strategy, "parallel.mesh": mesh,
                                           "parallel.devices": 8, "model.capacity_factor": factor,
                                           "train.grad_accum": accum}))
    got = logged(tmp_path / "run")
    where = f"lm-moe: {strategy} on {mesh}, capacity factor {factor}, {accum} microbatch(es)"
    np.testing.assert_allclose(got["grad_norm"], want_norm, rtol=1e-5, err_msg=f"{where}: gradient norm differs")
    np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5, err_msg=f"{where}: loss differs")
    assert got["moe_dropped"] == want_drops, where
    assert (sum(want_drops) == 0) == (factor >= 4.0), want_drops  # drops where (and only where) capacity is short
    moe = summary["moe"]
    assert moe["dropped"] == sum(want_drops) and moe["capacity"] == math.ceil(factor * 16 * 2 / 8), moe
    assert moe["assignments_per_step"] == 16 * 16 * 2 * 2  # batch x seq x k x blocks
    # The record counts the dispatch and the return, forward and backward: 2 + 2 per block at least (the gates'
    # gradient adds a fifth at capacity 16, above; at capacity 2 XLA all-gathers the small experts' outputs for it).
    comms = summary["measurements"]["comms"]
    assert comms["all-to-all"]["count"] >= 4 * 2 and comms["all-to-all"]["bytes"] > 0, comms
    if (strategy, factor, accum) == ("dp+ep", 4.0, 1):
        # Exactly: two all-to-alls per MoE block forward (dispatch, return) and three backward: the return's
        # transpose (the outputs' gradient back to the experts), the dispatch's (the tokens' gradient back to their
        # devices), and the experts' outputs brought to the tokens' devices once more for the gates' gradient (the
        # combine weights are differentiated: PARALLELISM.md's 'two more backward' leaves the gates out).
        assert comms["all-to-all"]["count"] == 5 * TINY["model.num_layers"], comms


@pytest.mark.slow
def test_experts_under_context_parallelism_drop_as_one_device(tmp_path: Path, reference) -> None:
    """dp+cp lays each sequence out head-tail over seq=4: with capacity for 2 of 4 assignments per expert, the
    same tokens drop as on one device, and the losses and gradients follow."""
    want_loss, want_norm, want_drops = reference(0.5)
    run(tiny(tmp_path, "run", **{"parallel.strategy": "dp+cp", "parallel.mesh": "data=2,seq=4",
                                 "parallel.devices": 8, "model.capacity_factor": 0.5}))
    got = logged(tmp_path / "run")
    assert got["moe_dropped"] == want_drops
    np.testing.assert_allclose(got["grad_norm"], want_norm, rtol=1e-5, err_msg="gradient norm differs")
    np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5, err_msg="loss differs")


# The tiny model's parameters by hand (vocabulary 512, width 32, 4 heads of 8, 16 positions, 2 blocks, 8 experts of
# width 16): embedding 512x32, positions 16x32, final norm 2x32, head 32x512; per block two LayerNorms 2x(2x32),
# q/k/v 32x3x32 + 3x32, output 32x32 + 32, router 32x8; per block's experts 8x32x16 + 8x16 + 8x16x32 + 8x32.
DENSE_PARAMS = 512 * 32 + 16 * 32 + 2 * 32 + 32 * 512 + 2 * (4 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 8)
EXPERT_PARAMS = 2 * (8 * 32 * 16 + 8 * 16 + 8 * 16 * 32 + 8 * 32)


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "mesh", "per_device"), [
    ("ep", "expert=8", DENSE_PARAMS + EXPERT_PARAMS // 8),  # experts 1 of 8 per device, the rest whole
    ("fsdp+ep", "data=2,expert=4", DENSE_PARAMS // 2 + EXPERT_PARAMS // 8),  # experts over expert, then data
])
def test_plan_holds_the_experts_hand_count(tmp_path: Path, strategy: str, mesh: str, per_device: int) -> None:
    from shardbench.plan.compile import compile_candidate

    assert (DENSE_PARAMS, EXPERT_PARAMS) == (42_560, 17_152)
    cfg = tiny(tmp_path, "plan", **{"parallel.strategy": strategy, "parallel.mesh": mesh, "parallel.devices": 8})
    result = compile_candidate(cfg, link_span=8)
    assert result["state"]["params_bytes"] == 4 * per_device
    assert result["state"]["gradients_bytes"] == 4 * per_device
    assert any(c["kind"] == "all-to-all" for c in result["collectives"]), result["collectives"]


def test_inspect_shows_the_experts_each_device_holds(tmp_path: Path) -> None:
    """data=2,expert=4: device d sits at (data d // 4, expert d % 4) and holds experts 2(d % 4) and 2(d % 4) + 1."""
    from shardbench.inspect import inspect

    text = inspect(tiny(tmp_path, "inspect", **{"parallel.strategy": "dp+ep", "parallel.mesh": "data=2,expert=4",
                                                "parallel.devices": 8}))
    assert "experts: 8 per block, split over expert (blocks/expert1_bias)" in text
    for e in range(4):
        assert f"  experts {2 * e}-{2 * e + 1} on devices {e},{e + 4}" in text, text
    text = inspect(tiny(tmp_path, "inspect", **{"parallel.strategy": "dp", "parallel.mesh": "8",
                                                "parallel.devices": 8}))
    assert "experts 0-7 on devices 0-7" in text


def test_the_moe_sweep_preset_runs_lm_moe_under_dp_fsdp_and_ep(tmp_path: Path) -> None:
    """Each run of the preset passes every check a run makes before compiling."""
    from shardbench.sweep.grid import make_sweep

    sweep = make_sweep("moe")
    layouts = [(r.settings["parallel.strategy"], r.settings["parallel.mesh"]) for r in sweep.runs]
    assert layouts == [("dp", "8"), ("fsdp", "8"), ("ep", "expert=8"), ("dp+ep", "data=2,expert=4"),
                       ("ep+tp", "expert=4,model=2")]
    for r in sweep.runs:
        check_runnable(override(get_preset("lm-moe"), {**r.settings, "data.cache_dir": str(tmp_path)}))
