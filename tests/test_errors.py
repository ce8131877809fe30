"""Bad input: one clear line on stderr, a non-zero exit, and no run directory left behind."""

from __future__ import annotations

import io
import json
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardbench.cli import main

BASE = ["train", "--preset", "vit-tiny", "--data", "synthetic", "--data.synthetic-train", "256",
        "--data.synthetic-test", "64", "--model.patch-size", "8", "--model.embed-dim", "32", "--model.num-layers", "1",
        "--model.mlp-dim", "64", "--batch-size", "32", "--steps", "2", "--no-train.progress", "--no-train.eval"]


def _paths(tmp_path: Path) -> set[Path]:
    cache = tmp_path / "cache"  # decoded data kept for the next run: a cache, not the run's output
    return {p for p in tmp_path.rglob("*") if p != cache and cache not in p.parents}


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    out = tmp_path / "run"
    before = _paths(tmp_path)
    code = main([*BASE, "--out", str(out), "--data.cache-dir", str(tmp_path / "cache"), *args])
    err = capsys.readouterr().err.strip()
    if code in (2, 4):  # bad input (configuration 2, data 4) is caught before anything is written
        left = sorted(str(p.relative_to(tmp_path)) for p in _paths(tmp_path) - before)
        assert not left, f"a refused run left {left}"
    return code, err


def _image_tree(root: Path, *, splits: tuple[str, ...] = ("train", "test"), corrupt: str | None = None) -> Path:
    for split in splits:
        for cls in ("cat", "dog"):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(4):
                Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    if corrupt:
        (root / corrupt).write_bytes(b"this is not an image")
    return root


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--devices", "8", "--strategy", "dp+tp", "--mesh", "4x4"],
         "--mesh 4x4 has 16 devices but 8 devices are in use"),
        (["--devices", "1", "--strategy", "dp", "--mesh", "4x2"], "--mesh 4x2 has 8 devices but 1 device is in use"),
        (["--profile"], "--profile traces steps 6-8 (--train.profile-skip 5 + --train.profile-steps 3), but this "
                        "run has 2 step(s) to train"),
        (["--devices", "8", "--strategy", "dp", "--batch-size", "36"],
         "--batch-size 36 is not divisible by the data-parallel size 8"),
        (["--devices", "8", "--strategy", "tp", "--mesh", "model=8"],
         "model.num_heads = 4 is not divisible by the model axis (8 devices"),
        (["--devices", "8", "--strategy", "tp", "--mesh", "model=8", "--model.num-heads", "8", "--model.mlp-dim", "60"],
         "model.mlp_dim = 60 is not divisible by the model axis"),
        (["--strategy", "zero3"], "unknown --strategy 'zero3'"),
        # Mistakes a new user makes: each names its flag before anything compiles.
        (["--steps", "-5"], "--steps must be in [0, 2^31); 0 = train by --epochs, got -5"),
        (["--lr", "nan"], "--lr must be in (0, inf), got nan"),
        (["--train.eval-batch-size", "-3"], "--train.eval-batch-size must be in [0, 2^31); 0 = --batch-size, got -3"),
        (["--optim.weight-decay", "-1"], "--optim.weight-decay must be in [0, inf), got -1.0"),
        (["--train.checkpoint-every", "-1"], "--train.checkpoint-every must be in [0, 2^31); 0 = only at the end"),
        (["--devices", "-1"], "--devices must be in [0, 2^31); 0 = every device, got -1"),
        (["--dtype", "float8"], "unknown --dtype 'float8'"),
    ],
)
def test_bad_configuration(tmp_path, capsys, args, message) -> None:
    code, err = _run(tmp_path, capsys, *args)
    assert code == 2
    assert message in err
    assert len(err.splitlines()) == 1 and err.startswith("shardbench: error:")


@pytest.mark.parametrize(
    ("args", "message", "exit_code"),
    # A mistyped name is a choice answered with the valid ones (2, as every other flag's; it was 4); a path that
    # does not exist is the data's (4).
    [(["--data", "mnist"], "unknown dataset 'mnist'", 2), (["--data", "imagefolder:/does/not/exist"],
                                                            "/does/not/exist", 4)],
)
def test_bad_dataset_spec(tmp_path, capsys, args, message, exit_code) -> None:
    code, err = _run(tmp_path, capsys, *args)
    assert code == exit_code
    assert message in err and len(err.splitlines()) == 1 and err.startswith("shardbench: error:")


def test_unknown_preset_is_rejected_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "--preset", "vit-huge"])
    err = capsys.readouterr().err.strip().splitlines()
    # The one useful line with the valid choices, and where to read more: not the 36 lines of usage.
    assert exc.value.code == 2 and len(err) == 2
    assert "invalid choice: 'vit-huge' (choose from" in err[0] and "'vit-tiny'" in err[0]
    assert err[1] == "see 'shardbench train --help'"


def test_corrupt_image_is_named(tmp_path, capsys) -> None:
    root = _image_tree(tmp_path / "images", corrupt="train/dog/bad.png")
    code, err = _run(tmp_path, capsys, "--data", f"imagefolder:{root}", "--model.num-classes", "2")
    assert code == 4 and "bad.png" in err and len(err.splitlines()) == 1


def test_wrong_layout_is_explained(tmp_path, capsys) -> None:
    root = _image_tree(tmp_path / "images", splits=("train",))
    code, err = _run(tmp_path, capsys, "--data", f"imagefolder:{root}", "--model.num-classes", "2")
    assert code == 4 and "test" in err and len(err.splitlines()) == 1


def test_wrong_checksum_is_reported(tmp_path, capsys) -> None:
    tarball = tmp_path / "cifar-10-python.tar.gz"
    payload = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]}, protocol=2)
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    code, err = _run(tmp_path, capsys, "--data", f"cifar10:{tarball}")
    assert code == 4 and "md5" in err and "c58f30108f718f92721af3b95e74349a" in err


def test_class_count_mismatch_is_explained(tmp_path, capsys) -> None:
    """Whole images of 2 classes for the vit's 10: the file is sound and a flag mends it, so the configuration's
    exit (2), not a corrupt file's (4)."""
    root = _image_tree(tmp_path / "images")
    code, err = _run(tmp_path, capsys, "--data", f"imagefolder:{root}")
    assert code == 2 and "has 2 classes but the model is set up for 10; pass --model.num-classes 2" in err, err


@pytest.mark.slow
def test_diverging_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, capsys) -> None:
    code, err = _run(tmp_path, capsys, "--steps", "30", "--optim.optimizer", "sgd", "--lr", "1e12",
                     "--optim.grad-clip", "0", "--optim.warmup-steps", "0", "--optim.schedule", "constant",
                     "--train.checkpoint-every", "1", "--train.log-every", "1")
    assert code == 3, err
    assert " became " in err and "at step" in err
    step = int(err.split("at step ")[1].split()[0])
    assert step >= 1
    out = tmp_path / "run"
    assert not (out / "summary.json").exists()
    saved = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert all(s < step for s in saved)
    if step > 1:  # a checkpoint every step: the last one is the step before the one that diverged
        assert saved and saved[-1] == step - 1, (saved, step)
        assert f"the last checkpoint, saved before it diverged, is step {saved[-1]}" in err


def test_a_long_error_keeps_its_start_and_its_end_on_one_line() -> None:
    """A message over the limit keeps its first two thirds and its last quarter (where a line says what would be
    right) and counts what it left out; a short one, and the first line of several, are kept whole."""
    from shardbench.errors import ONE_LINE, one_line

    long = "w" * 700 + " use --this instead"
    line = one_line(long + "\nsecond line")
    kept = ONE_LINE * 2 // 3 + ONE_LINE // 4
    assert line == f"{'w' * (ONE_LINE * 2 // 3)} [... {len(long) - kept} characters ...] {long[-(ONE_LINE // 4):]}"
    assert line.endswith("w use --this instead") and "\n" not in line
    assert one_line("  short  \nnext") == "short" and one_line("w" * ONE_LINE) == "w" * ONE_LINE


def test_a_collective_whose_peer_process_stopped_is_said_as_such_in_a_joined_run(monkeypatch) -> None:
    """A process of a launch killed mid-step leaves the other in a collective that fails with gloo's words; that
    process said "internal error: JaxRuntimeError ... (a bug in shardbench ...)", exit 70. In a joined run it is
    the processes' kind of failure (exit 5); outside one, such an error stays what it was."""
    import jax

    from shardbench import errors
    from shardbench.errors import ClusterError, describe_fault, report

    err = jax.errors.JaxRuntimeError("UNKNOWN: Gloo all-reduce failed: [../third_party/gloo/transport/tcp/pair.cc"
                                     ":534] Read error [127.0.0.1]:47187: Connection reset by peer")
    assert describe_fault(err) is None
    monkeypatch.setattr(errors, "_end_at_once", True)
    fault = describe_fault(err)
    assert isinstance(fault, ClusterError) and report(fault) == 5
    assert str(fault).startswith("another process of this run stopped while this one was exchanging data with it "
                                 "(UNKNOWN: Gloo all-reduce failed")
    assert describe_fault(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory")) is None


def test_a_full_disk_is_said_as_such_not_as_a_corrupt_database_or_a_bug(tmp_path, capsys) -> None:
    """SQLite's "database or disk is full" was said as a corrupt database, with the advice to remove it (every
    run a sweep had recorded); orbax's ENOSPC, wrapped in a ValueError, was "a bug in shardbench" (exit 70). Both
    are a path that cannot be used: exit 6, one line. The database is filled for real: a page limit makes SQLite
    refuse as a full disk does."""
    import sqlite3

    from shardbench.errors import run_reported

    db = sqlite3.connect(tmp_path / "sweep.db")
    db.execute("CREATE TABLE runs (payload BLOB)")
    db.commit()
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0] + 1}")

    def fill() -> int:
        for _ in range(100):
            db.execute("INSERT INTO runs VALUES (?)", (b"x" * 65536,))
        return 0

    assert run_reported(fill) == 6
    line = capsys.readouterr().err.strip()
    assert line.startswith("shardbench: error: a file could not be written: its disk has no space left "
                           "(database or disk is full)") and "corrupt" not in line, line

    def checkpoint() -> int:  # orbax's words, as a full disk gave them
        raise ValueError("RESOURCE_EXHAUSTED: Error writing to file: /tmp/r1/checkpoints/4.orbax-checkpoint-tmp/d/x: "
                         "No space left on device")

    assert run_reported(checkpoint) == 6
    assert "its disk has no space left" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "says"), [
    ("[]", "a configuration is a table of sections (data, model, parallel, precision, optim, train), not a list"),
    ('{"model": 5, "data": {}, "parallel": {}, "precision": {}, "optim": {}, "train": {}}',
     "a configuration's section 'model' is a int, not a table of fields"),
    # `{}` was read as the defaults: "was trained with data.synthetic_train=50000", a run it never was.
    ("{}", "it lacks the section(s) data, model, parallel, precision, optim, train that every run's config.json holds"),
    ('"hello"', "not a str"),
    ("{", "Expecting property name"),
])
def test_a_resumed_runs_config_json_that_is_no_configuration_is_unreadable_in_one_line(tmp_path, text: str,
                                                                                       says: str) -> None:
    """A config.json that parses but is no configuration gave an AttributeError (exit 70) or a false difference;
    each is now "unreadable", naming the file and what it holds (exit 2)."""
    from shardbench.errors import ConfigError
    from shardbench.parsing import override
    from shardbench.presets import get_preset
    from shardbench.rundir import check_resume

    (tmp_path / "config.json").write_text(text)
    cfg = override(get_preset("vit-tiny"), {"train.resume": True})
    with pytest.raises(ConfigError) as err:
        check_resume(cfg, tmp_path)
    assert str(err.value).startswith(f"--resume: {tmp_path / 'config.json'} is unreadable ("), str(err.value)
    assert says in str(err.value)


def test_a_resume_does_not_hold_a_setting_the_run_never_reads_against_it(tmp_path) -> None:
    """Trained on arrays with --data.synthetic-train 512 (said to do nothing there), resumed without it: the
    resume went on only with the same value ('trained with data.synthetic_train=512, not 50000'). A setting the
    run reads still has to agree."""
    from shardbench.errors import ConfigError
    from shardbench.parsing import override
    from shardbench.presets import get_preset
    from shardbench.rundir import check_resume

    first = override(get_preset("vit-tiny"), {"data.dataset": "arrays:mine.npz", "data.synthetic_train": 512})
    (tmp_path / "config.json").write_text(first.to_json())
    again = override(get_preset("vit-tiny"), {"data.dataset": "arrays:mine.npz", "train.resume": True})
    check_resume(again, tmp_path)
    with pytest.raises(ConfigError, match=re.escape("was trained with optim.lr=0.001, not 0.5")):
        check_resume(override(again, {"optim.lr": 0.5}), tmp_path)
    # Where its compiled programs are cached changes no program: another --train.compile-cache resumes it (it was
    # refused, "trained with train.compile_cache='', not '/tmp/xla'").
    check_resume(override(again, {"train.compile_cache": str(tmp_path / "xla")}), tmp_path)
    # A profile of the resumed steps changes no step either: --profile and its window may be added on resume (it
    # was refused, "trained with train.profile=False, not True").
    check_resume(override(again, {"train.profile": True, "train.profile_skip": 1, "train.profile_steps": 2}),
                 tmp_path)


def test_a_resume_names_first_what_the_run_read(tmp_path) -> None:
    """A run by --steps 8 resumed with --epochs 8 instead: the line named train.epochs=3, a field that run never
    read, and hid --steps in "(and 1 more)". What the run read comes first."""
    from shardbench.errors import ConfigError
    from shardbench.parsing import override
    from shardbench.presets import get_preset
    from shardbench.rundir import check_resume

    (tmp_path / "config.json").write_text(override(get_preset("vit-tiny"), {"train.steps": 8}).to_json())
    with pytest.raises(ConfigError, match=re.escape("was trained with train.steps=8, not 0 (and 1 more)")):
        check_resume(override(get_preset("vit-tiny"), {"train.epochs": 8, "train.resume": True}), tmp_path)


def test_a_resume_compares_the_layout_the_flags_resolved_to(micro, tmp_path) -> None:
    """A run of --devices 0 (every device: 8 here) resumed on 4 devices went on without a word (its record then
    said 4 devices had trained it all), while the same 8 devices named as --devices 8 were refused ("trained with
    parallel.devices=0, not 8"): the flags were compared, not what they resolved to. The run keeps its layout in
    layout.json, and a resume is compared on it."""
    import jax

    from shardbench.errors import ConfigError
    from shardbench.parallel.rules import make_layout
    from shardbench.parsing import override
    from shardbench.rundir import LAYOUT_RECORD, check_resume
    from shardbench.train.loop import run

    cfg = micro(**{"train.steps": 2, "train.checkpoint_every": 1, "parallel.devices": 0, "parallel.strategy": "dp"})
    run(cfg)
    out = Path(cfg.train.out)
    assert json.loads((out / LAYOUT_RECORD).read_text()) == {"strategy": "dp", "mesh": {"data": 8}, "devices": 8,
                                                             "processes": 1}
    again = override(cfg, {"train.resume": True, "parallel.devices": 8})
    check_resume(again, out, layout=make_layout("dp", "", jax.devices()[:8]))  # the same 8, named
    fewer = override(cfg, {"train.resume": True, "parallel.devices": 4})
    with pytest.raises(ConfigError) as err:
        check_resume(fewer, out, layout=make_layout("dp", "", jax.devices()[:4]))
    assert str(err.value) == (f"--resume: {out} was trained as dp on mesh data=8 (8 device(s), 1 process(es)), not dp "
                              f"on mesh data=4 (4 device(s), 1 process(es)); resume on the same devices and layout, "
                              f"or start a new run with another --out")
    fsdp = override(cfg, {"train.resume": True, "parallel.strategy": "fsdp"})  # a flag that changes the layout
    with pytest.raises(ConfigError, match=re.escape("was trained as dp on mesh data=8")):
        check_resume(fsdp, out, layout=make_layout("fsdp", "", jax.devices()[:8]))
    with pytest.raises(ConfigError, match=re.escape("was trained with optim.lr=0.001, not 0.5")):  # the rest still
        check_resume(override(again, {"optim.lr": 0.5}), out, layout=make_layout("dp", "", jax.devices()[:8]))


def test_a_resume_whose_checkpoints_cannot_be_written_is_refused_before_training(micro, tmp_path) -> None:
    """A resumed run whose checkpoints folder could not be written trained every step left, then failed at its
    first save with orbax's tracebacks: it is checked with --out, before anything compiles. (Here the folder is a
    file where a folder is needed; a read-only mount is refused by the same check.)"""
    import shutil

    from shardbench.errors import FileFault
    from shardbench.parsing import override
    from shardbench.train.loop import run

    cfg = micro(**{"train.steps": 2, "train.checkpoint_every": 1})
    run(cfg)
    ckpt = Path(cfg.train.out) / "checkpoints"
    shutil.rmtree(ckpt)
    ckpt.write_text("not a folder")
    with pytest.raises(FileFault) as err:
        run(override(cfg, {"train.resume": True, "train.steps": 2}))
    assert str(err.value) == (f"--out {ckpt}: {ckpt} is a file where a folder is needed: remove it or choose another "
                              f"path")


def test_an_out_folder_holding_something_else_is_not_called_a_run(tmp_path) -> None:
    """--out naming a folder of notes was refused as one that "already holds a run: pass --resume to continue
    it", which would then fail for want of a run. It says what it holds."""
    from shardbench.errors import ConfigError
    from shardbench.parsing import override
    from shardbench.presets import get_preset
    from shardbench.rundir import check_resume

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as err:
        check_resume(get_preset("vit-tiny"), tmp_path)
    assert str(err.value) == (f"--out {tmp_path} holds files of something else (notes.txt), no run: choose an empty "
                              f"or new --out")
    (tmp_path / "config.json").write_text(get_preset("vit-tiny").to_json())
    with pytest.raises(ConfigError, match="already holds a run: pass --resume to continue it"):
        check_resume(override(get_preset("vit-tiny"), {}), tmp_path)


@pytest.mark.parametrize(("argv", "line"), [
    (["train", "--batch-sise", "3"], "unrecognized arguments: --batch-sise 3; did you mean --batch-size?"),
    (["sweep", "--model.embed-dimm=3"], "unrecognized arguments: --model.embed-dimm=3; did you mean --model.embed-dim?"),
    (["train", "--bogus-flag", "3"], "unrecognized arguments: --bogus-flag 3"),  # nothing close: no guess
])
def test_a_mistyped_flag_is_answered_with_the_closest_one(capsys, argv: list[str], line: str) -> None:
    """argparse of Python 3.11 names an unknown flag but not the one meant (`--batch-sise`, `--stratgy`)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == f"shardbench {argv[0]}: error: {line}"


def test_a_run_saved_with_the_old_default_fused_projection_resumes_under_auto(tmp_path, monkeypatch) -> None:
    """--model.qkv-layout's default was fused until auto: a run started then resumes with today's defaults where
    auto runs fused for it (this CPU: the einsum attention), and is refused where auto would run another layout
    (stood in for by the attention resolver alone: cuDNN's, as on an NVIDIA GPU) or where it named another."""
    from shardbench import models
    from shardbench.errors import ConfigError
    from shardbench.parsing import override
    from shardbench.presets import get_preset
    from shardbench.rundir import check_resume

    bf16 = override(get_preset("vit-tiny"), {"precision.dtype": "bfloat16"})
    (tmp_path / "config.json").write_text(override(bf16, {"model.qkv_layout": "fused"}).to_json())
    again = override(bf16, {"train.resume": True})
    assert again.model.qkv_layout == "auto"
    check_resume(again, tmp_path)
    monkeypatch.setattr(models, "resolve_attention", lambda cfg: "cudnn")
    with pytest.raises(ConfigError, match=re.escape("was trained with model.qkv_layout='fused', not 'auto'")):
        check_resume(again, tmp_path)
    monkeypatch.undo()
    (tmp_path / "config.json").write_text(override(bf16, {"model.qkv_layout": "split"}).to_json())
    with pytest.raises(ConfigError, match=re.escape("was trained with model.qkv_layout='split', not 'auto'")):
        check_resume(again, tmp_path)
