"""Pipeline stages (`--strategy pp`, `dp+pp`): the mesh's stage axis, where the stacked layers live, the
stage-to-stage transfers the compiled step runs (counted in its HLO by `shardbench.measure.comms`) and what
`inspect` says. Their equality with one device is `test_equivalence.py`'s; the refusals are `test_bad_input.py`'s.

The model: `mlp` with 16 inputs, width 64, 5 layers (4 stacked, one per stage) and 8 outputs, batch 32.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardbench import config as config_lib
from shardbench.inspect import inspect
from shardbench.measure.comms import along_one_axis, count_collectives
from shardbench.parallel.mesh import MESH_AXES, MeshShape, parse_mesh
from shardbench.parallel.pipeline import bubble_fraction
from shardbench.parallel.rules import resolve_strategy
from shardbench.parsing import override
from shardbench.presets import get_preset
from conftest import lowered_train_step

WIDTH, BATCH, STAGES = 64, 32, 4


def _cfg(tmp_path: Path, strategy: str, mesh: str, devices: int, microbatches: int) -> config_lib.Config:
    return override(get_preset("mlp-small"), {
        "model.num_layers": STAGES + 1, "model.mlp_dim": WIDTH, "model.input_dim": 16, "model.num_classes": 8,
        "data.synthetic_train": 64, "data.synthetic_test": 32, "data.cache_dir": str(tmp_path / "cache"),
        "train.batch_size": BATCH, "train.progress": False, "train.eval": False, "train.out": str(tmp_path / "run"),
        "parallel.strategy": strategy, "parallel.mesh": mesh, "parallel.devices": devices,
        "parallel.microbatches": microbatches})


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
