"""The speed options change speed and memory, never the arithmetic: unrolled layers, remat, dropout masks,
the compilation cache and the allocator settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from shardbench import malloc
from shardbench.bench.bench_cmd import settings
from shardbench.bench.cases import compile_only
from shardbench.errors import ConfigError
from shardbench.config import ModelConfig
from shardbench.models.transformer import keep_mask, layers_per_iteration
from shardbench.train.loop import run
from conftest import logged_losses as _losses


def _train_losses(micro, **overrides: object) -> list[float]:
    cfg = micro(**overrides)
    run(cfg)
    return _losses(Path(cfg.train.out))


@pytest.fixture(scope="module")
def dropout_reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    from conftest import micro_config

    cfg = micro_config(tmp_path_factory.mktemp("reference"), **{"model.dropout": 0.1})
    run(cfg)
    return _losses(Path(cfg.train.out))


def test_auto_unroll_rule() -> None:
    assert layers_per_iteration(ModelConfig(num_layers=6)) == 6
    assert layers_per_iteration(ModelConfig(num_layers=24)) == 1
    assert layers_per_iteration(ModelConfig(num_layers=6, remat="full")) == 1
    assert layers_per_iteration(ModelConfig(num_layers=6, unroll=2)) == 2
    assert layers_per_iteration(ModelConfig(num_layers=6, unroll=99)) == 6


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{"model.unroll": 1}, {"model.remat": "block"}, {"model.remat": "full"},
                                       {"model.attention": "fused"}],
                         ids=["rolled-loop", "remat-block", "remat-full", "fused-attention"])
def test_layer_loop_and_remat_give_the_same_losses(micro, dropout_reference, overrides) -> None:
    """Against the default (two layers unrolled, no remat), with dropout on so the masks are compared too."""
    reference = dropout_reference
    losses = _train_losses(micro, **{"model.dropout": 0.1, **overrides})
    assert len(losses) == len(reference) == 4
    assert losses == pytest.approx(reference, rel=2e-5, abs=2e-6)


@pytest.mark.slow
def test_remat_saves_compiled_memory() -> None:
    temp = {policy: compile_only("vit-tiny", {"model.remat": policy, "train.batch_size": 32})["temp_bytes"]
            for policy in ("none", "block", "full")}
    assert temp["none"] > temp["block"] > temp["full"] > 0


def test_keep_mask_statistics() -> None:
    shape, keep = (256, 1024), 0.9
    mask = np.asarray(keep_mask(jax.random.key(0), shape, keep))
    n = mask.size
    sigma = (keep * (1 - keep) / n) ** 0.5
    assert abs(mask.mean() - keep) < 5 * sigma
    # Neighbours along either axis are uncorrelated.
    x = mask.astype(np.float64) - mask.mean()
    for a, b in ((x[:, 1:], x[:, :-1]), (x[1:], x[:-1])):
        corr = (a * b).mean() / x.var()
        assert abs(corr) < 5 / n**0.5
    # Same key, same mask; another key agrees only by chance (keep^2 + (1-keep)^2 of the time).
    assert np.array_equal(mask, np.asarray(keep_mask(jax.random.key(0), shape, keep)))
    other = np.asarray(keep_mask(jax.random.key(1), shape, keep))
    agree = (mask == other).mean()
    assert abs(agree - (keep**2 + (1 - keep) ** 2)) < 0.01


def test_keep_mask_is_the_same_when_sharded() -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    make = jax.jit(lambda k: keep_mask(k, (64, 48), 0.7), out_shardings=sharding)
    sharded = make(jax.random.key(3))
    assert len(sharded.sharding.device_set) == 8
    assert np.array_equal(np.asarray(sharded), np.asarray(keep_mask(jax.random.key(3), (64, 48), 0.7)))


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardbench", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


MICRO_FLAGS = ["--preset", "vit-tiny", "--data", "synthetic", "--data.synthetic-train", "256",
               "--data.synthetic-test", "64", "--model.patch-size", "8", "--model.embed-dim", "32",
               "--model.num-layers", "2", "--model.mlp-dim", "64", "--batch-size", "32", "--steps", "2",
               "--no-train.eval", "--no-train.progress"]


@pytest.mark.slow
def test_compile_cache_is_hit_by_a_second_process(tmp_path) -> None:
    cache = tmp_path / "xla"
    summaries = []
    for name in ("first", "second"):
        out = tmp_path / name
        done = _cli(["train", *MICRO_FLAGS, "--data.cache-dir", str(tmp_path / "data"),
                     "--train.compile-cache", str(cache), "--out", str(out)])
        assert done.returncode == 0, done.stderr[-2000:]
        summaries.append(json.loads((out / "summary.json").read_text())["measurements"]["compile_cache"])
    first, second = summaries
    assert first["dir"] == second["dir"] == str(cache)
    assert first["hits"] == 0 and first["requests"] > 0
    assert second["hits"] == first["requests"]  # every program the first run compiled came from disk
    assert any(cache.iterdir())


@pytest.mark.slow
def test_compile_cache_counts_each_run_alone(micro, tmp_path) -> None:
    """Two runs in one process with one cache: the second's figures are its own, not the process's total."""
    cache = str(tmp_path / "xla-shared")
    # A run without the cache first: the eager programs a process compiles once (in-memory) are not then
    # counted against the first run alone, whichever tests ran before this one.
    run(micro(**{"train.compile_cache": str(tmp_path / "xla-warm"), "train.out": str(tmp_path / "warm")}))
    first = run(micro(**{"train.compile_cache": cache, "train.out": str(tmp_path / "a")}))
    second = run(micro(**{"train.compile_cache": cache, "train.out": str(tmp_path / "b")}))
    a, b = first["measurements"]["compile_cache"], second["measurements"]["compile_cache"]
    assert a["requests"] > 0 and a["hits"] == 0
    assert b["requests"] == a["requests"] and b["hits"] == b["requests"]


@pytest.mark.slow
def test_compile_cache_off(micro) -> None:
    cfg = micro(**{"train.compile_cache": "off"})
    summary = run(cfg)
    assert summary["measurements"]["compile_cache"]["dir"] is None


PRINT_TUNABLES = ("import sys; from shardbench import malloc; malloc.maybe_reexec(int(sys.argv[1])); import os; "
                  "print(os.environ.get('GLIBC_TUNABLES', ''))")


def _tunables(env: dict[str, str], steps: int = 100) -> str:
    return subprocess.run([sys.executable, "-c", PRINT_TUNABLES, str(steps)], capture_output=True, text=True,
                          env=env, check=True).stdout.strip()


CLEAN = ("GLIBC_TUNABLES", "SHARDBENCH_MALLOC_TUNED", "SHARDBENCH_MALLOC", "SHARDBENCH_MALLOC_CHOICE")


@pytest.mark.slow
@pytest.mark.skipif(not malloc.applies({"JAX_PLATFORMS": "cpu"}), reason="needs Linux with glibc")
def test_reexec_sets_the_allocator_tunables() -> None:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env["JAX_PLATFORMS"] = "cpu"
    tunables = dict(t.split("=") for t in _tunables(env).split(":"))
    assert tunables == malloc.TUNABLES
    # A user's own setting wins; the opt-out leaves the environment alone.
    done = _tunables({**env, "GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    assert "glibc.malloc.arena_max=4" in done and "glibc.malloc.arena_max=1" not in done
    assert "glibc.malloc.mmap_max=0" in done
    assert _tunables({**env, "SHARDBENCH_MALLOC": "default"}) == ""


@pytest.mark.slow
@pytest.mark.skipif(not malloc.applies({"JAX_PLATFORMS": "cpu"}), reason="needs Linux with glibc")
def test_allocator_is_tuned_only_for_cpu_training_long_enough_to_repay_it() -> None:
    """A process that JAX will run on a GPU or TPU keeps glibc's allocator (the tuned one slowed XLA's GPU
    compiler 5x); on the CPU a training process gets the tunables unless it is too short to repay the
    slower compilation; SHARDBENCH_MALLOC=tuned forces them anywhere."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    assert _tunables({**env, "JAX_PLATFORMS": "cpu"}) != ""
    assert _tunables({**env, "JAX_PLATFORMS": "cpu"}, steps=0) != ""  # trained by epochs
    assert _tunables({**env, "JAX_PLATFORMS": "cpu"}, steps=malloc.MIN_STEPS - 1) == ""
    for platform in ("cuda", "gpu", "rocm", "tpu", "cuda,cpu"):
        assert _tunables({**env, "JAX_PLATFORMS": platform}) == "", platform
    assert "glibc.malloc.arena_max=1" in _tunables({**env, "JAX_PLATFORMS": "cuda", "SHARDBENCH_MALLOC": "tuned"})
    # Without JAX_PLATFORMS: an accelerator counts when its plugin is installed and its device files exist.
    cuda, nvidia = {"jax_cuda13_plugin"}, {"/dev/nvidiactl"}
    assert malloc.target_platform({}, installed=cuda.__contains__, present=nvidia.__contains__) == "gpu"
    assert malloc.target_platform({}, installed=cuda.__contains__, present=set().__contains__) == "cpu"
    assert malloc.target_platform({}, installed=set().__contains__, present=nvidia.__contains__) == "cpu"
    assert malloc.target_platform({}, installed={"libtpu"}.__contains__,
                                  present={"/dev/accel[0-9]*"}.__contains__) == "tpu"
    assert malloc.target_platform({"JAX_PLATFORMS": "cpu"}, installed=cuda.__contains__,
                                  present=nvidia.__contains__) == "cpu"
    # What a child that does not choose for itself (a benchmark worker) gets, and what its record says.
    gpu_worker = malloc.child_environ({**env, "JAX_PLATFORMS": "cuda"}, 0)
    assert "GLIBC_TUNABLES" not in gpu_worker and malloc.describe(gpu_worker).startswith("default (JAX runs on gpu")
    cpu_worker = malloc.child_environ({**env, "JAX_PLATFORMS": "cpu"}, 0)
    assert malloc.describe(cpu_worker).startswith("tuned (CPU training;")
    assert "GLIBC_TUNABLES" not in malloc.child_environ({**env, "JAX_PLATFORMS": "cpu"}, None)


def test_bench_settings_pair_dtypes_with_batches() -> None:
    assert settings(None, None, "cpu") == [("float32", 128)]  # neither given: the platform's default pairs
    assert settings(None, None, "gpu") == [("float32", 128), ("bfloat16", 1024)]
    assert settings("bfloat16", None, "gpu") == [("bfloat16", 128)]
    assert settings("float32,bfloat16", "64", "cpu") == [("float32", 64), ("bfloat16", 64)]
    assert settings("float32,bfloat16", "128,1024", "cpu") == [("float32", 128), ("bfloat16", 1024)]
    # (a batch of 0 is a whole number, refused by the batch size's declared range when bench validates each
    # setting: tests/test_bench.py)
    for dtypes, batches, words in (("float32,bfloat16", "1,2,3", "same length"), ("bfloat61", None, "bfloat61"),
                                   (None, "x", "'x' is not a whole number"), ("", None, "--dtype ''"),
                                   (None, ",", "--batch-size ','")):
        with pytest.raises(ConfigError, match=words):
            settings(dtypes, batches, "cpu")


@pytest.mark.slow
def test_bench_rejects_bad_input_before_starting(tmp_path) -> None:
    out = tmp_path / "never"
    for args, words in ((["--groups", "step,warp"], "--groups"), (["--batches", "32,x"], "--batches"),
                        (["--set", "model.num_heads=7"], "not divisible"),
                        (["--preset", "lm-seed"], "--preset lm-seed: shardbench bench compares the ViT's")):
        done = _cli(["bench", *args, "--out", str(out)])
        assert done.returncode == 2
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not out.exists()


FAULTS_PER_CALL = """
import resource, jax, jax.numpy as jnp
x = jnp.ones((4096, 4096))  # 64 MiB: every call needs temporaries this large
f = jax.jit(lambda x: jnp.cumsum(x * 2.0, axis=0).sum())
for _ in range(3):
    f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    f(x).block_until_ready()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


@pytest.mark.slow
@pytest.mark.skipif(not malloc.applies({"JAX_PLATFORMS": "cpu"}), reason="needs Linux with glibc")
def test_tuned_allocator_reuses_memory_instead_of_faulting_it_in() -> None:
    """64 MiB of temporaries are 16,384 pages of 4 KiB: glibc's default maps them afresh on every call; the
    tuned allocator hands back most of what the previous call freed (measured on a Xeon: 3,277 faults per call
    against 49,155 here, and 0 per step against 595,000 for a vit-seed train step on an EPYC)."""
    # XLA_FLAGS dropped too: the tests' -O0 makes the cumsum itself three times slower, and the faults counted
    # are the allocator's, whatever code XLA emits.
    base = {k: v for k, v in os.environ.items()
            if k not in ("GLIBC_TUNABLES", "SHARDBENCH_MALLOC_TUNED", "XLA_FLAGS")}
    faults = {}
    for name, env in (("default", base), ("tuned", malloc.tuned_environ(base))):
        done = subprocess.run([sys.executable, "-c", FAULTS_PER_CALL], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        faults[name] = float(done.stdout.strip().splitlines()[-1])
    pages = 4096 * 4096 * 4 / 4096
    assert faults["tuned"] < 0.5 * faults["default"]
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not (thp.exists() and "[always]" in thp.read_text()):  # with 2 MiB pages everywhere there are fewer
        assert faults["default"] > 0.5 * pages
