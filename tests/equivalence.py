"""What the equivalence tests share (tests/test_equivalence.py: every strategy and SPMD style;
tests/test_pipeline_equivalence.py: every pipeline layout and schedule): the models' shapes, the run's settings,
and a one-device computation written here that each run is held to, loss and gradient norm at every step.

The runs use plain SGD without clipping, so a gradient off by a uniform factor (a reduction that sums where
it should average) changes every later loss; the gradient norm (the `grad_norm` metric: after the
cross-device reduction, before the update) catches it at the first step. The reference shares only the model,
the task's loss terms and the data order with the code under test: its gradients, their norm and the update
are computed here on one device, without the train step, the optimizer, the loop or any mesh.
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
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.tasks import Rows
from shardbench.train.loop import run
from shardbench.preflight import check_run

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
    # the LM's 4 blocks as 2 stages x 2 repeats of one block, its embedding and head outside the loop
    "lm-circular": {**PIPELINE_SHAPES["lm-deep"], "parallel.schedule": "circular", "parallel.repeats": 2,
                    "parallel.microbatches": 4},
})
# A model of your own that stacks its layers on 'layers' and hands them to run_stack (examples/stacked_mlp.py),
# under GPipe and 1F1B.
PIPELINE_SHAPES.update({
    "own-stacked": {**PIPELINE_SHAPES["mlp-deep"], "model.task": "regress",
                    "model.factory": f"{Path(__file__).resolve().parents[1] / 'examples' / 'stacked_mlp.py'}:build"},
})
PIPELINE_SHAPES["own-1f1b"] = {**PIPELINE_SHAPES["own-stacked"], "parallel.schedule": "1f1b"}
SAME_MODEL = {"mlp-1f1b": "mlp-deep", "lm-1f1b": "lm-deep", "lm-circular": "lm-deep",  # one reference for each model
              "own-1f1b": "own-stacked"}
PRESETS = {"mlp-deep": "mlp-small", "lm-deep": "lm-seed", "vit-deep": "vit-tiny", "mlp-1f1b": "mlp-small",
           "mlp-circular": "mlp-small", "lm-1f1b": "lm-seed", "lm-circular": "lm-seed", "own-stacked": "mlp-small", "own-1f1b": "mlp-small"}
PIPELINE_LAYOUTS = [("pp", "stage=4", 4), ("dp+pp", "data=2,stage=4", 8)]
# Stages combined with the other axes, on three axes at once where it can: fsdp+pp and dp+pp+tp on the MLP, whose
# step compiles fastest (dp+pp+tp splits each stage's hidden kernels over model, its batch over data, and covers
# pp+tp's placement), and pp+tp on the LM, where tensor parallelism splits the attention heads and the MLP inside
# every stage's blocks.
COMBINED_PIPELINE_CASES = [("mlp-deep", "fsdp+pp", "data=2,stage=4", 8, "jit"),
                           ("mlp-deep", "dp+pp+tp", "data=2,stage=2,model=2", 8, "jit"),
                           ("lm-deep", "pp+tp", "stage=4,model=2", 8, "jit"),
                           ("mlp-deep", "fsdp+pp+tp", "data=2,stage=2,model=2", 8, "jit")]
# Both layouts on the MLP and the LM; the ViT's blocks are the LM's without the mask, so pp alone. 1F1B on dp+pp of
# the MLP and of the LM (its embedding and head are the parts the schedule cuts off the stack), and on pp alone
# with the stacked MLP of your own below (the same schedule over an MLP's stack: a pp run of the built-in MLP
# under 1F1B checked nothing these two do not); circular on dp+pp of the MLP and on 2 stages of the LM. Each a
# compile of 5 to 10 s.
PIPELINE_CASES = [(preset, *layout, "jit") for preset in ("mlp-deep", "lm-deep") for layout in PIPELINE_LAYOUTS] + [
    ("vit-deep", *PIPELINE_LAYOUTS[0], "jit")] + [
    ("mlp-1f1b", *PIPELINE_LAYOUTS[1], "jit"),
    ("mlp-circular", *PIPELINE_LAYOUTS[1], "jit"), ("lm-1f1b", *PIPELINE_LAYOUTS[1], "jit"),
    ("lm-circular", "pp", "stage=2", 2, "jit")] + COMBINED_PIPELINE_CASES + [
    ("own-stacked", *PIPELINE_LAYOUTS[1], "jit"), ("own-1f1b", *PIPELINE_LAYOUTS[0], "jit")]


def config(tmp: Path, preset: str, name: str, **overrides: object) -> config_lib.Config:
    base = {"train.steps": STEPS, "train.progress": False, "train.checkpoint_every": 0, "train.log_every": 1,
            "train.eval": False, "train.out": str(tmp / name), "data.cache_dir": str(tmp / "cache"),
            "train.compile_cache": "off", "data.synthetic_train": 256, "data.synthetic_test": 64,
            "model.dropout": 0.0, "optim.optimizer": "sgd", "optim.momentum": 0.0, "optim.lr": LR,
            "optim.schedule": "constant", "optim.warmup_steps": 0, "optim.grad_clip": 0.0, "optim.ema": 0.0}
    return override(get_preset(PRESETS.get(preset, preset)), {**base, **{**SHAPES, **PIPELINE_SHAPES}[preset],
                                                              **overrides})


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
                                                                     "parallel.repeats": 1}))
            losses, norms = done[preset]
            # SGD steps whose gradients are far from zero: a factor on them would move every later loss.
            assert min(norms) > 0.01 and abs(losses[-1] - losses[0]) > 1e-4 * losses[0]
        return done[preset]

    return get


def trains_as_one_device(tmp_path: Path, reference: Callable[[str], tuple[list[float], list[float]]], preset: str,
                         strategy: str, mesh: str, devices: int, style: str, **extra: object) -> str:
    """Train `preset` in this layout (and `extra` settings) and hold its losses and gradient norms to one
    device's; returns the layout as a failure names it."""
    want_loss, want_norm = reference(SAME_MODEL.get(preset, preset))
    run(config(tmp_path, preset, "run", **{"parallel.strategy": strategy, "parallel.mesh": mesh,
                                           "parallel.devices": devices, "parallel.spmd": style, **extra}))
    got_loss, got_norm = logged(tmp_path / "run")
    assert len(got_loss) == STEPS
    # float32 sums in another order (over devices, split matmuls): at most 6e-7 apart when measured. The norm
    # first: a gradient off by a factor shows in it at the first step.
    shape = {**SHAPES, **PIPELINE_SHAPES}[preset]
    schedule = str(shape.get("parallel.schedule", "gpipe"))
    layout = (f"{preset}: {strategy} on mesh {mesh} under {style}" + (f", schedule {schedule}" if "pp" in strategy
                                                                       else "")
              + "".join(f", {k} {v}" for k, v in extra.items()))
    np.testing.assert_allclose(got_norm, want_norm, rtol=1e-5, err_msg=f"{layout}: gradient norm differs")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, err_msg=f"{layout}: loss differs")
    return layout
