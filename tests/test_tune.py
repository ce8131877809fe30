"""`shardbench tune`: the space against the strategies' table, dropping what does not fit with its reason, the
budget's choice, regret and Kendall's tau by hand, one real small tune end to end (interrupted and resumed, its
winner trained by `shardbench train`), and the one-line refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import held_by_another_process

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.parallel.strategies import STRATEGIES
from shardbench.plan.candidates import Candidate
from shardbench.plan.predict import Prediction
from shardbench.report.kendall import kendall_tau
from shardbench.tune.select import (OBJECTIVES, START_S, MeasuredFigures, Planned, check_budget_floor, outcome, rank,
                                    regret, select)
from shardbench.tune.space import Dropped, Point, Space, enumerate_space
from shardbench.tune.tune_cmd import nothing_fits

# The small MLP of tests/test_plan.py: 3 layers of width 64, batch 64.
SMALL_MLP = ["--preset", "mlp-small", "--model.num-layers", "3", "--model.mlp-dim", "64", "--model.input-dim", "16",
             "--model.num-classes", "8", "--batch-size", "64", "--devices", "8"]


def prediction(step_s: float, total_bytes: float, memory_bytes: float = 1e9) -> Prediction:
    """A prediction with only what tune reads: the step, the bytes per device and the usable bytes."""
    return Prediction(params_bytes=0, optimizer_bytes=0, gradients_bytes=0, activations_bytes=0.0, other_bytes=0,
                      runtime_bytes=0.0, total_bytes=total_bytes, memory_bytes=memory_bytes,
                      fits=total_bytes <= memory_bytes, comm_bytes={}, compute_s=step_s, bound="compute",
                      kernels_s=0.0, comm_s={}, exposed_comm_s=0.0, step_s=step_s, breakdown_s={},
                      flops_per_step=0.0, examples_per_s=0.0, mfu=0.0, overlap=0.0, compiler="cpu compiler")


def planned(strategy: str, step_s: float | None, total: float = 1e6, batch: int = 64, problem: str = "") -> Planned:
    point = Point(Candidate(strategy, "8", "none", "float32"), batch)
    return Planned(point, None if step_s is None else prediction(step_s, total), problem)


def test_the_space_is_the_strategy_table_on_every_mesh() -> None:
    """Every strategy of the table but single (one device) has candidates on 8 devices; single is dropped with
    its reason; every pipeline candidate has microbatches and a schedule; a batch of 4 drops the layouts with more
    data shards than examples, each with why."""
    points, dropped = enumerate_space(8, Space(remats=("none",), batches=(64,)))
    assert {p.candidate.strategy for p in points} == set(STRATEGIES) - {"single"}
    assert [d.what for d in dropped] == ["single batch=64"] and "no candidate mesh uses 8 devices" in dropped[0].reason
    staged = [p.candidate for p in points if "pp" in p.candidate.strategy.split("+")]
    assert staged and all(c.microbatches and c.schedule for c in staged)
    assert {c.schedule for c in staged} == {"gpipe", "1f1b", "circular"}
    one, folded = enumerate_space(1, Space(strategies=("single", "dp"), remats=("none",), batches=(64,)))
    assert {p.candidate.strategy for p in one} == {"single"}  # dp on one device is single's layout
    assert [d.what for d in folded] == ["dp 1x1 batch=64"]
    small, dropped = enumerate_space(8, Space(strategies=("dp", "dp+tp"), remats=("none",), batches=(4,)))
    assert {p.candidate.mesh for p in small} == {"2x4", "4x2"}  # dp+tp: 2 or 4 data shards of a batch of 4
    assert [d.what for d in dropped] == ["dp batch=4"]  # 8 data shards for 4 examples
    assert "--batch-size 4 is divisible by no candidate's data-parallel size (8)" in dropped[0].reason
    _, by_accum = enumerate_space(8, Space(strategies=("dp+tp",), remats=("none",), batches=(8,), accums=(4,)))
    assert [d.what for d in by_accum] == ["dp+tp 4x2 accum=4 batch=8"]  # 2 examples per shard: 4 do not divide
    assert by_accum[0].reason == "--grad-accum 4 does not divide its 2 examples per data shard"


def test_one_device_measures_each_layout_once() -> None:
    """On 1 device dp, fsdp, tp, zero1, zero2, ep and cp are single's layout (every array whole, nothing sent): the
    space keeps single at each remat, K and batch size (and the one-stage pipelines, whose microbatches make another
    step), so tune never plans or measures one layout twice; each strategy left out is dropped by name, saying which
    layout it is."""
    space = Space(remats=("none", "block"), batches=(32, 64), accums=(1, 2), per_stage=(1,), schedules=("gpipe",))
    points, dropped = enumerate_space(1, space)
    single = sorted((p.candidate.remat, p.candidate.grad_accum, p.batch) for p in points
                    if p.candidate.strategy == "single")
    assert {p.candidate.strategy for p in points} == {"single", "pp"}
    assert single == sorted((r, k, b) for r in ("none", "block") for k in (1, 2) for b in (32, 64))
    layouts = [(p.candidate.remat, p.candidate.grad_accum, p.candidate.microbatches, p.candidate.schedule, p.batch)
               for p in points]
    assert len(layouts) == len(set(layouts))  # no layout twice
    folded = {d.what: d.reason for d in dropped if "lays out as" in d.reason}
    assert set(folded) == {f"{s} 1x1 batch={b}" for s in ("dp", "fsdp", "tp", "zero1", "zero2", "ep", "cp")
                           for b in (32, 64)}
    assert folded["zero2 1x1 batch=64"] == ("on 1 device zero2 lays out as single (every array whole, nothing "
                                            "sent): planned and measured once, as single")


def test_every_microbatch_count_a_layout_cannot_take_is_dropped_with_why() -> None:
    """At batch 16 on 8 devices, dp and fsdp (8 data shards: 2 examples each) take K=1 and not K=4: each K=4 is
    dropped by name with why, not left out silently; pp (8 stages, 16 examples) takes M=8 and not M=32."""
    points, dropped = enumerate_space(8, Space(strategies=("dp", "fsdp"), remats=("none",), batches=(16,),
                                               accums=(1, 4)))
    assert sorted((p.candidate.strategy, p.candidate.grad_accum) for p in points) == [("dp", 1), ("fsdp", 1)]
    assert [(d.what, d.reason) for d in dropped] == [
        ("dp 8x1 accum=4 batch=16", "--grad-accum 4 does not divide its 2 examples per data shard"),
        ("fsdp 8x1 accum=4 batch=16", "--grad-accum 4 does not divide its 2 examples per data shard")]
    piped, dropped = enumerate_space(8, Space(strategies=("pp",), remats=("none",), batches=(16,), per_stage=(1, 4)))
    assert {p.candidate.microbatches for p in piped} == {8}
    assert [(d.what, d.reason) for d in dropped] == [
        ("pp stage=8 M=32 batch=16", "32 pipeline microbatches (4 per stage x 8 stages) do not divide its 16 "
                                     "examples per data shard")]


def test_the_whole_space_is_either_planned_or_dropped_by_name() -> None:
    """Every strategy x mesh x K x pipeline M of the space on 8 devices at batch 16, K in 1, 2, 4: each is a layout
    or has its own drop (the mesh's, where the batch does not split, else its K's, else its M's)."""
    from shardbench.parallel.strategies import batch_shards
    from shardbench.plan.candidates import USES, meshes

    space = Space(remats=("none",), batches=(16,), accums=(1, 2, 4), per_stage=(1, 4))
    points, dropped = enumerate_space(8, space)
    kept = {(p.candidate.strategy, p.candidate.mesh, p.candidate.grad_accum, p.candidate.microbatches)
            for p in points}
    names = {d.what for d in dropped}
    for strategy in set(USES) - {"single"}:
        for shape in meshes(8, USES[strategy]):
            if 16 % batch_shards(STRATEGIES[strategy], shape):
                assert f"{strategy} {shape} batch=16" in names
                continue
            stages = shape.stage if "stage" in USES[strategy] else 0
            for k in space.accums:
                whole = [(f"{strategy} {shape}{f' M={stages * m}' if stages else ''}"
                          f"{f' accum={k}' if k > 1 else ''} batch=16", stages * m)
                         for m in (space.per_stage if stages else (0,))]
                if f"{strategy} {shape} accum={k} batch=16" in names:
                    assert not any((strategy, str(shape), k, m) in kept for _, m in whole)
                    continue
                for name, m in whole:
                    assert ((strategy, str(shape), k, m) in kept) != (name in names), (name, kept)


def test_a_batch_larger_than_the_epoch_is_dropped_before_planning() -> None:
    """100 generated examples, 10% held out: 90 to train on. Batch 128 makes no step (`shardbench train` refuses
    it), so tune drops it with that reason and plans batch 64 alone."""
    from shardbench.cli import build_parser
    from shardbench.tune.tune_cmd import prepare

    args = build_parser().parse_args(["tune", *SMALL_MLP[:-4], "--devices", "8", "--candidates", "dp", "--remat",
                                      "none", "--data.synthetic-train", "100", "--batch-size", "64,128"])
    _, _, space, points, dropped = prepare(args)
    assert space.examples == 90 and {p.batch for p in points} == {64}
    assert [(d.what, d.reason) for d in dropped] == [("batch=128", "--batch-size 128 is larger than the 90 "
                                                                   "training examples")]
    _, kept = enumerate_space(8, dataclasses.replace(space, examples=None))
    assert kept == []  # where the epoch's size is not known, no batch is dropped for it


def test_a_batch_smaller_than_its_repeats_is_dropped_not_divided_by() -> None:
    """--data.repeat-augment 3: a batch of 2 holds 2 // 3 = 0 distinct examples, no step of them; the space drops
    it with that reason (never dividing the epoch by 0 examples a step) and keeps batch 6 (2 distinct, 45 steps
    of the 90): dp on 2 devices, 3 examples a shard."""
    space = Space(strategies=("dp",), remats=("none",), batches=(2, 6), examples=90, repeats=3)
    points, dropped = enumerate_space(2, space)
    assert [p.name for p in points] == ["dp 2x1 remat=none float32 batch=6"]
    assert [(d.what, d.reason) for d in dropped] == [
        ("batch=2", "--batch-size 2 holds no whole example repeated --data.repeat-augment 3 times")]


@pytest.mark.parametrize(("batches", "bad"), [("384,2", 2), ("384,128", 128)])
def test_every_batch_size_of_the_space_is_checked_before_planning(batches: str, bad: int, tmp_path: Path) -> None:
    """vit-cifar-spt repeats each image 3 times in a batch (--data.repeat-augment 3): its batch 384 holds 128
    distinct images, but 2 holds none (2 // 3 = 0) and 128 is no multiple of 3 (42 x 3 + 2); `shardbench train`
    refuses both, so tune refuses either in the list before planning anything, in one line naming it."""
    out = tmp_path / "t"
    done = shardbench("tune", "--preset", "vit-cifar-spt", "--devices", "4", "--batch-size", batches, "--candidates",
                      "dp", "--remat", "none", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardbench: error: "), done.stderr[-2000:]
    assert f"--batch-size {bad} must be a multiple of 3" in lines[0]
    assert not out.exists()


def test_a_refusal_at_a_later_batch_size_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where train's check at a batch size of the list does not name it, tune's line does: the user gave several."""
    from shardbench import tasks
    from shardbench.presets import get_preset
    from shardbench.tune.tune_cmd import validate_batches

    def refuse_128(cfg: object) -> None:
        if cfg.train.batch_size == 128:  # type: ignore[attr-defined]
            raise ConfigError("--model.something 3 needs an even number of examples per device")

    monkeypatch.setattr(tasks, "validate", refuse_128)
    validate_batches(get_preset("mlp-small"), (64, 256))
    with pytest.raises(ConfigError) as err:
        validate_batches(get_preset("mlp-small"), (64, 128, 256))
    assert str(err.value) == "--batch-size 128: --model.something 3 needs an even number of examples per device"


def test_when_nothing_is_left_to_plan_the_refusal_gives_the_reason(tmp_path: Path) -> None:
    """mlp-small generates 16,384 examples and holds 10% (1,638) out: 14,746 to train on. A batch of 32,768 makes
    no step of them, so the one layout asked for is dropped before planning, and the refusal says why, as
    docs/tune.md promises (the commonest reason), not only that it was dropped."""
    done = shardbench("tune", "--preset", "mlp-small", "--devices", "4", "--batch-size", "32768", "--candidates", "dp",
                      "--remat", "none", "--out", str(tmp_path / "t"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("shardbench: error: nothing fits: of 1 layouts, 1 were dropped before planning (the "
                           "commonest reason, 1 of them: --batch-size 32768 is larger than the 14746 training "
                           "examples)"), last
    assert "compiled:" not in done.stderr


@pytest.mark.parametrize("command", ["tune", "plan"])
def test_a_dataset_train_refuses_is_refused_before_anything_is_planned(
        tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--data synthetic (images) for the MLP: tune planned each layout, saw each refused for the dataset, and
    said "nothing fits: of 2 layouts, 2 were refused", writing a tune.json; plan compiled none and said none
    could run. Both now give train's own line, before anything is planned, and write nothing."""
    from shardbench import cli

    out = tmp_path / "out"
    code = cli.main([command, "--preset", "mlp-small", "--devices", "8", "--target", "cpu", "--candidates", "dp,fsdp",
                     "--remat", "none", "--data", "synthetic", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.strip().splitlines() == [
        "shardbench: error: --data synthetic is a dataset for the vit model, not mlp: use one of regression, "
        "arrays:PATH"], captured.err
    assert "planning" not in captured.out + captured.err and not out.exists()


def test_a_host_whose_devices_jax_cannot_list_is_one_line_naming_the_platforms_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Asked for CUDA on a host with none, JAX's last line is a bare AssertionError: the line says which
    platforms it was asked for, so the user knows what to fix. Nothing is planned or written."""
    from shardbench import cli

    monkeypatch.setenv("JAX_PLATFORMS", "cuda")  # the probe's process; this one's JAX started long ago
    out = tmp_path / "out"
    code = cli.main(["tune", "--preset", "vit-tiny", "--target", "1xh100", "--candidates", "dp", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("shardbench: error: tune: JAX could not list this host's devices (") and (
        ", with JAX_PLATFORMS=cuda): fix the installation (or JAX_PLATFORMS)" in err[0]), err
    assert not out.exists()


def test_what_does_not_fit_is_dropped_with_its_reason() -> None:
    fast_but_big = planned("dp", 0.010, total=3e9)  # 3 GB of 1 GB usable
    refused = planned("ep", None, problem="refused: --strategy ep splits a mixture's experts ...")
    ok = [planned("fsdp", 0.030), planned("tp", 0.020)]
    ranked = rank([fast_but_big, refused, *ok], OBJECTIVES["time"])
    assert [p.point.candidate.strategy for p in ranked] == ["tp", "fsdp"]
    assert fast_but_big.dropped == "does not fit: 2.8 GiB per device of 954 MiB usable"
    # Amounts once printed alike (0.04 GB of 0.04 GB) never do: where `format_bytes` rounds them alike, whole bytes.
    just_over = [dataclasses.replace(planned("dp", 0.01), prediction=prediction(0.01, need, usable))
                 for need, usable in ((41.2e6, 37.8e6), (41_000_000.4, 41_000_000.0))]
    assert [p.dropped for p in just_over] == ["does not fit: 39.3 MiB per device of 36.0 MiB usable",
                                              "does not fit: 41,000,001 B per device of 41,000,000 B usable"]
    assert refused.dropped.startswith("refused: --strategy ep") and ok[0].dropped == ""
    by_memory = rank([planned("dp", 0.01, total=5e5), planned("fsdp", 0.03, total=2e5)], OBJECTIVES["memory"])
    assert [p.point.candidate.strategy for p in by_memory] == ["fsdp", "dp"]
    split = [Dropped(f"dp 8x1 batch={b}", f"--batch-size {b} does not split over its 8 data shards") for b in (4, 12)]
    line = str(nothing_fits([fast_but_big, refused, refused], split, Path("out")))
    assert line.startswith("nothing fits: of 5 layouts, 2 were refused, 2 were dropped before planning, 1 do not fit")
    assert "(the commonest reason, 2 of them: refused: --strategy ep" in line
    assert "out/tune.json" in line and "\n" not in line
    # Three layouts dropped before planning for one reason outnumber the two refused: theirs is the commonest.
    big = [Dropped(f"{s} batch=256", "--batch-size 256 is larger than the 90 training examples")
           for s in ("dp", "fsdp", "tp")]
    line = str(nothing_fits([refused, refused], big, Path("out")))
    assert line.startswith("nothing fits: of 5 layouts, 3 were dropped before planning, 2 were refused (the "
                           "commonest reason, 3 of them: --batch-size 256 is larger than the 90 training examples)")


def test_the_budget_takes_the_plans_top_k_that_fit_together() -> None:
    """Estimated walls 40, 30, 50, 10 s in rank order: 100 s holds the first two (70 s; the third would make 120,
    and the choice stops there), k=1 the first alone, 35 s none: one line naming the top choice's estimate."""
    ranked = [planned(s, 0.01) for s in ("dp", "fsdp", "tp", "zero1")]
    walls = dict(zip((p.point.name for p in ranked), (40.0, 30.0, 50.0, 10.0)))
    estimate = lambda p: walls[p.point.name]  # noqa: E731
    assert [p.point.candidate.strategy for p in select(ranked, 4, 100.0, estimate)] == ["dp", "fsdp"]
    assert [p.point.candidate.strategy for p in select(ranked, 1, 100.0, estimate)] == ["dp"]
    assert len(select(ranked, 4, 130.0, estimate)) == 4
    with pytest.raises(ConfigError, match=r"too small for one run: the plan's top choice, dp 8 remat=none float32 "
                                          r"batch=64, is estimated at 40 s"):
        select(ranked, 4, 35.0, estimate)
    with pytest.raises(ConfigError, match="too small for one run"):
        check_budget_floor(START_S / 60 / 2)
    check_budget_floor(1.0)


def test_regret_and_tau_by_hand() -> None:
    """Plan order dp, fsdp, tp (predicted 10, 20, 30 ms); measured 12, 10, 15 ms. Winner fsdp; the plan's top (dp)
    regrets (12 - 10) / 10 = 20%. Pairs (dp,fsdp) discordant, (dp,tp) and (fsdp,tp) concordant: tau = (2-1)/3."""
    chosen = [planned("dp", 0.010), planned("fsdp", 0.020), planned("tp", 0.030)]
    measured = {p.point.name: MeasuredFigures(s, 1e6) for p, s in zip(chosen, (0.012, 0.010, 0.015))}
    v = outcome(chosen, measured, OBJECTIVES["time"])
    assert v is not None and v.winner is chosen[1] and v.plan_top is chosen[0]
    assert v.winner_value == pytest.approx(0.010 / 64)
    assert v.regret == pytest.approx(0.2) == regret(12, 10)
    assert v.taus() == {64: pytest.approx(1 / 3)} and kendall_tau([10, 20, 30], [12, 10, 15]) == pytest.approx(1 / 3)
    assert regret(10, 10) == 0.0
    # The plan's top choice failed: the winner is still named, the regret is unknown.
    failed = outcome(chosen, {k: m for k, m in measured.items() if not k.startswith("dp")}, OBJECTIVES["time"])
    assert failed is not None and failed.winner is chosen[1] and failed.regret is None and failed.measured == 2


def test_tau_is_taken_within_each_batch_size() -> None:
    """Runs of one batch are one piece of work: at batch 16 the plan orders 10, 20, 30 ms against 12, 10, 15
    measured (tau 1/3, as above); at batch 64 it orders 40, 50, 60 against 60, 50, 40 (tau -1). Pooled, the
    larger batch's longer steps alone would make the plan look right (tau 7/15); two runs say nothing."""
    small = [planned(s, t, batch=16) for s, t in (("dp", 0.010), ("fsdp", 0.020), ("tp", 0.030))]
    large = [planned(s, t, batch=64) for s, t in (("dp", 0.040), ("fsdp", 0.050), ("tp", 0.060))]
    pair = [planned("dp", 0.010, batch=8), planned("tp", 0.020, batch=8)]
    chosen = small + large + pair
    steps = (0.012, 0.010, 0.015, 0.060, 0.050, 0.040, 0.001, 0.002)
    measured = {p.point.name: MeasuredFigures(s, 1e6) for p, s in zip(chosen, steps)}
    v = outcome(chosen, measured, OBJECTIVES["time"])
    assert v is not None
    assert v.taus() == {8: None, 16: pytest.approx(1 / 3), 64: pytest.approx(-1.0)}
    assert kendall_tau([10, 20, 30, 40, 50, 60], [12, 10, 15, 60, 50, 40]) == pytest.approx(7 / 15)
    assert v.tau_texts()[8] == "2 runs, too few for Kendall's tau to mean anything"
    assert v.tau_texts()[64] == "Kendall's tau -1.00 over 3 runs"


def test_a_target_of_another_platform_is_not_measured_here() -> None:
    """The local executor measures on this host: an H100 target from a CPU host is one line, before compiling."""
    from shardbench.cli import build_parser
    from shardbench.tune.tune_cmd import prepare

    args = build_parser().parse_args(["tune", "--preset", "mlp-small", "--target", "8xh100"])
    with pytest.raises(ConfigError, match="--target 8xh100 is gpu hardware and this host runs on cpu: measure on it "
                                          "with --executor slurm"):
        prepare(args)


def test_the_local_executor_needs_the_targets_devices_on_this_host() -> None:
    """An accelerator target is measured here with all its devices: 8 H100s on a host of 4 is one line naming
    what would run, so is another chip or a target over nodes; a CPU target's devices are simulated by each run
    (any count), so nothing is asked of this host. This host's devices are listed by JAX in a process of its own."""
    from shardbench.plan.target import parse_target
    from shardbench.tune.tune_cmd import HostDevices, check_host, host_devices

    four = HostDevices("gpu", 4, "NVIDIA H100 80GB HBM3")
    with pytest.raises(ConfigError, match=r"^--target 8xh100 has 8 devices, and this host has 4 \(NVIDIA H100 80GB "
                                          r"HBM3\): give --target 4xh100, or measure on the target with --executor "
                                          r"slurm$"):
        check_host(parse_target("8xh100"), four)
    with pytest.raises(ConfigError, match=r"^--target 2x2xh100 has 4 devices, 2 nodes of 2, and this host has 2 "):
        check_host(parse_target("2x2xh100"), HostDevices("gpu", 2, "NVIDIA H100 80GB HBM3"))
    with pytest.raises(ConfigError, match=r"^--target 4xa100 is a100 and this host's devices are h100 \(NVIDIA H100 "
                                          r"80GB HBM3\): give --target 4xh100"):
        check_host(parse_target("4xa100"), four)
    check_host(parse_target("4xh100"), four)
    check_host(parse_target("2xh100"), four)  # a run takes the first 2
    check_host(parse_target("4xh100"), HostDevices("gpu", 4, "an unknown board"))  # the count alone is checked
    check_host(parse_target("cpu", cpu_devices=64), HostDevices("cpu", 1, "cpu"))
    here = host_devices()
    assert here.platform == "cpu" and here.count >= 1 and here.kind == "cpu"


def test_a_tpu_v3_target_is_tuned_on_its_jax_devices_and_priced_by_its_chips() -> None:
    """A v3-8 host lists 8 JAX devices ("TPU v3"), its 4 chips' 8 TensorCores: tpu-v3:2x2 is those 8 and runs there,
    tpu-v3:4x4 is 32 on 4 hosts of 8 and does not. The cost objective prices a 0.5 s step over a batch of 64 on
    tpu-v3:2x2 as 4 chips at the table's per-chip price (not 8), and the report says so."""
    from shardbench.plan.target import parse_target
    from shardbench.prices import load_prices
    from shardbench.tune.select import objective
    from shardbench.tune.tune_cmd import HostDevices, check_host

    v3_8 = HostDevices("tpu", 8, "TPU v3")
    small = parse_target("tpu-v3:2x2")
    check_host(small, v3_8)
    with pytest.raises(ConfigError, match=r"^--target tpu-v3:4x4 has 32 devices, 4 nodes of 8, and this host has 8 "
                                          r"\(TPU v3\): give a target of at most 8 devices"):
        check_host(parse_target("tpu-v3:4x4"), v3_8)
    table = load_prices()
    hourly = table.lookup("tpu-v3").on_demand
    p = dataclasses.replace(planned("dp", 0.5), target=small)
    assert objective("cost", table, small).predicted(p) == pytest.approx(0.5 * 4 * hourly / 3600 / 64)
    assert small.priced_on("device") == "8 devices (4 tpu-v3 chips)"


def shardbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process, as a user runs it."""
    environ = {**os.environ, "JAX_PLATFORMS": "cpu"}
    environ.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "shardbench", *args], capture_output=True, text=True, env=environ,
                          cwd=cwd, timeout=600)


@pytest.mark.slow
def test_an_interrupted_tune_resumed_measures_k_and_writes_a_winner_train_accepts(tmp_path: Path) -> None:
    """dp, tp and ep on the small MLP: ep is refused (no experts) and said so in tune.json; the other two are
    measured (k=2). Stopped by SIGTERM after its first run (a scheduler's stop, which Ctrl-C's path shares: it
    exited 143 without a word), the tune says how to finish it; the same command with
    --resume (another --top-k, other candidates or another --lr are refused, naming the flag; the candidates in
    another order, or --devices left out for the same 8, are not) runs the second run alone, each run recorded once.
    The verdict
    covers both runs: the report charts predicted against measured, and the ready command trains a step.
    (One tune, interrupted, serves both: a second uninterrupted tune of the same space would run the same code.)"""
    import signal
    import threading

    from shardbench.store import Store

    out = tmp_path / "tune"
    argv = ["tune", *SMALL_MLP, "--remat", "none", "--candidates", "dp,tp,ep", "--top-k", "2", "--budget-min", "5",
            "--measure-steps", "3", "--out", str(out)]
    # Unbuffered: the first run's line arrives as it is printed, while the second run's process is still starting
    # (a few seconds), not together with it at the end.
    environ = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    environ.pop("XLA_FLAGS", None)
    proc = subprocess.Popen([sys.executable, "-m", "shardbench", *argv], env=environ, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    try:
        printed = []
        for line in proc.stdout or ():
            printed.append(line)
            if line.startswith("[1/2] "):  # the first run is recorded; the second is starting
                proc.send_signal(signal.SIGTERM)
                break
        printed.append(proc.communicate(timeout=120)[0])
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    text = "".join(printed)
    assert proc.returncode == 143, text[-3000:]
    assert (f"tune: interrupted; finish it with the same shardbench tune command and --resume (its --out is {out})"
            in text)
    # The one way on is tune's: the sweep inside it no longer says "continue with --resume --out", which, taken,
    # ran the runs and left the tune without its verdict.
    assert "shardbench: sweep stopped by SIGTERM; 1 of 2 runs are recorded in " in text
    assert "continue with --resume" not in text
    with Store(out / "sweep.db") as store:
        assert len(store.names()) == 1
    assert not (out / "tune.md").exists() and json.loads((out / "tune.json").read_text())["result"] is None

    with held_by_another_process(out):  # a second tune there ran the same runs beside the first
        busy = shardbench(*argv, "--resume", cwd=tmp_path)
    assert busy.returncode == 2 and "a sweep or tune is running there" in busy.stderr.strip().splitlines()[-1]
    changed = shardbench(*argv, "--top-k", "3", "--resume", cwd=tmp_path)
    assert changed.returncode == 2 and "(--top-k: 2 there, 3 now)" in changed.stderr.strip().splitlines()[-1]
    fewer = [a if a != "dp,tp,ep" else "dp,tp" for a in argv]
    changed = shardbench(*fewer, "--resume", cwd=tmp_path)
    assert "(--candidates: ['dp', 'ep', 'tp'] there, ['dp', 'tp'] now)" in changed.stderr.strip().splitlines()[-1]
    changed = shardbench(*argv, "--lr", "0.5", "--resume", cwd=tmp_path)  # a field of the configuration, by its flag
    assert changed.returncode == 2 and "(--lr: " in changed.stderr.strip().splitlines()[-1]  # it said "optim.lr"
    # The same candidates in another order are the same tune (it was refused, showing both whole spaces), and
    # --devices left out counts the same 8 devices (it was refused: "parallel.devices: 8 there, 0 now").
    again = [a if a != "dp,tp,ep" else "ep,dp,tp" for a in argv]
    again = again[:again.index("--devices")] + again[again.index("--devices") + 2:]
    done = shardbench(*again, "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "resuming: 1 of 2 runs already recorded" in done.stdout and "[2/2] " in done.stdout
    tuned = json.loads((out / "tune.json").read_text())
    by_strategy = {row["strategy"]: row for row in tuned["layouts"]}
    assert set(by_strategy) == {"dp", "tp", "ep"}
    assert by_strategy["ep"]["dropped"].startswith("refused:") and not by_strategy["ep"]["chosen"]
    chosen = [row for row in tuned["layouts"] if row["chosen"]]
    assert len(chosen) == 2 and all(row["measured_step_s"] and row["predicted_step_s"] for row in chosen)
    result = tuned["result"]
    assert result["measured"] == 2
    assert result["winner"] in {row["name"] for row in chosen} and result["regret"] >= 0
    # Both runs are one batch: two runs are too few for a tau, and tune.md says so.
    assert result["kendall_tau_by_batch"] == {str(tuned["config"]["train.batch_size"]): None}
    assert set(tuned["runs"]) == {row["run"] for row in chosen}
    with Store(out / "sweep.db") as store:
        runs = store.runs()
    assert sorted(r.name for r in runs) == sorted(row["run"] for row in chosen)
    assert all(r.status == "complete" for r in runs)
    # One host peak for the plan and both runs, the resumed one too: <out>/peak.json, measured as the tune began
    # (the plan read the host's cached figure, the runs one the sweep measured later).
    peak = json.loads((out / "peak.json").read_text())["float32"]["flops_per_s"]
    planned = json.loads((out / "plan" / "plan.json").read_text())["hardware"]["float32"]
    assert planned["peak_flops"] * 8 == pytest.approx(peak, rel=1e-12)
    for r in runs:
        mfu = r.record["measurements"]["mfu"]
        assert mfu["peak_origin"] == f"handed over in {(out / 'peak.json').resolve()}", mfu
        assert mfu["peak_flops_per_s_per_device"] * 8 == pytest.approx(peak, rel=1e-12)
    md = (out / "tune.md").read_text()
    assert "2 runs, too few for Kendall's tau" in md and "regret" in md and "report/plan_vs_measured.png" in md
    # 3 steps time 1 or 2 intervals: the verdict says what so few leave of it, as the sweep's report does
    timed = sorted({r.record["measurements"]["step_time_s"]["measured_steps"] for r in runs})
    assert (f"the measured step times rest on {' or '.join(map(str, timed))} timed step(s) (fewer than 5): a gap "
            f"within 15% between them is within one step's noise, so the winner and the regret may not hold; a "
            f"larger --measure-steps (3 now) times more") in md, md
    assert (out / "report" / "plan_vs_measured.png").exists()
    assert "The plan against the measurement" in (out / "report" / "report.md").read_text()
    assert result["command"] in done.stdout

    # winner.toml is a sweep file of the one winning run, with the settings of the ready command.
    from shardbench.sweep.grid import make_sweep
    from shardbench.sweep.sweep_file import load_sweep_file

    sweep = make_sweep(sweep_file=load_sweep_file(out / "winner.toml"))
    command = result["command"].split()
    assert command[:4] == ["shardbench", "train", "--preset", "mlp-small"] and len(sweep.runs) == 1
    flags = dict(arg[2:].split("=", 1) for arg in command[4:])
    settings = {k.replace("_", "-"): str(v) for k, v in sweep.runs[0].settings.items()}
    assert flags == settings
    trained = shardbench(*command[1:], "--steps", "1", "--no-train.eval", "--out", str(tmp_path / "winner"),
                         cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "winner" / "summary.json").exists()

    # A plain sweep folder with a plan of its runs (`plan --validate` writes plan-validation.json) gets the chart too.
    from shardbench.report.write import write_report

    plain = tmp_path / "plain"
    shutil.copytree(out, plain, ignore=shutil.ignore_patterns("tune.json", "report"))
    (plain / "plan-validation.json").write_text(json.dumps({"runs": tuned["runs"]}))
    paths = write_report(plain)
    assert "plan_vs_measured" in paths.charts and "Kendall's tau" in paths.markdown.read_text()
    assert "plan_vs_measured" not in paths.clipped  # no run's name runs past the chart's edge


@pytest.mark.slow
@pytest.mark.parametrize(("args", "expected", "compiled"), [
    (["--budget-min", "0.05"], "--budget-min 0.05 (3.0 s) is too small for one run: a run takes about", False),
    (["--candidates", "ep,dp+ep", "--budget-min", "5"],
     "nothing fits: of 3 layouts, 3 were refused (the commonest reason, 2 of them: refused: --strategy dp+ep ", False),
    (["--candidates", "dp", "--budget-min", "0.5", "--measure-steps", "1000000"],
     "--budget-min 0.5 is too small for one run: the plan's top choice, dp 8x1 remat=none float32 batch=64", True),
])
def test_refusals_are_one_line_and_exit_2(args: list[str], expected: str, compiled: bool, tmp_path: Path) -> None:
    """A budget below a run's start-up (before anything compiles), a space where nothing can run, a budget the
    plan's top choice overruns."""
    done = shardbench("tune", *SMALL_MLP, "--remat", "none", *args, "--out", str(tmp_path / "t"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("shardbench: error: ") and expected in last, done.stderr[-2000:]
    assert ("compiled:" in done.stderr) == compiled
    assert not (tmp_path / "t" / "sweep.db").exists()
    if "plan's top choice" in expected:  # refused after planning: the folder holds the plan, and the line says so
        assert last.endswith(f"; the plan is kept in {tmp_path / 't'} (tune.json, plan/): tune again with another "
                             f"--out"), last
    elif "a run takes about" in expected:  # before planning: the floor is the start-up's, not the whole run's
        assert "give more than 0.1 (that holds the start-up alone: the plan's estimate of its top choice" in last


def test_a_folder_a_stopped_tune_left_only_its_lock_in_takes_a_new_one(tmp_path: Path) -> None:
    """Ctrl-C while a tune planned left `--out` holding its lock file alone, and the same command there was
    refused ("is not empty: choose a new directory for the sweep", naming a sweep besides). A lone lock is no
    content; anything else is, and the line names the command."""
    from shardbench.store import LOCK
    from shardbench.sweep.sweep_cmd import check_out

    out = tmp_path / "t"
    out.mkdir()
    (out / LOCK).write_text("")
    check_out(out, resume=False, command="tune")
    (out / "tune.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"^--out {out} is not empty: choose a new directory for the tune$"):
        check_out(out, resume=False, command="tune")


@pytest.mark.slow
def test_with_no_measured_run_tune_writes_what_it_points_at(tmp_path: Path) -> None:
    """Every run past its time limit (1 s: not even JAX has started): no winner, exit 1. tune.md, tune.json and the
    report are written, tune.md says there is no winner and where the runs' errors are, every path tune names
    exists, and no winner.toml is written. The run is given 100,000 steps (over a minute on 2 cores), so that it
    cannot end within the time limit's 5 s grace either: with 3 steps it once ended there, under the full suite's
    load, and was recorded complete (a record written whole is kept, `sweep.runner.execute`)."""
    out = tmp_path / "t"
    done = shardbench("tune", *SMALL_MLP, "--remat", "none", "--candidates", "dp", "--budget-min", "5",
                      "--measure-steps", "100000", "--timeout", "1", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((out / "tune.json").read_text())["result"] is None
    md = (out / "tune.md").read_text()
    assert "no winner: none of the 1 measured run(s) gave step time per example" in md and "| failed |" in md
    assert "timeout: no result within the 1 s time limit" in (out / "report" / "report.md").read_text()
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("tune: ") and not (out / "winner.toml").exists()
    named = [Path(part.split(": ")[-1]) for part in last[len("tune: "):].split(", ")]
    assert out / "tune.md" in named and out / "report" / "report.md" in named
    assert all(path.exists() for path in named), last


@pytest.mark.slow
def test_each_refused_layout_keeps_its_own_reason(tmp_path: Path) -> None:
    """cp and ep on the MLP are both refused before compiling, each for its own reason (no attention; no experts):
    tune.json says so per layout, even where every layout at the batch is refused."""
    out = tmp_path / "t"
    done = shardbench("tune", *SMALL_MLP, "--remat", "none", "--candidates", "cp,ep", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    rows = {row["strategy"]: row for row in json.loads((out / "tune.json").read_text())["layouts"]}
    assert rows["cp"]["dropped"].startswith("refused: --strategy cp splits the sequence"), rows["cp"]
    assert "the mlp has no attention" in rows["cp"]["dropped"]
    assert rows["ep"]["dropped"].startswith("refused: --strategy ep splits a mixture's experts"), rows["ep"]
    assert "(the commonest reason, 1 of them: refused: --strategy cp" in done.stderr.strip().splitlines()[-1]


def test_the_cost_objective_prices_the_step_on_the_targets_devices() -> None:
    """Dollars per example by hand: 8 H100s at the table's on-demand price, a 0.5 s step over a batch of 64; a
    layout as fast on twice the devices costs twice as much; a target the table has no row for is one line."""
    from shardbench.plan.target import parse_target
    from shardbench.prices import load_prices, parse_prices
    from shardbench.tune.select import objective

    table = load_prices()
    h100 = parse_target("8xh100")
    cost = objective("cost", table, h100)
    hourly = table.lookup("h100").on_demand
    p = dataclasses.replace(planned("dp", 0.5), target=h100)
    assert cost.predicted(p) == pytest.approx(0.5 * 8 * hourly / 3600 / 64)
    assert cost.measured(p, MeasuredFigures(0.25, None)) == pytest.approx(0.25 * 8 * hourly / 3600 / 64)
    wider = dataclasses.replace(planned("dp", 0.5), target=parse_target("2x8xh100"))
    assert cost.predicted(wider) == pytest.approx(2 * cost.predicted(p))
    assert rank([wider, p], cost)[0] is p  # time ranks them level; cost puts the half-price one first
    # Within one tune every layout runs on all the target's devices: cost is time x a constant, the same order.
    same = [dataclasses.replace(planned(s, step, batch=b), target=h100)
            for s, step, b in (("dp", 0.5, 64), ("fsdp", 0.8, 128), ("tp", 0.3, 32), ("zero1", 0.2, 16))]
    assert [p.point.name for p in rank(same, cost)] == [p.point.name for p in rank(same, OBJECTIVES["time"])]
    assert all(cost.predicted(p) == pytest.approx(OBJECTIVES["time"].predicted(p) * 8 * hourly / 3600) for p in same)
    only_cpu = parse_prices('currency = "USD"\ntaken = "2026-11-25"\n[devices.cpu]\non_demand = 1.0\nspot = 0.5\n'
                            'watts = 100\nsource = "by hand"\ndate = "2026-11"\nper = "host"\n', "test table")
    with pytest.raises(ConfigError, match=r"--objective cost: the price table \(test table\) has no row for h100"):
        objective("cost", only_cpu, h100)
    assert objective("time", only_cpu, h100) is OBJECTIVES["time"]


def test_tunes_report_prices_an_epoch_of_each_measured_layout(tmp_path: Path) -> None:
    """The report's cost per epoch by hand: the CPU row (priced per host) x the plan's step x the epoch's steps
    for the prediction, and the run record's own cost for the measurement."""
    from shardbench.measure.run_record import Cost
    from shardbench.plan.target import parse_target
    from shardbench.presets import get_preset
    from shardbench.prices import load_prices
    from shardbench.tune.report import Tuning, cost_table

    cfg = get_preset("mlp-small")
    target = parse_target("cpu", cpu_devices=8)
    dp = dataclasses.replace(planned("dp", 0.5), target=target)
    tuning = Tuning(cfg, target, OBJECTIVES["time"], Space(), 1, 10.0, 10, tmp_path, chosen=[dp],
                    measured={dp.point.name: MeasuredFigures(0.4, None, Cost(on_demand_usd=0.125, kwh=0.5))})
    rows, how = cost_table(tuning)
    # By hand: mlp-small's 16,384 generated examples less the 10% held out for validation (1,638) are 14,746; at the
    # layout's batch of 64 (not the preset's 1,024) an epoch is 230 whole steps, at 128 it is 115.
    assert (cfg.data.synthetic_train, cfg.data.val_fraction, dp.point.batch) == (16384, 0.1, 64)
    hourly, watts = load_prices().lookup("cpu").on_demand, load_prices().lookup("cpu").watts
    assert rows[1] == [dp.point.name, f"${0.5 * 230 * hourly / 3600:,.4g}", f"{0.5 * 230 * watts / 3.6e6:,.4g}",
                       "$0.125", "0.5"]
    assert "(14746 examples over each layout's batch)" in how
    assert ", on 1 host(s);" in how  # the CPU row is priced per host: 8 simulated devices are one machine
    assert ", on 8 device(s);" in cost_table(dataclasses.replace(tuning, target=parse_target("8xh100")))[1]
    half = dataclasses.replace(dp, point=dataclasses.replace(dp.point, batch=dp.point.batch * 2))
    tuning.chosen = [half]  # a layout at twice the batch: half the steps an epoch, at the same step time
    assert cost_table(tuning)[0][1][1] == f"${0.5 * 115 * hourly / 3600:,.4g}"


def stop_while_the_verdict_is_written(out: Path, signal_name: str) -> int:
    """`tune_cmd.measure` of one measured layout into `out`, the real signal `signal_name` sent to this process
    from inside the report's writing: the exit status it gives. The runs are stood in for by their outcome."""
    import argparse
    import signal

    from shardbench.plan.target import parse_target
    from shardbench.presets import get_preset
    from shardbench.report import write as report_write
    from shardbench.tune import tune_cmd
    from shardbench.tune.report import Tuning

    target = parse_target("cpu", cpu_devices=8)
    dp = dataclasses.replace(planned("dp", 0.5), target=target)
    tuning = Tuning(get_preset("mlp-small"), target, OBJECTIVES["time"], Space(), 1, 10.0, 10, out, chosen=[dp])
    tune_cmd.run_measurements = lambda *a, **k: 0  # the runs, measured
    tune_cmd.measured_runs = lambda out, names: {dp.point.name: MeasuredFigures(0.4, None, None)}

    def stopped(out: Path, **how: object) -> None:
        os.kill(os.getpid(), getattr(signal, signal_name))

    report_write.write_report = stopped
    return tune_cmd.measure(argparse.Namespace(measure_steps=3), tuning, resume=False)


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stop_while_the_verdict_is_written_says_how_to_finish_and_leaves_no_verdict(
        tmp_path: Path, signal_name: str) -> None:
    """The runs are measured; a Ctrl-C or SIGTERM lands while the report is written. It printed only "interrupted"
    (SIGTERM: nothing, the process died of it), and tune.json already held the verdict without tune.md or
    winner.toml beside it. Now the stop says how to finish, and tune.json holds no verdict until its files are
    written. The stop is the real signal, sent from inside the report's writing, in a process of its own that
    takes Ctrl-C as a terminal's process does: a suite started in the background (bash's `&`) ignores SIGINT, and
    the SIGINT case failed there."""
    from shardbench.tune.report import TUNE_JSON

    script = (f"import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              f"sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_tune; "
              f"print(test_tune.stop_while_the_verdict_is_written(__import__('pathlib').Path(sys.argv[1]), "
              f"sys.argv[2]))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path), signal_name], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.stdout.split()[-1:] == [str(130 if signal_name == "SIGINT" else 143)], done.stdout + done.stderr
    assert (f"tune: interrupted; finish it with the same shardbench tune command and --resume (its --out is "
            f"{tmp_path})") in done.stderr
    assert json.loads((tmp_path / TUNE_JSON).read_text())["result"] is None
    assert not (tmp_path / "tune.md").exists() and not (tmp_path / "winner.toml").exists()


def test_the_measured_runs_and_the_winner_keep_the_users_reporting_flags() -> None:
    """--prices and --data.cache-dir go to every measured run (their records are priced with the user's table,
    their data read from the user's cache) and into the ready command; the sweep's own fields do not."""
    from shardbench.parsing import override
    from shardbench.presets import get_preset
    from shardbench.tune.space import user_settings

    cfg = override(get_preset("mlp-small"), {"train.prices": "/tmp/mine.toml", "data.cache_dir": "/data/cache",
                                             "train.steps": 7, "train.out": "/tmp/x", "parallel.strategy": "fsdp"})
    assert user_settings(cfg) == {"train.prices": "/tmp/mine.toml", "data.cache_dir": "/data/cache",
                                  "train.steps": 7}


def test_a_resume_takes_the_spaces_lists_in_another_order(tmp_path: Path) -> None:
    """The configuration holds the first value of each list of the space (--remat, --dtype, --grad-accum,
    --batch-size): a resume that gave a list in another order was refused ("--remat: 'none' there, 'block'
    now"), though the docs say the order changes nothing. Reordered, the tune is the same; another list is not,
    and is named by tune's own flag."""
    from shardbench.parsing import override
    from shardbench.plan.target import parse_target
    from shardbench.presets import get_preset
    from shardbench.tune.report import Tuning, _difference, write_json

    def tuning(remats: tuple[str, ...], dtypes: tuple[str, ...], accums: tuple[int, ...],
               batches: tuple[int, ...]) -> Tuning:
        cfg = override(get_preset("mlp-small"), {"model.remat": remats[0], "precision.dtype": dtypes[0],
                                                 "train.grad_accum": accums[0], "train.batch_size": batches[0]})
        space = Space(remats=remats, dtypes=dtypes, accums=accums, batches=batches)
        return Tuning(cfg, parse_target("cpu", cpu_devices=8), OBJECTIVES["time"], space, 1, 10.0, 10, tmp_path)

    stored = json.loads(write_json(tuning(("none", "block"), ("float32", "bfloat16"), (1, 2), (16, 32))).read_text())
    assert _difference(stored, tuning(("block", "none"), ("bfloat16", "float32"), (2, 1), (32, 16))) is None
    assert _difference(stored, tuning(("none", "block"), ("float32", "bfloat16"), (2, 4), (16, 32))) == (
        "--grad-accum: [1, 2] there, [2, 4] now")
    assert _difference(stored, tuning(("none", "block"), ("float32", "bfloat16"), (1, 2), (64, 16))) == (
        "--batch-size: [16, 32] there, [16, 64] now")


@pytest.mark.parametrize(("text", "says"), [
    ("", "is unreadable"),
    ("[]", "is not a tune's record"),
    ('{"space": 5}', "is not a tune's record"),
    ('{"layouts": [5]}', "is not a tune's record"),
])
def test_a_damaged_tune_json_is_named_when_resumed(tmp_path: Path, text: str, says: str) -> None:
    """tune --resume read tune.json with no check: an empty file was "a JSON file is corrupt" without its name,
    a list or a `space` that is not a table an internal error (exit 70). Each names the file (data, exit 4)."""
    from shardbench.errors import DataError
    from shardbench.plan.target import parse_target
    from shardbench.presets import get_preset
    from shardbench.tune.report import TUNE_JSON, Tuning, resumed

    (tmp_path / TUNE_JSON).write_text(text)
    tuning = Tuning(get_preset("mlp-small"), parse_target("cpu", cpu_devices=8), OBJECTIVES["time"], Space(), 1,
                    10.0, 10, tmp_path)
    with pytest.raises(DataError) as err:
        resumed(tuning)
    assert str(err.value).startswith(f"--resume: {tmp_path / TUNE_JSON} {says}"), str(err.value)


@pytest.mark.parametrize("candidate", [
    Candidate("dp+pp", "data=4,stage=2", "none", "float32", microbatches=2, schedule="circular"),
    Candidate("dp", "8x1", "none", "float32"),
], ids=["circular", "no-stages"])
@pytest.mark.parametrize("repeats", [1, 2])
def test_each_measured_run_is_told_every_field_of_the_program_its_plan_compiled(candidate: Candidate,
                                                                                repeats: int) -> None:
    """What a measured run (and the ready command) is told, the user's settings and the layout's, is the
    configuration the planner compiled for that candidate, field by field. A circular pipeline loops its
    microbatches twice (at one repeat its schedule is GPipe's): its run was told no --parallel.repeats, so it
    measured GPipe's program; a layout without stages runs once, even where the user gave --parallel.repeats 2
    for the pipelines (its run was told 2 and refused)."""
    from shardbench.parsing import override
    from shardbench.plan.candidates import candidate_config
    from shardbench.presets import get_preset
    from shardbench.sweep.grid import SWEEP_OWNED
    from shardbench.tune.space import Point, layout_settings, user_settings

    cfg = override(get_preset("vit-tiny"), {"parallel.repeats": repeats, "train.steps": 3})
    told = config_lib.flatten(override(get_preset("vit-tiny"), {**user_settings(cfg),
                                                                 **layout_settings(cfg, Point(candidate, 64), 8)}))
    planned = candidate_config(override(cfg, {"train.batch_size": 64}), candidate, 8)
    differs = {k: (told[k], planned[k]) for k in planned if k not in SWEEP_OWNED and told[k] != planned[k]}
    assert differs == {}
    assert told["parallel.repeats"] == (2 if candidate.schedule == "circular" else 1)


@pytest.mark.parametrize("objective", ["time", "memory"])
def test_the_verdicts_table_has_one_column_per_figure(tmp_path: Path, objective: str) -> None:
    """The objective's own column is added where it is not already the table's: under --objective memory the
    measured memory per device was printed twice, as "measured memory" and "measured memory"."""
    from shardbench.plan.target import parse_target
    from shardbench.presets import get_preset
    from shardbench.tune.report import Tuning, table

    target = parse_target("cpu", cpu_devices=8)
    dp = dataclasses.replace(planned("dp", 0.5), target=target)
    tuning = Tuning(get_preset("mlp-small"), target, OBJECTIVES[objective], Space(), 1, 10.0, 10, tmp_path,
                    chosen=[dp], measured={dp.point.name: MeasuredFigures(0.4, 3 * 2**20, None)})
    head, row = table(tuning)
    assert len(head) == len(set(head)) == len(row)
    assert ("measured time" in head) == (objective == "time")
    assert row[head.index("measured memory")] == "3.0 MiB"
