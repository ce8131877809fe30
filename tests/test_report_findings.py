"""The report's findings on small made-up records whose answers are counted by hand: the plan's order within
groups of the same work, figures from too few timed steps, what differs between runs, image sizes, SPMD styles
and context modes compared only with their own kind, the throughput chart of old records, the dtype-role
sentence, the mesh x batch charts' left-out runs, and an old record's zero step. Then faults an audit of the report
found: which losses a folder's runs are compared on, groups with none to compare, folders without config.json,
one tie rule for every section, the model state in the breakdown, failed runs in the mesh x batch charts, a
summary.json that is not an object, empty columns, memory chart titles, the cost note, old wall-clock rates and
Markdown escaping."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from test_report import MIB, markdown_table, record, row

from shardbench.measure.kernels import TraceTime
from shardbench.plan.validate import Check, render, summary
from shardbench.report import plots
from shardbench.report.content import COLUMNS, ReportedRun, comms_measure, reported, shown
from shardbench.report.context import context_findings
from shardbench.report.findings import dtype_role_finding, explain, precision_findings, spmd_findings
from shardbench.report.plan_chart import plan_findings
from shardbench.report.speed import NOT_A_CAUSE_TRACED, speed_findings
from shardbench.report.write import write_report
from shardbench.store import RunRow, Store


def rec(name: str, step_ms: float, *, steps: int = 37, p90: float = 1.0,
        breakdown: tuple[float, float, float, float] = (1, 2, 1, 1), strategy: str = "dp", mesh: str = "8",
        sent: dict[str, float] | None = None) -> dict[str, Any]:
    """A record with its median step, its p90 as a multiple of it, how many timed steps it rests on, and the MiB
    each collective kind sends per device per step (its payload twice that)."""
    made = record(name, strategy, mesh, 8, breakdown=breakdown, total=sum(breakdown),
                  comms={k: (1, 2 * mib) for k, mib in (sent or {}).items()}, epochs=[], step_ms=step_ms, img_s=0.0,
                  mfu=0.1, acc=0.5, partial=(10, 100, 1.0), sent=sent)
    made["measurements"]["step_time_s"].update(p90=step_ms * p90 / 1e3, measured_steps=steps)
    return made


def run(name: str, overrides: dict[str, Any], step_ms: float, predicted_ms: float | None = None,
        **kw: Any) -> ReportedRun:
    made = reported(row(name, overrides, rec(name, step_ms, **kw)))
    return made if predicted_ms is None else dataclasses.replace(made, predicted={"step_s": predicted_ms / 1e3})


# ----------------------------------------------------------------------------- 1: the plan, group by group
def test_the_plans_order_is_judged_within_each_group_of_the_same_work() -> None:
    """lm at 1,024 tokens, three layouts: predicted 1 < 2 < 3 ms, measured 10, 30, 20 ms: pairs (a,b) and (a,c)
    agree, (b,c) does not, tau = (2 - 1) / 3 = 0.33; errors 90%, 93.3% and 85%, mean 89.4%. At 2,048 tokens two layouts: predicted 5 < 6, measured 60 >
    50: too few for a tau (errors 91.7% and 88%, mean 89.8%), and the plan's fastest measured 60 ms against 50 (+20.0%). Pooled, the five runs' tau
    would be 0.6: the lengths' own order would count as the plan's."""
    lm = {"model.kind": "lm"}
    runs = [run("a", lm | {"model.seq_len": 1024}, 10.0, 1.0), run("b", lm | {"model.seq_len": 1024}, 30.0, 2.0),
            run("c", lm | {"model.seq_len": 1024}, 20.0, 3.0), run("d", lm | {"model.seq_len": 2048}, 60.0, 5.0),
            run("e", lm | {"model.seq_len": 2048}, 50.0, 6.0)]
    assert plan_findings(runs) == [
        "Predicted against measured step time (seq_len 1024): Kendall's tau 0.33 over 3 runs; mean absolute error "
        "89.4%; the plan's fastest, a, was also the fastest measured (10.0 ms).",
        "Predicted against measured step time (seq_len 2048): 2 runs, too few for Kendall's tau to mean anything; "
        "mean absolute error 89.8%; the plan's fastest, d, measured 60.0 ms against the fastest measured, e, "
        "50.0 ms (+20.0%)."]
    # From one timed step each, a 10% gap between the plan's fastest and the fastest measured is undecided.
    few = [run("d", lm, 55.0, 5.0, steps=1), run("e", lm, 50.0, 6.0, steps=1)]
    assert plan_findings(few)[0].endswith(
        "the plan's fastest, d, against the fastest measured, e, is undecided (55.0 against 50.0 ms, +10.0%, from "
        "1 timed step each).")
    # A batch size is another piece of work too.
    batches = [run("f", {"train.batch_size": 128}, 10.0, 1.0), run("g", {"train.batch_size": 256}, 20.0, 2.0)]
    assert [s.split(":")[0] for s in plan_findings(batches)] == [
        "Predicted against measured step time (batch_size 128)", "Predicted against measured step time (batch_size 256)"]


def test_plan_validate_ranks_within_each_group_of_the_same_work() -> None:
    """The same five runs as `shardbench plan --validate` checks them: tau within each group, never pooled."""
    checks = [Check("a", 0.010, 0.001, 1.0, 1.0, "compiled", group="seq_len 1024"),
              Check("b", 0.030, 0.002, 1.0, 1.0, "compiled", group="seq_len 1024"),
              Check("c", 0.020, 0.003, 1.0, 1.0, "compiled", group="seq_len 1024"),
              Check("d", 0.060, 0.005, 1.0, 1.0, "compiled", group="seq_len 2048"),
              Check("e", 0.050, 0.006, 1.0, 1.0, "compiled", group="seq_len 2048")]
    groups = summary(checks)["step_tau_by_group"]
    assert [(g["group"], g["runs"], round(g["tau"], 4) if g["tau"] is not None else None) for g in groups] == [
        ("seq_len 1024", 3, 0.3333), ("seq_len 2048", 2, None)]
    assert ("Kendall's tau of the step-time ranking within each group of the same work (model, shape, batch): "
            "seq_len 1024: Kendall's tau 0.33 over 3 runs; seq_len 2048: 2 runs, too few for Kendall's tau to mean "
            "anything") in render(Path("d"), checks, {}, in_sample=False)


# ----------------------------------------------------------------------------- 2: too few timed steps
def test_figures_from_too_few_timed_steps_say_so_and_small_gaps_are_undecided() -> None:
    """a 100 ms, b 110 ms (10% apart, within the 15% margin), c 200 ms, each from 1 timed step (p90 = median):
    a against b is undecided, c is 2.00x slower with its step count said. The same figures from 37 steps with
    no spread rank b 1.10x slower; 4 steps are too few, 5 are enough."""
    def speed(steps: int) -> list[str]:
        return speed_findings([run(n, {"parallel.mesh": m}, ms, steps=steps)
                               for n, m, ms in (("a", "8x1", 100.0), ("b", "4x2", 110.0), ("c", "2x4", 200.0))])

    few = speed(1)
    assert few[0] == "Fastest: a, 100.0 ms per step (from 1 timed step; ranked by median step time)."
    assert few[1] == ("b against a is undecided (110.0 ms against 100.0 ms, from 1 timed step each): the 10.0% "
                      "difference is within the 15% margin the report requires of figures from fewer than 5 timed "
                      "steps, so this ranking cannot tell them apart.")
    assert few[2] == ("c is 2.00x slower (200.0 ms against 100.0 ms, from 1 timed step each); it differs in: "
                      "parallel.mesh 2x4 against 8x1.")
    assert speed(4)[1].startswith("b against a is undecided (110.0 ms against 100.0 ms, from 4 timed steps each)")
    for steps in (5, 37):
        many = speed(steps)
        assert many[0] == "Fastest: a, 100.0 ms per step (ranked by median step time)."
        assert many[1] == "b is 1.10x slower (110.0 ms against 100.0 ms); it differs in: parallel.mesh 4x2 against 8x1."


def _context(name: str, mode: str, tokens: int, ms: float, steps: int = 37, batch: int = 4) -> ReportedRun:
    return run(name, {"model.kind": "lm", "parallel.strategy": "cp", "parallel.context": mode,
                      "model.seq_len": tokens, "train.batch_size": batch}, ms, steps=steps)


def test_no_crossover_is_declared_from_an_undecided_gap() -> None:
    """Ring against all-gather at 256, 512 and 1,024 tokens: 16.4 / 11.5 ms (ring 30% slower), 25.8 / 26.6 ms
    (3% faster), 91.4 / 237.2 ms. From 37 timed steps the ring overtakes from 512 on; from 1 step the 3% at 512
    is undecided, so it overtakes from 1,024 on."""
    figures = {256: (16.4, 11.5), 512: (25.8, 26.6), 1024: (91.4, 237.2)}

    def sentence(steps: int) -> str:
        (found,) = context_findings([_context(f"{mode}_{t}", mode, t, ms[i], steps) for t, ms in figures.items()
                                     for i, mode in enumerate(("ring", "all-gather"))])
        return found

    assert "the ring overtakes the all-gather from 512 tokens on (its step was not the faster at 256 tokens)." \
        in sentence(37)
    one = sentence(1)
    assert ("by sequence length (figures from 1 timed step each): 256 tokens: ring 16.4 ms, all-gather 11.5 ms"
            in one)
    assert ("the ring overtakes the all-gather from 1,024 tokens on (its step was not the faster at 256 tokens, "
            "undecided at 512 tokens, where the two steps are within 15% of each other from fewer than 5 timed "
            "steps).") in one


def test_an_undecided_length_between_two_wins_does_not_move_the_crossover() -> None:
    """From 1 timed step: the ring 30% faster at 1,024 tokens, 5% at 2,048 (undecided: within 15%), 40% at 4,096.
    The undecided length counts neither way, so the ring is the faster from the shortest length on."""
    figures = {1024: (70.0, 100.0), 2048: (95.0, 100.0), 4096: (60.0, 100.0)}
    (found,) = context_findings([_context(f"{mode}_{t}", mode, t, ms[i], 1) for t, ms in figures.items()
                                 for i, mode in enumerate(("ring", "all-gather"))])
    assert ("the ring's step was the faster from the shortest length measured, 1,024 tokens, on (it was undecided "
            "at 2,048 tokens, where the two steps are within 15% of each other from fewer than 5 timed steps).") \
        in found, found


# ----------------------------------------------------------------------------- 3: what differs
def test_every_setting_that_differs_is_named_and_no_mfu_stands_in() -> None:
    """Slower runs that differ from the fastest only in the matmul precision, in gradient accumulation, or in
    nothing at all: each names exactly that (no 'MFU x% against y%')."""
    found = speed_findings([run("base", {}, 10.0), run("highest", {"precision.matmul_precision": "highest"}, 30.0),
                            run("accum", {"train.grad_accum": 4}, 25.0), run("again", {}, 20.0)])
    assert found[1:4] == [
        "again is 2.00x slower (20.0 ms against 10.0 ms); its recorded settings are the same as base's.",
        "accum is 2.50x slower (25.0 ms against 10.0 ms); it differs in: train.grad_accum 4 against 1.",
        "highest is 3.00x slower (30.0 ms against 10.0 ms); it differs in: precision.matmul_precision highest "
        "against default."]
    assert not any("MFU" in s for s in found)


def test_a_run_of_more_processes_says_so() -> None:
    """The same settings launched as 2 processes (gloo over loopback, much slower on one host) and as 1: the
    process count is what the records show differs, not 'the same settings'."""
    two = run("two", {}, 57.5)
    two = dataclasses.replace(two, record=dataclasses.replace(two.rec, measurements=dataclasses.replace(
        two.m, processes=2)))
    one = run("one", {}, 10.0)
    found = speed_findings([one, two])
    assert found[1] == "two is 5.75x slower (57.5 ms against 10.0 ms); it differs in: 2 process(es) against 1."
    # The table has a processes column where some run was launched as several, and only there.
    column = next(c for c in COLUMNS if c.key == "processes")
    assert column in shown(COLUMNS, [one, two]) and column not in shown(COLUMNS, [one])
    assert (column.text(two), column.text(one)) == ("2", "1")


def test_a_slowdown_names_the_time_in_collectives_where_both_traces_give_it() -> None:
    """Bytes are counted, not timed: where both runs were profiled, the time their traces spent in collectives is
    named beside what differs; where one was not, or the two are within 10%, it is not."""
    def traced(r: ReportedRun, ms: float) -> ReportedRun:
        return dataclasses.replace(r, traced=TraceTime(steps=3, devices=8, span_ms=20.0, busy_ms=18.0, collectives_ms=ms,
                                                       collective_ms={"all-reduce": ms}, top=(), counted_steps=True))

    fast, slow = run("fast", {}, 10.0), run("slow", {"train.grad_accum": 4}, 25.0)
    found = speed_findings([traced(fast, 2.0), traced(slow, 7.5)])
    assert found[1] == ("slow is 2.50x slower (25.0 ms against 10.0 ms); it differs in: train.grad_accum 4 against 1; "
                        "7.5 ms per device per step in collectives in its trace against 2.0 ms.")
    assert found[2] == NOT_A_CAUSE_TRACED  # the time is measured, and still no cause
    untraced = dataclasses.replace(fast, traced=TraceTime(3, 1, 20.0, 18.0, 0.0, {}, (), True))
    assert speed_findings([untraced, traced(slow, 7.5)])[1].endswith("in its trace against none.")
    assert "in its trace" not in " ".join(untimed := speed_findings([fast, traced(slow, 7.5)]))
    assert NOT_A_CAUSE_TRACED not in untimed  # no traced time was named: the bytes' sentence
    assert "in its trace" not in " ".join(speed_findings([traced(fast, 7.0), traced(slow, 7.5)]))


# ----------------------------------------------------------------------------- 4: image sizes
def test_vit_runs_at_different_image_sizes_are_ranked_apart() -> None:
    found = speed_findings([run("img32", {"data.image_size": 32}, 10.0), run("img64", {"data.image_size": 64}, 40.0)])
    assert found == ["The only timed run at image_size 32: img32, 10.0 ms per step.",
                     "The only timed run at image_size 64: img64, 40.0 ms per step."]


# ----------------------------------------------------------------------------- 5, 6: compared with their own kind
def test_spmd_styles_are_compared_within_runs_that_differ_only_in_style() -> None:
    """jit and shard_map at batch 128 (10, 11 ms) and at 1,024 (80, 88 ms): each style against jit at its own
    batch (1.10x both times), never shard_map at 1,024 against jit at 128."""
    runs = [run(f"{style}_b{b}", {"parallel.spmd": style, "train.batch_size": b}, ms)
            for style, b, ms in (("jit", 128, 10.0), ("shard_map", 128, 11.0), ("jit", 1024, 80.0),
                                 ("shard_map", 1024, 88.0))]
    found = spmd_findings(runs)
    head = "DP replicates parameters and optimizer state on every device"
    assert [s.split(":")[0] for s in found] == [f"{head} (batch 128) in each SPMD style",
                                                 f"{head} (batch 1024) in each SPMD style"]
    assert "shard_map 11.0 ms/step (1.10x jit)" in found[0] and "shard_map 88.0 ms/step (1.10x jit)" in found[1]



def test_a_styles_gap_is_ranked_by_the_reports_one_rule_and_only_kinds_that_send_are_named() -> None:
    """jit 10 ms with a p90 of 12 ms against shard_map 11 ms: within jit's spread (20%), a tie. From one timed step
    each, 10 against 11.4 ms (+14%) is undecided, and 10 against 7.1 ms is said with its one step. One device's pmap
    compiles an all-reduce that sends nothing: its bytes are said, not the kind."""
    def styles(jit_ms: float, other_ms: float, **kw: Any) -> str:
        runs = [run("jit", {"parallel.spmd": "jit"}, jit_ms, **kw), run("shard_map", {"parallel.spmd": "shard_map"},
                                                                        other_ms, **kw)]
        return spmd_findings(runs)[0]

    assert "shard_map 11.0 ms/step (1.10x jit, within the spread of their step times)" in styles(10.0, 11.0, p90=1.2)
    assert "(1.14x jit, undecided: from 1 timed step each)" in styles(10.0, 11.4, steps=1)
    assert "(0.71x jit, from 1 timed step each)" in styles(10.0, 7.1, steps=1)
    assert "(1.14x jit)" in styles(10.0, 11.4)  # 37 timed steps each, no spread: apart, said bare
    one = styles(10.0, 11.0, sent={"all-reduce": 0.0, "all-gather": 0.5})
    assert "0.50 MiB sent in collectives (all-gather)" in one and "all-reduce" not in one


def test_context_modes_are_paired_only_with_the_same_settings() -> None:
    """At 1,024 tokens, batch 4: ring 10 ms, all-gather 12 ms; batch 16: ring 40 ms, all-gather 20 ms. Each batch
    is its own series: the ring is faster at batch 4 and never at 16 (paired by length alone, the batch-16 ring
    would have stood against the batch-4 all-gather)."""
    found = context_findings([_context("r4", "ring", 1024, 10.0), _context("g4", "all-gather", 1024, 12.0),
                              _context("r16", "ring", 1024, 40.0, batch=16),
                              _context("g16", "all-gather", 1024, 20.0, batch=16)])
    assert len(found) == 2
    four = next(s for s in found if "(train.batch_size 4)" in s)
    sixteen = next(s for s in found if "(train.batch_size 16)" in s)
    assert "ring 10.0 ms, all-gather 12.0 ms" in four and "the ring's step was the faster at every length" in four
    assert "ring 40.0 ms, all-gather 20.0 ms" in sixteen and "the ring never overtakes" in sixteen


# ----------------------------------------------------------------------------- 7: the throughput chart
def test_throughput_chart_of_old_vit_records_draws_each_runs_figure() -> None:
    """Records from before schema 2 keep no units_per_s: the bars are the global batch over the median step,
    128 / 0.010 s = 12,800 images/s and 128 / 0.040 s = 3,200, and per device an eighth of it."""
    runs = [run("a", {}, 10.0), run("b", {}, 40.0)]
    assert all(r.rec.schema_version < 2 and r.m.throughput.units_per_s is None for r in runs)  # type: ignore[union-attr]
    fig = plots.throughput_figure(runs)
    assert not isinstance(fig, str)
    total, per_device = fig.axes[0], fig.axes[1]
    assert [round(p.get_width(), 6) for p in total.patches] == [12_800.0, 3_200.0]
    assert [round(p.get_width(), 6) for p in per_device.patches] == [1_600.0, 400.0]


# ----------------------------------------------------------------------------- 8: the dtype-role sentence
def test_dtype_role_sentence_bounds_from_every_share_and_groups_models() -> None:
    """vit at batch 64: activation shares 40% and 90%; at batch 256: 70% and 80%. Not every batch size is
    dominated (40% at 64), nor from a batch size on (90% at 64): 3 of the 4 runs are; the bound is half the
    largest share, 45%. An MLP's 20% is said apart."""
    shares = {("v1", 64): (1, 1, 1, 2), ("v2", 64): (1, 0, 0, 9), ("v3", 256): (1, 1, 1, 7), ("v4", 256): (1, 0, 1, 8)}
    runs = [run(n, {"model.kind": "vit", "train.batch_size": b, "parallel.mesh": n}, 10.0, breakdown=parts)
            for (n, b), parts in shares.items()]
    runs.append(run("m", {"model.kind": "mlp", "train.batch_size": 64}, 10.0, breakdown=(2, 4, 2, 2)))
    found = dtype_role_finding(runs)
    assert len(found) == 2
    vit = next(s for s in found if s.startswith("vit: "))
    assert ("which are 40–90% of the per-device breakdown at batch 64; 70–80% at batch 256, so they dominate in 3 "
            "of the 4 runs here. Were 16-bit compute to halve them (not measured here), it would save at most about "
            "45% of it.") in vit
    mlp = next(s for s in found if s.startswith("mlp: "))
    assert "20% of the per-device breakdown at batch 64, so they do not dominate at this batch size" in mlp
    assert "save at most about 10% of it" in mlp


def test_a_precision_pair_says_which_way_memory_moved_in_figures_that_show_it() -> None:
    """bfloat16 compute that grew a small model's activations (as XLA's CPU compiler can): the total "grows", in
    figures that differ (it said "moves only 13% (0.5 -> 0.6 MiB)", and for another pair "0.6 -> 0.6"), and the
    role sentence points to the measured pair rather than bounding an assumed halving beside it."""
    def at(dtype: str, activations: float) -> ReportedRun:
        return run(dtype, {"model.kind": "mlp", "train.batch_size": 64, "precision.dtype": dtype}, 10.0,
                   breakdown=(0.1, 0.2, 0.1, activations))

    pair = [at("float32", 0.13), at("bfloat16", 0.2)]
    (said,) = precision_findings(pair, {})
    assert said == ("Compute dtype bfloat16 vs float32: activations/temporaries 0.13 -> 0.2 MiB, while parameters + "
                    "optimizer state + gradients stay 0.4 MiB (they are stored in the parameter dtype, float32), so "
                    "the compiled total per device grows only 13% (0.53 -> 0.6 MiB).")
    (said,) = precision_findings([at("float32", 0.2), at("bfloat16", 0.1)], {})
    assert said.endswith("shrinks 17% (0.6 -> 0.5 MiB).")
    (role,) = dtype_role_finding(pair)
    assert role.endswith("What 16-bit compute did to them here is measured: see the compute dtype comparisons.")
    assert "halve" not in role


def test_mfu_from_a_peak_measured_on_a_busy_host_is_said_to_read_high() -> None:
    """Runs whose records say their peak was measured while other work loaded the host (`Mfu.peak_busy`): the
    report's speed section says their MFU may read high, naming the load; a run with a quiet host's peak is not
    named."""
    def at(name: str, busy: str | None) -> ReportedRun:
        made = rec(name, 10.0)
        made["measurements"]["mfu"]["peak_busy"] = busy
        return reported(row(name, {"parallel.mesh": name}, made))

    found = explain([at("a", "load average 5.1 on 2 core(s)"), at("b", "load average 5.1 on 2 core(s)"),
                     at("c", None)], {})["Speed"]
    busy = [s for s in found if "busy" in s or "load average" in s]
    assert busy == ["MFU of a, b divides by a host peak measured with the host at load average 5.1 on 2 core(s): "
                    "other work on the cores reads a peak low, so these MFUs may read high; step times and "
                    "throughput do not rest on it (measure the peak on a quiet host: --train.recalibrate-peak)."]


def test_the_activation_share_is_of_the_whole_breakdown_its_other_bytes_included() -> None:
    """Parameters, optimizer state, gradients and activations of 1 MiB each and 1 MiB of other bytes (the batch,
    the outputs): activations are 20% of the breakdown the chart shows, not 25% of four of its parts."""
    made = rec("r", 10.0, breakdown=(1, 1, 1, 1))
    made["measurements"]["memory"]["breakdown"]["other_bytes"] = MIB
    (role,) = dtype_role_finding([reported(row("r", {"train.batch_size": 64}, made))])
    assert "which are 20% of the per-device breakdown at batch 64" in role


def test_dtype_role_sentence_bounds_the_saving_from_float32_compute_runs_only() -> None:
    """Only a float32-compute run's activations can be halved by bfloat16 compute: with a 90% share at bfloat16
    and 40% at float32 the bound is 20% (it said 45%), and where every run computes in bfloat16 there is no
    halving left to offer (it offered 45%)."""
    def at(name: str, dtype: str, parts: tuple[int, int, int, int]) -> ReportedRun:
        return run(name, {"model.kind": "vit", "train.batch_size": 64, "parallel.mesh": name,
                          "precision.dtype": dtype}, 10.0, breakdown=parts)

    mixed = dtype_role_finding([at("half", "bfloat16", (1, 0, 0, 9)), at("full", "float32", (1, 1, 1, 2))])
    assert len(mixed) == 1 and "save at most about 20% of it." in mixed[0]
    half = dtype_role_finding([at("a", "bfloat16", (1, 0, 0, 9)), at("b", "bfloat16", (1, 1, 1, 2))])
    assert len(half) == 1 and "Halving" not in half[0]
    assert half[0].endswith("Every run here already computes in 16 bits, so no further halving of them is in reach.")


# ----------------------------------------------------------------------------- 9, 10: charts and old records
def _mesh_batch_grid(store: Store, failed: dict[tuple[str, int], tuple[str, str]] | None = None) -> None:
    """Meshes 8x1 and 4x2 x batches 64 and 256, one run each (a step of batch / 8 ms), or the failure `failed`
    gives its cell."""
    for mesh in ("8x1", "4x2"):
        for batch in (64, 256):
            name = f"mesh_{mesh}_batch_{batch}"
            error = (failed or {}).get((mesh, batch))
            store.add(row(name, {"parallel.mesh": mesh, "train.batch_size": batch},
                          None if error else rec(name, batch / 8, mesh=mesh), error))


def test_mesh_by_batch_charts_name_the_runs_they_leave_out(tmp_path: Path) -> None:
    """Two meshes x two batches, and at mesh 8x1 batch 64 a bfloat16 run beside the float32 one: one bar per
    cell, so the chart says which run it left out."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        _mesh_batch_grid(store)
        store.add(row("mesh_8x1_batch_64_bf16", {"parallel.mesh": "8x1", "train.batch_size": 64,
                                                 "precision.dtype": "bfloat16"}, rec("bf16", 5.0, mesh="8x1")))
    paths = write_report(directory)
    text = paths.markdown.read_text()
    assert "mesh_batch_memory" in paths.charts and paths.clipped == {}
    assert ("left out, as another run has its mesh and batch (the first is drawn): mesh_8x1_batch_64_bf16."
            in text)


def test_an_old_record_with_a_zero_median_step_is_reported(tmp_path: Path) -> None:
    """A median step of 0.0 (an old record) gives no throughput to divide, and no ranking; the report is written."""
    zero = rec("z", 10.0)
    zero["measurements"]["step_time_s"].update(median=0.0, p90=0.0)
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        store.add(row("good", {"parallel.mesh": "8"}, rec("good", 12.0)))
        store.add(row("z", {"parallel.mesh": "4x2"}, zero))
    text = write_report(directory).markdown.read_text()
    speed = text.split("### Speed", 1)[1].split("###", 1)[0]
    assert "The only timed run: good, 12.0 ms per step." in speed and "z is" not in speed


def test_a_folder_of_runs_compares_the_losses_logged_beside_each_summary(tmp_path: Path) -> None:
    """Runs kept as benchmarks/data keeps them, metrics.jsonl beside summary.json: two layouts compared on their
    two logged losses and the test loss, 3 in all (the test loss alone without the logged ones)."""
    from shardbench.parsing import override
    from shardbench.presets import get_preset

    for mesh in ("8x1", "4x2"):
        folder = tmp_path / "runs" / mesh
        folder.mkdir(parents=True)
        cfg = override(get_preset("vit-tiny"), {"parallel.mesh": mesh, "train.out": f"runs/{mesh}"})
        (folder / "config.json").write_text(cfg.to_json())
        (folder / "summary.json").write_text(json.dumps(rec(mesh, 10.0, mesh=mesh)))
        (folder / "metrics.jsonl").write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.9}\n')
    text = write_report(tmp_path / "runs", out_dir=tmp_path / "out").markdown.read_text()
    assert "are the same computation in different layouts: their losses differ by at most 0.0e+00 (relative, over " \
           "3 compared losses)" in text


def test_swept_numbers_are_listed_ascending_and_names_in_first_use() -> None:
    """Runs read from folders come in name order (1024, 16384, 2048, 256): the lengths are listed as numbers."""
    from shardbench.report.write import swept_fields

    runs = [run(f"r{n}", {"model.seq_len": n, "parallel.context": mode}, 10.0)
            for n, mode in ((1024, "ring"), (16384, "ring"), (2048, "all-gather"), (256, "ring"))]
    swept = swept_fields(runs)
    assert swept["model.seq_len"] == [256, 1024, 2048, 16384]
    assert swept["parallel.context"] == ["ring", "all-gather"]


# ----------------------------------------------------------------------------- collectives: bytes sent, payloads
def _comms_run(name: str, strategy: str, comms: dict[str, tuple[int, float]], sent: dict[str, float] | None,
               unknown_loops: int | None = None) -> ReportedRun:
    made = record(name, strategy, "8", 8, breakdown=(1, 2, 1, 1), total=5.0, comms=comms, epochs=[], step_ms=10.0,
                  img_s=0.0, mfu=0.1, acc=0.5, partial=(10, 100, 1.0), sent=sent)
    if unknown_loops is not None:
        made["measurements"]["comms_unknown_trip_counts"] = unknown_loops
    return reported(row(name, {"parallel.strategy": strategy}, made))


def test_dp_and_zero2_compare_by_the_bytes_each_device_sends_and_older_records_by_their_payload() -> None:
    """8 MiB of gradients on 8 devices. dp's all-reduce: payload 8 MiB, sent 2 x 7/8 x 8 = 14 MiB. zero2's
    reduce-scatter and all-gather: payload 8 MiB each (16 in all), sent 7/8 x 8 = 7 MiB each, 14 in all: the same
    as dp's, where the payloads differ by 2x. An older zero2 record without bytes sent shows its payload, 16 MiB,
    and says so."""
    from shardbench.report.findings import comms_findings, strategy_findings

    dp = _comms_run("dp", "dp", {"all-reduce": (1, 8.0)}, {"all-reduce": 14.0})
    zero2 = _comms_run("zero2", "zero2", {"reduce-scatter": (1, 8.0), "all-gather": (1, 8.0)},
                       {"reduce-scatter": 7.0, "all-gather": 7.0})
    old = _comms_run("old", "fsdp", {"reduce-scatter": (1, 8.0), "all-gather": (1, 8.0)}, None, unknown_loops=2)
    assert (dp.comms_mib, zero2.comms_mib, old.comms_mib) == (14.0, 14.0, 16.0)
    assert (dp.comms_sent, zero2.comms_sent, old.comms_sent) == (True, True, False)
    sentences = strategy_findings([dp, zero2, old])
    assert "and sends 14.0 MiB per device per step in collectives (all-reduce)." in sentences[0]
    assert "and sends 14.0 MiB per device per step in collectives (all-gather, reduce-scatter)." in sentences[1]
    assert "and has 16.0 MiB of collective payload per device per step (all-gather, reduce-scatter)." in sentences[2]
    said = comms_findings([dp, zero2, old])
    assert said[0].startswith("Collective figures are the bytes each device sends per step on a ring")
    assert said[1].startswith("old: recorded before the bytes each device sends were kept, so its collective "
                              "figures are payloads") and said[1].endswith("with the other runs' bytes sent.")
    assert said[2] == ("old: 2 loops of its step ran an unknown number of times (XLA recorded no trip count): "
                       "collectives inside them are counted once, so its collective figures undercount them.")
    assert comms_findings([dp, zero2]) == [said[0]]
    table = {column.key: column for column in COLUMNS}
    assert (table["comms_mib"].text(dp), table["comms_mib"].text(old)) == ("14.00", "16.00 (payload)")
    assert [comms_measure(runs) for runs in ([dp, zero2], [old], [dp, old])] == ["sent", "payload", "mixed"]
    # One strategy with a new record and an older one: each figure under its own measure, never one span of both
    # called payload ("has 14.0-16.0 MiB of collective payload").
    fsdp = _comms_run("fsdp", "fsdp", {"reduce-scatter": (1, 8.0), "all-gather": (1, 8.0)},
                      {"reduce-scatter": 7.0, "all-gather": 7.0})
    mixed = strategy_findings([fsdp, old])[0]
    assert ("and sends 14.0 MiB per device per step in collectives (all-gather, reduce-scatter) where the record "
            "counts bytes sent, and has 16.0 MiB of collective payload where an older record counts only that."
            ) in mixed, mixed


def test_a_strategy_sentence_says_which_of_its_axes_no_run_split() -> None:
    """fsdp+tp on 8 devices with no --mesh runs on 8x1: the sentence said it shards "over both mesh axes" where
    nothing was split over model. Said where every run of the strategy left the axis whole; a run that split it
    makes the axis split; pipeline axes are read from named meshes, and dp (one axis) gets no clause."""
    from shardbench.report.findings import strategy_findings

    def said(*runs: tuple[str, str]) -> str:
        made = [run(f"r{i}", {"parallel.strategy": strategy}, 10.0, strategy=strategy, mesh=mesh)
                for i, (strategy, mesh) in enumerate(runs)]
        return strategy_findings(made)[0]

    assert said(("fsdp+tp", "8x1")).startswith(
        "FSDP+TP shards parameters and optimizer state over the data and model axes (here its model axis has one "
        "device, so nothing is split over it): ")
    assert said(("fsdp+tp", "4x2")).startswith(
        "FSDP+TP shards parameters and optimizer state over the data and model axes: ")
    assert said(("fsdp+tp", "8x1"), ("fsdp+tp", "4x2")).startswith(
        "FSDP+TP shards parameters and optimizer state over the data and model axes: ")
    assert "(here its stage and model axes have one device each, so nothing is split over them)" in said(
        ("dp+pp+tp", "data=8"))
    assert "(here" not in said(("dp", "8x1")) + said(("single", "none"))


def test_a_record_that_never_counted_its_collectives_is_not_said_to_have_none() -> None:
    """A record written before collectives were counted (no comms, no total) read as "none", a claim that the run
    moved nothing between devices; one that counted them and found none still reads "none"."""
    table = {column.key: column for column in COLUMNS}
    counted = _comms_run("counted", "single", {}, None)
    old = rec("old", 10.0)
    del old["measurements"]["comms"], old["measurements"]["comms_total_bytes"]
    never = reported(row("never", {}, old))
    assert (table["collectives"].text(counted), table["collectives"].text(never)) == ("none", "–")


# ----------------------------------------------------------------------------- audit: the report's own faults
def _kept_run(folder: Path, name: str, written_to: Path, losses: tuple[float, float]) -> None:
    """A run folder as benchmarks/data keeps them (config.json, summary.json and metrics.jsonl side by side),
    whose record and config name `written_to` as where it was first written."""
    from shardbench.parsing import override
    from shardbench.presets import get_preset

    folder.mkdir(parents=True)
    mesh = {"a": "8x1", "b": "4x2"}[name]
    cfg = override(get_preset("vit-tiny"), {"parallel.mesh": mesh, "train.out": str(written_to)})
    (folder / "config.json").write_text(cfg.to_json())
    (folder / "summary.json").write_text(json.dumps(rec(name, 10.0, mesh=mesh) | {"out": str(written_to)}))
    (folder / "metrics.jsonl").write_text("".join(f'{{"step": {step}, "train/loss": {loss}}}\n'
                                                  for step, loss in zip((1, 2), losses, strict=True)))


def test_the_losses_compared_are_those_beside_each_summary_whichever_parent_is_reported(tmp_path: Path) -> None:
    """Runs a and b kept in kept/sweep/{a,b}, first written to first/{a,b}, which still hold identical losses
    (2.0, 1.9). The kept b logged 2.6 at step 1: its own losses are (2.6 - 2.0) / 2.6 = 2.3e-01 apart from a's
    there, whether kept/sweep or kept is reported (reading first/ when the run's name is not a folder beside the
    reported one made kept pass where kept/sweep failed)."""
    for name, kept_losses in (("a", (2.0, 1.9)), ("b", (2.6, 1.9))):
        first = tmp_path / "first" / name
        first.mkdir(parents=True)
        (first / "metrics.jsonl").write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.9}\n')
        _kept_run(tmp_path / "kept" / "sweep" / name, name, first, kept_losses)
    for reported_dir in (tmp_path / "kept" / "sweep", tmp_path / "kept"):
        paths = write_report(reported_dir, out_dir=tmp_path / "out")
        assert paths.differing == ("a, b differ by 2.3e-01 at step 1 (tolerance 2e-03): see the report",), reported_dir
        assert ("a, b should be the same computation but differ: their losses are 2.3e-01 apart (relative) at step 1"
                in paths.markdown.read_text())


@pytest.mark.parametrize(("text", "says"), [
    ("[1]", "is not a run's record (a JSON object), but a list"),
    # An object that is not a record: `{}` was reported as a complete run (a row of dashes, "2 complete").
    ("{}", "is not a finished run's record: its status is None, where a record shardbench train wrote says "
           "'complete'; remove it, or train the run again"),
])
def test_a_summary_that_is_not_a_record_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               text: str, says: str) -> None:
    """summary.json holding [1] (valid JSON, not a record) or {}: a data error naming the file (exit 4, as a
    config.json that is not a table of sections), not an internal error (exit 70) nor a complete run."""
    import argparse

    from shardbench.errors import EXIT_CODES, run_reported
    from shardbench.report import report_cmd

    folder = tmp_path / "runs" / "r1"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(text)
    parser = argparse.ArgumentParser()
    report_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert run_reported(lambda: report_cmd.run(args)) == EXIT_CODES["data"] == 4
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"shardbench: error: {folder / 'summary.json'} {says}"]


def test_runs_past_the_compared_steps_without_logged_losses_are_said_not_compared(tmp_path: Path) -> None:
    """Two layouts of one computation trained 1,000 steps, test losses 2.0 and 3.0: a test loss after step 200 is
    not compared, and neither run logged a loss, so the report says the group was not compared and why (it said
    nothing). With train losses logged at steps 10 and 20 (2.0 and 1.8 each), they are compared on those 2."""
    def long_run(name: str, mesh: str, test_loss: float) -> RunRow:
        made = rec(name, 10.0, mesh=mesh) | {"steps": 1000, "test_loss": test_loss}
        return row(name, {"parallel.mesh": mesh, "train.steps": 1000}, made)

    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        store.add(long_run("a", "8x1", 2.0))
        store.add(long_run("b", "4x2", 3.0))
    paths = write_report(directory)
    assert paths.differing == ()
    assert ("- a, b differ only in layout but their losses were not compared: they trained 1,000 steps, and a test "
            "or last loss after step 200 is not compared, as the losses of layouts may drift apart chaotically by "
            "then; they logged no train loss within the first 200 steps that the report found (in the metrics.jsonl "
            "of a run's folder).") in paths.markdown.read_text()
    for name in ("a", "b"):
        (directory / "runs" / name).mkdir(parents=True)
        (directory / "runs" / name / "metrics.jsonl").write_text(
            '{"step": 10, "train/loss": 2.0}\n{"step": 20, "train/loss": 1.8}\n{"step": 900, "train/loss": 1.0}\n')
    assert ("a, b are the same computation in different layouts: their losses differ by at most 0.0e+00 (relative, "
            "over 2 compared losses)") in write_report(directory).markdown.read_text()
    # A run and a repeat of it (its resume, say) in the same layout are not "different layouts".
    again = tmp_path / "again"
    with Store(again / "sweep.db") as store:
        store.add(long_run("full", "8x1", 2.0))
        store.add(long_run("res", "8x1", 2.0))
    for name in ("full", "res"):
        (again / "runs" / name).mkdir(parents=True)
        (again / "runs" / name / "metrics.jsonl").write_text('{"step": 10, "train/loss": 2.0}\n')
    assert ("full, res are the same computation in one layout (repeats of one run): their losses differ by at most "
            "0.0e+00") in write_report(again).markdown.read_text()
    # The mesh left to its default in one sweep and written out in another: one layout, as their records say it
    # ran (the report of both sweeps called them "different layouts").
    spelled = tmp_path / "spelled"
    with Store(spelled / "sweep.db") as store:
        store.add(row("default", {"parallel.mesh": "", "train.steps": 1000},
                      rec("default", 10.0, mesh="8x1") | {"steps": 1000, "test_loss": 2.0}))
        store.add(long_run("named", "8x1", 2.0))
    for name in ("default", "named"):
        (spelled / "runs" / name).mkdir(parents=True)
        (spelled / "runs" / name / "metrics.jsonl").write_text('{"step": 10, "train/loss": 2.0}\n')
    assert ("default, named are the same computation in one layout (repeats of one run)"
            in write_report(spelled).markdown.read_text())


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_accumulation_is_a_layout_where_no_microbatch_draws_masks_of_its_own(tmp_path: Path, dropout: float) -> None:
    """dp and dp accumulating 2 microbatches make the whole batch's update, up to the order of its sums: they were
    never compared. With dropout each microbatch draws its own masks, and they are not one computation."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for name, k in (("whole", 1), ("accum", 2)):
            store.add(row(name, {"train.grad_accum": k, "model.dropout": dropout}, rec(name, 10.0)))
    text = write_report(directory).markdown.read_text()
    assert ("whole, accum are the same computation in different layouts" in text) is (dropout == 0.0)


def test_run_folders_without_config_are_ranked_by_their_records_and_never_called_one_computation(
        tmp_path: Path) -> None:
    """Two folders with summary.json alone: dp at 10 ms and fsdp at 25 ms per step, global batch 1,024 in their
    records. The strategies are what was swept, the speed ranking has fsdp 2.50x slower, the batch column reads
    1,024, and the two are not called the same computation: without config.json nothing says they train one model
    (the report had no Speed section, said the runs shared one configuration and compared their losses)."""
    for name, step in (("dp", 10.0), ("fsdp", 25.0)):
        made = rec(name, step, strategy=name)
        made["measurements"]["global_batch"] = 1024
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps(made))
    paths = write_report(tmp_path / "runs", out_dir=tmp_path / "out")
    text = paths.markdown.read_text()
    assert "- `parallel.strategy`: dp, fsdp\n" in text and "share one configuration" not in text
    speed = text.split("### Speed", 1)[1].split("###", 1)[0]
    assert "- Fastest: dp, 10.0 ms per step (ranked by median step time).\n" in speed
    assert ("- fsdp is 2.50x slower (25.0 ms against 10.0 ms); it differs in: parallel.strategy fsdp against dp."
            in speed)
    assert [r["batch"] for r in markdown_table(text)] == ["1,024", "1,024"]
    assert "are the same computation" not in text
    assert ("- dp, fsdp were not compared with any run: their folders have no config.json, so the report knows only "
            "the strategy, mesh, devices, SPMD style, model kind and global batch their records give, not whether "
            "they compute what another run does (a model's shape, the data, seed, steps and precision).") in text


def test_a_folder_mixing_runs_with_and_without_config_json_names_each_group_by_what_its_runs_give(
        tmp_path: Path) -> None:
    """Runs a (embed_dim 64, 10 ms) and b (embed_dim 128, 20 ms) with the config.json a run writes, and c (30 ms)
    with its summary.json alone. What was swept is embed_dim 64 and 128 (no None for c, whose record does not say
    its width), the groups are named by embed_dim, and c's by the missing configuration: not by every setting of
    the model (c gave none of them, which read as a difference in each)."""
    from shardbench.presets import get_preset

    base = get_preset("vit-tiny")
    for name, step, dim in (("a", 10.0, 64), ("b", 20.0, 128), ("c", 30.0, None)):
        made = rec(name, step, mesh="8") | {"model": "vit"}
        made["measurements"]["global_batch"] = 1024
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps(made))
        if dim is not None:
            cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, embed_dim=dim),
                                      parallel=dataclasses.replace(base.parallel, strategy="dp", mesh="8", devices=8),
                                      train=dataclasses.replace(base.train, batch_size=1024))
            (tmp_path / "runs" / name / "config.json").write_text(json.dumps(cfg.to_dict()))
    text = write_report(tmp_path / "runs", out_dir=tmp_path / "out").markdown.read_text()
    assert text.split("## What was swept\n\n")[1].split("\n\n")[0] == "- `model.embed_dim`: 64, 128"
    speed = text.split("### Speed\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert speed == ["- The only timed run without config.json: c, 30.0 ms per step.",
                     "- The only timed run at embed_dim 64: a, 10.0 ms per step.",
                     "- The only timed run at embed_dim 128: b, 20.0 ms per step."]
    precision = text.split("### Precision and memory\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split(":")[0] for line in precision] == ["- embed_dim 64", "- embed_dim 128",
                                                           "- without config.json"]
    # With one configured group, its settings do not tell it apart: it is the one "with config.json" (its name
    # was empty beside "without config.json").
    from shardbench.report.speed import label

    a, c = (("model", "vit"), ("model.embed_dim", "64")), (("model", "vit"),)
    assert (label(a, [a, c]), label(c, [a, c])) == ("with config.json", "without config.json")


def test_a_compile_time_loaded_from_the_compilation_cache_is_marked_and_not_ranked_with_compilations() -> None:
    """Four runs of one work: a compiled in 4.7 s (a record without cache counts), b in 2.0 s (0 of 8 programs
    from the cache), c in 0.1 s with all 8 from the cache, d in 0.2 s with 3 of 8. The compile range is b's 2.0 s
    to a's 4.7 s: c's load is no compilation (it read "0.1 s (c) to 4.7 s (a)"), nor is d's, partly a load (it
    read "0.2 s (d)": a sweep sharing the machine's cache often hits some programs). Both are named with what
    the cache answered, and their table cells say so."""
    def timed(name: str, compile_s: float, cache: tuple[int, int] | None) -> ReportedRun:
        made = rec(name, 10.0)
        made["measurements"]["compile"]["compile_s"] = compile_s
        if cache is not None:
            made["measurements"]["compile_cache"] = {"dir": "/cache", "hits": cache[0], "requests": cache[1]}
        return reported(row(name, {}, made))

    runs = [timed("a", 4.7, None), timed("b", 2.0, (0, 8)), timed("c", 0.1, (8, 8)), timed("d", 0.2, (3, 8))]
    found = speed_findings(runs)
    assert "Compilation, which the step times leave out, took 2.0 s (b) to 4.7 s (a)." in found
    assert ("From the persistent compilation cache (--train.compile-cache), c every program, d 3 of its 8 "
            "programs: their compile time is wholly or partly a load from disk, not a compilation, and is "
            "compared with no other run's.") in found
    column = next(c for c in COLUMNS if c.key == "compile_s")
    assert [column.text(r) for r in runs] == ["4.70", "2.00", "0.10 (cache)", "0.20 (cache 3/8)"]


def test_runs_of_one_name_from_two_sweeps_are_each_named_by_their_folder_and_a_default_is_said(
        tmp_path: Path) -> None:
    """Folders a/dp and b/dp both hold a run named strategy_dp, and b/fsdp one named strategy_fsdp: the two of one
    name are each named by their folder (the first kept its record's name, so a/dp's row could not be told from
    one of b's), the third keeps its own. a/dp ran on the default mesh (''), which what was swept calls
    "(default, ran as 8)", with the mesh its record says (an empty item before; "(default)" beside 8 after)."""
    from shardbench.presets import get_preset

    base = get_preset("vit-tiny")
    for folder, name, step, mesh in (("a/dp", "strategy_dp", 10.0, ""), ("b/dp", "strategy_dp", 12.0, "8"),
                                     ("b/fsdp", "strategy_fsdp", 14.0, "8")):
        made = rec(name, step, mesh="8") | {"model": "vit"}
        (tmp_path / "runs" / folder).mkdir(parents=True)
        (tmp_path / "runs" / folder / "summary.json").write_text(json.dumps(made))
        cfg = dataclasses.replace(base, parallel=dataclasses.replace(base.parallel, mesh=mesh))
        (tmp_path / "runs" / folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    text = write_report(tmp_path / "runs", out_dir=tmp_path / "out").markdown.read_text()
    assert [r["run"] for r in markdown_table(text)] == ["a/dp", "b/dp", "strategy_fsdp"]
    assert "- `parallel.mesh`: (default, ran as 8), 8\n" in text


def test_a_report_of_two_sweeps_says_what_both_held_fixed(tmp_path: Path) -> None:
    """Two sweeps reported together, both given --steps 6 and --model.embed-dim 32, one --devices 8 too: the report
    of each says what it held fixed, and the report of both said nothing. It says what both held alike."""
    for sweep, base, strategy in (("s1", {"train.steps": 6, "model.embed_dim": 32}, "dp"),
                                  ("s2", {"train.steps": 6, "model.embed_dim": 32, "parallel.devices": 8}, "fsdp")):
        with Store(tmp_path / "both" / sweep / "sweep.db") as store:
            store.set_meta("base", base)
            store.add(row(f"strategy_{strategy}", {"parallel.strategy": strategy}, rec(strategy, 10.0)))
    text = write_report(tmp_path / "both").markdown.read_text()
    fixed = next(line for line in text.splitlines() if line.startswith("Set the same for every run: "))
    assert fixed == "Set the same for every run: `model.embed_dim` = 32, `train.steps` = 6", fixed


def test_a_speed_sentence_gives_throughput_in_the_tables_unit() -> None:
    """Two LM runs at batch 16 and 32 (so ranked by throughput), 1,024 tokens an example: 16 / 0.5 s = 32
    examples/s = 32,768 tokens/s against 32 / 0.8 s = 40 = 40,960 tokens/s, as the table's tokens/s column counts
    them (the sentence said "32 against 40 examples/s"). A ViT's are images/s."""
    def lm(name: str, batch: int, step_s: float) -> ReportedRun:
        made = rec(name, step_s * 1e3) | {"model": "lm"}
        m = made["measurements"]
        m["global_batch"] = batch
        m["throughput"] = {"examples_per_s": batch / step_s, "unit": "tokens", "units_per_s": batch * 1024 / step_s}
        return reported(row(name, {"model.kind": "lm", "train.batch_size": batch}, made))

    found = speed_findings([lm("small", 16, 0.5), lm("large", 32, 0.8)])
    assert found[0].startswith("Fastest: large, 800.0 ms per step at batch 32, 40,960 tokens/s")
    assert found[1].startswith("small is 1.25x slower (32,768 against 40,960 tokens/s)")
    vit = [run("a", {"train.batch_size": 128}, 10.0), run("b", {"train.batch_size": 64}, 10.0)]
    vit = [dataclasses.replace(r, config={**r.config, "train.batch_size": b}) for r, b in zip(vit, (128, 64))]
    assert "images/s" in speed_findings(vit)[0]


def test_the_context_and_plan_sections_call_a_gap_within_the_spread_a_tie_as_the_speed_section_does() -> None:
    """Ring 100 ms and all-gather 101 ms at 1,024 tokens, 300 and 301 ms at 2,048, every p90 1.25x its median (37
    timed steps): gaps of 1.0% and 0.3%, within the 25% spread, which Speed calls ties; the context sentence called
    the ring the faster at every length. Plan: a predicted fastest at 100.5 ms against b's measured 100.0 ms
    (+0.5%, within 25%) is a tie too, not a miss."""
    def ctx(name: str, mode: str, tokens: int, ms: float) -> ReportedRun:
        return run(name, {"model.kind": "lm", "parallel.strategy": "cp", "parallel.context": mode,
                          "model.seq_len": tokens, "train.batch_size": 4}, ms, p90=1.25)

    runs = [ctx("ring_1k", "ring", 1024, 100.0), ctx("ag_1k", "all-gather", 1024, 101.0),
            ctx("ring_2k", "ring", 2048, 300.0), ctx("ag_2k", "all-gather", 2048, 301.0)]
    speed = speed_findings(runs)
    assert speed[1].startswith("ag_1k ties with ring_1k (101.0 ms against 100.0 ms): the 1.0% difference")
    assert speed[3].startswith("ag_2k ties with ring_2k (301.0 ms against 300.0 ms): the 0.3% difference")
    (said,) = context_findings(runs)
    assert said.endswith(
        ": on this machine neither step was decidedly the faster at any length measured (tied at 1,024, 2,048 "
        "tokens, where the two steps differ by less than the spread of their own step times, median to p90).")
    # A tie at the shortest length and a 2x win at the longer one: the ring is the faster from 2,048 on.
    runs[3] = ctx("ag_2k", "all-gather", 2048, 600.0)
    assert context_findings(runs)[0].endswith(
        "the ring overtakes the all-gather from 2,048 tokens on (its step was tied at 1,024 tokens, where the two "
        "steps differ by less than the spread of their own step times, median to p90).")
    planned = [run("a", {"parallel.mesh": "8x1"}, 100.5, 1.0, p90=1.25),
               run("b", {"parallel.mesh": "4x2"}, 100.0, 2.0, p90=1.25)]
    assert speed_findings(planned)[1].startswith("a ties with b (100.5 ms against 100.0 ms)")
    assert plan_findings(planned)[0].endswith(
        "the plan's fastest, a, ties with the fastest measured, b (100.5 against 100.0 ms, +0.5%, within the spread "
        "of their step times, median to p90, up to 25.0%).")


def test_a_gap_is_a_tie_within_the_larger_of_the_two_runs_spreads() -> None:
    """Two runs with different spreads: a's p90 is 1.02x its median (2%), b's 1.10x (10%), 37 timed steps each.
    b at 105 ms is 5% slower than a at 100 ms: beyond a's 2% spread but within b's 10%, so by the rule "a gap
    within the larger of the two spreads is a tie" they tie, up to 10.0%. The same 5% with the wide spread on the
    faster run ties too (the rule is symmetric). c at 111 ms (p90 1.10x) is 11% slower than a: beyond the larger
    spread, 10%, so apart (the sum of the spreads, 12%, would have called it a tie). Every other fixture gives its runs one p90/median ratio, where the larger spread and the smaller are equal."""
    narrow, wide = {"p90": 1.02}, {"p90": 1.10}
    found = speed_findings([run("a", {"parallel.mesh": "8x1"}, 100.0, **narrow),
                            run("b", {"parallel.mesh": "4x2"}, 105.0, **wide),
                            run("c", {"parallel.mesh": "2x4"}, 111.0, **wide)])
    assert found[1] == ("b ties with a (105.0 ms against 100.0 ms): the 5.0% difference is within the spread of "
                        "their step times (median to p90, up to 10.0%), so this ranking cannot tell them apart.")
    assert found[2].startswith("c is 1.11x slower (111.0 ms against 100.0 ms); it differs in: parallel.mesh 2x4")
    swapped = speed_findings([run("a", {"parallel.mesh": "8x1"}, 100.0, **wide),
                              run("b", {"parallel.mesh": "4x2"}, 105.0, **narrow)])
    assert swapped[1].startswith("b ties with a (105.0 ms against 100.0 ms): the 5.0% difference")
    assert swapped[1].endswith("(median to p90, up to 10.0%), so this ranking cannot tell them apart.")


def test_the_memory_breakdown_holds_the_model_state_so_its_total_is_memory_per_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of your own with 50 MiB of BatchNorm statistics and RNG state beside parameters 1, optimizer 2,
    gradients 1, activations 1 and 3 MiB of other outputs: compiled total 58 MiB. The stacked bar ends at 58.0
    (it ended at 8.0, the model state left out) and the table gives model state 50.0 MiB; a built-in model's 0
    draws and shows none."""
    made = rec("own", 10.0)
    made["measurements"]["memory"]["breakdown"] |= {"model_state_bytes": 50 * 2**20, "other_bytes": 3 * 2**20}
    made["measurements"]["memory"]["total_bytes"] = 58 * 2**20
    own = reported(row("own", {}, made))
    drawn: dict[str, Any] = {}
    monkeypatch.setattr(plots, "_save", lambda fig, out, name, title, note="": drawn.setdefault(name, fig))
    plots.memory_breakdown([own], tmp_path)
    ax = drawn["memory_breakdown"].axes[0]
    assert own.memory == (58.0, "compiled") and [t.get_text() for t in ax.texts] == [" 58.0", "dp"]
    assert "model state (BatchNorm statistics, RNG)" in [t.get_text() for t in ax.get_legend().get_texts()]
    column = next(c for c in COLUMNS if c.key == "model_state_mib")
    assert column.text(own) == "50.0" and column in shown(COLUMNS, [own])
    plain = rec("vit", 10.0)
    plain["measurements"]["memory"]["breakdown"]["model_state_bytes"] = 0
    builtin = reported(row("vit", {}, plain))
    drawn.clear()
    plots.memory_breakdown([builtin], tmp_path)
    assert "model state (BatchNorm statistics, RNG)" not in [
        t.get_text() for t in drawn["memory_breakdown"].axes[0].get_legend().get_texts()]
    assert column not in shown(COLUMNS, [builtin])


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every figure the charts draw, by chart name, as they are saved (the figures the PNGs are written from)."""
    figures: dict[str, Any] = {}
    save = plots._save

    def spy(fig: Any, out: Path, name: str, title: str, note: str = "") -> Any:
        figures[name] = fig
        return save(fig, out, name, title, note)

    monkeypatch.setattr(plots, "_save", spy)
    return figures


def test_mesh_by_batch_charts_mark_the_runs_that_failed(tmp_path: Path, drawn: dict[str, Any]) -> None:
    """Meshes 8x1 and 4x2 x batches 64 and 256, the 4x2 run at batch 256 out of memory, and a run at batch 1,024
    (no bar has that batch) out of memory too: the first keeps its cell (mesh 1, second batch of two: x = 1 - 0.4
    + 0.4 x 1.5 = 1.2) as a gap labelled 'failed (oom)', the second is named in the caption (both were dropped
    without a word)."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        _mesh_batch_grid(store, failed={("4x2", 256): ("oom", "RESOURCE_EXHAUSTED")})
        store.add(row("mesh_8x1_batch_1024", {"parallel.mesh": "8x1", "train.batch_size": 1024}, None,
                      ("oom", "RESOURCE_EXHAUSTED")))
        # A second failure in the gap's cell (it was not named), and a tp run refused before its strategy chose a
        # mesh (the caption called its mesh "tp").
        store.add(row("mesh_4x2_batch_256_bf16", {"parallel.mesh": "4x2", "train.batch_size": 256,
                                                  "precision.dtype": "bfloat16"}, None, ("oom", "RESOURCE_EXHAUSTED")))
        store.add(row("tp_batch_64", {"parallel.strategy": "tp", "train.batch_size": 64}, None,
                      ("config", "tp: model.num_heads = 2 is not divisible by 8")))
    paths = write_report(directory)
    caption = ("No bar, a labelled gap: mesh_4x2_batch_256, failed (oom); mesh_4x2_batch_256_bf16, failed (oom). "
               "Not drawn, at a mesh or batch size no bar has: mesh_8x1_batch_1024, failed (oom) (mesh 8x1, batch "
               "1024); tp_batch_64, failed (config) (mesh unrecorded, batch 64).")
    for name in ("mesh_batch_epoch_time", "mesh_batch_memory"):
        ax = drawn[name].axes[0]
        assert [(t.get_text(), round(t.get_position()[0], 6)) for t in ax.texts if "failed" in t.get_text()] == [
            (" failed (oom)", 1.2)]
        assert len(ax.patches) == 3
    text = paths.markdown.read_text()
    assert text.count(caption) == 2 and paths.clipped == {}


def test_a_strategy_whose_runs_all_failed_is_not_in_the_legends(tmp_path: Path, drawn: dict[str, Any]) -> None:
    """dp measured, tp refused: the per-run charts' legends name dp only (tp had an entry and no bar)."""
    runs = [run("dp_run", {"parallel.strategy": "dp"}, 10.0),
            reported(row("tp_run", {"parallel.strategy": "tp"}, None, ("config", "tp: heads not divisible")))]
    plots.write_charts(runs, tmp_path)
    legends = {name: [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
               for name, fig in drawn.items()}
    assert {"step_time", "throughput", "epoch_time", "peak_memory"} <= legends.keys()
    for name in ("step_time", "throughput", "epoch_time", "peak_memory"):
        assert legends[name] == ["dp"], (name, legends[name])


def test_mesh_by_batch_charts_name_a_failed_run_whose_cell_another_run_fills(tmp_path: Path) -> None:
    """Meshes 8x1 and 4x2 x batches 64 and 256, each drawn, and at 4x2 batch 64 a second run (another learning
    rate) that diverged: its cell has a bar, so no gap can show it, and the caption names it (it was dropped
    without a word)."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        _mesh_batch_grid(store)
        store.add(row("mesh_4x2_batch_64_lr_1e12", {"parallel.mesh": "4x2", "train.batch_size": 64, "optim.lr": 1e12},
                      None, ("diverged", "loss is nan at step 2")))
    text = write_report(directory).markdown.read_text()
    assert text.count("Not drawn, at a mesh and batch size another run's bar has: mesh_4x2_batch_64_lr_1e12, "
                      "failed (diverged) (mesh 4x2, batch 64).") == 2  # under both mesh x batch charts


def test_mesh_by_batch_charts_are_not_drawn_across_models_and_a_failed_single_run_is_on_one_device(
        tmp_path: Path) -> None:
    """A folder holding a ViT's and an MLP's runs at meshes 8x1 and 4x2 x batches 64 and 256, no cell shared: one
    bar per cell would set one model's mesh beside the other's, so the charts are left out with a line (they were
    drawn, unlabelled). A timed-out run with strategy single, configured with --devices 8, ran on one device: the
    table says 1 (it said 8)."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for kind, mesh in (("vit", "8x1"), ("mlp", "4x2")):
            for batch in (64, 256):
                name = f"{kind}_{mesh}_{batch}"
                store.add(row(name, {"model.kind": kind, "parallel.mesh": mesh, "train.batch_size": batch},
                              rec(name, batch / 8, mesh=mesh)))
        store.add(row("lone", {"parallel.strategy": "single", "parallel.devices": 8, "parallel.mesh": "none"}, None,
                      ("timeout", "past --timeout 6 s")))
    paths = write_report(directory)
    text = paths.markdown.read_text()
    assert "mesh_batch_memory" not in paths.charts and "mesh_batch_epoch_time" not in paths.charts
    assert "per mesh and batch size: left out, as the runs train 2 models (vit, mlp)" in text
    lone = next(r for r in markdown_table(text) if r["run"] == "lone")
    assert lone["devices"] == "1"


def test_a_report_of_runs_none_of_which_completed_says_so_for_communication(tmp_path: Path) -> None:
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        store.add(row("a", {"parallel.mesh": "8"}, None, ("timeout", "past --timeout 6 s")))
    text = write_report(directory).markdown.read_text()
    assert "Communication per step: left out, as no run completed." in text
    assert "no run moves bytes between devices" not in text

def test_columns_no_run_has_are_left_out(tmp_path: Path) -> None:
    """Two runs of part of an epoch each (no epoch time), no MFU and no test accuracy: the table has no "epoch
    time s", "MFU %" or "test acc %" column (each was a column of dashes), and every column it has holds a value
    in some row."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for name, mesh in (("a", "8x1"), ("b", "4x2")):
            made = rec(name, 10.0, mesh=mesh) | {"test_accuracy": None}
            made["measurements"]["mfu"] = {"mfu": None, "not_measured": "no peak FLOP/s is known for cpu"}
            store.add(row(name, {"parallel.mesh": mesh}, made))
    table = markdown_table(write_report(directory).markdown.read_text())
    assert not {"epoch time s", "MFU %", "test acc %"} & set(table[0])
    assert {"step ms median", "memory/device MiB", "test loss"} <= set(table[0])
    assert all(any(r[label] != "–" for r in table) for label in table[0])


def test_memory_charts_are_titled_by_what_their_bars_are(tmp_path: Path) -> None:
    """Runs on CPU report no runtime peak: their bars are XLA's compiled totals, and the charts say so (both were
    titled "Peak memory"); a run with a peak of 12.5 MiB is a runtime peak; the two together are said both."""
    def one(name: str, peak: float | None, mesh: str = "8", batch: int = 128) -> ReportedRun:
        made = rec(name, 10.0, mesh=mesh)
        made["measurements"]["memory"]["peak_bytes_in_use"] = None if peak is None else int(peak * 2**20)
        return reported(row(name, {"parallel.mesh": mesh, "train.batch_size": batch}, made))

    def title(runs: list[ReportedRun]) -> str:
        chart = plots.peak_memory(runs, tmp_path)
        assert not isinstance(chart, str)
        return chart.title

    assert title([one("cpu", None)]) == "Compiled memory total per device per run"
    assert title([one("gpu", 12.5)]) == "Runtime peak memory per device per run"
    assert title([one("gpu", 12.5), one("cpu", None)]) == \
        "Memory per device per run (runtime peak; hatched: compiled total)"
    grid = [one(f"m{mesh}_b{batch}", None, mesh, batch) for mesh in ("8x1", "4x2") for batch in (64, 256)]
    chart = plots.mesh_batch_memory(grid, tmp_path)
    assert not isinstance(chart, str) and chart.title == "Compiled memory total per device per mesh and batch size"
    assert chart.clipped == ()  # the title wraps to the narrow figure's width


def test_the_cost_note_says_what_each_rows_price_is_for() -> None:
    """The packaged cpu row is priced per host, tpu-v3's per chip (two JAX devices each), h100's per device: the
    note named none of it ("x devices x the hourly price"), though a CPU run's 8 simulated devices cost one host."""
    from shardbench.report.cost import cost_note

    def priced(name: str, row_name: str, count: int) -> ReportedRun:
        made = rec(name, 10.0) | {"cost": {"device": row_name, "devices": count, "on_demand_usd": 1.0,
                                           "prices": "packaged"}}
        return reported(row(name, {}, made))

    note = cost_note([priced("a", "cpu", 1), priced("b", "tpu-v3", 4), priced("c", "h100", 8)])
    assert note == (" Cost per epoch is steps per epoch x median step x the row's hourly price x the hosts, chips or "
                    "devices it is for (row cpu: per host; row h100: per device; row tpu-v3: per chip of 2 JAX "
                    "devices; packaged price table: sources and dates in each record's cost.price_source and "
                    "docs/cost.md); kWh is measured power (NVML) where the energy column says measured, else the "
                    "table's watts.")


def test_an_old_records_wall_clock_rate_is_marked_and_not_drawn_as_batch_over_step(tmp_path: Path) -> None:
    """Two schema-0 records: "timed" with a 10 ms median step at batch 128 (12,800 images/s, batch over step) and
    "untimed" without a step time, whose only figure is its wall-clock 900 images/s. The table gives 12,800 and
    "900 (wall clock)" (900 read as batch over step before), the note says why, and the chart, whose bars are
    batch over step, leaves a gap saying so."""
    untimed = rec("untimed", 10.0) | {"images_per_s": 900.0}
    untimed["measurements"]["step_time_s"] = {"median": None, "p90": None, "not_measured": "1 step"}
    untimed["measurements"]["throughput"] = {"examples_per_s": 900.0, "examples_per_s_per_device": 112.5}
    runs = [reported(row("timed", {}, rec("timed", 10.0))), reported(row("untimed", {}, untimed))]
    column = next(c for c in COLUMNS if c.key == "img_s")
    assert [column.text(r) for r in runs] == ["12,800", "900 (wall clock)"]
    fig = plots.throughput_figure(runs)
    assert not isinstance(fig, str)
    assert [round(p.get_width(), 6) for p in fig.axes[0].patches] == [12_800.0, 0.0]
    assert "wall-clock rate only (a record before schema 2 with no step time)" in [
        t.get_text().strip() for t in fig.axes[0].texts]
    from shardbench.report.write import wall_note
    assert wall_note(runs) == (' Throughput marked "wall clock" (untimed) is not the batch over the median step: the '
                               "record, written before schema 2 and without a step time, has only the epochs' "
                               "examples over their wall time, data loading included.")


def test_markdown_cells_findings_and_error_messages_are_shown_literally(tmp_path: Path) -> None:
    """A run named "_lr*2_", a slower one named "mesh_<4>", and a failed run "mesh_<4x2>" whose message ends 'in
    <module>' and holds a `*`: report.md escapes what Markdown would read as markup (the message's "<module>"
    rendered as an unknown HTML tag, dropped, and "*2_" as emphasis), in the table, the failed runs, the findings
    and the charts' notes alike, and leaves a name's inner underscores as they are."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        store.add(row("_lr*2_", {"parallel.mesh": "8x1"}, rec("_lr*2_", 10.0, mesh="8x1")))
        store.add(row("mesh_<4>", {"parallel.mesh": "2x4"}, rec("mesh_<4>", 20.0, mesh="2x4")))
        store.add(row("mesh_<4x2>", {"parallel.mesh": "4x2"}, None,
                      ("crash", 'File "train.py", line 3, in <module>: x * y | z')))
    text = write_report(directory).markdown.read_text()
    assert "| \\_lr\\*2\\_ | complete |" in text
    assert "- `mesh_<4x2>`: crash: File \"train.py\", line 3, in \\<module>: x \\* y \\| z\n" in text
    assert markdown_table(text)[2]["run"] == "mesh\\_\\<4x2>"
    findings = text.split("## What the numbers say")[1].split("## Runs")[0]
    assert "- Fastest: \\_lr\\*2\\_," in findings and "- mesh\\_\\<4> is 2.00x slower" in findings
    assert "_lr*2_" not in findings and "mesh_<4>" not in findings
    charts = text.split("## Charts")[1]  # the charts' titles and notes, which name runs left out, alike
    assert "mesh\\_\\<4x2> (failed)" in charts and "_<4x2>" not in charts, charts


def test_a_half_written_line_in_a_metrics_log_loses_that_line_only(tmp_path: Path) -> None:
    """A run killed while writing a line, then resumed, leaves a broken line among whole ones: the losses of
    every whole line are read (steps 1, 2 and the resumed 3), not none of the file's."""
    from shardbench.report.write import _read_losses

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.5}\n{"step": 3, "tra'
                   '\n{"step": 3, "train/loss": 1.25}\n[4]\n')
    assert _read_losses(log) == ((1, 2.0), (2, 1.5), (3, 1.25))
    assert _read_losses(tmp_path / "missing.jsonl") is None


def test_figures_below_one_keep_three_significant_figures() -> None:
    """A small model's runs read "1.36x slower (0.2 ms against 0.2 ms)" and "1/7.9 of the 0.0 MiB a full replica
    holds": figures below 1 keep three significant figures."""
    from shardbench.report.findings import strategy_findings

    fast, slow = run("fast", {"parallel.strategy": "dp"}, 0.15), run("slow", {"parallel.strategy": "dp"}, 0.204)
    assert "slow is 1.36x slower (0.204 ms against 0.15 ms)" in " ".join(speed_findings([fast, slow]))
    tiny = run("tiny", {"parallel.strategy": "dp"}, 10.0, breakdown=(0.0123, 0.0246, 0.0123, 1.0))
    assert strategy_findings([tiny])[0].startswith(
        "DP replicates parameters and optimizer state on every device: 0.0369 MiB of parameters + optimizer state")


def test_runs_dividing_mfu_by_different_host_peaks_are_said_to_rank_unlike_their_steps() -> None:
    """Two sweeps reported together, each with the peak it measured on a busy host (60 and 180 GFLOP/s): the
    slower run showed the higher MFU, with only a chart caption naming both peaks. One peak among the runs: no
    sentence."""
    from shardbench.report.findings import peak_findings

    def measured(name: str, step_ms: float, host_gflops: float) -> ReportedRun:
        made = run(name, {"parallel.strategy": "dp"}, step_ms)
        mfu = dataclasses.replace(made.mfu, peak_flops_per_s_per_device=host_gflops * 1e9 / 8,
                                  peak_origin="handed over in peak.json")
        return dataclasses.replace(made, record=dataclasses.replace(
            made.rec, measurements=dataclasses.replace(made.m, mfu=mfu)))

    runs = [measured("s1/dp", 92.0, 60.0), measured("s2/dp", 57.8, 180.0), measured("s2/fsdp", 60.0, 180.0)]
    assert peak_findings(runs) == [
        "MFU of the float32 runs divides by 2 different host peaks, each measured by its own sweep or run (60.0 GFLOP/s "
        "for s1/dp, 180.0 GFLOP/s for s2/dp, s2/fsdp): across them MFU does not rank runs as their step times do; "
        "compare their step times or throughput."]
    assert peak_findings(runs[1:]) == []


def test_runs_over_other_data_are_another_computation_not_a_layout_whose_results_differ(tmp_path: Path) -> None:
    """dp, then the data file regenerated, then fsdp: the report said they "should be the same computation but
    differ ... Check the layouts' results" and that fsdp "differs in: parallel.strategy". Each run's data.json
    keeps its data's digest: the runs are not one computation, and the data is named among what differs."""
    from shardbench.parsing import override
    from shardbench.presets import get_preset

    for name, strategy, digest, loss in (("dp", "dp", "a" * 40, 1.0), ("fsdp", "fsdp", "b" * 40, 1.5)):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        made = rec(name, 10.0 if name == "dp" else 20.0, strategy=strategy) | {"model": "vit", "test_loss": loss}
        (folder / "summary.json").write_text(json.dumps(made))
        cfg = override(get_preset("vit-tiny"), {"parallel.strategy": strategy})
        (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
        (folder / "data.json").write_text(json.dumps({"dataset": "arrays:x.npz", "sha1": digest}))
    text = write_report(tmp_path / "runs", out_dir=tmp_path / "out").markdown.read_text()
    assert "should be the same computation" not in text and "same computation in different layouts" not in text
    assert "it differs in: parallel.strategy fsdp against dp; the data it read (data.json's digest)" in text, text
    # a damaged data.json leaves the run reported, its data unknown (the report stopped on it)
    (tmp_path / "runs" / "fsdp" / "data.json").write_text("{")
    assert "the data it read" not in write_report(tmp_path / "runs", out_dir=tmp_path / "out").markdown.read_text()
