"""`shardbench plan`: the compiled figures against hand counts, the time model's arithmetic, the ranking and
recommendation on constructed cases, the TPU path, bad input, and --validate on a real CPU sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import QUICK_COMPILE_FLAGS
from shardbench import config as config_lib
from shardbench.parsing import override
from shardbench.plan.calibration import Coefficients, fit
from shardbench.plan.candidates import Candidate
from shardbench.plan.compile import compile_candidate
from shardbench.plan.predict import Hardware, Prediction, predict, sent_fraction
from shardbench.plan.recommend import Row, amounts, rank, recommendation
from shardbench.plan.steptime import StepFeatures, step_time
from shardbench.plan.tpu import libtpu_installed
from shardbench.plan.validate import kendall_tau
from shardbench.presets import get_preset

SMALL_MLP = {"model.num_layers": 3, "model.mlp_dim": 64, "model.input_dim": 16, "model.num_classes": 8,
             "train.batch_size": 64}
# Parameters of that MLP: in (16x64 + 64), two hidden layers (2x64x64 + 2x64), out (64x8 + 8), float32.
MLP_PARAM_BYTES = (16 * 64 + 64 + 2 * 64 * 64 + 2 * 64 + 64 * 8 + 8) * 4


def mlp_config(**overrides: Any) -> config_lib.Config:
    return override(get_preset("mlp-small"), {**SMALL_MLP, "parallel.devices": 8,
                                                                     **overrides})


def test_sharded_state_bytes_match_hand_counts() -> None:
    """dp keeps every parameter whole; fsdp on 8 splits every one 8 ways (the out bias's 8 values: 1 each);
    Adam's two moments are laid out like the parameters; gradients like the parameters."""
    dp = compile_candidate(mlp_config(**{"parallel.strategy": "dp", "parallel.mesh": "8"}), link_span=8)
    fsdp = compile_candidate(mlp_config(**{"parallel.strategy": "fsdp", "parallel.mesh": "8"}), link_span=8)
    assert dp["state"]["params_bytes"] == MLP_PARAM_BYTES == 39_712
    assert fsdp["state"]["params_bytes"] == MLP_PARAM_BYTES // 8
    for r in (dp, fsdp):
        assert r["state"]["gradients_bytes"] == r["state"]["params_bytes"]
    counters = dp["state"]["optimizer_bytes"] - 2 * dp["state"]["params_bytes"]
    assert 0 < counters < 64  # Adam's step counters, replicated
    assert fsdp["state"]["optimizer_bytes"] == 2 * fsdp["state"]["params_bytes"] + counters
    # dp all-reduces every gradient once per step: the payload is the whole gradient (+ the loss terms).
    reduces = [c for c in dp["collectives"] if c["kind"] == "all-reduce"]
    assert sum(c["bytes"] for c in reduces) >= MLP_PARAM_BYTES
    assert all(c["group"] == 8 and c["link"] == "intra" for c in dp["collectives"])


def test_a_model_of_your_own_is_planned_with_the_runs_one_device_flop_count(tmp_path: Path) -> None:
    """examples/mlp_dropout.py has no flops_per_example: dp and tp candidates carry the same one-device count (the
    run's MFU divides it), where the compiled programs' counts x 8 differ (tp repeats the unsplit work on every
    device), and the predicted MFU divides it too."""
    examples = Path(__file__).resolve().parents[1] / "examples"
    own = {"model.factory": f"{examples / 'mlp_dropout.py'}:build", "model.task": "classify",
           "data.dataset": "synthetic", "train.batch_size": 64}
    from shardbench.plan import compile as plan_compile

    def compiled(strategy: str, mesh: str) -> dict[str, Any]:
        plan_compile._TRACED.clear()  # each layout counts afresh here (a plan counts once per model)
        return compile_candidate(override(get_preset("vit-tiny"), {**own, "parallel.devices": 8,
                                                                   "parallel.strategy": strategy,
                                                                   "parallel.mesh": mesh}), 8)

    dp, tp = compiled("dp", "8"), compiled("tp", "model=8")
    assert len(plan_compile._TRACED) == 1  # one model: one count, whatever its layouts
    assert dp["flops"]["analytic_per_step"] is None and dp["flops"]["traced_per_step"] is not None
    assert dp["flops"]["traced_per_step"] == tp["flops"]["traced_per_step"]
    assert tp["flops"]["xla_per_device"] * 8 > 1.5 * dp["flops"]["xla_per_device"] * 8
    for r in (dp, tp):
        made = predict(r, GPU, UNIT, batch=64, remat="none", dtype="float32", activation_scale=1.0,
                       activation_source="compiled")
        assert made.flops_per_step == r["flops"]["traced_per_step"]


def test_collectives_are_placed_on_the_link_they_cross() -> None:
    """fsdp+tp on a 2x4 mesh with 4 devices to a node: the model axis (4 neighbours) stays inside a node,
    the data axis (devices i and i + 4) crosses nodes."""
    r = compile_candidate(mlp_config(**{"parallel.strategy": "fsdp+tp", "parallel.mesh": "2x4"}), link_span=4)
    groups = {(c["group"], c["link"]) for c in r["collectives"]}
    assert groups, "fsdp+tp moves data"
    assert all(link == ("inter" if group == 2 else "intra") for group, link in groups if group in (2, 4))
    assert (2, "inter") in groups
    one_node = compile_candidate(mlp_config(**{"parallel.strategy": "fsdp+tp", "parallel.mesh": "2x4"}),
                                 link_span=8)
    assert {c["link"] for c in one_node["collectives"]} == {"intra"}


GPU = Hardware(name="test", platform="gpu", peak_flops=1e12, peak_source="test", memory_bytes=1e9,
               memory_source="test", bandwidth={"intra": 1e9, "inter": 1e8}, bandwidth_source="test",
               memory_bandwidth=1e11, memory_bandwidth_source="test")
UNIT = Coefficients(efficiency=0.5, memory_efficiency=0.5, kernel_s=1e-6, collective_s=1e-5, fixed_s=1e-4,
                    overlap=0.0, source="test")


def _predicted(cfg: config_lib.Config) -> tuple[dict[str, Any], Prediction]:
    """(the compiled figures, their prediction on the test hardware above with its own activations)."""
    r = compile_candidate(cfg, link_span=8)
    return r, predict(r, GPU, UNIT, batch=cfg.train.batch_size, remat="none", dtype="float32",
                      activation_scale=1.0, activation_source="test")


@pytest.mark.parametrize(("strategy", "gradients"), [("zero1", 1), ("zero2", 8)])
def test_zero_plan_memory_is_the_hand_count(strategy: str, gradients: int) -> None:
    """ZeRO's count of bytes per device (the ZeRO paper's), N = 8 and P = 9,928 float32 parameters (every array has a dim 8
    divides): parameters 4P, Adam's two moments 8P/N, gradients 4P (ZeRO-1) or 4P/N (ZeRO-2), plus 8 bytes of
    step counters (two int32, replicated): 4P + 4P + 8P/N + 8 and 4P + (4P + 8P)/N + 8 bytes in all."""
    _, p = _predicted(mlp_config(**{"parallel.strategy": strategy, "parallel.mesh": "8"}))
    four_p = MLP_PARAM_BYTES
    assert (p.params_bytes, p.gradients_bytes, p.optimizer_bytes) == (four_p, four_p // gradients,
                                                                        2 * four_p // 8 + 8)
    by_hand = {"zero1": four_p + four_p + 2 * four_p // 8 + 8, "zero2": four_p + (four_p + 2 * four_p) // 8 + 8}
    assert p.params_bytes + p.gradients_bytes + p.optimizer_bytes == by_hand[strategy]


def test_accumulation_plans_one_microbatchs_activations_and_k_reductions() -> None:
    """dp on 8 devices at batch 2048, the update in 4 microbatches against 1: the activations are below the
    whole batch's and above those of one microbatch alone (batch 512 in one pass), which K=4 adds the float32
    gradient accumulator (4P) to; under jit XLA all-reduces the gradients once per microbatch, so the bytes
    reduced are exactly 4 times one pass's; the matmul work of the step is the same. (about 3 s)"""
    dp = {"parallel.strategy": "dp", "parallel.mesh": "8"}
    whole = _predicted(mlp_config(**dp, **{"train.batch_size": 2048}))
    accum = _predicted(mlp_config(**dp, **{"train.batch_size": 2048, "train.grad_accum": 4}))
    micro = _predicted(mlp_config(**dp, **{"train.batch_size": 512}))
    assert accum[0]["grad_accum"] == 4 and accum[0]["unknown_trip_counts"] == 0
    assert micro[1].activations_bytes + MLP_PARAM_BYTES <= accum[1].activations_bytes < whole[1].activations_bytes

    def reduced(r: dict[str, Any]) -> tuple[int, int]:
        return (sum(c["count"] for c in r["collectives"] if c["kind"] == "all-reduce"),
                sum(c["bytes"] for c in r["collectives"] if c["kind"] == "all-reduce"))

    (once, once_bytes), (four, four_bytes) = reduced(whole[0]), reduced(accum[0])
    assert MLP_PARAM_BYTES <= once_bytes <= MLP_PARAM_BYTES + 16  # the gradients and a scalar or few
    assert (four, four_bytes) == (4 * once, 4 * once_bytes)
    assert accum[1].comm_s["intra"] == pytest.approx(4 * whole[1].comm_s["intra"])
    assert accum[1].flops_per_step == whole[1].flops_per_step
    # XLA's own count (what a model without a FLOP formula is timed by) sees the microbatch loop's body once:
    # scaled by K it is one pass's again, but for the update it then counts 4 times (a few FLOPs a parameter).
    assert accum[0]["flops"]["xla_per_device"] == pytest.approx(whole[0]["flops"]["xla_per_device"], rel=0.05)
    assert accum[1].step_s > whole[1].step_s  # K loop iterations' kernels and collectives



def result(*, flops: float, temp: int, collectives: list[dict[str, Any]], devices: int = 8,
           params: int = 1000, traffic: float = 0.0) -> dict[str, Any]:
    """A compile result as `compile_candidate` gives one, with the numbers a test chooses."""
    return {"devices": devices, "platform": "cpu", "device_kind": "cpu", "compile_s": 0.0,
            "state": {"params_bytes": params, "optimizer_bytes": 2 * params, "gradients_bytes": params},
            "batch_bytes": 0, "compiled": {"argument_bytes": 3 * params, "output_bytes": 3 * params,
                                           "alias_bytes": 3 * params, "temp_bytes": temp, "generated_code_bytes": 0},
            "flops": {"analytic_per_step": flops, "xla_per_device": None}, "bytes_accessed": traffic, "kernels": 100,
            "collectives": collectives, "unknown_trip_counts": 0}


def test_step_time_is_the_slower_of_compute_and_memory_plus_overheads_and_communication() -> None:
    """8e9 FLOPs on 8 devices at 50% of 1 TFLOP/s = 2 ms; 1e8 bytes accessed at 50% of 100 GB/s = 2 ms too;
    100 kernels at 1 us and 0.1 ms per step; one all-reduce of 1 MB over 8 devices sends 2 x 7/8 MB at
    1 GB/s = 1.75 ms, plus 10 us."""
    ring = [{"kind": "all-reduce", "link": "intra", "group": 8, "count": 1, "bytes": 1_000_000}]
    r = result(flops=8e9, temp=5000, collectives=ring, traffic=1e8)
    p = predict(r, GPU, UNIT, batch=64, remat="none", dtype="float32", activation_scale=0.5,
                activation_source="test")
    assert p.compute_s == pytest.approx(2e-3)
    assert p.kernels_s == pytest.approx(1e-4 + 1e-4)
    assert p.comm_s["intra"] == pytest.approx(1.75e-3)
    assert p.step_s == pytest.approx(2e-3 + 2e-4 + 1.75e-3 + 1e-5)
    assert p.examples_per_s == pytest.approx(64 / p.step_s)
    slower = predict(result(flops=8e9, temp=5000, collectives=ring, traffic=3e8), GPU, UNIT, batch=64,
                     remat="none", dtype="float32", activation_scale=0.5, activation_source="test")
    assert slower.bound == "memory" and slower.compute_s == pytest.approx(6e-3)  # max, not a sum
    # Memory: state exact, activations (temporaries - gradients) scaled: 1000 + 2000 + 1000 + 4000 x 0.5.
    assert p.activations_bytes == 2000 and p.total_bytes == 6000
    assert sent_fraction("all-gather", 4) == 0.75 and sent_fraction("collective-permute", 2) == 1.0
    assert sent_fraction("all-reduce", 1) == 0.0


@pytest.mark.slow
def test_fit_recovers_known_coefficients() -> None:
    """Step times made by the model itself, with coefficients on the fitting grids, are fitted back exactly:
    a roofline (the CPU's form) and a sum of matmuls and 16-bit-scaled traffic (the GPU's). (about 3 s)"""
    from shardbench.plan.calibration import GRID

    roofline = Coefficients(efficiency=float(GRID[30]), memory_efficiency=float(GRID[20]), kernel_s=3e-6,
                            collective_s=5e-5, fixed_s=2e-3, overlap=0.0, source="truth")
    summed = replace(roofline, compute_memory_overlap=0.0, low_precision_traffic=0.6)
    for truth in (roofline, summed):
        samples = []
        for i, (flops, traffic, kernels, colls) in enumerate([
                (1e9, 1e8, 100, 2), (4e9, 9e8, 300, 10), (2e9, 2e8, 50, 40), (8e9, 1e9, 500, 0), (3e9, 6e8, 200, 20),
                (5e9, 2e8, 80, 7), (6e9, 5e8, 120, 3)]):
            f = StepFeatures(compute_s=flops / 1e12, traffic_s=traffic / 1e11, kernels=float(kernels),
                             collectives=float(colls), link_s={"intra": 1e-4, "inter": 0.0},
                             low_precision=truth is summed and i % 2 == 1)
            samples.append((f, step_time(f, truth).total_s))
        got = fit(samples, UNIT, "fitted")
        for name in ("efficiency", "memory_efficiency", "kernel_s", "collective_s", "fixed_s",
                     "compute_memory_overlap", "low_precision_traffic"):
            assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fit(samples[:3], UNIT, "too few") is UNIT


def test_the_fits_least_squares_match_scipys_nnls_for_every_right_hand_side_at_once() -> None:
    """The fit's non-negative least squares, solved for many right-hand sides in one call, against scipy's NNLS
    solving each alone: rows whose unconstrained solution is negative in some coefficient (so another subset of
    the columns wins) sit beside rows where every coefficient is positive, and a column of zeros stays 0."""
    import numpy as np
    from scipy.optimize import nnls

    from shardbench.plan.calibration import _NNLS

    rng = np.random.default_rng(0)
    a = np.column_stack([rng.uniform(0.1, 1.0, (9, 3)), np.zeros(9)])
    # 40 rows of noise, then 20 made from positive coefficients (solved exactly by all three columns)
    b = np.concatenate([rng.normal(0.0, 1.0, (40, 9)), (a[:, :3] @ rng.uniform(0.1, 1.0, (3, 20))).T])
    got = _NNLS(a)(b)
    for row, x in zip(b, got):
        want, _ = nnls(a, row)
        np.testing.assert_allclose(x, want, atol=1e-9)
    unconstrained = np.linalg.lstsq(a[:, :3], b.T, rcond=None)[0].T
    assert (unconstrained < 0).any(axis=1).sum() >= 10  # the rows that need another subset are there
    assert (got[:, 3] == 0).all() and (got[40:, :3] > 0).all()


def _row(name: str, *, flops: float, temp: int, inter_bytes: int = 0) -> Row:
    colls = [{"kind": "all-gather", "link": "inter", "group": 8, "count": 1, "bytes": inter_bytes}] if inter_bytes \
        else []
    p = predict(result(flops=flops, temp=temp, collectives=colls), GPU, UNIT, batch=64, remat="none",
                dtype="float32", activation_scale=1.0, activation_source="test")
    strategy, mesh = name.split()
    return Row(Candidate(strategy, mesh, "none", "float32"), p)


def test_recommendation_on_a_case_with_a_known_answer() -> None:
    """Three layouts: the fastest needs more memory than there is, the second fits and is the answer, the
    third fits but spends most of its step on the inter-node link."""
    too_big = _row("dp 8x1", flops=1e9, temp=2_000_000_000)
    answer = _row("fsdp 8x1", flops=2e9, temp=100_000_000)
    chatty = _row("dp+tp 4x2", flops=2e9, temp=100_000_000, inter_bytes=10_000_000)
    refused = Row(Candidate("tp", "1x8", "none", "float32"), None, "refused: heads")
    ranked = rank([too_big, chatty, refused, answer])
    assert [r.candidate.strategy for r in ranked] == ["fsdp", "dp+tp", "dp", "tp"]
    line = recommendation(ranked, GPU)
    q = chatty.prediction
    assert line.startswith("use fsdp 8x1 remat=none float32: fits with 90% headroom")
    assert f"{q.step_s / answer.prediction.step_s:.2f}x faster than dp+tp 4x2" in line
    assert q.main_link == "inter" and q.comm_share > 0.5
    assert f", which spends {q.comm_share:.0%} of its step communicating over InfiniBand" in line
    assert "dp 8x1 remat=none float32 would be" in line and "faster but needs 1.9 GiB of 954 MiB" in line
    assert recommendation(rank([too_big]), GPU).startswith("nothing fits: the smallest, dp 8x1")


def _sized(row: Row, total: float, usable: float) -> Row:
    """`row` with its prediction needing `total` bytes per device of `usable`."""
    return Row(row.candidate, replace(row.prediction, total_bytes=total, memory_bytes=usable, fits=total <= usable))


# Memory needs just over what a device holds, each pair once printed alike: 0.04 GB of 0.04 GB (two decimals of a
# GB), 2.0 GB of 2.0 GB (one decimal), 39.1 MiB of 39.1 MiB (`format_bytes`' three figures), and less than a byte
# apart.
ALIKE = [(41_200_000, 37_800_000, "39.3 MiB", "36.0 MiB"), (2.04e9, 1.96e9, "1.9 GiB", "1.8 GiB"),
         (41_000_000, 40_990_000, "41,000,000 B", "40,990,000 B"),
         (41_000_000.4, 41_000_000.0, "41,000,001 B", "41,000,000 B")]


@pytest.mark.parametrize(("need", "usable", "need_shown", "usable_shown"), ALIKE)
def test_a_memory_need_never_prints_as_the_memory_it_does_not_fit(need: float, usable: float, need_shown: str,
                                                                   usable_shown: str) -> None:
    """The recommendation's byte counts go through `units.format_bytes`, and where two different amounts would
    still print alike, in whole bytes rounded apart (the larger up, the smaller down): never "needs X of X"."""
    assert f"{need / 1e9:.2f}" == f"{usable / 1e9:.2f}" or f"{need / 1e9:.1f}" == f"{usable / 1e9:.1f}"  # once alike
    assert amounts(need, usable) == (need_shown, usable_shown)
    assert amounts(usable, need) == (usable_shown, need_shown)  # the smaller rounded down wherever it comes
    fits = _sized(_row("fsdp 8x1", flops=2e9, temp=1000), 1e6, 1e9)
    big = _sized(_row("dp 8x1", flops=1e9, temp=1000), need, usable)
    assert recommendation(rank([big]), GPU).startswith(
        f"nothing fits: the smallest, dp 8x1 remat=none float32, needs {need_shown} per device of {usable_shown} "
        f"usable;")
    assert f"faster but needs {need_shown} of {usable_shown})" in recommendation(rank([fits, big]), GPU)


def test_a_plan_of_one_layout_compares_it_with_no_other() -> None:
    """Candidates that differ in remat alone are one layout: the recommendation says it is the only one planned
    and compares it with nothing (not "1.00x faster than" itself)."""
    none = _row("single none", flops=1e9, temp=100_000_000)
    block = Row(replace(none.candidate, remat="block"), replace(none.prediction, step_s=none.prediction.step_s * 1.2))
    line = recommendation(rank([block, none]), GPU)
    assert line.startswith("use single none remat=none float32: fits with") and "faster than" not in line
    assert line.endswith(", the only layout planned (its 2 candidates differ in remat)")
    refused = Row(Candidate("tp", "1x8", "none", "float32"), None, "refused: heads")
    assert recommendation(rank([block, none, refused]), GPU).endswith(", the only layout that fits")
    # one candidate alone (--candidates dp --remat none) is the only layout planned too, and says so
    assert recommendation(rank([none]), GPU).endswith(", the only layout planned")


def test_a_list_that_names_one_value_twice_plans_it_once() -> None:
    from shardbench.plan.plan_cmd import _choices

    dtypes, remats = _choices(get_preset("mlp-small"), {"precision.dtype": ["float32", "bfloat16", "float32"],
                                                        "model.remat": ["none", "none"]})
    assert (dtypes, remats) == (["float32", "bfloat16"], ["none"])


def test_kendall_tau() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert kendall_tau([5, 5, 5], [1, 2, 3]) is None  # a plan predicting every run alike ranks nothing


def test_kendall_tau_b_counts_tied_pairs_in_its_denominator() -> None:
    """Tau-b is (C - D) / sqrt((n0 - n1)(n0 - n2)): n0 pairs, n1 of them tied in a, n2 tied in b. A tied pair is
    neither concordant nor discordant but stays in the other list's factor; tau-a, (C - D) / n0, and a tau that
    drops every tied pair give other values. Counted by hand, pairs as (i, j) of positions:

    a = [1, 1, 2, 3], b = [1, 2, 3, 4]: (0,1) tied in a only; (0,2) (0,3) (1,2) (1,3) (2,3) concordant. C 5, D 0,
    n0 6, n1 1, n2 0: 5 / sqrt(5 x 6) = 5 / sqrt(30) = 0.913 (tau-a 5/6; dropping the tie, 5/5 = 1).

    a = [1, 1, 2, 3, 3], b = [1, 2, 2, 3, 1], ties on both sides: (0,1) (3,4) tied in a only; (0,4) (1,2) tied in b
    only; (0,2) (0,3) (1,3) (2,3) concordant; (1,4) (2,4) discordant. C 4, D 2, n0 10, n1 2, n2 2:
    2 / sqrt(8 x 8) = 0.25 (dropping the ties, 2 / 6).

    a = [1, 1, 2, 3], b = [1, 1, 2, 2], a pair tied in both: (0,1) tied in both, out of both factors; (2,3) tied
    in b only; (0,2) (0,3) (1,2) (1,3) concordant. C 4, D 0, n0 6, n1 1, n2 2: 4 / sqrt(5 x 4) = 2 / sqrt(5)."""
    assert kendall_tau([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / 30 ** 0.5)
    assert kendall_tau([1, 2, 3, 4], [1, 1, 2, 3]) == pytest.approx(5 / 30 ** 0.5)  # the ties on the other side
    assert kendall_tau([1, 1, 2, 3, 3], [1, 2, 2, 3, 1]) == pytest.approx(0.25)
    assert kendall_tau([1, 1, 2, 3], [1, 1, 2, 2]) == pytest.approx(2 / 5 ** 0.5)


def shardbench(*args: str, env: dict[str, str] | None = None, code: str = "pass") -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process (its own devices), optionally after `code` runs."""
    # Its own devices, and the quick compilation of this process (tests/conftest.py): the programs compile in less
    # time, and a run and the planner's recompiling of it compile alike.
    environ = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": QUICK_COMPILE_FLAGS,
               **(env or {})}
    script = f"import sys; {code}; from shardbench.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=environ,
                          timeout=600)


@pytest.mark.parametrize(("args", "expected"), [
    (["--target", "8xh900"], "unknown chip 'h900'"),
    (["--target", "8xh100", "--candidates", "dp,fsdp", "--batch-size", "12"], "--batch-size 12 is divisible by"),
    (["--target", "tpu-v5e:4x4x4x4"], "a TPU slice is CHIP:AxB or CHIP:AxBxC"),
    (["--target", "8xh100", "--candidates", "dp,zero"], "unknown --candidates 'zero': choose one of single, dp,"),
    (["--target", "8xh100", "--dtype", "float32,float8"],
     "unknown --dtype 'float8': choose one of float32, bfloat16, float16 (a comma list)"),
    (["--target", "8xh100", "--remat", "none,most"], "unknown --remat 'most': choose one of none, block, full"),
    (["--target", "8xh100", "--grad-accum", "2,0"], "--grad-accum must be in [1, 2^31); 1 = off, got 0"),
    (["--target", "8xh100", "--grad-accum", "2,x"], "--grad-accum 'x' is not a whole number"),
    (["--target", "8xh100", "--candidates", ","], "--candidates ',': give one value or a comma list"),
    # the CPU's devices are --devices, not a slice's shape (it was answered with the TPU slice's form)
    (["--target", "cpu:8"], "--target cpu:8: the CPU target is 'cpu', its devices counted by --devices (--target "
                            "cpu --devices 8)"),
    # given empty, it planned every strategy without a word, as if left out
    (["--target", "8xh100", "--candidates", ""], "--candidates '': give one value or a comma list"),
    (["--target", "8xh100", "--microbatches-per-stage", "2,0"], "--microbatches-per-stage must be in [1, 2^31), got 0"),
    (["--target", "8xh100", "--workers", "-1"], "--workers -1: give a number of processes"),
    (["--target", "16xh100"], "--target 16xh100: one h100 node holds 8; write 2x8xh100"),
    (["--target", "2x8xv100"], "--target 2x8xv100: the v100's data sheet gives no bandwidth between nodes; plan one "
                               "node (8xv100)"),
    # A slice has its pods' sides: v5e and v6e 2-D, v4 and v5p 3-D (refused before libtpu is looked for).
    (["--target", "tpu-v5e:2x2x2"], "--target tpu-v5e:2x2x2: a v5e slice is 2-D (AxB, e.g. tpu-v5e:2x4)"),
    (["--target", "tpu-v6e:2x4x1"], "--target tpu-v6e:2x4x1: a v6e slice is 2-D (AxB, e.g. tpu-v6e:2x4)"),
    (["--target", "tpu-v4:2x2"], "--target tpu-v4:2x2: a v4 slice is 3-D (AxBxC, e.g. tpu-v4:2x2x1)"),
    (["--target", "tpu-v5p:4x4"], "--target tpu-v5p:4x4: a v5p slice is 3-D (AxBxC, e.g. tpu-v5p:4x4x1)"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    done = shardbench("plan", "--preset", "mlp-small", "--out", str(tmp_path / "p"), *args)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_no_candidate_runs_is_refused_before_compiling(tmp_path: Path) -> None:
    """7 devices for tp: no model axis of 7 divides the MLP's width, so every candidate is refused."""
    done = shardbench("plan", "--preset", "mlp-small", "--target", "7xh100", "--candidates", "tp",
                      "--out", str(tmp_path / "p"))
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("shardbench: error: no candidate can run on 7 device(s): tp:"), done.stderr
    assert "compiled:" not in done.stderr and not (tmp_path / "p").exists()


def test_tpu_target_without_libtpu_says_how_to_install(tmp_path: Path) -> None:
    done = shardbench("plan", "--preset", "mlp-small", "--target", "tpu-v5e:2x4", "--out", str(tmp_path / "p"),
                      code="sys.modules['libtpu'] = None")  # as if it were not installed
    assert done.returncode == 2
    assert "needs libtpu, which is not installed: pip install 'shardbench[tpu]'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _plan(out: Path, target: str, candidates: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`shardbench plan` of the small MLP without remat candidates: the process and its plan.json."""
    done = shardbench("plan", "--preset", "mlp-small", *_flags(SMALL_MLP), "--target", target,
                      "--candidates", candidates, "--remat", "none", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return done, json.loads((out / "plan.json").read_text(), parse_constant=_not_json)


def _not_json(word: str) -> None:
    """Python's json reads Infinity and NaN; strict JSON readers (and this test) refuse them."""
    raise ValueError(f"plan.json holds {word}, which is not JSON")


@pytest.mark.slow
def test_plan_ranks_every_candidate_and_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    done, plan = _plan(out, "2x4xh100", "dp,fsdp,tp,fsdp+tp")
    names = [c["name"] for c in plan["candidates"]]
    assert len(names) == 1 + 1 + 1 + 2  # dp 8x1, fsdp 8x1, tp 1x8, fsdp+tp 2x4 and 4x2
    predicted = [c for c in plan["candidates"] if c["prediction"]]
    steps = [c["prediction"]["step_s"] for c in predicted if c["prediction"]["fits"]]
    assert steps == sorted(steps)
    assert plan["recommendation"].startswith(f"use {predicted[0]['name']}")
    assert plan["recommendation"] in done.stdout
    # 2 nodes of 4: fsdp's all-gathers over 8 devices cross nodes; the state is 1/8 of dp's.
    by = {c["strategy"] + " " + c["mesh"]: c["prediction"] for c in predicted}
    assert by["fsdp 8x1"]["comm_bytes"].get("inter", 0) > 0
    assert by["fsdp 8x1"]["params_bytes"] == MLP_PARAM_BYTES // 8 and by["dp 8x1"]["params_bytes"] == MLP_PARAM_BYTES
    md = (out / "plan.md").read_text()
    assert plan["recommendation"] in md and "InfiniBand MiB" in md and "Assumptions and sources" in md


@pytest.mark.slow
def test_one_device_plans_each_layout_once(tmp_path: Path) -> None:
    """On 1 device dp, fsdp, tp, zero1 and zero2 are single's layout (every array whole, nothing sent): the plan
    compiles single alone, at each remat, says once which strategies it stands for, and compares it with nothing.
    The --strategy and --devices it was given do nothing, which it says."""
    out = tmp_path / "plan"
    done = shardbench("plan", "--preset", "mlp-small", *_flags(SMALL_MLP), "--target", "1xh100",
                      "--remat", "none,block", "--strategy", "tp", "--devices", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr
    # Layout flags a plan does not read are said (they were silently ignored).
    assert ("shardbench: note: --strategy does nothing here: plan lays out every candidate strategy on every mesh "
            "the target's devices allow (--candidates names the strategies)\n") in done.stdout
    assert "shardbench: note: --devices does nothing with --target 1xh100: it has 1 device(s)\n" in done.stdout
    assert "--mesh does nothing" not in done.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert sorted(c["name"] for c in plan["candidates"]) == ["single none remat=block float32",
                                                             "single none remat=none float32"]
    assert plan["folded"] == {s: "single" for s in ("dp", "fsdp", "tp", "zero1", "zero2")}
    said = "on 1 device dp, fsdp, tp, zero1, zero2 lay out as single: every array whole on the one device"
    assert done.stdout.count(said) == 1 and said in (out / "plan.md").read_text() and said in plan["folded_line"]
    assert "faster than" not in plan["recommendation"] and plan["recommendation"].endswith(
        "the only layout planned (its 2 candidates differ in remat)")
    assert [c["name"] for c in plan["cost"]["candidates"]] == [c["name"] for c in plan["candidates"]]


def _flags(overrides: dict[str, Any]) -> list[str]:
    return [arg for k, v in overrides.items() for arg in ("--" + k.replace("_", "-"), str(v))]


@pytest.mark.slow
@pytest.mark.skipif(not libtpu_installed(), reason="libtpu is not installed (pip install 'shardbench[tpu]'): the "
                                                   "TPU compiler cannot be tried here")
def test_tpu_slice_compiles_with_the_tpu_compiler(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    _, plan = _plan(out, "tpu-v5e:2x4", "dp,fsdp")
    assert plan["devices"] == 8
    by = {c["strategy"]: c["prediction"] for c in plan["candidates"]}
    assert by["fsdp"]["params_bytes"] == MLP_PARAM_BYTES // 8 and by["dp"]["params_bytes"] == MLP_PARAM_BYTES
    assert by["dp"]["sources"]["activations"] == "the TPU compiler's own temporaries"
    assert "ICI MiB" in (out / "plan.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not libtpu_installed(), reason="libtpu is not installed (pip install 'shardbench[tpu]'): the "
                                                   "TPU compiler cannot be tried here")
def test_a_tpu_v3_plan_lays_its_mesh_over_every_core(tmp_path: Path) -> None:
    """A 2x2 slice of v3 chips is 8 JAX devices (two TensorCores a chip), as libtpu's topology lists them: fsdp's
    mesh spans all 8 (1/8 of the parameters each, not 1/4), each device planned with half a chip (61.5 TF float32 at
    default precision, 16 GiB), and an epoch priced as 4 chips at the table's per-chip $2.00 an hour."""
    out = tmp_path / "plan"
    _, plan = _plan(out, "tpu-v3:2x2", "fsdp")
    assert plan["devices"] == 8
    fsdp = plan["candidates"][0]
    assert fsdp["mesh"] == "8x1" and fsdp["prediction"]["params_bytes"] == MLP_PARAM_BYTES // 8
    hw = plan["hardware"]["float32"]
    assert hw["name"] == "8 devices (4 tpu-v3 chips) on a 2x2 slice (ICI throughout)"
    assert hw["peak_flops"] == 123e12 / 2 and hw["memory_bytes"] == 16 * 2**30
    cost = plan["cost"]["candidates"][0]
    assert cost["devices"] == 4 and cost["on_demand_usd"] == pytest.approx(2.00 * 4 * cost["epoch_time_s"] / 3600)


@pytest.mark.slow
@pytest.mark.skipif(not libtpu_installed(), reason="libtpu is not installed (pip install 'shardbench[tpu]'): the "
                                                   "TPU compiler cannot be tried here")
def test_a_plan_whose_links_are_not_timed_says_what_its_ranking_leaves_out(tmp_path: Path) -> None:
    """The v4's data sheet gives no ICI bandwidth, so no transfer is timed: fsdp, sending a quarter more bytes than
    dp over ICI here (its all-gathers and reduce-scatter against dp's all-reduce, each device's ring share), was
    recommended as faster with no word of them. The line names the bytes the ranking left out."""
    done, plan = _plan(tmp_path / "plan", "tpu-v4:2x2x2", "dp,fsdp")
    moved = {c["strategy"]: c["prediction"]["comm_bytes"]["intra"] / 2**20 for c in plan["candidates"]}
    assert moved["fsdp"] > 1.2 * moved["dp"] > 0
    first, second = (c["strategy"] for c in plan["candidates"])
    assert (f"; not counted: ICI transfers (no ICI bandwidth on the chip's data sheet), {moved[first]:.1f} MiB for "
            f"{first} ") in plan["recommendation"]
    assert f"against {moved[second]:.1f} MiB" in plan["recommendation"]
    assert "an assumed 10 us per collective, unmeasured" in done.stdout


@pytest.mark.slow
def test_validate_predicts_a_measured_cpu_sweep(tmp_path: Path) -> None:
    """A real sweep of one MLP at three batch sizes on 8 simulated devices: the planner recompiles each run as it
    ran, so its memory is the run's compiled total exactly, and its step times rank the batches. The report then
    shows the predictions beside the measurements. (The largest batch runs at 20% of the host's peak, at 35% with
    LLVM's default -O: the sweep measures that peak while the suite's other workers load the cores, and a peak
    measured five times too low would put a run over 100% MFU, whose step time is then dropped as not credible:
    with batch 4096 in the sweep, one run of the suite lost a step time so.)"""
    sweep = tmp_path / "sweep"
    wide = {**SMALL_MLP, "model.mlp_dim": 512, "model.num_layers": 4, "model.input_dim": 256}
    done = shardbench("sweep", "--preset", "mlp-small", *_flags(wide),
                      "--batch-size", "16,256,1024", "--devices", "8", "--strategy", "dp", "--steps", "8",
                      "--no-train.eval", "--data.synthetic-train", "8192",
                      "--out", str(sweep), "--no-report", env={"SHARDBENCH_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    done = shardbench("plan", "--validate", str(sweep), env={"SHARDBENCH_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    saved = json.loads((sweep / "plan-validation.json").read_text())
    assert saved["summary"]["runs"] == 3
    # 0 by construction, not a measure of accuracy: on a CPU the run's memory figure is XLA's compiled total
    # (the CPU keeps no runtime peak) and the planner recompiles the same program with the same compiler, so
    # the bytes are the same. It checks that the recompiled step is the run's step (shardings, batch,
    # precision); GPU memory accuracy is benchmarks/plan-h100.md's held-out error.
    assert saved["summary"]["memory_mape"] == 0.0
    # Three batch sizes are three pieces of work: no ranking of layouts across them, so one run per group and no
    # tau; the plan's step times still grow with the batch (the measured ones at -O0, 89, 86 and 96 ms on 2 quiet
    # cores, are within noise of each other below batch 1024).
    groups = saved["summary"]["step_tau_by_group"]
    assert [(g["group"], g["runs"], g["tau"]) for g in groups] == [
        ("batch_size 16", 1, None), ("batch_size 256", 1, None), ("batch_size 1024", 1, None)]
    assert "batch_size 16: 1 run, too few for Kendall's tau to mean anything" in done.stdout
    predicted = [saved["runs"][name]["step_s"] for name in sorted(saved["runs"], key=lambda n: int(n.split("_")[-1]))]
    assert predicted == sorted(predicted), predicted
    # The bytes the plan puts on a link are those the run's record says a device sends (a ring's 2 x 7/8 of the
    # gradients' all-reduce), not the collective's payload (the plan's column once showed 4/7 of them).
    for name, p in saved["runs"].items():
        sent = json.loads((sweep / "runs" / name / "summary.json").read_text())["measurements"][
            "comms_total_sent_bytes"]
        assert sent > 0 and sum(p["comm_bytes"].values()) == pytest.approx(sent, rel=1e-6), (name, p["comm_bytes"])

    from shardbench.report.write import write_report

    markdown = write_report(sweep).markdown.read_text()
    assert "step ms predicted" in markdown and "memory/device MiB predicted" in markdown


def test_a_model_of_your_own_plans_every_remat_given_and_its_configured_one_by_default() -> None:
    """A model of your own is handed the configuration, --model.remat among it, so a --remat list is planned
    value by value, as for a built-in model (it was cut to its first value, the rest dropped without a word);
    without one, its configured value alone (a built-in model's default is none and block)."""
    from shardbench.plan.plan_cmd import remat_choices

    own = override(get_preset("mlp-small"), {"model.factory": "models/mine.py:build", "model.remat": "full"})
    assert remat_choices(own, {"model.remat": ["full", "none"]}) == ["full", "none"]
    assert remat_choices(own, {}) == ["full"]
    assert remat_choices(get_preset("mlp-small"), {}) == ["none", "block"]


def test_the_plans_header_counts_what_it_compiled_and_its_table_sizes_small_models_in_readable_units() -> None:
    """Three candidates, one predicted at 5 MiB per device (1 MiB of state, 3 MiB of activations), one refused
    before compiling, one that failed: the header counts each (it said "3 candidate(s) compiled"), and the memory
    columns read 5.0 MiB, 1.0 MiB and 3.0 MiB (they read "0.01 GB", "0.001 GB" and "0.00 GB")."""
    import dataclasses as dc

    from shardbench.plan.build import Plan
    from shardbench.plan.target import parse_target

    made = Prediction(params_bytes=2**19, optimizer_bytes=2**18, gradients_bytes=2**18, activations_bytes=3 * 2**20,
                      other_bytes=2**20, runtime_bytes=0.0, total_bytes=5 * 2**20, memory_bytes=1e9, fits=True,
                      comm_bytes={}, compute_s=1e-3, bound="compute", kernels_s=0.0, comm_s={}, exposed_comm_s=0.0,
                      step_s=1e-3, breakdown_s={}, flops_per_step=0.0, examples_per_s=0.0, mfu=0.0, overlap=0.0,
                      compiler="cpu compiler")
    rows = [Row(Candidate("dp", "8", "none", "float32"), made),
            Row(Candidate("tp", "1x8", "none", "float32"), problem="refused: heads do not split"),
            Row(Candidate("fsdp", "8", "none", "float32"), problem="failed to compile: XlaRuntimeError")]
    cpu = {"float32": dc.replace(GPU, platform="cpu")}
    plan = Plan(get_preset("mlp-small"), parse_target("cpu", cpu_devices=8), cpu, UNIT, "test", "test", rows, 1.0, "")
    assert plan.header()[1] == ("3 candidate(s): 1 compiled, 1 refused before compiling, 1 failed to compile for 8 "
                                "device(s) in 1 s; nothing was run")
    head, first = plan.table()[:2]
    assert [first[head.index(c)] for c in ("memory/device", "params+opt+grads", "activations")] == [
        "5.0 MiB", "1.0 MiB", "3.0 MiB"]


def test_a_plan_where_no_candidate_compiled_says_so_on_stderr_and_exits_1(tmp_path: Path, monkeypatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Every candidate failed to compile (an XLA error for that device, say): the plan is written, with each
    failure's reason, and the command exits 1 with one line on stderr saying so (it exited 1 with nothing there).
    The compile workers are stood in for by their outcome, two failures: this test is of what plan says of them."""
    import dataclasses as dc

    from shardbench.cli import main
    from shardbench.plan import build
    from shardbench.plan.build import Plan
    from shardbench.plan.target import parse_target

    rows = [Row(Candidate(s, "8", "none", "float32"), problem=f"failed to compile: XlaRuntimeError ({s})")
            for s in ("dp", "fsdp")]
    cpu = {"float32": dc.replace(GPU, platform="cpu")}
    monkeypatch.setattr(build, "make_plan", lambda cfg, target, *a, **k: Plan(
        cfg, parse_target("cpu", cpu_devices=8), cpu, UNIT, "test", "test", rows, 1.0, ""))
    out = tmp_path / "plan"
    assert main(["plan", "--preset", "mlp-small", "--target", "cpu", "--devices", "8", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1] == (
        f"shardbench plan: no candidate compiled for --target cpu: each one's reason is above and in {out / 'plan.md'}")
    assert "XlaRuntimeError (fsdp)" in captured.out and "XlaRuntimeError (dp)" in (out / "plan.md").read_text()


def test_step_milliseconds_are_never_written_in_exponent_form() -> None:
    """A CPU plan's second-long steps read "1.01e+03" in its table and its recommendation; three significant
    figures below a second, whole milliseconds with separators above."""
    from shardbench.plan.recommend import ms

    assert [ms(s) for s in (1.0107, 0.9996, 0.1234, 0.01234, 0.001234, 12.3456)] == [
        "1,011", "1,000", "123", "12.3", "1.23", "12,346"]
