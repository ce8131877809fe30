"""Every pipeline layout (pp, dp+pp, fsdp+pp, pp+tp, dp+pp+tp) and schedule (GPipe, 1F1B, circular) trains the
MLP, the LM, the ViT and a model of your own as one device does: the loss and the gradients' global norm at every
step, against the one-device computation of tests/equivalence.py; and each run's record names its stages,
microbatches and bubble, and counts its stage-to-stage shifts.
"""

# ruff: noqa: F811 - `reference` is a fixture imported from tests/equivalence.py
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from shardbench.parallel.mesh import parse_mesh
from equivalence import PIPELINE_CASES, PIPELINE_SHAPES, reference, trains_as_one_device  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("preset", "strategy", "mesh", "devices", "style"), PIPELINE_CASES,
                         ids=["-".join(map(str, case)) for case in PIPELINE_CASES])
def test_pipeline_trains_as_one_device(tmp_path: Path, reference: Callable[[str], tuple[list[float], list[float]]],
                                       preset: str, strategy: str, mesh: str, devices: int, style: str) -> None:
    layout = trains_as_one_device(tmp_path, reference, preset, strategy, mesh, devices, style)
    # The record names the pipeline and counts its stage-to-stage shifts.
    shape = PIPELINE_SHAPES[preset]
    schedule = str(shape.get("parallel.schedule", "gpipe"))
    repeats = int(shape.get("parallel.repeats", 1))  # type: ignore[call-overload]
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["measurements"]
    stages = parse_mesh(mesh, devices).stage
    m = int(shape.get("parallel.microbatches", stages))  # type: ignore[call-overload]
    assert (record["pipeline_stages"], record["pipeline_microbatches"]) == (stages, m), layout
    assert record["pipeline_bubble"] == pytest.approx((stages - 1) / (repeats * m + stages - 1)), layout
    # GPipe and circular: three shifts per iteration (tests/test_pipeline.py says which), a few more once per
    # step. 1F1B: activations one stage on and cotangents one stage back in each of its 2(M+S-1) ticks.
    loop = 2 * (m + stages - 1) if schedule == "1f1b" else repeats * m + stages - 1
    shifts = 2 * 2 * loop if schedule == "1f1b" else 3 * loop
    assert record["comms"]["collective-permute"]["count"] >= shifts, layout
    # ... all of them between stages (the record's stage-to-stage transfers), whatever else splits a stage.
    transfers = record["pipeline_transfers"]["count"]
    assert transfers >= shifts, layout
    # Every stage-to-stage shift in the loop runs once an iteration, exactly as many times as the schedule has
    # iterations (ticks), neither an idle one more nor one fewer; after the loop, GPipe and circular send the last
    # stage's outputs to stage 0 and their gradient back (2), while 1F1B's last stage took its loss inside its
    # ticks (0). (How many shifts an iteration takes is XLA's choice: 3, 5 and 7 on jax 0.10.2's CPU compiler.)
    assert transfers % loop == (0 if schedule == "1f1b" else 2), (layout, transfers, loop)


def test_accumulated_microbatches_through_stages_make_the_full_batch_update(
        tmp_path: Path, reference: Callable[[str], tuple[list[float], list[float]]]) -> None:
    """Gradient accumulation composes with stages: 2 accumulated microbatches, each split into the pipeline's
    own microbatches, make one device's full-batch update."""
    layout = trains_as_one_device(tmp_path, reference, "mlp-deep", "dp+pp", "data=2,stage=4", 8, "jit",
                                  **{"train.grad_accum": 2})
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["measurements"]
    assert (record["grad_accum"], record["pipeline_microbatches"]) == (2, 8), layout
