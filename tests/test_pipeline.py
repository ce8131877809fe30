"""Pipeline stages (`--strategy pp`, `dp+pp`): the mesh's stage axis, where the stacked layers live, the
stage-to-stage transfers the compiled step runs (counted in its HLO by `shardbench.measure.comms`), what
`inspect` says, the 1F1B order and the activations each schedule keeps. Their equality with one device is
`test_pipeline_equivalence.py`'s; the refusals are `test_bad_input.py`'s.

The model: `mlp` with 16 inputs, width 64, 5 layers (4 stacked, one per stage) and 8 outputs, batch 32.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardbench import config as config_lib
from shardbench.inspect import inspect
from shardbench.measure.comms import along_one_axis, count_collectives
from shardbench.parallel.mesh import MESH_AXES, MeshShape, parse_mesh
from shardbench.train.one_f_one_b import backward_ticks, forward_ticks, ticks
from shardbench.parallel.pipeline import bubble_fraction, stack_work, stage_order
from shardbench.parallel.rules import resolve_strategy
from shardbench.parsing import override
from shardbench.presets import get_preset
from conftest import lowered_train_step

WIDTH, BATCH, STAGES = 64, 32, 4


def _cfg(tmp_path: Path, strategy: str, mesh: str, devices: int, microbatches: int,
         **extra: object) -> config_lib.Config:
    return override(get_preset("mlp-small"), {
        "model.num_layers": STAGES + 1, "model.mlp_dim": WIDTH, "model.input_dim": 16, "model.num_classes": 8,
        "data.synthetic_train": 64, "data.synthetic_test": 32, "data.cache_dir": str(tmp_path / "cache"),
        "train.batch_size": BATCH, "train.progress": False, "train.eval": False, "train.out": str(tmp_path / "run"),
        "parallel.strategy": strategy, "parallel.mesh": mesh, "parallel.devices": devices,
        "parallel.microbatches": microbatches, **extra})


def _compiled_hlo(cfg: config_lib.Config) -> str:
    return lowered_train_step(cfg).compile().as_text()


def test_the_stage_axis_is_named_and_the_short_forms_keep_their_meaning() -> None:
    assert parse_mesh("data=2,stage=4", 8) == MeshShape.of(data=2, stage=4)
    assert parse_mesh("4x2", 8) == MeshShape.of(data=4, model=2)
    assert parse_mesh("4", 4, "stage") == MeshShape.of(stage=4)
    assert str(MeshShape.of(data=2, stage=4)) == "data=2,stage=4"
    assert resolve_strategy("auto", "stage=8", 8) == "pp"
    assert resolve_strategy("auto", "data=2,stage=4", 8) == "dp+pp"


def test_inspect_shows_which_stage_holds_each_layer(tmp_path: Path) -> None:
    text = inspect(_cfg(tmp_path, "pp", "stage=4", 4, 8))
    row = next(line for line in text.splitlines() if line.startswith("hidden_kernel"))
    # The stacked dim over stage: each of the 4 devices holds one of the 4 layers.
    assert "P('stage', None, None)" in row and "(1, 64, 64)" in row
    assert "mesh stage=4 (stage)" in text
    assert "8 microbatches of 4 examples; 11 iterations per pass" in text
    assert bubble_fraction(4, 8) == 3 / 11 and "(S-1)/(M+S-1) = 27.3%" in text
    # Accumulated in 2 parts on 2 data shards: 32 / 2 / 4 = 4 examples a microbatch, 2 on each shard.
    text = inspect(_cfg(tmp_path, "dp+pp", "data=2,stage=4", 8, 4, **{"train.grad_accum": 2}))
    assert "4 microbatches of 4 examples (2 per data shard), in each of the 2 accumulated parts" in text


@pytest.mark.parametrize(("strategy", "mesh", "spec", "device_shape", "stage0", "stage1", "within"), [
    # 2 stages of 2 layers; stage s is the mesh's stage index s: devices (data, stage, model) in row-major order.
    ("fsdp+pp", "data=2,stage=2", "P('stage', 'data', None)", "(2, 32, 64)", "0,2", "1,3", "data"),
    ("pp+tp", "stage=2,model=2", "P('stage', None, 'model')", "(2, 64, 32)", "0,1", "2,3", "model"),
    ("dp+pp+tp", "data=2,stage=2,model=2", "P('stage', None, 'model')", "(2, 64, 32)", "0,1,4,5", "2,3,6,7", "model"),
])
def test_inspect_shows_each_stage_and_its_other_splits(tmp_path: Path, strategy: str, mesh: str, spec: str,
                                                       device_shape: str, stage0: str, stage1: str,
                                                       within: str) -> None:
    devices = parse_mesh(mesh, None).size
    text = inspect(_cfg(tmp_path, strategy, mesh, devices, 0))
    row = next(line for line in text.splitlines() if line.startswith("hidden_kernel"))
    assert spec in row and device_shape in row, row
    assert f"split further over {within}," in text
    assert f"  stage 0: layers 0-1 on devices {stage0}\n  stage 1: layers 2-3 on devices {stage1}\n" in text


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "mesh", "devices", "microbatches"),
                         [("pp", "stage=4", 4, 4), ("dp+pp", "data=2,stage=4", 8, 8)])
def test_each_iteration_shifts_one_microbatch_between_stages(tmp_path: Path, strategy: str, mesh: str,
                                                             devices: int, microbatches: int) -> None:
    """Each of the M + S - 1 iterations moves one microbatch's activations per device (its rows over the data
    shards x width, float32) one stage on: one collective-permute around the ring in the forward pass, and two in
    the backward (XLA sends the transposed ring's wrap, stage 0 to the last, apart). The last stage's outputs are
    gathered once after the loop, by collectives that run once per step."""
    comms = count_collectives(_compiled_hlo(_cfg(tmp_path, strategy, mesh, devices, microbatches)))
    permutes = [op for op in comms.ops if op.kind == "collective-permute"]
    iterations = microbatches + STAGES - 1
    activation = BATCH // microbatches // (devices // STAGES) * WIDTH * 4
    in_loop = [op for op in permutes if op.count == iterations]
    assert [op.bytes_each for op in in_loop] == [activation] * 3, permutes
    assert all(op.count == 1 for op in permutes if op not in in_loop), permutes
    shifts = comms.by_kind["collective-permute"]
    assert shifts.count == 3 * iterations + len(permutes) - 3
    # Each of them crosses the stage axis alone: the record's stage-to-stage transfers are all of them here.
    assert along_one_axis(comms.ops, parse_mesh(mesh, devices).sizes, MESH_AXES.index("stage")) == shifts
    # What each device sends (`_sent_by_hand`): the record gives the fullest device's, the last stage's.
    assert _sent_by_device(comms) == {d: _sent_by_hand(d % STAGES, microbatches, activation)
                                      for d in range(devices)}
    assert shifts.sent_bytes == _sent_by_hand(STAGES - 1, microbatches, activation)


def _sent_by_device(comms) -> dict[int, int]:  # noqa: ANN001 - a CommsReport
    sent: dict[int, int] = {}
    for op in comms.ops:
        for device, b in (op.sent_by_device() or {}).items():
            sent[device] = sent.get(device, 0) + op.count * b
    return sent


def _sent_by_hand(stage: int, microbatches: int, activation: int) -> int:
    """Bytes a device of `stage` sends per step under GPipe (M microbatches of `activation` bytes per device, S =
    STAGES, M + S - 1 iterations): in each iteration one microbatch's activations one stage on (every device, the
    wrap from the last stage to stage 0 included) and one microbatch's gradient one stage back (the two permutes XLA
    splits the backward ring into: each device is a source in one of them); after the loop the last stage sends
    its stacked outputs of all M + S - 1 iterations to stage 0, and stage 0 sends the M real outputs' gradient back
    to the last stage."""
    iterations = microbatches + STAGES - 1
    once = iterations if stage == STAGES - 1 else microbatches if stage == 0 else 0
    return (2 * iterations + once) * activation


@pytest.mark.slow
def test_the_record_charges_each_stage_to_stage_transfer_to_the_device_that_sends_it(tmp_path: Path) -> None:
    """One step of dp+pp on data=2, stage=4 with 4 microbatches of 32 / 4 / 2 = 4 rows per device (4 x 64 x 4 =
    1,024 bytes), 7 iterations: the last stage sends 3 x 7 microbatches (`_sent_by_hand`), 21,504 bytes, the most
    of any device (stage 0: 18,432; stages 1 and 2: 14,336). The record's bytes sent, in comms and in
    pipeline_transfers, are that device's; the payload counts every permute's buffer on every device, 23 permutes
    of 32 microbatches' bytes (32,768), which the record gave as bytes sent too before a permute was charged to
    its source devices alone."""
    from shardbench.train.loop import run

    microbatches, activation = 4, BATCH // 4 // 2 * WIDTH * 4
    run(override(_cfg(tmp_path, "dp+pp", "data=2,stage=4", 8, microbatches),
                  {"train.steps": 1, "train.checkpoint_every": 0, "train.compile_cache": "off"}))
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["measurements"]
    fullest = _sent_by_hand(STAGES - 1, microbatches, activation)
    assert fullest == 21504 > _sent_by_hand(0, microbatches, activation) > _sent_by_hand(1, microbatches, activation)
    transfers = {"count": 3 * 7 + 2, "bytes": (3 * 7 + 7 + 4) * activation, "sent_bytes": fullest}
    assert record["comms"]["collective-permute"] == transfers
    assert record["pipeline_transfers"] == transfers


def test_circular_stages_hold_every_sth_chunk(tmp_path: Path) -> None:
    """8 stacked layers, 4 stages x 2 repeats: stage s holds layers s and s + 4, stored in its block of the stack."""
    assert stage_order(8, 4, 2).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert stage_order(8, 2, 2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    assert stage_order(8, 4, 1).tolist() == list(range(8))
    text = inspect(_cfg(tmp_path, "pp", "stage=4", 4, 8, **{"model.num_layers": 9, "parallel.schedule": "circular",
                                                            "parallel.repeats": 2}))
    row = next(line for line in text.splitlines() if line.startswith("hidden_kernel"))
    assert "P('stage', None, None)" in row and "(2, 64, 64)" in row
    assert all(f"stage {s}: layers {s}, {s + 4} on devices {s}\n" in text for s in range(4)), text
    assert bubble_fraction(4, 8, 2) == 3 / 19 and "19 iterations" in text and "(S-1)/(R*M+S-1) = 15.8%" in text


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (4, 2), (2, 8), (1, 3)])
def test_1f1b_runs_one_forward_then_one_backward(stages: int, microbatches: int) -> None:
    """The ticks: every stage runs each microbatch's forward and backward once, one thing per tick, a forward
    after the previous stage's and a backward after the next stage's (the last stage: after its own forward);
    after S-1-s warm-up forwards a stage alternates, and at most S - s microbatches wait for their backward."""
    s_, m = stages, microbatches
    every_tick = jnp.arange(ticks(s_, m))
    f_i, f_ok = (np.asarray(a) for a in jax.vmap(lambda t: forward_ticks(t, s_, m))(every_tick))
    b_i, b_ok = (np.asarray(a) for a in jax.vmap(lambda t: backward_ticks(t, s_, m))(every_tick))
    fwd = {(s, int(f_i[t, s])): t for t in range(len(every_tick)) for s in range(s_) if f_ok[t, s]}
    bwd = {(s, int(b_i[t, s])): t for t in range(len(every_tick)) for s in range(s_) if b_ok[t, s]}
    every = {(s, i) for s in range(s_) for i in range(m)}
    assert set(fwd) == every and set(bwd) == every
    for s in range(s_):
        busy = sorted([fwd[s, i] for i in range(m)] + [bwd[s, i] for i in range(m)])
        assert len(set(busy)) == 2 * m, f"stage {s} runs two things in one tick"
        for i in range(m):
            assert s == 0 or fwd[s, i] > fwd[s - 1, i]
            assert bwd[s, i] > (fwd[s, i] if s == s_ - 1 else bwd[s + 1, i])
            assert i == 0 or fwd[s, i] > fwd[s, i - 1]
        order = "".join("F" if t in {fwd[s, i] for i in range(m)} else "B" for t in busy)
        warm = min(s_ - 1 - s, m)
        assert order.startswith("F" * warm + "FB" * min(m - warm, 1)), (s, order)
        alive = max(sum(fwd[s, i] <= t < bwd[s, i] for i in range(m)) for t in range(ticks(s_, m)))
        assert alive == min(s_ - s, m), (s, alive)


@pytest.mark.slow
def test_1f1b_keeps_fewer_activations_than_gpipe(tmp_path: Path) -> None:
    """2 stages of 8 layers, microbatches of 64 rows: GPipe's compiled step keeps the activations of every
    iteration (M + S - 1 of them) for its backward, 1F1B's the inputs of at most S microbatches per stage and one
    microbatch's layers at a time (its backward recomputes the stage), and circular's (2 repeats) every
    iteration's input: XLA's temporary bytes per device say so."""
    rows = 64

    def temp(schedule: str, repeats: int, microbatches: int) -> int:
        cfg = _cfg(tmp_path, "pp", "stage=2", 2, microbatches, **{
            "model.num_layers": 17, "train.batch_size": rows * microbatches,
            "data.synthetic_train": 2 * rows * microbatches, "parallel.schedule": schedule,
            "parallel.repeats": repeats})
        return lowered_train_step(cfg).compile().memory_analysis().temp_size_in_bytes

    gpipe, one_f, circular = temp("gpipe", 1, 8), temp("1f1b", 1, 8), temp("circular", 2, 8)
    # Measured (jax 0.10.2, CPU, benchmarks/data/pipeline-temps/): 2,386,984 bytes for GPipe, 1,112,648 for 1F1B,
    # 1,517,544 for circular; 1F1B at 32 microbatches 2,519,176.
    assert one_f < 0.7 * gpipe, (gpipe, one_f)
    assert circular < gpipe, (gpipe, circular)
    # What 1F1B adds per added microbatch is batch-sized, outside its ticks: the stack's input and its gradient,
    # and the first layer's, which runs on the whole batch; under 4 arrays of one microbatch's WIDTH floats (3.6
    # measured). A stage that kept every microbatch's input, not a ring of S, would add a fifth (4.6).
    one_microbatch = rows * WIDTH * 4
    assert temp("1f1b", 1, 32) - one_f <= 4 * (32 - 8) * one_microbatch, one_f


@pytest.mark.parametrize(("stages", "microbatches"), [(8, 8), (4, 2), (2, 8)])
def test_each_schedules_program_work_is_counted_from_its_iterations(stages: int, microbatches: int) -> None:
    """Per stage, in forwards of its layers over one microbatch (a backward costs two): the useful work is 3M.
    GPipe runs M+S-1 forward and as many backward iterations; circular (R=2) R*M+S-1 iterations of 1/R of the
    layers, each forward then recomputed and differentiated (1 + 1 + 2); 1F1B every one of its ticks a forward, a
    recomputed forward and a backward (1 + 1 + 2)."""
    s_, m = stages, microbatches
    assert stack_work("gpipe", s_, m) == pytest.approx((m + s_ - 1) * (1 + 2) / (3 * m))
    assert stack_work("circular", s_, m, 2) == pytest.approx((2 * m + s_ - 1) * (1 + 1 + 2) / 2 / (3 * m))
    assert stack_work("circular", s_, m, 1) == stack_work("gpipe", s_, m)  # one repeat runs GPipe's program
    assert stack_work("1f1b", s_, m) == pytest.approx(ticks(s_, m) * (1 + 1 + 2) / (3 * m))
