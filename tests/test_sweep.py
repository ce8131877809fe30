"""Sweeps: grid expansion and names, sweep files, and real sweeps of tiny runs in real processes into a real
SQLite store (failed runs recorded as results, time limits, a killed sweep resumed)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import held_by_another_process

from shardbench import config as config_lib
from shardbench.cli import main
from shardbench.errors import ConfigError
from shardbench.sweep import sweep_cmd
from shardbench.naming import run_name
from shardbench.parallel.mesh import same_mesh
from shardbench.presets import get_preset
from shardbench.sweep.grid import axes_from_values, make_sweep, run_config, split_alternatives
from shardbench.sweep.runner import Options, Outcome, classify, train_command
from shardbench.store import RunRow, Store
from shardbench.sweep.sweep_file import load_sweep_file

# In-process sweeps fork from a pytest process whose JAX is up; each child execs at once, so JAX's warning is moot.
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")

TINY = ["--preset", "vit-tiny", "--data", "synthetic", "--data.synthetic-train", "256", "--data.synthetic-test",
        "64", "--model.patch-size", "8", "--model.embed-dim", "32", "--model.num-layers", "1", "--model.mlp-dim",
        "64", "--batch-size", "32", "--steps", "2", "--no-train.eval", "--devices", "8"]

# The sweep's entry point through a parser of its own, as `shardbench sweep` will call it.
SWEEP_MAIN = ("import argparse, sys; from shardbench.sweep import sweep_cmd; p = argparse.ArgumentParser(); "
              "sweep_cmd.add_parser(p.add_subparsers(dest='command')); sys.exit(sweep_cmd.run(p.parse_args()))")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shardbench")
    sweep_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["sweep", *argv])


def sweep(tmp_path: Path, *argv: str) -> int:
    return sweep_cmd.run(parse(*TINY, "--data.cache-dir", str(tmp_path / "cache"), *argv))


def rows(out: Path) -> dict[str, RunRow]:
    with Store(out / "sweep.db") as store:
        return {r.name: r for r in store.runs()}


# ------------------------------------------------------------------------------------------ grids, pure
def test_settings_given_alone_with_resume_apply_to_the_stored_plan() -> None:
    """A sweep of lm-tiny over dp and fsdp at 3 steps, resumed with `--steps 5` alone: the plan is the stored one
    with 5 steps, so the difference named is the steps (a plan from nothing started at vit-seed and named that);
    with `--steps 3`, or the strategies again, it is the stored plan itself."""
    from shardbench.sweep.sweep_cmd import plan_difference, plan_meta

    stored = make_sweep("lm-tiny", None, None, {"parallel.strategy": "dp,fsdp", "train.steps": 3})
    meta = plan_meta(stored, {})
    changed = make_sweep(None, None, None, {"train.steps": 5}, stored)
    assert [r.name for r in changed.runs] == [r.name for r in stored.runs] == ["strategy_dp", "strategy_fsdp"]
    assert plan_difference(meta, plan_meta(changed, {})) == "train.steps=3 in the store, 5 now"
    for same in ({"train.steps": 3}, {"parallel.strategy": "dp,fsdp"}):
        assert plan_difference(meta, plan_meta(make_sweep(None, None, None, same, stored), {})) is None
    assert plan_difference(meta, plan_meta(make_sweep(None, None, None, {"train.steps": 5}), {})) == (
        "base preset 'lm-tiny' in the store, 'vit-seed' now")  # what it said, from a plan started from nothing


def test_a_dry_run_refuses_an_out_folder_the_sweep_would_refuse(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--dry-run "exits as the sweep would start": on an --out that holds a sweep (without --resume), or one whose
    stored plan differs (with it), it answered 0 and listed runs the sweep would refuse to start."""
    from shardbench.sweep.sweep_cmd import open_store, plan_meta

    out = tmp_path / "s"
    stored = make_sweep("mlp-small", None, None, {"parallel.strategy": "dp,fsdp", "train.steps": 3})
    open_store(out, False, plan_meta(stored, {})).close()
    common = ("--preset", "mlp-small", "--out", str(out), "--dry-run")

    def refusal(*argv: str) -> str:
        assert sweep_cmd.run(parse(*common, *argv)) == 2
        said = capsys.readouterr()
        assert said.out == ""  # refused before listing a run
        return said.err.strip()

    assert refusal("--strategy", "dp,fsdp", "--steps", "3") == (
        f"shardbench: error: --out {out} already holds a sweep: pass --resume to finish it, or choose another --out")
    differs = refusal("--resume", "--strategy", "dp,fsdp,zero1", "--steps", "3")
    assert f"--resume: {out} holds a different sweep (run strategy_zero1 new); resume it with" in differs
    assert "sweep them into a folder beside it, and `shardbench report` the folder holding both" in differs
    assert "(train.steps=3 in the store, 5 now)" in refusal("--resume", "--strategy", "dp,fsdp", "--steps", "5")
    assert sweep_cmd.run(parse(*common, "--resume", "--strategy", "dp,fsdp", "--steps", "3")) == 0
    assert "2 run(s) from mlp-small" in capsys.readouterr().out


@pytest.mark.slow
def test_a_resume_runs_failed_runs_again_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs that timed out at 1 s are recorded failed; `--resume --timeout 300` printed that the timeout was
    replaced and ran nothing, so it now says they did not complete and how to run them again; with
    --retry-failed they run again (their folders started afresh) and complete."""
    out = tmp_path / "s"
    args = ("--batch-size", "16,32", "--out", str(out))
    assert sweep(tmp_path, *args, "--timeout", "1") == 1
    assert [r.error_kind for r in rows(out).values()] == ["timeout", "timeout"]
    capsys.readouterr()
    assert sweep(tmp_path, *args, "--resume", "--timeout", "300") == 1
    assert ("resuming: 2 of 2 runs already recorded (2 of them did not complete: --retry-failed runs them again); "
            "nothing left to run" in capsys.readouterr().out)
    assert sweep(tmp_path, *args, "--retry-failed") == 2  # without --resume: one line
    assert "--retry-failed runs again the failed runs of a sweep being resumed: add --resume" in capsys.readouterr().err
    assert sweep(tmp_path, *args, "--resume", "--retry-failed", "--timeout", "300") == 0
    assert [r.status for r in rows(out).values()] == ["complete", "complete"]
    assert "[1/2] batch_16  complete" in capsys.readouterr().out
    # A finished sweep resumed says it has nothing left to run ("no run was recorded" read as a failure).
    assert sweep(tmp_path, *args, "--resume") == 0
    said = capsys.readouterr().out
    assert "resuming: 2 of 2 runs already recorded; nothing left to run" in said
    assert "no run recorded by this invocation" in said


def test_a_swept_field_no_run_reads_is_noted(capsys: pytest.CaptureFixture[str]) -> None:
    """--model.num-heads swept on the MLP made runs that computed the same, which the report ranked apart, with
    a word only in each run's log. Weight decay swept beside adam and adamw is read by the adamw runs: no note."""
    assert sweep_cmd.run(parse("--preset", "mlp-small", "--model.num-heads", "2,4", "--strategy", "dp,fsdp",
                               "--dry-run")) == 0
    assert [line for line in capsys.readouterr().err.splitlines() if "note" in line] == [
        "shardbench: note: --model.num-heads is swept, but no run reads it (the mlp model has no attention): runs that "
        "differ only in it compute the same"]
    assert sweep_cmd.run(parse("--preset", "mlp-small", "--optim.optimizer", "adam,adamw", "--optim.weight-decay",
                               "0,0.1", "--dry-run")) == 0
    assert "note" not in capsys.readouterr().err
    # The profile window's size is read by every run of a sweep that traces them all (--profile, the sweep's own
    # option): no note there ("--profile is off" was said); without it, the note.
    window = ["--preset", "mlp-small", "--steps", "10", "--train.profile-steps", "2,3", "--dry-run"]
    assert sweep_cmd.run(parse(*window, "--profile")) == 0
    assert "note" not in capsys.readouterr().err
    assert sweep_cmd.run(parse(*window)) == 0
    assert "--train.profile-steps is swept, but no run reads it" in capsys.readouterr().err


def test_a_runs_layout_note_is_said_before_the_sweep_starts(capsys: pytest.CaptureFixture[str]) -> None:
    """fsdp+tp on 8 devices with no --mesh runs on 8x1 (every device on its first axis, as documented): nothing is
    split over model. `shardbench train` says so in each run's log; the sweep said nothing, and its report then
    read as if both axes were split. The note is said once, naming its runs; a mesh that splits both axes gets
    none, and nor does dp, whose one axis is split."""
    assert sweep_cmd.run(parse("--preset", "mlp-small", "--strategy", "dp,fsdp+tp", "--batch-size", "256,512",
                               "--dry-run")) == 0
    assert [line for line in capsys.readouterr().err.splitlines() if "note" in line] == [
        "shardbench: note: runs strategy_fsdp_tp_batch_256, strategy_fsdp_tp_batch_512: strategy fsdp+tp on mesh "
        "8x1: its model axis has one device, so nothing is split over it; a mesh naming its size splits it "
        "(--mesh data=N,model=N)"]
    assert sweep_cmd.run(parse("--preset", "mlp-small", "--strategy", "dp+tp,fsdp+tp", "--mesh", "data=4,model=2",
                               "--dry-run")) == 0
    assert "note" not in capsys.readouterr().err


def test_a_sweep_keeps_what_its_name_names() -> None:
    from shardbench.sweep.sweep_file import parse_sweep

    file = parse_sweep({"preset": "lm-tiny", "grid": {"parallel.strategy": ["dp", "fsdp"]}}, label="lm")
    assert [(s.label, s.origin, s.base_preset) for s in (
        make_sweep("strategies", "vit-tiny"), make_sweep(None, None, file), make_sweep("lm-tiny"), make_sweep())] == [
        ("strategies", "sweep preset", "vit-tiny"), ("lm", "sweep file", "lm-tiny"), ("lm-tiny", "preset", "lm-tiny"),
        ("vit-seed", "preset", "vit-seed")]


def test_mesh_grid_gives_the_seeds_runs() -> None:
    s = make_sweep("mesh-grid")
    assert s.base_preset == "vit-seed" and s.base == {"parallel.strategy": "auto"}
    assert [r.name for r in s.runs] == [f"mesh_{m}_batch_{b}" for m in ("none", "8_1", "4_2")
                                        for b in (128, 1024, 4096)]
    assert s.runs[7].overrides == {"parallel.mesh": "4x2", "train.batch_size": 1024}


def test_precision_grid_concatenates_its_sub_grids_and_runs_their_shared_baseline_once() -> None:
    """Its three sub-grids each hold vit-seed's own float32 run at batch 128 (float32 parameters and compute,
    default matmul precision): planned three times under three names, it ran three times."""
    sweep = make_sweep("precision-grid")
    runs = {r.name: r for r in sweep.runs}
    assert list(runs) == ["pdtype_float32", "pdtype_bfloat16", "dtype_float32_batch_4096",
                          "dtype_bfloat16_batch_128", "dtype_bfloat16_batch_4096", "matmul_high", "matmul_highest"]
    assert runs["pdtype_bfloat16"].settings == {"parallel.strategy": "auto", "precision.dtype": "float32",
                                                "train.batch_size": 128, "precision.param_dtype": "bfloat16"}
    assert runs["dtype_bfloat16_batch_4096"].settings["precision.param_dtype"] == "float32"
    assert sweep.same == {"pdtype_float32": ["dtype_float32_batch_128", "matmul_default"]}
    # no two runs left make the same configuration, and none of the sub-grids' configurations went missing
    configs = [json.dumps(run_config("vit-seed", r), sort_keys=True) for r in sweep.runs]
    assert len(set(configs)) == len(configs)
    seed, kept = config_lib.flatten(get_preset("vit-seed")), run_config("vit-seed", runs["pdtype_float32"])
    fields = ("precision.dtype", "precision.param_dtype", "train.batch_size")
    assert [kept[k] for k in fields] == ["float32", "float32", 128]
    assert kept["precision.matmul_precision"] == seed["precision.matmul_precision"] == "default"


def test_runs_two_grids_plan_alike_run_once_and_the_sweep_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep_cmd.run(parse("--preset", "precision-grid", "--dry-run")) == 0
    captured = capsys.readouterr()
    assert ("shardbench: note: dtype_float32_batch_128 and matmul_default make the same configuration as "
            "pdtype_float32: run once, as pdtype_float32") in captured.err.splitlines()
    assert captured.out.startswith("7 run(s) from vit-seed") and "matmul_default" not in captured.out


def test_the_strategies_preset_runs_every_strategy_on_a_mesh_it_takes() -> None:
    """`make demo`'s grid follows the table of strategies: a new entry joins it, on a mesh that strategy takes
    (pipeline stages aside: they must divide the model's layers)."""
    import jax

    from shardbench.parallel.rules import make_layout
    from shardbench.parallel.strategies import STRATEGIES

    runs = make_sweep("strategies").runs
    # Pipelines have their own needs, expert parallelism needs a model with experts (the moe preset runs it), and
    # context parallelism a sequence its seq axis splits (the long-context preset runs it).
    unstaged = [name for name, s in STRATEGIES.items() if not {"stage", "expert", "seq"} & set(s.axes)]
    assert sorted(r.settings["parallel.strategy"] for r in runs) == sorted(unstaged)
    for r in runs:
        devices = jax.devices()[:1 if r.settings["parallel.mesh"] == "none" else 8]
        make_layout(r.settings["parallel.strategy"], r.settings["parallel.mesh"], devices)  # raises if it cannot


def test_the_pipeline_preset_runs_every_schedule_beside_a_one_stage_run_at_its_microbatch_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """For each model: dp and fsdp on 8 devices; pp on 8 stages with every declared schedule at 8, 16 and 32
    microbatches (a schedule added to the choices joins without editing the preset); and, for each pipeline run,
    a one-stage run on one device with as many microbatches of the same batch, the reference its bubble is measured
    against."""
    from shardbench import config as config_lib

    monkeypatch.setattr(config_lib, "PIPELINE_SCHEDULES", (*config_lib.PIPELINE_SCHEDULES, "later"))
    runs = [r.settings for r in make_sweep("pipeline").runs]
    for kind in ("mlp", "lm"):
        mine = [r for r in runs if r["model.kind"] == kind]
        assert sorted(r["parallel.strategy"] for r in mine if r["parallel.strategy"] != "pp") == ["dp", "fsdp"]
        staged = [r for r in mine if r["parallel.strategy"] == "pp" and r["parallel.mesh"] == "stage=8"]
        assert sorted((r["parallel.schedule"], r["parallel.microbatches"]) for r in staged) == sorted(
            (s, m) for s in (*config_lib.PIPELINE_SCHEDULES,) for m in (8, 16, 32))
        assert all(r["parallel.devices"] == 8 for r in mine if r["parallel.mesh"] != "stage=1")
        one_stage = {r["parallel.microbatches"]: r for r in mine if r["parallel.mesh"] == "stage=1"}
        assert sorted(one_stage) == [8, 16, 32] and all(r["parallel.devices"] == 1 for r in one_stage.values())
        # The same batch and model: the same microbatch size as the 8-stage run (pp splits no data axis).
        for r in staged:
            ref = one_stage[r["parallel.microbatches"]]
            assert {k: v for k, v in ref.items() if not k.startswith("parallel.")} == {
                k: v for k, v in r.items() if not k.startswith("parallel.")}


@pytest.mark.slow
def test_a_value_the_preset_already_sets_leaves_the_runs_that_set_their_own(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--devices 8`, as the docs pass it to the zero and moe presets, given to the pipeline preset (which runs on
    8) put its one-stage reference runs on 8 devices too: refused, and the report had no bubble to measure. It
    confirms the preset's 8; another count replaces every run's, as a single value does."""
    plain = {r.name: r.settings for r in make_sweep("pipeline").runs}
    assert make_sweep("pipeline", values={"parallel.devices": "8"}).runs == make_sweep("pipeline").runs
    assert [n for n, r in plain.items() if r["parallel.devices"] == 1] == [
        n for n, r in plain.items() if r["parallel.mesh"] == "stage=1"] != []
    assert sweep_cmd.run(parse("--preset", "pipeline", "--devices", "8", "--dry-run")) == 0
    assert "REFUSED" not in capsys.readouterr().out
    four = make_sweep("pipeline", values={"parallel.devices": "4"}).runs
    assert {r.settings["parallel.devices"] for r in four} == {4}


def test_every_run_of_the_pipeline_preset_passes_trains_checks() -> None:
    from shardbench.sweep.preflight import refusals

    assert refusals(make_sweep("pipeline")).refused == {}


def test_the_long_context_preset_runs_six_layouts_to_8k_and_the_ring_to_16k() -> None:
    runs = [r.settings for r in make_sweep("long-context").runs]
    layouts = {(r["parallel.strategy"], r.get("parallel.context", "all-gather"), r["parallel.mesh"],
                r.get("parallel.sequence_parallel", False)) for r in runs}
    assert layouts == {("dp", "all-gather", "4", False), ("fsdp", "all-gather", "4", False),
                       ("dp+tp", "all-gather", "data=2,model=2", True),
                       ("dp+tp", "all-gather", "data=2,model=2", False),
                       ("cp", "all-gather", "seq=4", False),
                       ("cp", "ring", "seq=4", False)}
    lengths = sorted((r["model.seq_len"], r["parallel.strategy"], r.get("parallel.context")) for r in runs)
    assert [t for t, *_ in lengths] == ([256] * 2 + [512] * 2 + [1024] * 6 + [2048] * 6 + [4096] * 6 + [8192] * 6
                                        + [16384])
    assert [(s, c) for t, s, c in lengths if t == 16384] == [("cp", "ring")]
    assert all(r["parallel.devices"] == 4 and r["train.batch_size"] == 4 and r["train.steps"] == 3 for r in runs)


@pytest.mark.slow
def test_every_run_of_the_long_context_preset_passes_trains_checks() -> None:
    from shardbench.sweep.preflight import refusals

    assert refusals(make_sweep("long-context")).refused == {}


def test_command_line_values_override_a_sweep_preset() -> None:
    s = make_sweep("mesh-grid", base_preset="vit-tiny", values={"train.steps": "20", "train.batch_size": "64,256"})
    assert s.base_preset == "vit-tiny" and s.base == {"parallel.strategy": "auto", "train.steps": 20}
    assert len(s.runs) == 6 and s.runs[1].name == "mesh_none_batch_256"
    fixed = make_sweep("mesh-grid", values={"train.batch_size": "32"})  # one value: out of every axis
    assert [r.name for r in fixed.runs] == ["mesh_none", "mesh_8_1", "mesh_4_2"]
    assert fixed.runs[0].settings["train.batch_size"] == 32


def test_comma_lists_become_axes_and_tuple_fields_take_semicolons() -> None:
    fixed, axes = axes_from_values({"parallel.strategy": "dp", "parallel.mesh": "8,4x2", "optim.lr": "1e-3,0.01",
                                    "data.crop_scale": "0.5,1.0", "data.crop_ratio": "0.8,1.2;0.9,1.1"})
    assert fixed == {"parallel.strategy": "dp", "data.crop_scale": (0.5, 1.0)}
    assert axes == [[{"parallel.mesh": "8"}, {"parallel.mesh": "4x2"}], [{"optim.lr": 0.001}, {"optim.lr": 0.01}],
                    [{"data.crop_ratio": (0.8, 1.2)}, {"data.crop_ratio": (0.9, 1.1)}]]
    assert split_alternatives("parallel.mesh", "data=4,model=2") == ["data=4,model=2"]
    assert split_alternatives("parallel.mesh", "data=4,model=2;8") == ["data=4,model=2", "8"]
    # one mesh in several spellings is one run: listed twice, it is refused as a sweep file's duplicate is (it
    # was run once, under its first spelling, without a word); a bare N (its axis the strategy's) and another mesh
    # stay apart
    _, axes = axes_from_values({"parallel.mesh": "4x2;8;data=8;model=8"})
    assert axes == [[{"parallel.mesh": "4x2"}, {"parallel.mesh": "8"}, {"parallel.mesh": "data=8"},
                     {"parallel.mesh": "model=8"}]]
    for spelled, twice in [("4x2;data=4,model=2;8", "'data=4,model=2'"), ("8;MODEL=2,DATA=4;4x2", "'4x2'"),
                           ("data=2,stage=2,model=2;model=2,stage=2,data=2", "'model=2,stage=2,data=2'"),
                           ("auto;none;08;8", "'8'")]:
        with pytest.raises(ConfigError, match=f"^--parallel.mesh '{re.escape(spelled)}' lists parallel.mesh = "
                                              f"{re.escape(twice)} twice"):
            axes_from_values({"parallel.mesh": spelled})
    with pytest.raises(ConfigError, match="^--train.batch-size '64,064' lists train.batch_size = 64 twice"):
        axes_from_values({"train.batch_size": "64,064"})
    assert same_mesh("auto") == same_mesh("") == "" and same_mesh(" MODEL=2,Data=4 ") == "4x2"
    assert run_name({"parallel.mesh": "4x2", "train.batch_size": 1024}) == "mesh_4_2_batch_1024"
    assert run_name({"parallel.strategy": "dp+tp", "data.crop_scale": (0.5, 1.0)}) == \
        "strategy_dp_tp_crop_scale_0.5_1.0"
    s = make_sweep("vit-tiny", values={"train.batch_size": "32,64", "model.embed_dim": "32"})
    assert [r.name for r in s.runs] == ["batch_32", "batch_64"] and s.base == {"model.embed_dim": 32}


@pytest.mark.slow
def test_a_run_whose_values_make_a_long_name_runs_in_a_folder_of_a_short_one(tmp_path: Path) -> None:
    """Two runs whose swept values name them with 560 characters (a file name may have 255 bytes): each keeps the
    start of its name and a hash of the whole, so the two stay apart, and each runs and is reported."""
    cache = "/" + "/".join(["x" * 60] * 9)
    runs = [run_name({"data.cache_dir": f"{cache}{end}"}) for end in ("a", "b")]
    assert [len(n) for n in runs] == [200, 200] and runs[0] != runs[1]
    assert runs[0][:-13] == runs[1][:-13] and runs[0].startswith(f"cache_dir__{'x' * 60}_{'x' * 60}")
    assert run_name({"data.cache_dir": "/short"}) == "cache_dir__short"  # a name that fits is as it was
    out = tmp_path / "long"
    code = main(["sweep", "--preset", "mlp-small", "--devices", "1", "--steps", "1", "--batch-size", "16",
                 "--data.synthetic-train", "64", "--data.synthetic-test", "32", "--model.num-layers", "2",
                 "--model.mlp-dim", "16", "--no-train.eval", "--data.cache-dir",
                 f"{tmp_path / 'c'}{cache}a;{tmp_path / 'c'}{cache}b", "--out", str(out)])
    assert code == 0
    with Store(out / "sweep.db") as store:
        rows = store.runs()
    assert [r.status for r in rows] == ["complete", "complete"] and all(len(r.name) == 200 for r in rows)
    assert all((out / "runs" / r.name / "summary.json").exists() for r in rows)


def test_unknown_fields_and_malformed_values_stop_the_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ConfigError, match=r"^unknown configuration field 'train.batchsize' \(did you mean "
                                          r"'train.batch_size'\?\): see 'shardbench train --help'$"):
        make_sweep("vit-tiny", values={"train.batchsize": "1,2"})
    with pytest.raises(ConfigError, match="'many' is not a valid int"):
        make_sweep("vit-tiny", values={"train.batch_size": "32,many"})
    with pytest.raises(ConfigError, match="is set by the sweep"):
        make_sweep("vit-tiny", values={"train.out": "x"})
    assert sweep(tmp_path, "--batch-size", "32,x", "--out", str(tmp_path / "s")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardbench: error: --train.batch-size: 'x'")
    assert not (tmp_path / "s").exists()


def test_sweep_file_toml(tmp_path: Path) -> None:
    path = tmp_path / "grid.toml"
    path.write_text("""
preset = "vit-tiny"
axes = [[{parallel.mesh = "8x1", parallel.strategy = "dp"}, {"parallel.mesh" = "4x2", "parallel.strategy" = "dp+tp"}]]
grid = {"train.batch_size" = [128, 1024], data.crop_scale = [[0.5, 1.0]]}
[base]
train.steps = 20
"precision.dtype" = "bfloat16"
""")
    loaded = load_sweep_file(path)
    assert loaded.preset == "vit-tiny" and loaded.base == {"train.steps": 20, "precision.dtype": "bfloat16"}
    s = make_sweep(sweep_file=loaded, values={"train.steps": "5"})
    assert s.base_preset == "vit-tiny" and s.base == {"precision.dtype": "bfloat16", "train.steps": 5}
    assert [r.name for r in s.runs] == ["mesh_8_1_strategy_dp_batch_128_crop_scale_0.5_1.0",
                                        "mesh_8_1_strategy_dp_batch_1024_crop_scale_0.5_1.0",
                                        "mesh_4_2_strategy_dp_tp_batch_128_crop_scale_0.5_1.0",
                                        "mesh_4_2_strategy_dp_tp_batch_1024_crop_scale_0.5_1.0"]
    assert s.runs[0].overrides["data.crop_scale"] == (0.5, 1.0)
    path.write_text('grid = {"train.batch_size" = [128, "big"]}')
    with pytest.raises(ConfigError,
                       match=r"grid.toml: --train.batch-size: 'big' is not a valid int: give one in \(0, 2\^31\)"):
        load_sweep_file(path)
    path.write_text('grid = {"train.steps" = [2, true]}')  # said as the file says it, not as Python's True
    with pytest.raises(ConfigError, match="grid.toml: --train.steps: true is not a valid int"):
        load_sweep_file(path)
    path.write_text('[base]\nmodel.width = 3')
    with pytest.raises(ConfigError, match=r"unknown configuration field 'model.width': see"):  # near to nothing
        load_sweep_file(path)
    path.write_text('[grid]\nstrategy = ["dp", "fsdp"]')  # a short flag's spelling names its field
    with pytest.raises(ConfigError, match=r"unknown configuration field 'strategy' \(did you mean "
                                          r"'parallel.strategy'\?\)"):
        load_sweep_file(path)


@pytest.mark.parametrize(("text", "said"), [
    # two axes setting one field: the later replaced the earlier's values, so dp and fsdp were never run
    ('axes = [[{"parallel.strategy" = "dp"}, {"parallel.strategy" = "fsdp"}]]\n'
     'grid = {"parallel.strategy" = ["zero1", "zero2"]}',
     "'parallel.strategy' is swept by axes[0] and by grid entry 'parallel.strategy': the second would replace"),
    ('grid = {"parallel.strategy" = ["dp", "fsdp"], "train.batch_size" = [8, 16, 8]}',
     "grid entry 'train.batch_size' lists train.batch_size = 8 twice"),
    ('axes = [[{"parallel.mesh" = "4x2"}, {"parallel.mesh" = "data=4,model=2"}]]',
     "axes[0] lists parallel.mesh = 'data=4,model=2' twice (or as two spellings of one run)"),
    # a [base] value every run replaces: the dry run called it fixed
    ('grid = {"train.batch_size" = [64, 128]}\n[base]\ntrain.batch_size = 64',
     "'train.batch_size' is fixed in [base] and swept by grid entry 'train.batch_size', which sets it in every run"),
    ('grid = {"train.batch_size" = [64, 128]}\n[base]\npreset = "mlp-small"',
     "'preset' is inside [base]: a TOML key written after a [base] header belongs to that table"),
])
def test_a_sweep_file_that_would_run_other_runs_than_it_lists_is_refused(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_sweep_file(path)
    assert str(refused.value).startswith(f"--sweep-file {path}: {said}") and "\n" not in str(refused.value)


def test_a_base_value_an_axis_sets_in_some_entries_only_is_their_default(tmp_path: Path) -> None:
    """[base] strategy dp, and an axis whose second entry alone sets a strategy: the first entry runs dp."""
    path = tmp_path / "s.toml"
    path.write_text('axes = [[{"parallel.mesh" = "8x1"}, {"parallel.mesh" = "4x2", "parallel.strategy" = "dp+tp"}]]\n'
                    '[base]\nparallel.strategy = "dp"')
    s = make_sweep(sweep_file=load_sweep_file(path))
    assert [r.settings["parallel.strategy"] for r in s.runs] == ["dp", "dp+tp"]


def test_dry_run_prints_runs_and_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert sweep_cmd.run(parse("--preset", "mesh-grid", "--dry-run", "--out", str(tmp_path / "s"))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10 and lines[8].split() == ["mesh_4_2_batch_1024", "parallel.mesh=4x2",
                                                     "train.batch_size=1024"]
    assert not (tmp_path / "s").exists()


def test_each_run_is_a_train_command_of_its_own(tmp_path: Path) -> None:
    s = make_sweep("vit-tiny", values={"data.crop_scale": "0.5,1.0", "train.eval": False, "optim.lr": "-1,2",
                                       "parallel.mesh": ""})
    cmd = train_command(s.base_preset, s.runs[0], Options(tmp_path, profile=True))
    assert cmd[:6] == [sys.executable, "-m", "shardbench", "train", "--preset", "vit-tiny"]
    assert cmd[6:] == ["--data.crop-scale=0.5,1.0", "--no-train.eval", "--parallel.mesh=", "--optim.lr=-1.0",
                       "--out", str(tmp_path / "runs" / "lr_-1.0"), "--train.run-name", "lr_-1.0",
                       "--no-train.progress", "--train.profile", "--train.profile-root", str(tmp_path / "tensorboard")]


def test_failures_are_classified_from_the_exit_status_and_output(tmp_path: Path) -> None:
    log = tmp_path / "run.log"

    def kind(code: int | None, stderr: list[str], log_text: str = "") -> tuple[str, str]:
        log.write_text(log_text or "\n".join(stderr))
        return classify(Outcome(code, stderr, 0.0, 1.0), log, 60)

    assert kind(2, ["shardbench: error: --mesh 4x4 has 16 devices"]) == ("config", "shardbench: error: --mesh 4x4 "
                                                                         "has 16 devices")
    assert kind(4, ["shardbench: error: dataset 'cifar10:/x': /x does not exist"])[0] == "data"
    assert kind(3, ["shardbench: loss became nan at step 7"]) == ("diverged", "shardbench: loss became nan at step 7")
    assert kind(-9, [], "shardbench: vit-tiny\nRESOURCE_EXHAUSTED: out of memory allocating 2GiB")[0] == "oom"
    assert kind(-9, [], "shardbench: vit-tiny") == ("killed", "killed by SIGKILL")
    assert kind(-15, []) == ("killed", "killed by SIGTERM")
    assert kind(1, ["Traceback (most recent call last):", "ValueError: boom"]) == ("crash", "exit 1: ValueError: boom")
    assert kind(1, ["Traceback (most recent call last):", "MemoryError"])[0] == "oom"
    assert kind(None, []) == ("timeout", "no result within the 60 s time limit: stopped")
    assert len(kind(1, ["x" * 1000])[1]) == 300


def test_store_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "sweep.db") as store:
        for name in ("b", "a", "b"):
            store.add(RunRow(name, "failed", "config", "bad", {"train.batch_size": 1}, {"x.y": [1.0, 2.0]}, None,
                             1.0, 2.0, 1.0))
        store.set_meta("axes", [[{"parallel.mesh": "8"}]])
    with Store(tmp_path / "sweep.db") as store:
        assert [r.name for r in store.runs()] == ["a", "b"] and store.names() == {"a", "b"}
        assert store.get_meta("axes") == [[{"parallel.mesh": "8"}]] and store.get_meta("nope", 3) == 3


def test_every_kind_a_run_can_fail_with_is_one_the_store_takes() -> None:
    from shardbench.store import ERROR_KINDS
    from shardbench.sweep.runner import EXIT_KINDS
    from shardbench.sweep.slurm_jobs import KILLED_KINDS

    assert set(EXIT_KINDS.values()) | set(KILLED_KINDS.values()) | {"timeout", "oom", "crash"} <= set(ERROR_KINDS)


# ------------------------------------------------------------------------------ real sweeps, real processes
@pytest.mark.slow
def test_a_run_whose_processes_could_not_join_is_recorded_as_processes(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit status 5 (processes): each run is told, through the variables `shardbench train` joins by, to join a
    coordinator nobody runs, and gives up after 3 s. The sweep records it and goes on, not dies storing it."""
    from shardbench.launch import free_port

    monkeypatch.setenv("SHARDBENCH_COORDINATOR", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("SHARDBENCH_NUM_PROCESSES", "2")
    monkeypatch.setenv("SHARDBENCH_PROCESS_ID", "1")
    monkeypatch.setenv("SHARDBENCH_JOIN_TIMEOUT", "3")
    out = tmp_path / "s"
    assert sweep(tmp_path, "--mesh", "8", "--out", str(out), "--no-report") == 1
    (row,) = rows(out).values()
    assert (row.status, row.error_kind) == ("failed", "processes")
    assert "process 1 could not join the run within 3 s" in (row.error or "")


@pytest.mark.slow
def test_a_resume_that_repeats_the_plan_keeps_the_stored_options(tmp_path: Path) -> None:
    """A sweep started with --timeout 1 and killed before its run ended, resumed with the same plan arguments and
    no --timeout: the run gets the stored 1 s, not the default 1800 s (where it would complete)."""
    out = tmp_path / "s"
    argv = [*TINY, "--data.cache-dir", str(tmp_path / "cache"), "--mesh", "8", "--out", str(out), "--no-report"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    first = subprocess.Popen([sys.executable, "-c", SWEEP_MAIN, "sweep", *argv, "--timeout", "1"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout is not None
        for line in first.stdout:  # the store holds the plan and options once this is printed
            if line.startswith("sweep: 1 runs ->"):
                break
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    assert rows(out) == {}

    resumed = subprocess.run([sys.executable, "-c", SWEEP_MAIN, "sweep", *argv, "--resume"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "replaces the stored" not in resumed.stdout
    (row,) = rows(out).values()
    assert (row.error_kind, row.error) == ("timeout", "no result within the 1 s time limit: stopped")

    # An option given with --resume replaces the stored one, says so, and is kept for the next --resume.
    again = subprocess.run([sys.executable, "-c", SWEEP_MAIN, "sweep", *argv, "--resume", "--timeout", "600"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert "sweep: --timeout 600 replaces the stored 1" in again.stdout, again.stdout + again.stderr
    with Store(out / "sweep.db") as store:
        assert store.get_meta("options")["timeout"] == 600


@pytest.mark.slow
def test_an_impossible_run_stops_the_sweep_before_it_starts_unless_skipped(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "s"
    assert sweep(tmp_path, "--strategy", "dp", "--mesh", "8,4x4", "--out", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "shardbench: error: 1 of 2 runs would be refused before running (fix the sweep, or pass --skip-refused to "
        "record them as failed and run the rest; --dry-run lists each and why): mesh_4_4: --mesh 4x4 has 16 devices "
        "but 8 devices are in use")
    assert not out.exists()
    # A long reason (every strategy's name) leaves the line whole: its end, the other refused run, was cut off at
    # 300 characters, and with it, before, the way out.
    assert sweep(tmp_path, "--strategy", "dp,zero3,foo", "--out", str(out)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "strategy_zero3: unknown --strategy 'zero3': choose one of auto, single, dp" in line
    assert line.endswith("cp+tp; and 1 more: strategy_foo") and not out.exists()

    assert sweep(tmp_path, "--strategy", "dp", "--mesh", "8,4x4", "--out", str(out), "--skip-refused") == 1
    found = rows(out)
    assert list(found) == ["mesh_8", "mesh_4_4"]
    ok, bad = found["mesh_8"], found["mesh_4_4"]
    assert ok.status == "complete" and ok.record is not None and ok.record["steps"] == 2
    assert ok.config["parallel.mesh"] == "8" and ok.config["model.embed_dim"] == 32
    assert bad.status == "failed" and bad.error_kind == "config" and bad.record is None
    assert bad.error is not None and bad.error.startswith("refused before running: --mesh 4x4 has 16 devices")
    assert bad.overrides == {"parallel.mesh": "4x4"} and bad.wall_s == 0  # no process was started for it
    captured = capsys.readouterr()
    printed = captured.out
    assert "[1/2] mesh_8  complete" in printed and "[2/2] mesh_4_4  FAILED (config): refused before running" in printed
    table = [line for line in printed.splitlines() if line.startswith("mesh_4_4 ")]
    assert len(table) == 1 and "FAILED (config)" in table[0] and f"sweep: {out}" in printed
    assert "sweep: 1 of 2 runs failed: 1 config" in captured.err
    with Store(out / "sweep.db") as store:
        assert store.get_meta("preset") == "vit-tiny" and store.get_meta("axes") == [
            [{"parallel.mesh": "8"}, {"parallel.mesh": "4x4"}]]
        assert store.get_meta("base_config")["train.steps"] == 2 and store.get_meta("created") > 0
        timing = store.get_meta("timing")
    # The runs ran one after another inside the sweep's wall time: what is left over is the sweep's own cost.
    assert timing["runs"] == 2 and timing["runs_wall_s"] == pytest.approx(ok.wall_s)
    assert timing["wall_s"] >= timing["runs_wall_s"] and timing["ratio"] >= 1.0
    assert f"for 2 run(s) whose processes took {timing['runs_wall_s']:.1f} s" in printed
    assert not (out / "runs" / "mesh_4_4.log").exists()


@pytest.mark.slow
def test_one_peak_per_sweep_so_mfu_ranks_runs_as_step_time_does(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs of equal FLOPs: the sweep measures the host's peak once and every run divides by it, so MFU
    orders them exactly inversely to their step times. The 2-step runs still have a step time: the warm-up
    is lowered, with a line saying so."""
    out = tmp_path / "s"
    monkeypatch.setattr("os.getloadavg", lambda: (64.0, 0.0, 0.0))  # a busy host, as the sweep measures its peak
    assert sweep(tmp_path, "--strategy", "dp,fsdp", "--mesh", "8", "--out", str(out)) == 0
    assert "host matmul peak float32" in capsys.readouterr().out
    shared = json.loads((out / "peak.json").read_text())["float32"]
    records = [row.record for row in rows(out).values()]
    assert len(records) == 2 and all(r is not None for r in records)
    peaks = {r["measurements"]["mfu"]["peak_flops_per_s_per_device"] for r in records}
    assert peaks == {shared["flops_per_s"] / 8}
    assert {r["measurements"]["mfu"]["peak_measured_at"] for r in records} == {shared["measured_at"]}
    # the busy host's load travels with the figure into each record
    assert {r["measurements"]["mfu"]["peak_busy"] for r in records} == {shared["busy"]}
    assert shared["busy"].startswith("load average 64.0 on ")
    steps = [r["measurements"]["step_time_s"]["median"] for r in records]
    mfus = [r["measurements"]["mfu"]["mfu"] for r in records]
    assert records[0]["measurements"]["flops"]["analytic_per_step"] == records[1]["measurements"]["flops"][
        "analytic_per_step"]
    assert mfus[0] * steps[0] == pytest.approx(mfus[1] * steps[1], rel=1e-9)
    assert (steps[0] < steps[1]) == (mfus[0] > mfus[1])
    log = (out / "runs" / "strategy_dp.log").read_text()
    assert "warm-up lowered to 0 for this run" in log
    assert records[0]["measurements"]["step_time_s"]["warmup"] == 0
    # Every speed figure agrees: throughput is the batch over the median step, in the record and in the report,
    # whose first finding names the faster run; the two layouts are one computation, and the report says so.
    for r in records:
        assert r["examples_per_s"] == pytest.approx(32 / r["measurements"]["step_time_s"]["median"], rel=1e-9)
    text = (out / "report" / "report.md").read_text()
    table = [line.split(" | ") for line in text.splitlines() if line.startswith("| strategy_")]
    header = next(line for line in text.splitlines() if line.startswith("| run |")).split(" | ")
    for cells, r in zip(table, records, strict=True):
        assert cells[header.index("img/s")] == f"{32 / r['measurements']['step_time_s']['median']:,.0f}"
    faster = min(rows(out).values(), key=lambda row: row.record["measurements"]["step_time_s"]["median"])
    assert f"- Fastest: {faster.name}," in text.split("### Speed", 1)[1]
    assert "strategy_dp, strategy_fsdp are the same computation in different layouts" in text


def test_dry_run_marks_the_runs_that_would_be_refused(capsys: pytest.CaptureFixture) -> None:
    args = parse("--preset", "vit-tiny", "--devices", "8", "--strategy", "dp,fsdpp", "--dtype", "float32,bfloat61",
                 "--mesh", "8,3x3", "--dry-run")
    assert sweep_cmd.run(args) == 2  # as the sweep would stop: a dry run checks a sweep file for CI
    printed = capsys.readouterr()
    assert printed.err == ("shardbench: error: 7 of 8 runs would be refused (marked above); the sweep would stop "
                           "before its first run: fix them, or pass --skip-refused to run the rest\n")
    lines = printed.out.splitlines()
    assert lines[0] == "8 run(s) from vit-tiny; fixed: parallel.devices=8; 7 would be refused"
    runs = {line.split()[0]: line for line in lines[1:]}
    assert "REFUSED" not in runs["strategy_dp_dtype_float32_mesh_8"]
    assert "REFUSED: unknown --dtype 'bfloat61'" in runs["strategy_dp_dtype_bfloat61_mesh_8"]
    assert "REFUSED: unknown --strategy 'fsdpp'" in runs["strategy_fsdpp_dtype_float32_mesh_8"]
    assert "REFUSED: --mesh 3x3 has 9 devices" in runs["strategy_dp_dtype_float32_mesh_3_3"]
    assert sweep_cmd.run(parse("--preset", "vit-tiny", "--devices", "8", "--mesh", "8,3x3", "--skip-refused",
                               "--dry-run")) == 0  # the sweep would run the rest


def test_dry_run_refuses_what_a_run_of_several_processes_would_refuse(capsys: pytest.CaptureFixture) -> None:
    """The runs were checked as one process each: a device count that does not split over the processes, one
    that is not all of theirs, and pmap across processes all passed, and failed once the sweep ran them."""
    args = parse("--preset", "vit-tiny", "--devices", "3,4,8", "--spmd", "jit,pmap", "--strategy", "dp",
                 "--processes", "2", "--dry-run")
    assert sweep_cmd.run(args) == 2
    runs = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "REFUSED: --devices 3 does not split evenly over 2 processes" in runs["devices_3_spmd_jit"]
    assert "REFUSED: --spmd pmap runs in one process, but this run has 2 processes" in runs["devices_8_spmd_pmap"]
    assert "REFUSED" not in runs["devices_8_spmd_jit"] and "REFUSED" not in runs["devices_4_spmd_jit"]
    args = parse("--preset", "vit-tiny", "--devices", "4,8", "--strategy", "dp", "--processes", "2",
                 "--devices-per-process", "4", "--dry-run")
    assert sweep_cmd.run(args) == 2
    runs = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert ("REFUSED: --devices 4: a run of 2 processes uses all of their 8 devices; pass --devices 8 (or 0), or "
            "start fewer processes") in runs["devices_4"]
    assert "REFUSED" not in runs["devices_8"]


@pytest.mark.slow
def test_a_run_killed_by_a_signal_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDBENCH_FAULT_KILL_AT_STEP", "1")
    out = tmp_path / "s"
    assert sweep(tmp_path, "--mesh", "8", "--out", str(out)) == 1  # a failed run fails the sweep
    (row,) = rows(out).values()
    assert (row.status, row.error_kind, row.error) == ("failed", "killed", "killed by SIGKILL")


@pytest.mark.slow
def test_a_run_past_its_time_limit_is_recorded_as_timeout(tmp_path: Path) -> None:
    out = tmp_path / "s"
    t0 = time.perf_counter()
    assert sweep(tmp_path, "--timeout", "1", "--out", str(out)) == 1
    assert time.perf_counter() - t0 < 30
    (row,) = rows(out).values()
    assert (row.status, row.error_kind) == ("failed", "timeout") and "1 s time limit" in (row.error or "")


def test_a_run_stopped_at_its_limit_after_writing_its_record_is_complete(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run writes summary.json last, whole or not at all. One stopped by the time limit after writing it (its
    exit slow) was recorded as "no result within the limit" while its folder said complete, and a report of the
    folders counted it so; it is complete. One stopped before writing it is a timeout."""
    from shardbench.sweep import runner

    s = make_sweep("mlp-small", values={"train.batch_size": "8,16"})
    opts = Options(tmp_path / "s", timeout_s=1.0)
    for run, writes in zip(s.runs, (True, False), strict=True):
        folder = opts.sweep_dir / "runs" / run.name
        write = f"import json, pathlib; pathlib.Path({str(folder)!r}).mkdir(parents=True); " + (
            f"pathlib.Path({str(folder / 'summary.json')!r}).write_text(json.dumps({{'steps': 2}})); " if writes
            else "")
        monkeypatch.setattr(runner, "train_command", lambda *_, w=write: [sys.executable, "-c",
                                                                          w + "import time; time.sleep(60)"])
        row = runner.execute(s, run, opts)
        assert (row.status, row.error_kind, row.record) == (
            ("complete", None, {"steps": 2}) if writes else ("failed", "timeout", None)), row


@pytest.mark.slow
def test_a_killed_sweep_resumes_and_runs_everything_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "s"
    argv = [*TINY, "--data.cache-dir", str(tmp_path / "cache"), "--strategy", "dp", "--mesh", "4x4,8", "--out",
            str(out), "--skip-refused", "--timeout", "600"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen([sys.executable, "-c", SWEEP_MAIN, "sweep", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # The first run fails at once (16 devices asked of 8); kill the sweep once the second has written into
        # its run directory: on --resume, that leftover must go and the run start afresh.
        deadline = time.monotonic() + 240
        while not (out / "runs" / "mesh_8" / "config.json").exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the sweep never reached its second run"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert set(rows(out)) == {"mesh_4_4"}
    assert not (out / "runs" / "mesh_8" / "summary.json").exists()
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(out / "runs" / "mesh_8")):  # the run dies with its sweep, not trains on
        assert time.monotonic() < deadline, "the killed sweep's run is still running"
        time.sleep(0.2)

    # While another sweep or a tune holds the folder, a resume is refused in one line (it ran the same runs beside
    # the first sweep's).
    with held_by_another_process(out):
        busy = subprocess.run([sys.executable, "-c", SWEEP_MAIN, "sweep", "--out", str(out), "--resume"], env=env,
                              capture_output=True, text=True, timeout=300)
    assert busy.returncode == 2 and busy.stderr.strip().splitlines()[-1].endswith(
        f"--out {out}: a sweep or tune is running there (it holds {out / '.lock'}); sweep again with --resume once "
        f"it has ended, or choose another --out"), busy.stderr
    # A changed argument is refused, naming the field; --out alone resumes the stored plan and options.
    changed = subprocess.run([sys.executable, "-c", SWEEP_MAIN, "sweep", *argv, "--steps", "3", "--resume"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert changed.returncode == 2 and "train.steps=2 in the store, 3 now" in changed.stderr, changed.stderr
    # The same with the setting alone: it applies to the stored plan (it named the run preset, vit-seed, before).
    alone = subprocess.run([sys.executable, "-c", SWEEP_MAIN, "sweep", "--out", str(out), "--steps", "3", "--resume"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 2 and "(train.steps=2 in the store, 3 now)" in alone.stderr, alone.stderr
    resumed = subprocess.run([sys.executable, "-c", SWEEP_MAIN, "sweep", "--out", str(out), "--resume"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr  # the refused run stays failed
    assert "resuming: 1 of 2 runs already recorded" in resumed.stdout and "[2/2] mesh_8  complete" in resumed.stdout
    assert "sweep: 1 of 2 runs failed: 1 config" in resumed.stderr
    found = rows(out)
    assert list(found) == ["mesh_4_4", "mesh_8"] and [r.status for r in found.values()] == ["failed", "complete"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["mesh_8", "mesh_8.log"]
    with Store(out / "sweep.db") as store:
        assert store.get_meta("options")["timeout"] == 600
    assert json.loads((out / "runs" / "mesh_8" / "summary.json").read_text())["resumed_from"] == 0


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_an_existing_sweep_is_refused_without_resume(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "s"
    Store(out / "sweep.db").close()
    assert sweep(tmp_path, "--out", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"shardbench: error: --out {out} already holds a sweep: pass --resume to finish it, or choose "
                   f"another --out"]
    assert sorted(p.name for p in out.iterdir()) == ["sweep.db"]


def test_peak_memory_of_a_real_process_is_sampled(tmp_path: Path) -> None:
    from shardbench.sweep.runner import run_process

    size = 300 * 2**20
    # It touches 300 MiB, and maps 512 MiB more (private) that it never touches: resident memory is what counts,
    # not the address space (the interpreter itself is some 10 MiB).
    code = (f"import mmap, time; unused = mmap.mmap(-1, 512 << 20, "
            f"flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS); b = bytearray({size}); "
            f"b[::4096] = b'x' * len(b[::4096]); time.sleep(1.0)")
    outcome = run_process([sys.executable, "-c", code], tmp_path / "alloc.log", timeout_s=60)
    assert outcome.returncode == 0
    assert outcome.peak_rss_bytes is not None and size <= outcome.peak_rss_bytes < size + 100 * 2**20


def test_peak_memory_counts_the_runs_child_processes(tmp_path: Path) -> None:
    """A multi-process run's workers are children of its launch process: their memory is the run's, all of them
    together. Two children each touch 200 MiB and hold it for 1.5 s side by side (sampled every 0.25 s): the peak
    is at least their sum, 400 MiB, which neither child nor the launcher reaches alone (a peak that took the
    largest process of the tree would say about 200 MiB), and not twice it."""
    from shardbench.sweep.runner import run_process

    size = 200 * 2**20
    child = f"b = bytearray({size}); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(1.5)"
    code = (f"import subprocess, sys; children = [subprocess.Popen([sys.executable, '-c', {child!r}]) "
            f"for _ in range(2)]; sys.exit(max(c.wait() for c in children))")
    outcome = run_process([sys.executable, "-c", code], tmp_path / "alloc.log", timeout_s=60)
    assert outcome.returncode == 0
    # and no more than their sum and three interpreters' own (some 10 MiB each): no process counted twice
    assert outcome.peak_rss_bytes is not None and 2 * size <= outcome.peak_rss_bytes < 2 * size + 100 * 2**20


@pytest.mark.parametrize("version", [1, 2])
def test_the_cgroups_memory_limit_and_oom_kills_are_read(tmp_path: Path, version: int) -> None:
    """/proc/PID/cgroup and the cgroup files as the kernel writes them, in a folder standing for /proc and
    /sys/fs/cgroup: the tightest limit of the cgroup and its ancestors, and its count of OOM kills."""
    from shardbench.sweep.memory import cgroup_limit_bytes, memory_cgroup, oom_kills

    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "7").mkdir(parents=True)
    if version == 2:
        (proc / "7" / "cgroup").write_text("0::/user.slice/run\n")
        base = root
        (root / "cgroup.controllers").parent.mkdir(parents=True)
        (root / "cgroup.controllers").write_text("cpu memory pids\n")
        limits = {"user.slice": "2147483648", "user.slice/run": "max"}
        events = ("memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n")
    else:
        (proc / "7" / "cgroup").write_text("5:devices:/\n4:memory:/user.slice/run\n1:cpu:/\n0::/\n")
        base = root / "memory"
        limits = {"": "9223372036854771712", "user.slice": "2147483648", "user.slice/run": "3221225472"}
        events = ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
    for folder, value in limits.items():
        (base / folder).mkdir(parents=True, exist_ok=True)
        (base / folder / limit_file).write_text(value + "\n")
    (base / "user.slice" / "run" / events[0]).write_text(events[1])
    found = memory_cgroup(7, proc, root)
    assert found is not None and found.folders[0] == base / "user.slice" / "run"
    assert cgroup_limit_bytes(found) == 2 * 2**30 and oom_kills(found) == 2
    # No limit anywhere, no such cgroup mounted here (a cgroup namespace: its root stands for it), no process.
    (base / "user.slice" / limit_file).write_text("max\n" if version == 2 else "9223372036854771712\n")
    if version == 2:
        assert cgroup_limit_bytes(memory_cgroup(7, proc, root)) is None
    (proc / "7" / "cgroup").write_text("0::/elsewhere\n" if version == 2 else "4:memory:/elsewhere\n")
    assert memory_cgroup(7, proc, root).folders == (base,)  # type: ignore[union-attr]
    assert memory_cgroup(8, proc, root) is None


def test_a_sigkill_while_the_cgroup_counted_an_oom_kill_is_an_oom(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("shardbench: vit-tiny ...\n")
    kind, message = classify(Outcome(-9, [], 0.0, 1.0, 2**30, oom_kills=1), log, 60)
    assert kind == "oom" and "out-of-memory killer took 1 process(es)" in message
    assert classify(Outcome(-9, [], 0.0, 1.0, 2**30, oom_kills=0), log, 60) == ("killed", "killed by SIGKILL")
    # Run as several processes: the launcher's line names which one was killed (the error said only the signal).
    launched = ["shardbench: error: process 1 of 2 failed: killed by SIGKILL; stopped the other 1"]
    assert classify(Outcome(-9, launched, 0.0, 1.0, 2**30, oom_kills=0), log, 60) == (
        "killed", "process 1 of 2 failed: killed by SIGKILL; stopped the other 1")


def test_a_sigkill_near_the_host_memory_limit_is_called_an_oom(tmp_path: Path) -> None:
    from shardbench.sweep.memory import memory_limit_bytes
    from shardbench.sweep.runner import host_memory_bytes

    total, limit = host_memory_bytes(), memory_limit_bytes()
    assert total is not None and limit is not None
    log = tmp_path / "run.log"
    log.write_text("shardbench: vit-tiny ...\n")
    big = classify(Outcome(-9, [], 0.0, 1.0, int(0.9 * total)), log, 60)
    small = classify(Outcome(-9, [], 0.0, 1.0, 2**30), log, 60)
    assert big[0] == "oom" and "out-of-memory killer" in big[1]
    assert small == ("killed", "killed by SIGKILL")
    # The line is drawn at three quarters of the limit (the host's memory, or a tighter cgroup's): either side of it.
    assert classify(Outcome(-9, [], 0.0, 1.0, int(0.76 * limit)), log, 60)[0] == "oom"
    assert classify(Outcome(-9, [], 0.0, 1.0, int(0.74 * limit)), log, 60) == ("killed", "killed by SIGKILL")


@pytest.mark.slow
def test_sigterm_stops_a_sweep_as_ctrl_c_does_saying_how_to_resume(tmp_path: Path) -> None:
    """SIGTERM (a scheduler's, `kill`'s) ended a sweep with exit 143 and no word; it now stops it as Ctrl-C does:
    the line that says how many runs are recorded and how to go on, and no run left recorded half-done."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "JAX_PLATFORMS": "cpu", "SHARDBENCH_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "sw"
    proc = subprocess.Popen([sys.executable, "-m", "shardbench", "sweep", *TINY, "--batch-size", "16,32",
                             "--steps", "2000", "--out", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (out / "runs").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the first run's process has started
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("shardbench: sweep stopped by SIGTERM; 0 of 2 runs are recorded in "), last
    assert last.endswith(f"continue with --resume --out {out}"), last


def test_the_sweeps_check_refuses_a_batch_past_the_examples_and_parameters_past_a_device(tmp_path: Path) -> None:
    """A sweep's up-front check made only the checks that need no data: a run whose batch is larger than its
    synthetic training split (58 examples of 64) failed an hour in, after the runs before it. Its configuration
    gives that count, and the parameters' bytes; each is refused before the first run, in train's own words."""
    from shardbench.parsing import override
    from shardbench.presets import get_preset
    from shardbench.sweep.preflight import check

    base = override(get_preset("vit-tiny"), {"data.dataset": "synthetic", "data.synthetic_train": 64,
                                             "parallel.devices": 1, "parallel.mesh": "none",
                                             "parallel.strategy": "single"})
    configs = {name: config_lib.flatten(override(base, {"train.batch_size": b}))
               for name, b in (("fits", 16), ("past", 128))}
    configs["huge"] = config_lib.flatten(override(base, {"model.embed_dim": 65536, "model.mlp_dim": 262144,
                                                         "model.num_heads": 1}))
    refused = check(configs).refused
    assert "fits" not in refused
    assert refused["past"] == "--batch-size 128 is larger than the 58 training examples"
    assert "the parameters alone are" in refused["huge"], refused


@pytest.mark.parametrize(("dataset", "kind"), [("synthetic", "vit"), ("tokens-uniform", "lm"),
                                               ("regression", "mlp")])
def test_the_training_rows_a_configuration_gives_are_the_loaders(tmp_path: Path, dataset: str, kind: str) -> None:
    """`known_train_rows` (what the sweep's check counts without data) against the split the loader makes."""
    from shardbench.data.sources import known_train_rows, load_for
    from shardbench.parsing import override
    from shardbench.presets import get_preset

    preset = {"vit": "vit-tiny", "lm": "lm-tiny", "mlp": "mlp-small"}[kind]
    cfg = override(get_preset(preset), {"data.dataset": dataset, "data.synthetic_train": 77,
                                        "data.synthetic_test": 8, "data.val_fraction": 0.13})
    assert known_train_rows(cfg) == len(load_for(cfg, tmp_path).train) == 77 - 10
