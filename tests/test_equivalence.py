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

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from shardbench import config as config_lib
from shardbench.data.pipeline import make_batches
from shardbench.models import build_model
from shardbench.parallel.mesh import parse_mesh
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.tasks import Rows
from shardbench.train.loop import run
from shardbench.preflight import check_run

pytestmark = pytest.mark.slow

STEPS = 3  # each loss after the first depends on every update before it
LR = 0.05  # large enough that a wrong update moves the next loss well past the tolerance, small enough not to diverge

# Tiny shapes: compiling dominates each run (5 to 8 s on 2 shared cores). Heads (4) and MLP widths (64) divide
# the model axis (4 or 2); augmentation and dropout off, so the reference needs no random draws.
SHAPES: dict[str, dict[str, object]] = {
    "vit-tiny": {"model.patch_size": 8, "model.embed_dim": 32, "model.num_layers": 2, "model.num_heads": 4,
                 "model.mlp_dim": 64, "train.batch_size": 32, "data.augment": False},
    "lm-seed": {"model.embed_dim": 32, "model.num_heads": 4, "model.mlp_dim": 64, "model.num_layers": 2,
                "model.seq_len": 16, "train.batch_size": 16},
    "mlp-small": {"model.mlp_dim": 64, "model.num_layers": 3, "model.input_dim": 32, "train.batch_size": 32},
}

# Pipeline stages need a stack that splits into 4: the MLP stacks num_layers - 1 = 4 layers, the LM and the ViT 4
# blocks. The MLP runs 8 microbatches (not one per stage), the others the default (as many as stages).
PIPELINE_SHAPES: dict[str, dict[str, object]] = {
    "mlp-deep": {**SHAPES["mlp-small"], "model.num_layers": 5, "parallel.microbatches": 8},
    "lm-deep": {**SHAPES["lm-seed"], "model.num_layers": 4},
    "vit-deep": {**SHAPES["vit-tiny"], "model.num_layers": 4},
}
# The other schedules (GPipe is the default): 1F1B, and circular with 2 repeats on an MLP of 8 stacked layers (4
# stages x 2 repeats of one layer each).
PIPELINE_SHAPES.update({
    "mlp-1f1b": {**PIPELINE_SHAPES["mlp-deep"], "parallel.schedule": "1f1b"},
    "mlp-circular": {**PIPELINE_SHAPES["mlp-deep"], "model.num_layers": 9, "parallel.schedule": "circular",
                     "parallel.repeats": 2},
    "lm-1f1b": {**PIPELINE_SHAPES["lm-deep"], "parallel.schedule": "1f1b"},
})
# A model of your own that stacks its layers on 'layers' and hands them to run_stack (examples/stacked_mlp.py),
# under GPipe and 1F1B.
PIPELINE_SHAPES.update({
    "own-stacked": {**PIPELINE_SHAPES["mlp-deep"], "model.task": "regress",
                    "model.factory": f"{Path(__file__).resolve().parents[1] / 'examples' / 'stacked_mlp.py'}:build"},
})
PIPELINE_SHAPES["own-1f1b"] = {**PIPELINE_SHAPES["own-stacked"], "parallel.schedule": "1f1b"}
SAME_MODEL = {"mlp-1f1b": "mlp-deep", "lm-1f1b": "lm-deep", "own-1f1b": "own-stacked"}  # one reference for both
PRESETS = {"mlp-deep": "mlp-small", "lm-deep": "lm-seed", "vit-deep": "vit-tiny", "mlp-1f1b": "mlp-small",
           "mlp-circular": "mlp-small", "lm-1f1b": "lm-seed", "own-stacked": "mlp-small", "own-1f1b": "mlp-small"}
PIPELINE_LAYOUTS = [("pp", "stage=4", 4), ("dp+pp", "data=2,stage=4", 8)]
# Stages combined with the other axes, on three axes at once where it can: fsdp+pp and dp+pp+tp on the MLP, whose
# step compiles fastest (dp+pp+tp splits each stage's hidden kernels over model, its batch over data, and covers
# pp+tp's placement), and pp+tp on the LM, where tensor parallelism splits the attention heads and the MLP inside
# every stage's blocks.
COMBINED_PIPELINE_CASES = [("mlp-deep", "fsdp+pp", "data=2,stage=4", 8, "jit"),
                           ("mlp-deep", "dp+pp+tp", "data=2,stage=2,model=2", 8, "jit"),
                           ("lm-deep", "pp+tp", "stage=4,model=2", 8, "jit")]
# Both layouts on the MLP and the LM; the ViT's blocks are the LM's without the mask, so pp alone. 1F1B on both
# layouts of the MLP and dp+pp of the LM (its embedding and head are the parts the schedule cuts off the stack),
# circular on dp+pp of the MLP: each a compile of 5 to 10 s.
PIPELINE_CASES = [(preset, *layout, "jit") for preset in ("mlp-deep", "lm-deep") for layout in PIPELINE_LAYOUTS] + [
    ("vit-deep", *PIPELINE_LAYOUTS[0], "jit")] + [
    ("mlp-1f1b", *PIPELINE_LAYOUTS[0], "jit"), ("mlp-1f1b", *PIPELINE_LAYOUTS[1], "jit"),
    ("mlp-circular", *PIPELINE_LAYOUTS[1], "jit"), ("lm-1f1b", *PIPELINE_LAYOUTS[1], "jit")] + COMBINED_PIPELINE_CASES + [
    ("own-stacked", *PIPELINE_LAYOUTS[1], "jit"), ("own-1f1b", *PIPELINE_LAYOUTS[0], "jit")]

# Context parallelism on the LM (16 tokens, so 2 x seq = 8 head-tail chunks divide them): keys and values
# all-gathered and passed around a ring, alone and with the other axes, head-tail order except fsdp+cp's; and tp
# with sequence parallelism (the residual stream split along the sequence over model).
CONTEXT_SHAPES: dict[str, dict[str, object]] = {
    "lm-ring": {**SHAPES["lm-seed"], "parallel.context": "ring"},
    "lm-ring-contiguous": {**SHAPES["lm-seed"], "parallel.context": "ring", "parallel.context_order": "contiguous"},
    "lm-sp": {**SHAPES["lm-seed"], "parallel.sequence_parallel": True},
}
SAME_MODEL.update({name: "lm-seed" for name in CONTEXT_SHAPES})
PRESETS.update({name: "lm-seed" for name in CONTEXT_SHAPES})
CONTEXT_CASES = [("lm-seed", "cp", "seq=4", 4, "jit"), ("lm-ring", "cp", "seq=4", 4, "jit"),
                 ("lm-ring", "dp+cp", "data=2,seq=4", 8, "jit"),
                 ("lm-ring-contiguous", "fsdp+cp", "data=2,seq=4", 8, "jit"),
                 ("lm-ring", "cp+tp", "model=2,seq=4", 8, "jit"), ("lm-sp", "dp+tp", "4x2", 8, "jit")]
ALL_SHAPES = {**SHAPES, **PIPELINE_SHAPES, **CONTEXT_SHAPES}

# (strategy, mesh, devices) for every strategy; pmap runs data parallelism only.
LAYOUTS = [("dp", "8", 8), ("zero1", "8", 8), ("zero2", "8", 8), ("fsdp", "8", 8), ("tp", "model=4", 4),
           ("dp+tp", "4x2", 8), ("fsdp+tp", "4x2", 8)]
ADAM_LR = 0.01  # Adam moves every parameter by about this much per step
# Every model under every strategy as jit compiles it (zero1 on the MLP alone: with plain SGD there is no
# optimizer state to shard, so it computes as dp does; the Adam test below checks it where it differs), and dp
# under pmap. shard_map reduces the gradients by hand (a pmean where they are replicated, a psum_scatter and a
# division where FSDP or ZeRO-2 shards them, the model axis left to XLA): every strategy on the MLP, whose step
# compiles fastest, and on the ViT and the LM the sliced path (zero2) and both axes at once (fsdp+tp).
CASES = ([(preset, "single", "none", 1, "jit") for preset in SHAPES]
         + [(preset, *layout, "jit") for preset in SHAPES for layout in LAYOUTS
            if layout[0] != "zero1" or preset == "mlp-small"]
         + [(preset, "dp", "8", 8, "pmap") for preset in SHAPES]
         + [("mlp-small", *layout, "shard_map") for layout in LAYOUTS]
         + [(preset, *layout, "shard_map") for preset in ("vit-tiny", "lm-seed")
            for layout in LAYOUTS if layout[0] in ("zero2", "fsdp+tp")]
         + PIPELINE_CASES + CONTEXT_CASES)


def config(tmp: Path, preset: str, name: str, **overrides: object) -> config_lib.Config:
    base = {"train.steps": STEPS, "train.progress": False, "train.checkpoint_every": 0, "train.log_every": 1,
            "train.eval": False, "train.out": str(tmp / name), "data.cache_dir": str(tmp / "cache"),
            "train.compile_cache": "off", "data.synthetic_train": 256, "data.synthetic_test": 64,
            "model.dropout": 0.0, "optim.optimizer": "sgd", "optim.momentum": 0.0, "optim.lr": LR,
            "optim.schedule": "constant", "optim.warmup_steps": 0, "optim.grad_clip": 0.0, "optim.ema": 0.0}
    return override(get_preset(PRESETS.get(preset, preset)), {**base, **ALL_SHAPES[preset], **overrides})


def adam_by_hand(params: nnx.State, grads: nnx.State, moments: tuple[nnx.State, nnx.State], step: int,
                 cfg: config_lib.OptimConfig) -> tuple[nnx.State, tuple[nnx.State, nnx.State]]:
    """One step of Adam (Kingma and Ba, Algorithm 1, with optax's epsilon outside the root), and its moments."""
    mu = jax.tree.map(lambda m, g: cfg.b1 * m + (1 - cfg.b1) * g, moments[0], grads)
    nu = jax.tree.map(lambda v, g: cfg.b2 * v + (1 - cfg.b2) * g * g, moments[1], grads)
    params = jax.tree.map(lambda p, m, v: p - cfg.lr * (m / (1 - cfg.b1 ** step))
                          / (jnp.sqrt(v / (1 - cfg.b2 ** step)) + 1e-8), params, mu, nu)
    return params, (mu, nu)


def one_device(cfg: config_lib.Config) -> tuple[list[float], list[float]]:
    """(loss, gradient norm) per step, computed on one device: full-batch gradients by `jax.grad`, their norm
    in float64, and SGD's (or Adam's, as `cfg` names) update by hand, from the same initial parameters and
    batches."""
    checked = check_run(cfg)
    task, b = checked.task, cfg.train.batch_size
    # The same draws as the run's initialisation, which uses JAX's non-partitionable threefry on a CPU.
    with jax.threefry_partitionable(False):
        graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(cfg.train.seed)), nnx.Param)

    def loss(p: nnx.State, batch: dict[str, jax.Array]) -> jax.Array:
        # No augmentation and no dropout: training inputs are the evaluation ones.
        outputs = nnx.merge(graphdef, p)(task.inputs(cfg, batch, jax.random.key(0), False, Rows(0, b)))
        terms = task.terms(outputs, batch)
        return terms.loss_sum.sum() / terms.count.sum()

    grad = jax.jit(jax.value_and_grad(loss), device=jax.devices()[0])
    losses, norms = [], []
    moments = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    for step, host in enumerate(make_batches(checked.dataset.train, global_batch=b, seed=cfg.train.seed,
                                             shuffle=True, num_steps=STEPS), start=1):
        value, g = grad(params, {k: jnp.asarray(v) for k, v in host.items()})
        losses.append(float(value))
        norms.append(float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(g)))))
        if cfg.optim.optimizer == "adam":
            params, moments = adam_by_hand(params, g, moments, step, cfg.optim)
        else:
            params = jax.tree.map(lambda p, d: p - LR * d, params, g)
    return losses, norms


def logged(out: Path) -> tuple[list[float], list[float]]:
    rows = [json.loads(line) for line in (out / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/loss" in r]
    return [r["train/loss"] for r in rows], [r["train/grad_norm"] for r in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[list[float], list[float]]]:
    """Each preset's one-device (losses, gradient norms), computed once for all its runs."""
    tmp, done = tmp_path_factory.mktemp("reference"), {}

    def get(preset: str) -> tuple[list[float], list[float]]:
        if preset not in done:
            done[preset] = one_device(config(tmp, preset, preset, **{"parallel.strategy": "single",
                                                                     "parallel.mesh": "none",
                                                                     "parallel.microbatches": 0,
                                                                     "parallel.schedule": "gpipe",
                                                                     "parallel.repeats": 1,
                                                                     "parallel.context": "all-gather",
                                                                     "parallel.sequence_parallel": False}))
            losses, norms = done[preset]
            # SGD steps whose gradients are far from zero: a factor on them would move every later loss.
            assert min(norms) > 0.01 and abs(losses[-1] - losses[0]) > 1e-4 * losses[0]
        return done[preset]

    return get


@pytest.mark.parametrize(("preset", "strategy", "mesh", "devices", "style"), CASES,
                         ids=["-".join(map(str, case)) for case in CASES])
def test_trains_as_one_device(tmp_path: Path, reference: Callable[[str], tuple[list[float], list[float]]],
                              preset: str, strategy: str, mesh: str, devices: int, style: str) -> None:
    want_loss, want_norm = reference(SAME_MODEL.get(preset, preset))
    run(config(tmp_path, preset, "run", **{"parallel.strategy": strategy, "parallel.mesh": mesh,
                                           "parallel.devices": devices, "parallel.spmd": style}))
    got_loss, got_norm = logged(tmp_path / "run")
    assert len(got_loss) == STEPS
    # float32 sums in another order (over devices, split matmuls): at most 6e-7 apart when measured. The norm
    # first: a gradient off by a factor shows in it at the first step.
    shape = ALL_SHAPES[preset]
    schedule = str(shape.get("parallel.schedule", "gpipe"))
    repeats = int(shape.get("parallel.repeats", 1))  # type: ignore[call-overload]
    layout = f"{preset}: {strategy} on mesh {mesh} under {style}" + (f", schedule {schedule}" if "pp" in strategy
                                                                      else "")
    np.testing.assert_allclose(got_norm, want_norm, rtol=1e-5, err_msg=f"{layout}: gradient norm differs")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, err_msg=f"{layout}: loss differs")
    if "pp" in strategy.split("+"):  # the record names the pipeline and counts its stage-to-stage shifts
        record = json.loads((tmp_path / "run" / "summary.json").read_text())["measurements"]
        stages = parse_mesh(mesh, devices).stage
        m = int(shape.get("parallel.microbatches", stages))  # type: ignore[call-overload]
        assert (record["pipeline_stages"], record["pipeline_microbatches"]) == (stages, m), layout
        assert record["pipeline_bubble"] == pytest.approx((stages - 1) / (repeats * m + stages - 1)), layout
        # GPipe and circular: three shifts per iteration (tests/test_pipeline.py says which), a few more once per
        # step. 1F1B: activations one stage on and cotangents one stage back in each of its 2(M+S-1) ticks.
        shifts = 2 * 2 * (m + stages - 1) if schedule == "1f1b" else 3 * (repeats * m + stages - 1)
        assert record["comms"]["collective-permute"]["count"] >= shifts, layout
        # ... all of them between stages (the record's stage-to-stage transfers), whatever else splits a stage.
        assert record["pipeline_transfers"]["count"] >= shifts, layout
    if shape.get("parallel.context") == "ring":  # N - 1 key/value blocks per layer forward, as many back
        record = json.loads((tmp_path / "run" / "summary.json").read_text())["measurements"]
        axes = parse_mesh(mesh, devices)
        batch, tokens, width, layers = (int(shape[k]) for k in (  # type: ignore[call-overload]
            "train.batch_size", "model.seq_len", "model.embed_dim", "model.num_layers"))
        # One device's keys and values, float32: 2 x its rows x its tokens x its share of the width (heads over model).
        block = 2 * (batch // axes.data) * (tokens // axes.seq) * (width // axes.model) * 4
        ring, moved = 2 * (axes.seq - 1) * layers, record["context_transfers"]
        # Beside the ring, XLA splits the seq + 1 token ids along seq too and hands each device its neighbour's edge
        # for the task's shift by one (one or two permutes of a few int32s: 13 or 14 in all, as measured).
        assert ring <= moved["count"] <= ring + 2, (layout, moved)
        assert 0 <= moved["bytes"] - ring * block < 1024, (layout, moved, block)


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


ADAM = {"optim.optimizer": "adam", "optim.lr": ADAM_LR}


@pytest.mark.parametrize(("preset", "strategy", "style"),
                         [("mlp-small", "zero1", "jit"), ("mlp-small", "zero2", "jit"), ("lm-seed", "zero2", "shard_map")])
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
