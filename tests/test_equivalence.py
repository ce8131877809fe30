"""Every strategy and SPMD style trains the ViT, the LM and the MLP as one device does: the loss and the
gradients' global norm at every step, against a one-device computation written here.

The runs use plain SGD without clipping, so a gradient off by a uniform factor (a reduction that sums where
it should average) changes every later loss; the gradient norm (the `grad_norm` metric: after the
cross-device reduction, before the update) catches it at the first step. The reference shares only the model,
the task's loss terms and the data order with the code under test: its gradients, their norm and the update
are computed here on one device, without the train step, the optimizer, the loop or any mesh.

ZeRO-2 also runs Adam, written out here too: its moments are sharded over the devices, each device updates its
slice, and the parameters are gathered after the update, so a slice updated with the wrong moments or gathered in
the wrong place changes the next loss.
"""

# ruff: noqa: F811 - `reference` is a fixture imported from tests/equivalence.py
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shardbench.train.loop import run
from equivalence import (  # noqa: F401 - reference is a fixture
    SHAPES, STEPS, config, logged, one_device, reference, trains_as_one_device,
)

pytestmark = pytest.mark.slow

# (strategy, mesh, devices) for every strategy; pmap runs data parallelism only.
LAYOUTS = [("dp", "8", 8), ("zero1", "8", 8), ("zero2", "8", 8), ("fsdp", "8", 8), ("tp", "model=4", 4),
           ("dp+tp", "4x2", 8), ("fsdp+tp", "4x2", 8)]
ADAM_LR = 0.01  # Adam moves every parameter by about this much per step
# Every model under every strategy as jit compiles it, and dp under pmap. shard_map reduces the gradients by hand (a
# pmean where they are replicated, a psum_scatter and a division where FSDP or ZeRO-2 shards them, the model axis
# left to XLA): every strategy on the MLP, whose step compiles fastest, and on the ViT and the LM the sliced path
# (zero2) and both axes at once (fsdp+tp). Three layouts are left to test_zero_trains_adam_as_one_device below,
# which holds the same loss and gradient norm at every step to one device's with Adam's sharded moments on top:
# zero1 and zero2 on the MLP under jit (zero1 on the ViT and the LM too: with plain SGD there is no optimizer
# state to shard, so it computes as dp does) and zero2 on the LM under shard_map.
ADAM_LAYOUTS = [("mlp-small", "zero1", "jit"), ("mlp-small", "zero2", "jit"), ("lm-seed", "zero2", "shard_map")]
CASES = [case for case in (
    [(preset, "single", "none", 1, "jit") for preset in SHAPES]
    + [(preset, *layout, "jit") for preset in SHAPES for layout in LAYOUTS if layout[0] != "zero1"]
    + [(preset, "dp", "8", 8, "pmap") for preset in SHAPES]
    + [("mlp-small", *layout, "shard_map") for layout in LAYOUTS]
    + [(preset, *layout, "shard_map") for preset in ("vit-tiny", "lm-seed")
       for layout in LAYOUTS if layout[0] in ("zero2", "fsdp+tp")]) if (case[0], case[1], case[4]) not in ADAM_LAYOUTS]


@pytest.mark.parametrize(("preset", "strategy", "mesh", "devices", "style"), CASES,
                         ids=["-".join(map(str, case)) for case in CASES])
def test_trains_as_one_device(tmp_path: Path, reference: Callable[[str], tuple[list[float], list[float]]],
                              preset: str, strategy: str, mesh: str, devices: int, style: str) -> None:
    trains_as_one_device(tmp_path, reference, preset, strategy, mesh, devices, style)


# Gradient accumulation: each update sums 4 microbatches' gradients, and must be the one-device full-batch
# update above, step for step. A few layouts per model, every style among them, 4 dividing each data shard's
# examples (the ViT's and MLP's 32, the LM's 16), one case with remat; float32 sums over microbatches in another
# order, so the same tolerance.
ACCUM = 4
ACCUM_RUNS = [
    ("vit-tiny", "single", "none", 1, "jit", {}),
    ("vit-tiny", "fsdp", "8", 8, "shard_map", {"model.remat": "full"}),
    ("lm-seed", "fsdp+tp", "4x2", 8, "jit", {}),
    ("lm-seed", "dp+tp", "4x2", 8, "shard_map", {}),
    ("mlp-small", "dp", "8", 8, "pmap", {}),
    ("mlp-small", "fsdp", "8", 8, "jit", {}),
    ("mlp-small", "zero2", "8", 8, "jit", {}),  # accumulated into ZeRO-2's slices of the gradients
]


@pytest.mark.parametrize(("preset", "strategy", "mesh", "devices", "style", "extra"), ACCUM_RUNS,
                         ids=[f"{p}-{s}-{st}" for p, s, _, _, st, _ in ACCUM_RUNS])
def test_accumulated_microbatches_make_the_full_batch_update(
        tmp_path: Path, reference: Callable[[str], tuple[list[float], list[float]]], preset: str, strategy: str,
        mesh: str, devices: int, style: str, extra: dict[str, object]) -> None:
    want_loss, want_norm = reference(preset)
    run(config(tmp_path, preset, "run", **{"parallel.strategy": strategy, "parallel.mesh": mesh,
                                           "parallel.devices": devices, "parallel.spmd": style,
                                           "train.grad_accum": ACCUM, **extra}))
    got_loss, got_norm = logged(tmp_path / "run")
    assert len(got_loss) == STEPS
    np.testing.assert_allclose(got_norm, want_norm, rtol=1e-5, err_msg=f"gradient norm, {strategy} {style}")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, err_msg=f"loss, {strategy} {style}")
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["measurements"]
    batch = int(SHAPES[preset]["train.batch_size"])  # type: ignore[call-overload]
    data = {"none": 1, "8": 8, "model=4": 1, "4x2": 4}[mesh]  # the data axis: the examples' shards
    assert (record["global_batch"], record["grad_accum"], record["microbatch"], record["microbatch_per_shard"]) == (
        batch, ACCUM, batch // ACCUM, batch // ACCUM // data)
    # Throughput counts the examples of an update, not of a microbatch.
    assert record["throughput"]["examples_per_s"] == pytest.approx(batch / record["step_time_s"]["median"])


def test_accumulation_keeps_the_batchs_augmentation_mixing_and_repeats(tmp_path: Path) -> None:
    """Batch-level augmentation under accumulation is the full batch's: the batch is augmented, mixed in pairs
    (mixup and cutmix), its labels smoothed and its images repeated before it is split into microbatches, so 4
    microbatches train as the batch in one pass (itself one device's, above) under dp."""
    recipe = {"data.augment": True, "data.mixup": 0.8, "data.cutmix": 0.5, "data.repeat_augment": 2,
              "train.label_smoothing": 0.1, "parallel.strategy": "dp", "parallel.mesh": "8", "parallel.devices": 8}
    got = {}
    for k in (1, ACCUM):
        run(config(tmp_path, "vit-tiny", f"k{k}", **recipe, **{"train.grad_accum": k}))
        got[k] = logged(tmp_path / f"k{k}")
    np.testing.assert_allclose(got[ACCUM][1], got[1][1], rtol=1e-5, err_msg="gradient norm")
    np.testing.assert_allclose(got[ACCUM][0], got[1][0], rtol=1e-5, err_msg="loss")
    # The mixing and smoothing ran: the same augmented, repeated batch without them trains otherwise (else both runs
    # above would agree whatever they did).
    plain = {**recipe, "data.mixup": 0.0, "data.cutmix": 0.0, "train.label_smoothing": 0.0}
    run(config(tmp_path, "vit-tiny", "plain", **plain))
    assert not np.allclose(got[1][0], logged(tmp_path / "plain")[0], rtol=1e-3), "mixing and smoothing changed no loss"


ADAM = {"optim.optimizer": "adam", "optim.lr": ADAM_LR}


@pytest.mark.parametrize(("preset", "strategy", "style"), ADAM_LAYOUTS)
def test_zero_trains_adam_as_one_device(tmp_path: Path, preset: str, strategy: str, style: str) -> None:
    """ZeRO-1 and ZeRO-2 with Adam: losses and gradient norms of Adam written out on one device, with Adam's
    moments held 1/8 per device (the summary's optimizer bytes)."""
    want_loss, want_norm = one_device(config(tmp_path, preset, "reference", **ADAM, **{
        "parallel.strategy": "single", "parallel.mesh": "none"}))
    summary = run(config(tmp_path, preset, "run", **ADAM, **{"parallel.strategy": strategy, "parallel.mesh": "8",
                                                               "parallel.devices": 8, "parallel.spmd": style}))
    got_loss, got_norm = logged(tmp_path / "run")
    np.testing.assert_allclose(got_norm, want_norm, rtol=1e-5, err_msg=f"{strategy} adam gradient norm")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, err_msg=f"{strategy} adam loss")
    parts = summary["measurements"]["memory"]["breakdown"]
    # Two moments of the parameters' size, replicated would be 2x the parameters: sharded, about 2/8 of them
    # (a few small arrays 8 does not divide stay whole).
    assert parts["optimizer_bytes"] < 0.3 * parts["params_bytes"]
