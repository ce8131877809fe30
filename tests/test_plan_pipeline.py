"""The planner's pipelines: candidates over stages x microbatches x schedules, the bubble in the predicted step
time, and the stage-to-stage bytes on the link they cross, against hand counts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.parsing import override
from shardbench.plan.candidates import candidate_config, candidates, Candidate
from shardbench.plan.predict import Hardware, step_features
from shardbench.presets import get_preset


def test_pipeline_candidates_are_stages_x_microbatches_x_schedules() -> None:
    """8 devices, batch 32, 1 and 4 microbatches per stage, two schedules. pp: stage=8, 32 examples: M = 8 and
    32 both divide, x 2 schedules = 4. dp+pp: data=2,stage=4 (16 examples per shard: M = 4, 16) and
    data=4,stage=2 (8: M = 2, 8), x 2 = 8. dp: one candidate, no microbatches. With --grad-accum 2, dp+pp's
    data=4,stage=2 has 4 examples per accumulated microbatch: M = 2 only."""
    found = candidates(8, 32, ["dp", "pp", "dp+pp"], ["none"], ["float32"], per_stage=(1, 4),
                       schedules=("gpipe", "other"))
    got = sorted((c.strategy, c.mesh, c.microbatches, c.schedule) for c in found)
    want = sorted([("dp", "8x1", 0, "")] + [
        (s, mesh, m, sched) for s, mesh, ms in [("pp", "stage=8", (8, 32)), ("dp+pp", "data=2,stage=4", (4, 16)),
                                                ("dp+pp", "data=4,stage=2", (2, 8))]
        for m in ms for sched in ("gpipe", "other")])
    assert got == want
    accumulated = candidates(8, 32, ["dp+pp"], ["none"], ["float32"], accums=(2,), per_stage=(1, 4),
                             schedules=("gpipe",))
    assert sorted((c.mesh, c.microbatches) for c in accumulated) == [
        ("data=2,stage=4", 4), ("data=4,stage=2", 2)]
    config = candidate_config(get_preset("mlp-small"), Candidate("pp", "stage=8", "none", "float32", 1, 32, "gpipe"), 8)
    assert (config["parallel.microbatches"], config["parallel.schedule"]) == (32, "gpipe")


@pytest.mark.parametrize(("configured", "want"), [(1, {"gpipe": 1, "1f1b": 1, "circular": 2}),
                                                  (4, {"gpipe": 1, "1f1b": 1, "circular": 4})])
def test_a_circular_candidate_loops_and_the_others_run_once(configured: int, want: dict[str, int]) -> None:
    """A circular candidate at --parallel.repeats 1 would run GPipe's program under circular's name: the planner
    lays it out with 2 repeats, or the configuration's own; gpipe and 1f1b run once through the stages (a repeats
    above 1 would have them refused)."""
    cfg = override(get_preset("mlp-small"), {"parallel.repeats": configured, "parallel.schedule": "circular"})
    for schedule, repeats in want.items():
        config = candidate_config(cfg, Candidate("pp", "stage=4", "none", "float32", 1, 8, schedule), 8)
        assert (config["parallel.schedule"], config["parallel.repeats"]) == (schedule, repeats)


def _hardware() -> Hardware:
    return Hardware(name="test", platform="gpu", peak_flops=1e12, peak_source="", memory_bytes=1e9,
                    memory_source="", bandwidth={"intra": 1e9, "inter": 1e8}, bandwidth_source="",
                    memory_bandwidth=1e12, memory_bandwidth_source="")


def test_the_bubble_stretches_a_stages_matmuls() -> None:
    """4 devices, 8e12 FLOPs a step: 2e12 per device at 1e12 FLOP/s is 2 s of matmuls. On 4 stages with 8
    microbatches GPipe's bubble is 3/11, so a stage's useful 2 s take 2 x 11/8 = 2.75 s of the schedule."""
    result = {"devices": 4, "flops": {"analytic_per_step": 8e12, "xla_per_device": None}, "collectives": [],
              "bytes_accessed": 0.0, "kernels": 0, "platform": "gpu"}
    assert step_features(result, _hardware(), "none", "float32").compute_s == pytest.approx(2.0)
    staged = {**result, "pipeline": {"stages": 4, "microbatches": 8, "schedule": "gpipe", "bubble": 3 / 11,
                                     "work": 11 / 8}}
    assert step_features(staged, _hardware(), "none", "float32").compute_s == pytest.approx(2.75)
    # 1F1B in one SPMD program: each of its 2 x 11 ticks computes a forward, a recomputed forward and a backward
    # (4 forwards' work) where the useful work is 3 x 8: 2 s x 88/24.
    one_f = {**result, "pipeline": {"stages": 4, "microbatches": 8, "schedule": "1f1b", "bubble": 3 / 11,
                                    "work": 88 / 24}}
    assert step_features(one_f, _hardware(), "none", "float32").compute_s == pytest.approx(2.0 * 88 / 24)
    # A plan written before the work was kept: the bubble's stretch.
    old = {**result, "pipeline": {"stages": 4, "microbatches": 8, "schedule": "gpipe", "bubble": 3 / 11}}
    assert step_features(old, _hardware(), "none", "float32").compute_s == pytest.approx(2.75)


def test_a_permutes_link_time_is_what_its_fullest_device_sends() -> None:
    """The pipeline of tests/test_pipeline.py's record test as the planner holds it: 23 permutes with a payload of
    65,536 bytes per device, of which the fullest device sends 43,008 and the 4 devices 137,216 together. On
    devices of their own a step waits on the fullest: 43,008 bytes at 1e8 B/s; on simulated devices sharing a
    host, every device's copies add up: 137,216 bytes. A result written before bytes sent were kept has its
    payload charged to every device (65,536; x 4 on a shared host)."""
    permutes = {"kind": "collective-permute", "link": "inter", "group": 2, "count": 23, "bytes": 65536,
                "sent": 43008, "sent_all": 137216, "stage": True}
    result = {"devices": 4, "flops": {"analytic_per_step": 0.0, "xla_per_device": None}, "bytes_accessed": 0.0,
              "kernels": 0, "platform": "gpu", "collectives": [permutes]}
    own, shared = _hardware(), replace(_hardware(), shared_host=True)
    assert step_features(result, own, "none", "float32").link_s["inter"] == pytest.approx(43008 / 1e8)
    assert step_features(result, shared, "none", "float32").link_s["inter"] == pytest.approx(137216 / 1e8)
    old = {**result, "collectives": [{k: v for k, v in permutes.items() if k not in ("sent", "sent_all")}]}
    assert step_features(old, own, "none", "float32").link_s["inter"] == pytest.approx(65536 / 1e8)
    assert step_features(old, shared, "none", "float32").link_s["inter"] == pytest.approx(4 * 65536 / 1e8)


@pytest.mark.slow
def test_stage_to_stage_bytes_are_predicted_on_the_link_they_cross(tmp_path: Path) -> None:
    """mlp of width 64, batch 32, 4 stacked layers on 4 stages, 4 microbatches of 8 rows (8 x 64 x 4 = 2,048
    bytes each), M + S - 1 = 7 iterations: 3 shifts per iteration (one forward, two back: tests/test_pipeline.py)
    = 21 x 2,048; then, once, the last stage's outputs reach stage 0: forward, the scan's stacked output of all 7
    iterations (7 x 2,048; the slice to the 4 real microbatches comes after), and back the 4 microbatches'
    gradient (4 x 2,048). In all 32 x 2,048 = 65,536 bytes of payload per device per step, every one between
    stages. A device sends its buffer only where it is a permute's source: one shift on and one back per iteration
    each, the stacked outputs from the last stage alone, their gradient from stage 0 alone; so the last stage
    sends the most, 3 x 7 x 2,048 = 43,008, and the 4 devices (36,864, 28,672, 28,672, 43,008) 137,216 together.
    Two devices per node: the ring of stages 0-1-2-3-0 crosses nodes, so each shift is on the inter-node link;
    four per node: inside one."""
    from shardbench.plan.compile import compile_candidate

    cfg = override(get_preset("mlp-small"), {
        "model.num_layers": 5, "model.mlp_dim": 64, "model.input_dim": 16, "model.num_classes": 8,
        "train.batch_size": 32, "parallel.strategy": "pp", "parallel.mesh": "stage=4", "parallel.devices": 4,
        "parallel.microbatches": 4, "data.cache_dir": str(tmp_path)})
    for span, link in ((2, "inter"), (4, "intra")):
        result = compile_candidate(cfg, span)
        stage = [c for c in result["collectives"] if c["stage"]]
        assert {c["link"] for c in stage} == {link}
        assert sum(c["bytes"] for c in stage) == (3 * 7 + 7 + 4) * 2048
        assert [(c["sent"], c["sent_all"]) for c in stage] == [(3 * 7 * 2048, (2 * 7 * 4 + 7 + 4) * 2048)]
        assert result["pipeline"] == {"stages": 4, "microbatches": 4, "schedule": "gpipe", "bubble": 3 / 7,
                                      "work": 7 / 4}
