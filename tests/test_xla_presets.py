"""XLA option presets reach XLA_FLAGS before JAX starts and are recorded; the kernel table counts a trace's
kernels as they ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from shardbench import xla_presets
from shardbench.errors import ConfigError
from shardbench.measure.kernels import Kernel, find_trace, kernel_table, render

ROOT = Path(__file__).resolve().parents[1]


def test_unknown_preset_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        xla_presets.parse("cudnn-layernorm,cuda-graphs")
    assert "'cuda-graphs'" in str(err.value) and "command-buffers" in str(err.value) and "\n" not in str(err.value)


def test_presets_merge_with_hand_set_flags() -> None:
    env = {"XLA_FLAGS": "--xla_gpu_autotune_level=4 --xla_force_host_platform_device_count=2"}
    value = xla_presets.apply("autotune-0,cudnn-layernorm", env)
    flags = value.split()
    assert "--xla_force_host_platform_device_count=2" in flags  # the user's own flag stays
    assert "--xla_gpu_autotune_level=0" in flags and "--xla_gpu_autotune_level=4" not in flags  # the preset wins
    assert "--xla_gpu_enable_cudnn_layer_norm=true" in flags  # and the second preset's flag is there too
    assert sorted(flags) == sorted(["--xla_force_host_platform_device_count=2", "--xla_gpu_autotune_level=0",
                                    "--xla_gpu_enable_cudnn_layer_norm=true"])  # each once, nothing else
    assert env["XLA_FLAGS"] == value


def test_presets_refused_once_jax_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    jax.devices()  # the backends are up in this process
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored afterwards
    with pytest.raises(ConfigError, match="already started"):
        xla_presets.apply("no-triton-gemm")
    xla_presets.apply("")  # no presets: nothing to refuse


def test_a_flag_this_jaxlib_does_not_know_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        xla_presets.check_known("--xla_gpu_autotune_level=0 --xla_no_such_flag=1")
    assert "--xla_no_such_flag" in str(err.value) and "\n" not in str(err.value)
    xla_presets.check_known(" ".join(f for p in xla_presets.PRESETS.values() for f in p.flags[:1]))


@pytest.mark.slow
def test_train_records_the_flags_it_ran_with(tmp_path: Path) -> None:
    """A real run: the presets' flags and a hand-set flag both reach XLA and the run record."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "shardbench", "train", "--preset", "vit-tiny", "--data", "synthetic",
         "--data.synthetic-train", "128", "--data.synthetic-test", "32", "--steps", "2", "--batch-size", "16",
         "--model.embed-dim", "32", "--model.mlp-dim", "64", "--model.num-layers", "1", "--no-train.eval",
         "--no-train.progress", "--train.xla-presets", "autotune-0,cudnn-layernorm", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "summary.json").read_text())
    flags = record["measurements"]["xla_flags"].split()
    assert flags == ["--xla_force_host_platform_device_count=2", "--xla_gpu_autotune_level=0",
                     "--xla_gpu_enable_cudnn_layer_norm=true"]
    assert record["devices"] == 2  # the hand-set flag took effect
    assert json.loads((out / "config.json").read_text())["train"]["xla_presets"] == "autotune-0,cudnn-layernorm"


def _traced_three_times(fn: Any, tmp_path: Path) -> tuple[list[Kernel], int, int]:
    """`kernel_table` of a profiler trace of three calls of `fn` (compiled on one device beforehand) on a 256 x 256
    array of ones."""
    f = jax.jit(fn, device=jax.devices()[0])
    x = jnp.ones((256, 256))
    f(x).block_until_ready()
    jax.profiler.start_trace(str(tmp_path))
    for _ in range(3):
        f(x).block_until_ready()
    jax.profiler.stop_trace()
    return kernel_table(find_trace(tmp_path), top=100)


def test_kernel_table_counts_each_launch(tmp_path: Path) -> None:
    """Three calls of a program of known ops: each op appears three times, and the shares add up to one."""
    kernels, total, devices = _traced_three_times(lambda x: (jnp.sin(x) @ x.T).sum(), tmp_path)
    assert kernels and total > 0 and devices == 1
    assert {k.count for k in kernels} == {3}
    assert abs(sum(k.share for k in kernels) - 1.0) < 1e-9
    assert [k.total_ns for k in kernels] == sorted((k.total_ns for k in kernels), reverse=True)
    table = render(kernels, total, steps=3)
    assert f"| `{kernels[0].name}` |" in table and "| 1 |" in table  # one launch per step


def test_kernel_table_counts_the_ops_inside_a_loop_not_the_loop(tmp_path: Path) -> None:
    """A loop of 4 iterations called three times: the ops of its body are launched 12 times each, those around it
    3 times, and the loop itself, which launches nothing of its own, is no kernel (XLA names it while.N; checked
    on jax 0.10.2's CPU compiler)."""
    kernels, _, _ = _traced_three_times(lambda x: jax.lax.fori_loop(0, 4, lambda i, y: jnp.sin(y) @ x.T, x).sum(),
                                        tmp_path)
    assert not any(k.name.startswith("while") for k in kernels), kernels
    assert {k.count for k in kernels} == {3, 12}, kernels


def test_no_trace_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no profiler trace") as err:
        find_trace(tmp_path)
    assert "\n" not in str(err.value)
