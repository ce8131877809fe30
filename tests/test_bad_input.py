"""Whatever the user gets wrong, every command answers with one line and its documented exit status (README's
"When something is wrong", docs/training.md), never a traceback, and leaves no output behind: no run folder, no
config.json, checkpoint or temporary file, nothing a later run could take for finished work.

The cases are generated from tables: every path-taking option of every command against every way a path can be
unusable, every file-reading option against every way a file can be empty or corrupt, and bad values and
settings that would do nothing, for each command. Add a row when a new mistake is found.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
from jax import tree_util
import pytest

from shardbench.capacity import check_fits, check_state_fits, param_bytes_per_device, shard_bytes
from shardbench.cli import main
from shardbench.optim import build_optimizer
from shardbench.errors import EXIT_CODES, ConfigError
from shardbench.parsing import override
from shardbench.preflight import check_runnable
from shardbench.presets import get_preset
from shardbench.train.state import abstract_train_state

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = ["--preset", "vit-tiny", "--data.synthetic-train", "64", "--data.synthetic-test", "32", "--batch-size", "16",
        "--steps", "2", "--model.embed-dim", "16", "--model.mlp-dim", "32", "--model.num-layers", "1",
        "--no-train.progress", "--no-train.eval", "--devices", "1", "--mesh", "none"]


@dataclass(frozen=True)
class Case:
    name: str
    argv: Callable[[Path], list[str]]  # the command line, given a fresh folder for this case
    says: str  # what the one line must name
    exit: str  # its class of mistake in the docs' table, a key of EXIT_CODES: configuration, data or files


# ------------------------------------------------------------------------------------ unusable paths
def _file_in_the_way(tmp: Path) -> Path:
    (tmp / "a-file").write_text("not a folder")
    return tmp / "a-file" / "out"


PATH_FAULTS: dict[str, Callable[[Path], Path]] = {
    "parent is a file": _file_in_the_way,
    "under /proc": lambda tmp: Path("/proc/shardbench-nope/out"),
    "a file given as the folder": lambda tmp: (tmp / "given-file").write_text("x") and tmp / "given-file",
}


def _sweep_dir(tmp: Path) -> Path:
    run = tmp / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"train": {"batch_size": 16}}))
    (run / "summary.json").write_text(json.dumps({"status": "complete", "run_name": "r1"}))
    return tmp / "runs"


PATH_NAMES = {"parent is a file": "a-file", "under /proc": "shardbench-nope", "a file given as the folder": "given-file"}
PATH_OPTIONS: dict[str, Callable[[Path, str], list[str]]] = {
    "train --out": lambda tmp, p: ["train", *TINY, "--out", p],
    "train --data.cache-dir": lambda tmp, p: ["train", *TINY, "--data.cache-dir", p, "--out", str(tmp / "o")],
    "train --train.compile-cache": lambda tmp, p: ["train", *TINY, "--train.compile-cache", p,
                                                   "--out", str(tmp / "o")],
    "sweep --out": lambda tmp, p: ["sweep", *TINY, "--batch-size", "16,32", "--out", p],
    "report --out": lambda tmp, p: ["report", str(_sweep_dir(tmp)), "--out", p],
    "bench --out": lambda tmp, p: ["bench", "--preset", "vit-tiny", "--groups", "pipeline", "--out", p],
    "plan --out": lambda tmp, p: ["plan", "--preset", "vit-tiny", "--target", "cpu", "--devices", "1",
                                  "--train.out", p],
}


def _path_cases() -> list[Case]:
    return [Case(f"{option}: {fault}", lambda tmp, o=option, f=fault: PATH_OPTIONS[o](tmp, str(PATH_FAULTS[f](tmp))),
                 says=PATH_NAMES[fault], exit="files")  # "a path that cannot be used"
            for option in PATH_OPTIONS for fault in PATH_FAULTS]


# ------------------------------------------------------------------------------- empty or corrupt files
def _truncated_npz(path: Path) -> None:
    full = path.with_suffix(".full.npz")
    np.savez(full, x_train=np.zeros((4, 8, 8, 3), np.uint8), y_train=np.zeros(4, np.int64))
    path.write_bytes(full.read_bytes()[:60])


CONTENTS: dict[str, Callable[[Path], None]] = {
    "empty": lambda p: p.write_bytes(b""),
    "random bytes": lambda p: p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes()),
    "a truncated zip": _truncated_npz,
}


def _store_over(tmp: Path, fill: Callable[[Path], None]) -> Path:
    (tmp / "s").mkdir()
    fill(tmp / "s" / "sweep.db")
    return tmp / "s"


def _summary_over(tmp: Path, fill: Callable[[Path], None]) -> Path:
    run = tmp / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"train": {"batch_size": 16}}))
    fill(run / "summary.json")
    return tmp / "runs"


def _file(tmp: Path, name: str, fill: Callable[[Path], None]) -> Path:
    fill(tmp / name)
    return tmp / name


FILE_OPTIONS: dict[str, tuple[Callable[[Path, Callable[[Path], None]], list[str]], str]] = {
    "train --data arrays:": (lambda tmp, f: ["train", *TINY, "--data", f"arrays:{_file(tmp, 'd.npz', f)}",
                                             "--out", str(tmp / "o")], "d.npz"),
    "train --data imagefolder:": (lambda tmp, f: ["train", *TINY, "--data", f"imagefolder:{_file(tmp, 'i.tar.gz', f)}",
                                                  "--out", str(tmp / "o")], "i.tar.gz"),
    "train --data cifar10:": (lambda tmp, f: ["train", *TINY, "--data", f"cifar10:{_file(tmp, 'c.tar.gz', f)}",
                                              "--out", str(tmp / "o")], "c.tar.gz"),
    "sweep --sweep-file (toml)": (lambda tmp, f: ["sweep", "--sweep-file", str(_file(tmp, "s.toml", f)),
                                                  "--out", str(tmp / "o")], "s.toml"),
    "sweep --sweep-file (json)": (lambda tmp, f: ["sweep", "--sweep-file", str(_file(tmp, "s.json", f)),
                                                  "--out", str(tmp / "o")], "s.json"),
    "report of a sweep.db": (lambda tmp, f: ["report", str(_store_over(tmp, f))], "sweep.db"),
    "sweep --resume of a sweep.db": (lambda tmp, f: ["sweep", "--resume", "--out", str(_store_over(tmp, f))],
                                     "sweep.db"),
    "report of a summary.json": (lambda tmp, f: ["report", str(_summary_over(tmp, f))], "summary.json"),
    "plan --validate of a summary.json": (lambda tmp, f: ["plan", "--validate", str(_summary_over(tmp, f))],
                                          "summary.json"),
}


# "An empty or corrupt file" is data (4), except where an empty file is a well-formed one with nothing in it: an
# empty TOML file is a sweep file with no axes (a setting that would do nothing), and SQLite reads an empty file
# as an empty database, which holds no runs to report and no plan to resume, as a folder with none would.
EMPTY_IS_WELL_FORMED = {"sweep --sweep-file (toml)", "report of a sweep.db", "sweep --resume of a sweep.db"}


def _file_exit(option: str, content: str) -> str:
    return "configuration" if content == "empty" and option in EMPTY_IS_WELL_FORMED else "data"


def _file_cases() -> list[Case]:
    return [Case(f"{option}: {content}", lambda tmp, o=option, c=content: FILE_OPTIONS[o][0](tmp, CONTENTS[c]),
                 says=FILE_OPTIONS[option][1], exit=_file_exit(option, content))
            for option in FILE_OPTIONS for content in CONTENTS]


# ------------------------------------------------------------------- bad values, and settings that do nothing
def _empty_sweep_file(tmp: Path) -> list[str]:
    (tmp / "s.toml").write_text('preset = "vit-tiny"\n[base]\n"train.steps" = 2\n')
    return ["sweep", "--sweep-file", str(tmp / "s.toml"), "--out", str(tmp / "o")]


def _victim(tmp: Path) -> Path:
    """A folder with a file in it, outside the run: what a run name that is a path must leave alone."""
    (tmp / "victim" / "keep").mkdir(parents=True)
    (tmp / "victim" / "keep" / "data.txt").write_text("x")
    return tmp / "victim"


CONF, DATA = "configuration", "data"
# (name, command line, what the one line names, exit class): a missing dataset is data, a value no field takes
# or a folder with nothing to report is configuration.
VALUES: list[tuple[str, Callable[[Path], list[str]], str, str]] = [
    ("train: a seed of 2^63", lambda t: ["train", *TINY, "--seed", str(2**63), "--out", str(t / "o")],
     "--seed must be in [0, 2^32)", CONF),
    ("train: 400 digits of steps", lambda t: ["train", *TINY, "--steps", "9" * 400, "--out", str(t / "o")],
     "--steps must be in [0, 2^31); 0 = train by --epochs, got a number of 400 digits", CONF),
    ("train: a width past 2^31", lambda t: ["train", *TINY, "--model.mlp-dim", "99999999999999999999", "--out",
                                            str(t / "o")], "--model.mlp-dim must be in (0, 2^31)", CONF),
    ("train: generated examples past 2^31", lambda t: ["train", *TINY, "--data.synthetic-train", "9" * 30, "--out",
                                                       str(t / "o")], "--data.synthetic-train must be in (0, 2^31)",
     CONF),
    ("train: parameters no device holds", lambda t: ["train", "--preset", "mlp-small", "--model.mlp-dim",
                                                     "2147483647", "--steps", "1", "--devices", "1",
                                                     "--out", str(t / "o")],
     "--model.mlp-dim 2147483647: the parameters alone are 368 EiB on each device (dp on mesh 1x1), and a cpu device "
     "has", CONF),
    ("train: more devices than XLA simulates in reasonable time", lambda t: [
        "train", *TINY[:-4], "--devices", "99999", "--out",
        str(t / "o")], "--devices 99999: at most 4096 CPU devices are simulated", CONF),
    ("train: a profile window of no steps", lambda t: ["train", *TINY, "--profile", "--train.profile-steps", "0",
                                                       "--out", str(t / "o")], "--train.profile-steps 0", CONF),
    ("train: a run name that is an absolute path", lambda t: [
        "train", *TINY, "--profile", "--train.profile-skip", "0", "--train.profile-steps", "1", "--train.run-name",
        str(_victim(t)), "--out", str(t / "o")], "is an absolute path", CONF),
    ("train: a run name of ..", lambda t: ["train", *TINY, "--profile", "--train.profile-skip", "0",
                                          "--train.profile-steps", "1", "--train.run-name", "..",
                                          "--out", str(t / "o")], "--train.run-name .. names a folder", CONF),
    ("train: a run name of .", lambda t: ["train", *TINY, "--train.run-name", ".", "--out", str(t / "o")],
     "--train.run-name . names a folder", CONF),
    ("train: a run name with a /", lambda t: ["train", *TINY, "--train.run-name", "../victim", "--out", str(t / "o")],
     "--train.run-name ../victim holds a path separator", CONF),
    ("train: a run name with a \\", lambda t: ["train", *TINY, "--train.run-name", "runs\\a", "--out", str(t / "o")],
     "holds a path separator (/ or \\)", CONF),
    ("train: a blank run name", lambda t: ["train", *TINY, "--train.run-name", "  ", "--out", str(t / "o")],
     "--train.run-name '  ' is blank", CONF),
    ("train: a list of dtypes", lambda t: ["train", *TINY, "--dtype", "float32,bfloat16", "--out", str(t / "o")],
     "unknown --dtype 'float32,bfloat16': choose one of float32, bfloat16, float16; several values are a sweep: "
     "shardbench sweep takes a comma list and runs each", CONF),
    ("train: a list of batch sizes", lambda t: ["train", *TINY, "--batch-size", "32,64", "--out", str(t / "o")],
     "'32,64' is not a valid int: give one in (0, 2^31); several values are a sweep", CONF),
    ("train: one class for the vit", lambda t: ["train", *TINY, "--model.num-classes", "1", "--out", str(t / "o")],
     "--model.num-classes 1: the vit classifies, which needs at least 2 classes", CONF),
    ("train: --rules for a built-in model", lambda t: ["train", *TINY, "--rules", "conv_out=mlp", "--out",
                                                      str(t / "o")],
     "--rules conv_out=mlp is for a model of your own", CONF),
    ("train: a data cache no folder can be made in", lambda t: [
        "train", *TINY, "--data.cache-dir", "/proc/shardbench-nope/cache", "--out", str(t / "o")],
     "--data.cache-dir /proc/shardbench-nope/cache: /proc/shardbench-nope does not exist", "files"),
    ("train: an unknown XLA preset", lambda t: ["train", *TINY, "--train.xla-presets", "turbo", "--out", str(t / "o")],
     "turbo", CONF),
    ("train: a batch the data cannot fill", lambda t: ["train", *TINY, "--batch-size", "4096", "--out", str(t / "o")],
     "4096", CONF),
    ("train: --resume of nothing", lambda t: ["train", *TINY, "--resume", "--out", str(t / "o")], "--resume", CONF),
    # not "runs/<preset>-<strategy>-<time> holds no run": with no --out a run gets a new folder of that name
    ("train: --resume without --out", lambda t: ["train", *TINY, "--resume"],
     "--resume needs --out: the folder of the run to resume", CONF),
    ("train: arrays that do not exist", lambda t: ["train", *TINY, "--data", f"arrays:{t / 'none.npz'}",
                                                   "--out", str(t / "o")], "none.npz", DATA),
    ("train: arrays given as a folder", lambda t: ["train", *TINY, "--data", f"arrays:{t}", "--out", str(t / "o")],
     "is a folder; give a .npz file after 'arrays:'", DATA),
    ("train: a model file that does not exist", lambda t: ["train", *TINY, "--model", f"{t / 'm.py'}:make",
                                                           "--task", "classify", "--out", str(t / "o")], "m.py", CONF),
    ("train: a negative learning rate", lambda t: ["train", *TINY, "--lr", "-1", "--out", str(t / "o")],
     "--lr must be in (0, inf), got -1.0", CONF),
    ("train: a mesh bigger than the devices", lambda t: ["train", *TINY, "--mesh", "16", "--out", str(t / "o")], "16",
     CONF),
    ("train: accumulation that does not divide the batch", lambda t: ["train", *TINY, "--train.grad-accum", "3",
                                                                      "--out", str(t / "o")],
     "--train.grad-accum 3 does not divide the 16 examples per data shard", CONF),
    ("train: accumulation with BatchNorm statistics", lambda t: [
        "train", *TINY, "--model", f"{EXAMPLES / 'cnn_batchnorm.py'}:build", "--task", "classify",
        "--train.grad-accum", "2", "--out", str(t / "o")], "BatchNorm statistics", CONF),
    ("train: pipeline stages that do not split the layers", lambda t: [
        "train", *TINY, "--strategy", "pp", "--mesh", "stage=4", "--devices", "4", "--out", str(t / "o")],
     "1 stacked layers (parameter encoder/ln1_bias) do not split into 4 equal stages", CONF),
    # The stage counts that would split the stack, each as a mesh of these 8 devices where the data axis can take
    # the rest, else with the devices it needs (said as "stage=2 or 3 or 6" before: 3 and 6 divide no 8).
    ("train: pipeline stages, and the meshes that would split the stack", lambda t: [
        "train", *TINY, "--strategy", "dp+pp", "--mesh", "data=2,stage=4", "--devices", "8", "--model.num-layers",
        "6", "--out", str(t / "o")],
     "use a mesh with stage=2 with the other axes over 4 devices, or stage=3 on 6 devices, or stage=6 on 12 "
     "devices, or a stack that is a multiple of 4 (--model.num-layers)", CONF),
    ("train: pipeline stages of the mlp, whose stack is one layer short", lambda t: [
        "train", "--preset", "mlp-small", "--data.synthetic-train", "64", "--data.synthetic-test", "32",
        "--batch-size", "16", "--steps", "2", "--model.mlp-dim", "32", "--model.num-layers", "4", "--no-train.eval",
        "--no-train.progress", "--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--out", str(t / "o")],
     "use a mesh with stage=3 on 3 devices, or a stack that is a multiple of 2 (--model.num-layers: the mlp stacks "
     "num_layers - 1)", CONF),
    ("train: microbatches that do not divide a data shard", lambda t: [
        "train", *TINY, "--strategy", "dp+pp", "--mesh", "data=2,stage=2", "--devices", "4", "--model.num-layers",
        "2", "--parallel.microbatches", "3", "--out", str(t / "o")],
     "--parallel.microbatches 3 does not divide the 8 examples per data shard", CONF),
    ("train: pipeline stages of a model of your own", lambda t: [
        "train", *TINY, "--model", f"{EXAMPLES / 'convnet.py'}:build", "--task", "classify", "--strategy", "pp",
        "--mesh", "stage=2", "--devices", "2", "--out", str(t / "o")], "your model hands it 0", CONF),
    ("train: pipeline stages under shard_map", lambda t: [
        "train", *TINY, "--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--model.num-layers", "2",
        "--spmd", "shard_map", "--out", str(t / "o")], "--spmd shard_map cannot run --strategy pp", CONF),
    ("train: pipeline stages with dropout", lambda t: [
        "train", *TINY, "--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--model.num-layers", "2",
        "--model.dropout", "0.1", "--out", str(t / "o")], "--model.dropout would draw the same masks", CONF),
    ("train: circular chunks that do not split the layers", lambda t: [
        "train", *TINY, "--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--model.num-layers", "2",
        "--parallel.schedule", "circular", "--parallel.repeats", "2", "--out", str(t / "o")],
     "do not split into 2 stages x 2 repeats = 4 equal chunks (mesh stage=2): use --parallel.repeats 1", CONF),
    ("train: repeats without the circular schedule", lambda t: [
        "train", *TINY, "--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--model.num-layers", "4",
        "--parallel.repeats", "2", "--out", str(t / "o")],
     "--parallel.repeats 2 loops microbatches through the stages, which only --parallel.schedule circular", CONF),
    ("train: circular with fewer microbatches than stages", lambda t: [
        "train", *TINY, "--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--model.num-layers", "4",
        "--parallel.schedule", "circular", "--parallel.repeats", "2", "--parallel.microbatches", "1",
        "--out", str(t / "o")], "1 microbatches cannot loop through 2 stages", CONF),
    ("train: 1f1b with accumulation", lambda t: [
        "train", *TINY, "--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--model.num-layers", "2",
        "--parallel.schedule", "1f1b", "--train.grad-accum", "2", "--out", str(t / "o")],
     "--parallel.schedule 1f1b with --train.grad-accum 2", CONF),
    ("train: a pipeline schedule without pipeline stages", lambda t: [
        "train", *TINY, "--parallel.schedule", "1f1b", "--out", str(t / "o")],
     "--parallel.schedule 1f1b orders the work of pipeline stages", CONF),
    ("train: microbatches without pipeline stages", lambda t: [
        "train", *TINY, "--parallel.microbatches", "4", "--out", str(t / "o")],
     "--parallel.microbatches 4 splits the batch for pipeline stages", CONF),
    # Was "the mlp model cannot be built from this configuration: ZeroDivisionError: float division by zero".
    ("train: an mlp of one layer", lambda t: ["train", "--preset", "mlp-small", "--model.num-layers", "1", "--steps",
                                              "1", "--out", str(t / "o")],
     "--model.num-layers 1: the mlp is an input layer and a stack of square layers", CONF),
    ("inspect: an mlp of one layer", lambda t: ["inspect", "--preset", "mlp-small", "--model.num-layers", "1"],
     "--model.num-layers 1: the mlp is an input layer and a stack of square layers", CONF),
    ("sweep: a sweep file with no axes", _empty_sweep_file, "no axes", CONF),
    ("sweep: a sweep file whose preset is a list", lambda t: (t / "s.toml").write_text(
        'preset = ["vit-tiny"]\ngrid = {"train.batch_size" = [8, 16]}\n') and [
        "sweep", "--sweep-file", str(t / "s.toml"), "--dry-run"], "preset '['vit-tiny']' is not a run preset", CONF),
    ("sweep: a sweep file that does not exist", lambda t: ["sweep", "--sweep-file", str(t / "no.toml")], "no.toml",
     CONF),
    ("sweep: a sweep file that sweeps one field in two axes", lambda t: (t / "s.toml").write_text(
        'preset = "mlp-small"\naxes = [[{"parallel.strategy" = "dp"}, {"parallel.strategy" = "fsdp"}]]\n'
        'grid = {"parallel.strategy" = ["zero1", "zero2"]}\n') and [
        "sweep", "--sweep-file", str(t / "s.toml"), "--out", str(t / "o")],
     "'parallel.strategy' is swept by axes[0] and by grid entry 'parallel.strategy'", CONF),
    # Was one run for 64 and 064 (the same value), without a word, as a sweep file's duplicate is refused.
    ("sweep: a command-line list naming one value twice", lambda t: [
        "sweep", *TINY, "--batch-size", "16,32,016", "--out", str(t / "o")],
     "--train.batch-size '16,32,016' lists train.batch_size = 16 twice (or as two spellings of one run)", CONF),
    ("sweep: --profile with a window of no steps", lambda t: ["sweep", *TINY, "--batch-size", "16,32", "--profile",
                                                              "--train.profile-steps", "0", "--out", str(t / "o")],
     "--train.profile-steps 0", CONF),
    ("sweep: a negative timeout", lambda t: ["sweep", *TINY, "--batch-size", "16,32", "--timeout", "-1",
                                             "--out", str(t / "o")], "--timeout", CONF),
    ("report: a folder that does not exist", lambda t: ["report", str(t / "nothing")], "nothing", CONF),
    ("report: a file for a folder", lambda t: (t / "f.txt").write_text("x") and ["report", str(t / "f.txt")],
     "f.txt: is a file, not a folder of runs", CONF),
    ("report: a folder with no runs", lambda t: (t / "e").mkdir() or ["report", str(t / "e")], "no runs", CONF),
    ("plan: an unknown chip", lambda t: ["plan", "--preset", "vit-tiny", "--target", "8xnope"], "nope", CONF),
    ("plan: negative workers", lambda t: ["plan", "--preset", "vit-tiny", "--target", "cpu", "--workers", "-2"],
     "--workers", CONF),
    ("plan: --validate of a missing folder", lambda t: ["plan", "--validate", str(t / "gone")], "gone", CONF),
    ("inspect: a strategy that does not exist", lambda t: ["inspect", "--preset", "vit-tiny", "--strategy", "zero3"],
     "zero3", CONF),
    ("inspect: a parameter that does not exist", lambda t: ["inspect", "--preset", "vit-tiny", "--devices", "1",
                                                            "--array", "nope/kernel"], "nope/kernel", CONF),
    ("bench: an unknown group", lambda t: ["bench", "--groups", "speed", "--out", str(t / "o")], "speed", CONF),
    # Was a case that errored (8 TiB allocated) after the others ran, exit 1, with bench.json written.
    ("bench: a batch past the field's range", lambda t: ["bench", "--groups", "batch", "--batches", "3000000000",
                                                         "--preset", "vit-tiny", "--out", str(t / "o")],
     "--batches 3000000000: each value must be in (0, 2^31)", CONF),
    ("bench: a language model", lambda t: ["bench", "--preset", "lm-tiny", "--out", str(t / "o")], "lm-tiny", CONF),
    ("launch: no processes", lambda t: ["launch", "--processes", "0", "train", *TINY], "--processes", CONF),
    # inf was taken, and crashed the launcher (OverflowError, exit 70) once its processes had started.
    ("launch: an infinite time limit", lambda t: ["launch", "--processes", "2", "--timeout", "inf", "train", *TINY],
     "--timeout must be 0 (no limit) or a finite number of seconds, got inf", CONF),
]


def _value_cases() -> list[Case]:
    return [Case(name, argv, says, exit) for name, argv, says, exit in VALUES]


CASES = _path_cases() + _file_cases() + _value_cases()


def _everything(root: Path, cache: Path) -> set[Path]:
    """Every file and folder below `root`, hidden ones included, but the data cache: a cache filled for a refused
    run is reused by the next one, not output that could be taken for a run."""
    return {p for p in root.rglob("*") if p != cache and cache not in p.parents}


def _invoke(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusals
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_tables_hold_enough_cases(tmp_path: Path) -> None:
    assert len(CASES) >= 60, len(CASES)
    assert len({c.name for c in CASES}) == len(CASES)
    commands = set()
    for i, case in enumerate(_value_cases()):
        (tmp_path / str(i)).mkdir()
        commands.add(case.argv(tmp_path / str(i))[0])
    assert commands == {"train", "sweep", "report", "plan", "inspect", "bench", "launch"}
    assert {c.exit for c in CASES} == {"configuration", "data", "files"}


@pytest.mark.parametrize("strategy, dtype, per_device", [
    # An MLP of 32 inputs, width 64, 3 layers (2 of them stacked) and 10 outputs: in 32*64 + 64, hidden 2*64*64 +
    # 2*64, out 64*10 + 10 = 11,082 parameters, of 4 bytes each in float32, whole on every device under dp.
    ("dp", "float32", (32 * 64 + 64 + 2 * 64 * 64 + 2 * 64 + 64 * 10 + 10) * 4),
    ("dp", "bfloat16", (32 * 64 + 64 + 2 * 64 * 64 + 2 * 64 + 64 * 10 + 10) * 2),
    # fsdp over 8 devices splits every parameter by 8 but the 10 output biases, which 8 does not divide (whole).
    ("fsdp", "float32", ((32 * 64 + 64 + 2 * 64 * 64 + 2 * 64 + 64 * 10) // 8 + 10) * 4),
])
def test_the_parameters_one_device_holds_are_counted_from_its_shards(strategy: str, dtype: str,
                                                                    per_device: int) -> None:
    cfg = override(get_preset("mlp-small"), {
        "model.input_dim": 32, "model.mlp_dim": 64, "model.num_layers": 3, "model.num_classes": 10,
        "parallel.strategy": strategy, "parallel.devices": 8, "precision.param_dtype": dtype})
    _, layout, spec = check_runnable(cfg)
    assert layout.shape.data == 8
    assert param_bytes_per_device(spec, layout) == per_device
    check_fits(cfg, spec, layout)  # a model that fits is not refused


MLP_PARAMS = 32 * 64 + 64 + 2 * 64 * 64 + 2 * 64 + 64 * 10 + 10  # the MLP above: 11,082
SPLIT_BY_8 = (MLP_PARAMS - 10) // 8 + 10  # a parameter split 8 ways but the 10 output biases, which 8 does not divide


@pytest.mark.parametrize("devices", [8, 1])
def test_a_cpu_host_s_memory_is_split_over_its_simulated_devices(devices: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The MLP above under dp holds all its 11,082 float32 parameters on every device: 44,328 bytes (43.3 KiB).
    A host of 64 pages of 4 KiB, 256 KiB, holds them whole; split over 8 simulated devices, which share it, each
    has 32 KiB: refused on 8 devices, with the split named, and accepted on one. (< 1 s)"""
    cfg = override(get_preset("mlp-small"), {
        "model.input_dim": 32, "model.mlp_dim": 64, "model.num_layers": 3, "model.num_classes": 10,
        "parallel.strategy": "dp", "parallel.devices": devices})
    _, layout, spec = check_runnable(cfg)
    assert param_bytes_per_device(spec, layout) == MLP_PARAMS * 4 == 44_328
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 64}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    if devices == 1:
        check_fits(cfg, spec, layout)  # 43.3 KiB of the whole 256 KiB
        return
    with pytest.raises(ConfigError) as refused:
        check_fits(cfg, spec, layout)
    said = str(refused.value)
    assert said.startswith("--model.mlp-dim 64: the parameters alone are 43.3 KiB on each device (dp on mesh "), said
    assert "and a cpu device has 32.0 KiB (this host's 256 KiB over 8 devices); use a smaller model" in said, said


@pytest.mark.parametrize("strategy, mu_dtype, per_device", [
    # AdamW: the parameters and its two moments, all float32, whole on every device under dp.
    ("dp", "", 3 * MLP_PARAMS * 4),
    ("dp", "bfloat16", 2 * MLP_PARAMS * 4 + MLP_PARAMS * 2),  # the first moment in bfloat16
    # ZeRO-1 splits the moments over the 8 data devices and keeps the parameters whole; fsdp splits all three.
    ("zero1", "", MLP_PARAMS * 4 + 2 * SPLIT_BY_8 * 4),
    ("fsdp", "", 3 * SPLIT_BY_8 * 4),
])
def test_the_train_state_one_device_holds_is_counted_from_its_shards(strategy: str, mu_dtype: str,
                                                                     per_device: int) -> None:
    """The whole train state as the layout places it: parameters and optimizer moments by hand; what else the
    state holds (the step and the optimizer's counters) are 4-byte scalars, counted from the tree."""
    cfg = override(get_preset("mlp-small"), {
        "model.input_dim": 32, "model.mlp_dim": 64, "model.num_layers": 3, "model.num_classes": 10,
        "parallel.strategy": strategy, "parallel.devices": 8, "optim.mu_dtype": mu_dtype})
    _, layout, spec = check_runnable(cfg)
    state = abstract_train_state(spec, layout, build_optimizer(cfg.optim, 10))
    scalars = [leaf for leaf in tree_util.tree_leaves(state) if leaf.shape == ()]
    assert all(leaf.dtype.itemsize == 4 for leaf in scalars)
    assert shard_bytes(state) == per_device + 4 * len(scalars)
    assert shard_bytes(state.params) == param_bytes_per_device(spec, layout)
    check_state_fits(cfg, spec, layout, state.params, state)  # a state that fits is not refused


@pytest.mark.slow
def test_a_train_state_no_device_holds_is_refused_before_the_run_folder(tmp_path: Path) -> None:
    """Parameters that fit one CPU device (a one-device run may have all of the host's memory) but whose train state,
    with AdamW's two float32 moments, does not: one line, exit 2, no run folder. A 2-layer MLP is mostly its one
    hidden mlp-dim x mlp-dim kernel: at this width its parameters are 0.4 of the host's memory and the state 1.2. The
    process may map 0.6 of it (and 4 GiB for JAX itself), so without the check it fails to allocate the moments
    rather than waking the kernel's out-of-memory killer."""
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    width = int((0.4 * host / 4) ** 0.5)
    out = tmp_path / "o"
    cap = int(0.6 * host) + 4 * 2**30
    capped = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap})); "
              f"sys.argv[0] = 'shardbench'; runpy.run_module('shardbench', run_name='__main__')")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "SHARDBENCH_CACHE": str(tmp_path / "cache")}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, "-c", capped, "train", "--preset", "mlp-small", "--model.num-layers", "2",
         "--model.mlp-dim", str(width), "--steps", "1", "--devices", "1", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == EXIT_CODES["configuration"], done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"shardbench: error: --model.mlp-dim {width}: the train state alone is "), last
    assert "AdamW" not in last and "optimizer state" in last and "--optim.mu-dtype bfloat16" in last, last
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a default output folder would land here
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDBENCH_CACHE", str(cache))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # a temporary file left behind shows below
    work = tmp_path / "case"
    work.mkdir()
    argv = case.argv(work)
    before = _everything(tmp_path, cache)
    code, out, err = _invoke(argv, capsys)
    assert code == EXIT_CODES[case.exit], (case.exit, code, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("shardbench: error:", "shardbench sweep: error",
                                                         "shardbench train: error", "shardbench: "))
              and "error" in line]
    assert len(errors) == 1, lines
    assert case.says in errors[0], (case.says, errors[0])
    assert all(line.startswith(("shardbench", "see '")) for line in lines), lines
    # No partial output: no run folder, even an empty one, no config.json, checkpoint, temporary or finished file.
    left = sorted(str(p.relative_to(tmp_path)) for p in _everything(tmp_path, cache) - before)
    assert not left, left


@pytest.mark.parametrize("given, says", [
    ({}, "$SHARDBENCH_CACHE /proc/shardbench-nope/env: "),
    ({"data.cache_dir": "/proc/shardbench-nope/flag"}, "--data.cache-dir /proc/shardbench-nope/flag: "),
    ({"train.compile_cache": "/proc/shardbench-nope/xla"}, "--train.compile-cache /proc/shardbench-nope/xla: "),
])
def test_an_unusable_cache_is_named_by_where_its_path_came_from(given: dict[str, str], says: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The compilation cache is <cache root>/xla unless --train.compile-cache names one: a root that cannot be
    made is blamed on --data.cache-dir, or on $SHARDBENCH_CACHE where the environment chose it, never on a
    --train.compile-cache the user did not give."""
    from shardbench.errors import FileFault
    from shardbench.runtime import start_process

    monkeypatch.setenv("SHARDBENCH_CACHE", "/proc/shardbench-nope/env")
    with pytest.raises(FileFault) as err:
        start_process(override(get_preset("mlp-small"), given))
    assert str(err.value).startswith(says), str(err.value)


@pytest.mark.slow
def test_a_device_count_past_what_xla_simulates_is_refused_without_starting_them(tmp_path: Path) -> None:
    """In a fresh process, where JAX has not started: XLA is never asked for 99,999 CPU devices (it would take far
    longer than the timeout here to start them); the count is refused in one line."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-m", "shardbench", "train", *TINY[:-4], "--devices", "99999", "--out",
                           str(tmp_path / "o")], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_CODES["configuration"], done.stderr
    assert "--devices 99999: at most 4096 CPU devices are simulated" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("mesh", ["data=4294967296,model=4294967296", "data=3037000500,model=3037000500"])
@pytest.mark.parametrize("command", ["train", "inspect"])
def test_a_mesh_whose_size_overflowed_is_named_in_one_line(command: str, mesh: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """2**32 x 2**32 devices were '0 devices ... or pass --devices 0', and 3037000500**2 a negative count (numpy's
    int64 product wrapped); inspect, which simulates the mesh's devices, named --parallel.devices."""
    out = tmp_path / "o"
    code, _, err = _invoke([command, *TINY[:-4], "--mesh", mesh, "--out", str(out)], capsys)
    size = math.prod(int(part.split("=")[1]) for part in mesh.split(","))
    assert code == EXIT_CODES["configuration"]
    assert err.strip().count("\n") == 0 and f"names {size:,} devices, more than any machine holds" in err
    assert not out.exists()


def test_single_on_more_devices_than_one_is_said() -> None:
    """`--strategy single --devices 4` trained on one device of the four, silently. It is said rather than refused:
    a sweep sets --devices for every run, single's among them (`--preset mlp-spmd-styles --devices 8`)."""
    from shardbench.validation import inert_notes

    said = ("--parallel.devices 4 does nothing here: strategy single trains on one device and leaves the others "
            "idle: use --devices 1, or a strategy that splits, such as --strategy dp --mesh 4")
    for layout in ({"parallel.strategy": "single"}, {"parallel.strategy": "auto", "parallel.mesh": "none"}):
        assert said in inert_notes(override(get_preset("vit-tiny"), {**layout, "parallel.devices": 4}))
        assert not [n for n in inert_notes(override(get_preset("vit-tiny"), {**layout, "parallel.devices": 1}))
                    if n.startswith("--parallel.devices")]
    assert not [n for n in inert_notes(override(get_preset("vit-tiny"), {"parallel.strategy": "dp",
                                                                         "parallel.devices": 4}))
                if n.startswith("--parallel.devices")]


@pytest.mark.slow
def test_a_process_shows_no_traceback_unless_asked(tmp_path: Path) -> None:
    """The real command line: the same one line, and the whole traceback with --debug for a bug report."""
    (tmp_path / "empty.npz").write_bytes(b"")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    args = [sys.executable, "-m", "shardbench", "train", *TINY, "--data", f"arrays:{tmp_path / 'empty.npz'}",
            "--out", str(tmp_path / "o")]
    quiet = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == EXIT_CODES["data"] and "Traceback" not in quiet.stderr
    assert quiet.stderr.strip().splitlines()[-1].startswith("shardbench: error: arrays:")
    loud = subprocess.run([*args[:3], "--debug", *args[3:]], env=env, capture_output=True, text=True, timeout=300)
    assert loud.returncode != 0 and "Traceback" in loud.stderr


def _checkpoint_leaves(out: Path, step: int) -> dict[str, np.ndarray]:
    """Every array of the checkpoint of `step`, by its path (restoring it fails where it is damaged)."""
    restored = ocp.StandardCheckpointer().restore((out / "checkpoints" / str(step) / "default").absolute())
    return {tree_util.keystr(path): np.asarray(leaf) for path, leaf in tree_util.tree_flatten_with_path(restored)[0]}


@pytest.mark.slow
def test_a_damaged_checkpoint_is_named_and_the_last_good_one_used(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The damaged checkpoints newer than the one resumed from are removed and written again as the resumed run
    passes their steps: it ends with checkpoints that restore to the uninterrupted run's (not the damaged files
    under a record that says complete), and keeps as many as --train.keep-checkpoints says."""
    out = tmp_path / "run"
    args = ["train", *TINY, "--steps", "6", "--train.checkpoint-every", "2", "--train.keep-checkpoints", "3",
            "--out", str(out), "--data.cache-dir", str(tmp_path / "cache")]
    assert main(args) == 0
    whole = {step: _checkpoint_leaves(out, step) for step in (4, 6)}
    (out / "summary.json").unlink()  # as if it had been stopped after its last checkpoint
    for step in (4, 6):
        for chunk in (out / "checkpoints" / str(step)).rglob("d/*"):
            chunk.write_bytes(b"")
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    said = capsys.readouterr()
    # The final checkpoint goes with the record it lacks (its steps are trained again, to time them); step 4's
    # damage is found on restoring, and step 2 is resumed from.
    assert "trained all 6 steps but it stopped before writing its record" in said.out
    err = said.err
    assert "the checkpoint of step 4" in err and "is damaged" in err and "the checkpoint of step 6" not in err
    assert "resuming from step 2" in err and "the damaged checkpoint of step 4 is removed" in err
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == 2
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [2, 4, 6]
    for step, leaves in whole.items():
        again = _checkpoint_leaves(out, step)
        assert again.keys() == leaves.keys() and int(again["['step']"]) == step
        for key, value in leaves.items():
            np.testing.assert_array_equal(again[key], value, err_msg=f"step {step}: {key}")
    (out / "summary.json").unlink()
    for chunk in (out / "checkpoints").rglob("d/*"):
        chunk.write_bytes(b"")
    (out / "checkpoints" / "4" / "default" / "_METADATA").unlink()  # orbax: "pytree structure error"
    code, _, err = _invoke([*args, "--resume"], capsys)
    assert code == EXIT_CODES["data"] and "no checkpoint in" in err and "Traceback" not in err
    assert "the checkpoint of step 4 in" in err and "is damaged (its file default/_METADATA is missing)" in err
    assert not (out / "summary.json").exists()


@pytest.mark.slow
def test_settings_that_do_nothing_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *TINY, "--optim.momentum", "0.5", "--train.profile-steps", "5", "--epochs", "3",
                 "--out", str(tmp_path / "o"), "--data.cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "note: --optim.momentum 0.5 does nothing here: it applies to --optim.optimizer sgd" in out
    assert "note: --train.profile-steps 5 does nothing here" in out
    # vit-tiny's own 3 epochs, given: --steps 2 decides the length, and the note says so
    assert "note: --train.epochs 3 does nothing here: --steps 2 decides the length" in out



@pytest.mark.slow
@pytest.mark.parametrize(("platforms", "command"), [("bogus", "train"), ("cuda", "inspect")])
def test_jax_platforms_naming_a_platform_jax_cannot_start_is_named(tmp_path: Path, platforms: str,
                                                                   command: str) -> None:
    """JAX_PLATFORMS=bogus made train say "internal error ... (a bug in shardbench)" (exit 70); JAX_PLATFORMS=cuda on
    a machine without CUDA's plugin made inspect blame the model's settings (JAX raises a bare AssertionError).
    Both are the environment's: exit 2, one line naming the variable, nothing written."""
    env = {**os.environ, "JAX_PLATFORMS": platforms, "SHARDBENCH_CACHE": str(tmp_path / "cache")}
    env.pop("XLA_FLAGS", None)
    args = [*TINY, "--out", str(tmp_path / "o")] if command == "train" else ["--preset", "vit-tiny", "--devices", "2"]
    done = subprocess.run([sys.executable, "-m", "shardbench", command, *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == EXIT_CODES["configuration"], done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"shardbench: error: JAX_PLATFORMS={platforms}: JAX could not start it"), line
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_launched_commands_own_argument_error_is_the_launchers_last_line(tmp_path: Path) -> None:
    """argparse names the sub-command ("shardbench train: error: ..."): the launcher's line took it for no line
    of shardbench's and gave "exit 2: see 'shardbench train --help'", losing what was wrong."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "SHARDBENCH_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "shardbench", "launch", "--processes", "2", "--", "train",
                           "--bogus-flag", "3"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_CODES["configuration"], done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("shardbench: error: process ") and "unrecognized arguments: --bogus-flag 3" in last, last


def test_a_stop_before_the_first_step_says_the_way_on(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C or SIGTERM while a run compiles (here raised where it makes its batches, just before compiling)
    said only "stopped by SIGTERM", where a stop in training names the way on. A fresh run's folder then holds its
    records, so the plain command is refused there: the line says --resume, which starts from step 0; a resumed
    run's line names the checkpoint it goes on from."""
    from shardbench.train import build

    out = tmp_path / "run"
    args = ["train", *TINY, "--train.checkpoint-every", "1", "--out", str(out)]

    def stopped(*_: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(build, "_batches", stopped)
        code, _, err = _invoke(args, capsys)
    assert code == EXIT_CODES["interrupted"] and err.strip().splitlines()[-1] == (
        f"shardbench: interrupted; no step was trained: the same command with --resume --out {out} starts it from "
        f"step 0"), err
    assert _invoke([*args, "--resume"], capsys)[0] == 0  # as the line says
    # As if stopped after its last checkpoint, step 2: the resume restores step 1's, to time step 2 again, and has
    # removed step 2's by the time it compiles; the line names what the folder holds then.
    (out / "summary.json").unlink()
    with monkeypatch.context() as patched:
        patched.setattr(build, "_batches", stopped)
        code, _, err = _invoke([*args, "--resume"], capsys)
    assert code == EXIT_CODES["interrupted"] and err.strip().splitlines()[-1] == (
        f"shardbench: interrupted; the same command with --resume --out {out} goes on from the checkpoint of "
        f"step 1"), err
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]


@pytest.mark.parametrize(("spoil", "says"), [
    (lambda tb: shutil.rmtree(tb) or tb.write_text("x"),
     "tensorboard is a file where the run's TensorBoard logs (a folder) go"),
    (lambda tb: (tb / "metrics.jsonl").unlink() or (tb / "metrics.jsonl").mkdir(),
     "metrics.jsonl is a folder where the run's log of metrics (a file) goes"),
])
def test_a_resumed_runs_logs_spoiled_are_refused_before_it_resumes(spoil: Callable[[Path], object], says: str,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A file where the run's TensorBoard folder was, or a folder for its metrics log: a resume failed only after
    restoring its checkpoint ("already exists as something else"); it is refused up front, naming the path."""
    out = tmp_path / "run"
    assert _invoke(["train", *TINY, "--train.checkpoint-every", "1", "--out", str(out)], capsys)[0] == 0
    (out / "summary.json").unlink()  # as a run stopped after its last checkpoint leaves it
    spoil(out / "tensorboard")
    code, printed, err = _invoke(["train", *TINY, "--train.checkpoint-every", "1", "--resume", "--out", str(out)],
                                 capsys)
    assert code == EXIT_CODES["files"] and says in err and len(err.strip().splitlines()) == 1, err
    assert "resuming" not in printed and not (out / "summary.json").exists()
