"""Simulated devices from a library import, and precision combinations that either run or are explained."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import pytest

from shardbench.config import DTYPES, MATMUL_PRECISIONS, PrecisionConfig
from shardbench.errors import ConfigError
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


def test_bfloat16_compute_really_computes_in_bfloat16(micro) -> None:
    from flax import nnx

    from shardbench.models import build_model

    cfg = micro(**{"precision.dtype": "bfloat16", "precision.param_dtype": "float32"})
    model = build_model(cfg, nnx.Rngs(0))
    assert model.head_kernel[...].dtype == jnp.float32
    jaxpr = jax.make_jaxpr(lambda x: model(x))(jnp.ones((2, 32, 32, 3)))
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert dots and all(e.invars[0].aval.dtype == jnp.bfloat16 for e in dots[:1])
    assert jaxpr.out_avals[0].dtype == jnp.float32  # logits (and so the loss) in float32
