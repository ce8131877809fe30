"""Simulated devices from a library import, and precision combinations that either run or are explained."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from shardbench.cli import main
from shardbench.config import DTYPES, MATMUL_PRECISIONS, PrecisionConfig
from shardbench.errors import ConfigError
from shardbench.optim import clip_by_global_norm, global_norm
from shardbench.precision import check_supported


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_simulate_devices_after_importing_the_package() -> None:
    done = _python("import shardbench, jax; shardbench.simulate_devices(4); print(jax.device_count())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4"


def test_simulate_devices_too_late_is_explained() -> None:
    code = ("import jax; jax.devices()\nimport shardbench\n"
            "try:\n    shardbench.simulate_devices(4)\nexcept shardbench.errors.ConfigError as e:\n    print(e)")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert "JAX already started with 1 CPU devices" in done.stdout


@pytest.mark.slow
def test_every_precision_combination_runs_on_the_cpu() -> None:
    """XLA's CPU backend runs all 27 combinations: the probe (a matmul, its gradient and a float32 softmax in
    exactly that precision) passes for each, so no CPU run is refused by it."""
    for param_dtype, dtype, precision in itertools.product(DTYPES, DTYPES, MATMUL_PRECISIONS):
        check_supported(PrecisionConfig(param_dtype, dtype, precision), jax.devices()[0])


def test_a_combination_the_device_cannot_run_is_named_in_one_line() -> None:
    """Where the probe fails (here: a device object the runtime cannot place arrays on), the error names the
    whole combination and the device's platform, in one line."""
    unusable = types.SimpleNamespace(platform="tpu")
    with pytest.raises(ConfigError) as err:
        check_supported(PrecisionConfig("bfloat16", "float16", "highest"), unusable)
    message = str(err.value)
    assert message.startswith("--param-dtype bfloat16 --dtype float16 --matmul-precision highest cannot run on tpu")
    assert "\n" not in message and "try --dtype float32" in message


def _dots(jaxpr: jax.extend.core.Jaxpr) -> list:
    """Every dot_general of `jaxpr`, inside scans, remat and custom rules too."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _dots(inner)
    return found


@pytest.mark.slow
def test_bfloat16_compute_really_computes_in_bfloat16(micro) -> None:
    """Every matmul of the train step, forward and backward: the patch embedding, the six of each layer (q/k/v,
    scores, weighted sum, output, two MLP), the head, and their gradients take bfloat16 operands. The one
    exception is by design: the attention scores accumulate in float32 (preferred_element_type), so their
    cotangent, and with it the two matmuls of the scores' backward, are float32 against a bfloat16 operand."""
    from flax import nnx

    from shardbench.models import build_model

    cfg = micro(**{"precision.dtype": "bfloat16", "precision.param_dtype": "float32", "model.attention": "einsum"})
    model = build_model(cfg, nnx.Rngs(0))
    assert model.head_kernel[...].dtype == jnp.float32
    graph, params = nnx.split(model)
    images = jnp.ones((2, 32, 32, 3))

    def loss(p, x):
        return nnx.merge(graph, p)(x).sum()

    forward = jax.make_jaxpr(loss)(params, images)
    dots = _dots(forward.jaxpr)
    assert len(dots) == 1 + 6 + 1  # the layer stack's body holds a layer's six once, whatever the depth
    assert all(e.invars[0].aval.dtype == e.invars[1].aval.dtype == jnp.bfloat16 for e in dots)
    backward = _dots(jax.make_jaxpr(jax.grad(loss))(params, images).jaxpr)
    assert len(backward) >= 3 * len(dots) - 2  # each matmul again forward, then two gradients (none for the input)
    scores_shape = (2, cfg.model.num_heads, 17, 17)  # (batch, heads, queries, keys): 16 patches + the class token
    mixed = [e for e in backward if e.invars[0].aval.dtype != e.invars[1].aval.dtype]
    assert [e.invars[0].aval.shape for e in mixed] == [scores_shape, scores_shape]
    assert all(e.invars[0].aval.dtype == jnp.float32 for e in mixed)
    assert all(e.invars[0].aval.dtype == e.invars[1].aval.dtype == jnp.bfloat16 for e in backward if e not in mixed)
    assert forward.out_avals[0].dtype == jnp.float32  # logits (and so the loss) in float32


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install 'shardbench[tpu]'): nothing to leave out")
def test_a_command_on_a_host_without_a_tpu_leaves_libtpu_alone() -> None:
    """With the `tpu` extra on a host without a TPU, JAX started libtpu's backend for every command: a page of
    warnings and an INVALID_ARGUMENT line on stderr, /tmp/libtpu_lockfile held and a libtpu log opened. The
    files a process holds open tell it without the warnings' wording (which libtpu prints only when no other
    process holds the lock)."""
    code = ("import os\nfrom shardbench.cli import main\n"
            "rc = main(['inspect', '--preset', 'mlp-small', '--model.num-layers', '2', '--devices', '2'])\n"
            "def link(fd):\n    try:\n        return os.readlink(f'/proc/self/fd/{fd}')\n"
            "    except OSError:\n        return ''\n"
            "print(rc, [p for p in map(link, os.listdir('/proc/self/fd')) if 'tpu' in p])")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout
    assert "libtpu" not in done.stderr and "TPU" not in done.stderr, done.stderr


# A small MLP regressing onto targets of a chosen scale: its gradients' global norm grows with the targets.
OVERFLOW_RUN = ["train", "--preset", "mlp-small", "--model.num-layers", "2", "--model.mlp-dim", "64", "--steps", "1",
                "--batch-size", "64", "--no-train.eval", "--no-train.progress", "--optim.optimizer", "sgd",
                "--lr", "1e-9", "--train.log-every", "1", "--devices", "1", "--mesh", "none"]


def _targets_scaled(tmp_path: Path, scale: float) -> str:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(640, 256)).astype(np.float32), rng.normal(size=(640, 10)).astype(np.float32) * scale
    path = tmp_path / f"targets-{scale:g}.npz"
    np.savez(path, x_train=x[:512], y_train=y[:512], x_test=x[512:], y_test=y[512:])
    return f"arrays:{path}"


def _first_grad_norm(out: Path) -> float:
    return json.loads((out / "tensorboard" / "metrics.jsonl").read_text().splitlines()[0])["train/grad_norm"]


@pytest.mark.slow
def test_float16_gradients_of_a_norm_past_256_are_measured_and_clipped_in_float32(tmp_path: Path) -> None:
    """The norm was summed in float16, whose squares overflow past a norm of 256: a finite gradient was read as
    infinite and the run stopped as diverged (exit 3), and clipping (on by default) scaled every update to 0."""
    data, norms = _targets_scaled(tmp_path, 3000.0), {}
    for dtype in ("float32", "float16"):
        out = tmp_path / dtype
        assert main([*OVERFLOW_RUN, "--data", data, "--param-dtype", dtype, "--out", str(out)]) == 0
        norms[dtype] = _first_grad_norm(out)
    assert norms["float32"] > 256.0  # past what float16 can sum the squares of
    assert norms["float16"] == pytest.approx(norms["float32"], rel=1e-2)


def test_the_clipping_norm_of_float16_updates_is_summed_in_float32() -> None:
    updates = {"w": jnp.full((1000,), 10.0, jnp.float16)}  # norm 10 * sqrt(1000) = 316.2, finite in float16
    assert float(global_norm(updates)) == pytest.approx(10 * math.sqrt(1000), rel=1e-3)
    clipped, _ = clip_by_global_norm(1.0).update(updates, optax.EmptyState())
    assert clipped["w"].dtype == jnp.float16
    assert float(global_norm(clipped)) == pytest.approx(1.0, rel=1e-2)  # optax's own gave 0: 10 / inf


@pytest.mark.slow
def test_accumulated_float16_gradients_overflow_no_sooner_than_the_whole_batchs(tmp_path: Path) -> None:
    """Each microbatch was differentiated as its loss sum, gradients its target count times larger than the whole
    batch's in the 16-bit compute dtype: 2 microbatches gave a nan norm where 1 batch gave a finite one."""
    data, norms = _targets_scaled(tmp_path, 30000.0), {}
    for k in (1, 2):
        out = tmp_path / f"k{k}"
        assert main([*OVERFLOW_RUN, "--data", data, "--dtype", "float16", "--batch-size", "256",
                     "--train.grad-accum", str(k), "--out", str(out)]) == 0
        norms[k] = _first_grad_norm(out)
    assert norms[2] == pytest.approx(norms[1], rel=2e-2)


@pytest.mark.slow
def test_1f1b_float16_gradients_overflow_no_sooner_than_one_devices(tmp_path: Path) -> None:
    """1F1B writes its backward itself and started each microbatch's from its loss sum: its 16-bit cotangents
    were its target count times larger than one device's, and float16 overflowed (an infinite norm, exit 3)."""
    data, norms = _targets_scaled(tmp_path, 30000.0), {}
    layouts = {"one": ["--devices", "1", "--mesh", "none"],
               "1f1b": ["--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--parallel.schedule", "1f1b",
                        "--parallel.microbatches", "2"]}
    for name, layout in layouts.items():
        out = tmp_path / name
        assert main([*OVERFLOW_RUN, "--data", data, "--dtype", "float16", "--batch-size", "256",
                     "--model.num-layers", "5", *layout, "--out", str(out)]) == 0
        norms[name] = _first_grad_norm(out)
    assert norms["1f1b"] == pytest.approx(norms["one"], rel=2e-2)
