"""The language model and the deep MLP, and what the SPMD styles do besides training as one device does (that
is test_equivalence): FSDP's memory and collectives under shard_map, impossible requests, sweeps over styles."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from shardbench import config as config_lib
from shardbench.data.tokens import text_tokens, uniform_tokens
from shardbench.errors import ConfigError, DataError
from shardbench.models import build_model, count_params
from shardbench.models.lm import flops_per_example as lm_flops
from shardbench.models.mlp import flops_per_example as mlp_flops
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.sweep.grid import make_sweep
from shardbench.train.loop import run
from shardbench.preflight import check_run

LN512 = math.log(512)


def small(tmp_path: Path, preset: str, name: str, **overrides: object) -> config_lib.Config:
    """A preset shrunk to compile and step in a second or two on 8 simulated devices."""
    shapes: dict[str, dict[str, object]] = {
        "lm-seed": {"model.embed_dim": 32, "model.num_heads": 4, "model.mlp_dim": 64, "model.num_layers": 2,
                    "model.seq_len": 16, "data.synthetic_train": 512, "data.synthetic_test": 64},
        "mlp-small": {"model.mlp_dim": 64, "model.num_layers": 5, "model.input_dim": 32, "train.batch_size": 64,
                      "data.synthetic_train": 512, "data.synthetic_test": 64},
        "vit-tiny": {"model.patch_size": 8, "model.embed_dim": 32, "model.num_layers": 2, "model.num_heads": 4,
                     "model.mlp_dim": 64, "train.batch_size": 32, "data.synthetic_train": 512,
                     "data.synthetic_test": 64},
    }
    base = {"train.steps": 4, "train.progress": False, "train.checkpoint_every": 0, "train.log_every": 1,
            "train.out": str(tmp_path / name), "data.cache_dir": str(tmp_path / "cache"),
            "train.compile_cache": "off", "optim.warmup_steps": 0}
    return override(get_preset(preset), {**base, **shapes[preset], **overrides})


# ------------------------------------------------------------------------------------------------ models
def test_parameter_counts_and_flops_match_a_hand_count() -> None:
    lm = get_preset("lm-seed")
    m = lm.model
    e, f, v, s, n = m.embed_dim, m.mlp_dim, m.vocab_size, m.seq_len, m.num_layers
    per_block = 4 * e * e + 4 * e + 2 * e * f + f + e + 4 * e  # q/k/v/out + biases, MLP, two LayerNorms
    want = v * e + s * e + n * per_block + 2 * e + e * v
    got = count_params(nnx.eval_shape(lambda: build_model(lm, nnx.Rngs(0))))
    assert got == want == 3_438_080
    assert lm_flops(m)["forward"] == n * (8 * s * e * e + 4 * s * s * e + 4 * s * e * f) + 2 * s * e * v

    mlp = get_preset("mlp-seed")
    m = mlp.model
    i, w, c = m.input_dim, m.mlp_dim, m.num_classes
    want = i * w + w + (m.num_layers - 1) * (w * w + w) + w * c + c  # the seed's 90 Dense(2056) + Dense(10)
    assert count_params(nnx.eval_shape(lambda: build_model(mlp, nnx.Rngs(0)))) == want == 378_526_058
    assert mlp_flops(m)["train"] == 3 * 2 * (i * w + (m.num_layers - 1) * w * w + w * c)


@pytest.mark.slow
def test_causal_lm_does_not_look_ahead() -> None:
    cfg = override(get_preset("lm-seed"), {"model.num_layers": 2, "model.seq_len": 12})
    model = build_model(cfg, nnx.Rngs(0))
    tokens = np.random.default_rng(0).integers(0, 512, (2, 12)).astype(np.int32)
    changed = tokens.copy()
    changed[:, 7:] = (changed[:, 7:] + 1) % 512
    a, b = np.asarray(model(tokens)), np.asarray(model(changed))
    np.testing.assert_allclose(a[:, :7], b[:, :7], rtol=1e-5, atol=1e-5)  # positions before 7 never see 7..
    assert np.abs(a[:, 7:] - b[:, 7:]).max() > 1e-3


# -------------------------------------------------------------------------------------------------- data
def test_text_windows_are_slices_of_the_file_and_held_out_text_comes_last(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    data = bytes(range(256)) * 4
    path.write_bytes(data)
    ds = text_tokens(path, seq_len=16, val_fraction=0.1)
    windows = (len(data) - 1) // 16
    assert len(ds.train) + len(ds.val) + len(ds.test) == windows
    all_rows = np.concatenate([ds.train.data["tokens"], ds.val.data["tokens"], ds.test.data["tokens"]])
    for k, row in enumerate(all_rows):
        assert row.tolist() == list(data[16 * k: 16 * k + 17])
    assert len(ds.test) == round(windows * 0.1)
    with pytest.raises(DataError, match=r"too few .* give a longer file"):
        text_tokens(path, seq_len=400, val_fraction=0.1)
    ds = uniform_tokens(100, 10, seq_len=8, vocab_size=512, seed=1, val_fraction=0.2)
    assert ds.train.data["tokens"].shape == (80, 9) and ds.info["loss_floor"] == pytest.approx(LN512)


# ---------------------------------------------------------------------------------------------- learning
@pytest.mark.slow
def test_lm_seed_on_uniform_tokens_approaches_but_never_beats_ln512(tmp_path: Path) -> None:
    """The seed's model and batch, 20 of its 50 steps. Its time goes to running steps, not to compiling, so it
    trains as a user's `shardbench train` does, in a process of its own with XLA's default code generation (one
    CPU device), not this process's quickest-to-compile one (tests/conftest.py), which runs its steps about 3x
    slower (benchmarks/data/lm-seed-flags/)."""
    out = tmp_path / "twenty"
    argv = ["--preset", "lm-seed", "--model.embed-dim", "256", "--model.num-heads", "8", "--model.mlp-dim", "1024",
            "--model.num-layers", "4", "--model.seq-len", "64", "--data.synthetic-train", "8192",
            "--data.synthetic-test", "256", "--data.val-fraction", "0.02", "--steps", "20", "--mesh", "none",
            "--no-train.progress", "--train.checkpoint-every", "0", "--train.log-every", "1",
            "--optim.warmup-steps", "0", "--out", str(out), "--data.cache-dir", str(tmp_path / "cache")]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    trained = subprocess.run([sys.executable, "-m", "shardbench", "train", *argv], env=env, capture_output=True,
                             text=True, timeout=600)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    done = json.loads((out / "summary.json").read_text())
    logged = [json.loads(line) for line in (tmp_path / "twenty" / "tensorboard" / "metrics.jsonl").open()]
    first = next(r["train/loss"] for r in logged if r["step"] == 1)
    assert LN512 + 0.2 < first < LN512 + 0.8  # a fresh model is worse than uniform guessing
    assert done["train_loss"] < first - 0.15
    assert abs(done["train_loss"] - LN512) < 0.08
    assert LN512 - 0.01 < done["test_loss"] < LN512 + 0.08  # held-out tokens: no model can beat ln(512)
    assert done["test_perplexity"] == pytest.approx(math.exp(done["test_loss"]))
    assert done["dataset"]["loss_floor"] == pytest.approx(LN512)
    assert done["measurements"]["throughput"]["unit"] == "tokens"
    assert done["tokens_per_s"] == pytest.approx(done["examples_per_s"] * 64)


@pytest.mark.slow
def test_tiny_lm_learns_a_repeated_text(tmp_path: Path) -> None:
    text = tmp_path / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; " * 300)
    summary = run(small(tmp_path, "lm-seed", "fox", **{
        "data.dataset": f"text:{text}", "model.vocab_size": 256, "model.seq_len": 32, "model.embed_dim": 64,
        "train.steps": 150, "train.batch_size": 32, "optim.lr": 3e-3, "optim.optimizer": "adamw"}))
    assert summary["test_loss"] < 0.5 < math.log(256)  # far below uniform guessing over bytes (5.55)


# --------------------------------------------------------------------------------------------- SPMD styles
@pytest.mark.slow
def test_shard_map_fsdp_holds_an_eighth_of_the_parameters(tmp_path: Path) -> None:
    single = run(small(tmp_path, "lm-seed", "single", **{"parallel.strategy": "single", "parallel.mesh": "none",
                                                          "train.steps": 2, "train.eval": False}))
    fsdp = run(small(tmp_path, "lm-seed", "fsdp", **{"parallel.strategy": "fsdp", "parallel.mesh": "8",
                                                      "parallel.spmd": "shard_map", "train.steps": 2,
                                                      "train.eval": False}))
    full = single["measurements"]["memory"]["breakdown"]["params_bytes"]
    held = fsdp["measurements"]["memory"]["breakdown"]["params_bytes"]
    assert full / 8 <= held < full / 8 * 1.05  # only the tiny LayerNorm vectors stay whole
    comms = fsdp["measurements"]["comms"]
    assert {"all-gather", "reduce-scatter"} <= set(comms)


# ------------------------------------------------------------------------------------------- bad requests
@pytest.mark.parametrize(("preset", "overrides", "message"), [
    ("mlp-small", {"parallel.spmd": "pmap", "parallel.strategy": "dp+tp", "parallel.mesh": "4x2"},
     r"--spmd pmap maps over one axis of devices but --mesh 4x2 has a model axis of 2"),
    ("mlp-small", {"parallel.spmd": "pmap", "parallel.strategy": "fsdp", "parallel.mesh": "8"},
     r"--spmd pmap replicates parameters .* cannot run --strategy fsdp"),
    ("mlp-small", {"parallel.strategy": "tp", "parallel.mesh": "model=8", "model.mlp_dim": 100},
     r"tp: model.mlp_dim = 100 is not divisible by the model axis \(8 devices"),
    ("lm-seed", {"parallel.strategy": "tp", "parallel.mesh": "model=8", "model.num_heads": 4},
     r"model.num_heads = 4 is not divisible by the model axis"),
    ("mlp-small", {"data.dataset": "tokens-uniform"},
     r"--data tokens-uniform is a dataset for the lm model, not mlp: use one of regression"),
    ("lm-seed", {"model.kind": "cnn"}, r"unknown --model.kind 'cnn': choose one of vit, lm, mlp"),
    ("lm-seed", {"parallel.spmd": "xmap"}, r"unknown --spmd 'xmap': choose one of jit, shard_map, pmap"),
])
def test_impossible_requests_get_one_line_errors(tmp_path: Path, preset: str, overrides: dict[str, object],
                                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        check_run(small(tmp_path, preset, "bad", **overrides))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "bad").exists()


def test_text_needs_a_byte_vocabulary(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello " * 100)
    with pytest.raises(ConfigError, match=r"byte-level text .* pass --model.vocab-size 256"):  # a configuration
        check_run(small(tmp_path, "lm-seed", "bad", **{"data.dataset": f"text:{text}", "model.vocab_size": 128}))


def test_cli_error_for_pmap_on_a_2d_mesh_exits_2_before_compiling(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shardbench", "train", "--preset", "mlp-small", "--devices", "8", "--mesh", "4x2",
         "--strategy", "dp+tp", "--spmd", "pmap", "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--spmd pmap" in proc.stderr
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------------------------ sweeps
def test_seed_sweep_presets_expand_to_the_seed_experiments() -> None:
    lm = make_sweep("lm-replicated-vs-fsdp")
    assert lm.base_preset == "lm-seed" and [r.settings["parallel.strategy"] for r in lm.runs] == ["dp", "fsdp"]
    assert all(r.settings["train.steps"] == 50 for r in lm.runs)
    mlp = make_sweep("mlp-spmd-styles", base_preset="mlp-small")
    assert [(r.settings["parallel.strategy"], r.settings["parallel.spmd"]) for r in mlp.runs] == [
        ("single", "jit"), ("dp", "jit"), ("dp", "pmap"), ("dp", "shard_map")]


@pytest.mark.slow
def test_sweep_compares_spmd_styles_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "shardbench", "sweep", "--preset", "mlp-spmd-styles", "--base", "mlp-small",
           "--devices", "8", "--steps", "3", "--model.num-layers", "3", "--model.mlp-dim", "64",
           "--model.input-dim", "32", "--batch-size", "64", "--data.synthetic-train", "512",
           "--data.synthetic-test", "64", "--train.compile-cache", "off", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = (out / "report" / "report.md").read_text()
    assert "| spmd |" in report and "SPMD styles" in report
    for style in ("pmap", "shard_map"):
        assert f"{style} " in report
    losses = {json.loads(p.read_text())["spmd"] + json.loads(p.read_text())["strategy"]:
              json.loads(p.read_text())["train_loss"] for p in out.rglob("summary.json")}
    assert len(losses) == 4
    np.testing.assert_allclose(list(losses.values()), losses["jitsingle"], rtol=2e-5)
