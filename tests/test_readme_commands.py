"""Every command the README, the pages under docs/ and `--help` show runs as written, so that they cannot rot.

Each `shardbench ...` line of the code blocks of the README and of every docs/*.md page (and the sweep file
`shardbench sweep --help` shows) is
parsed by the real parser and checked the way it would run, without its hours of training: a `train` or
`launch` command's configuration goes through every check `train` makes before loading data (in child
processes set up with the devices the command asks for, from a clean environment, as on a user's machine),
a sweep is expanded and every run checked (`--dry-run`), `inspect` and `presets` run for real, `bench` plans
its cases, `plan` makes every check it makes before compiling (a `plan --validate` is only parsed). Local files
the commands name (the CIFAR-10 JPEG tar, a text file, the sweep file) are made small in a working folder first.
Commands that need a cluster (srun, gcloud, HOST:PORT) are listed and skipped.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardbench import config as config_lib
from shardbench.cli import build_parser, config_from_args
from shardbench.parallel.mesh import mesh_size
from shardbench.parsing import from_dict
from shardbench.presets import PRESETS
from shardbench.sweep import sweep_cmd
from shardbench.sweep.preflight import check_in_processes

pytestmark = pytest.mark.slow  # every test here starts processes or trains for tens of seconds

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CLUSTER_ONLY = ("HOST:PORT", "--num-processes N")  # templates to fill in on a cluster


def page_commands(page: Path) -> list[str]:
    """One page's shardbench command lines (continuations joined, comments and prompts dropped)."""
    commands, pending = [], ""
    for raw in page.read_text().splitlines():
        line = raw[4:] if raw.startswith("    ") else None
        if line is None:
            pending = ""
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        line = line.removeprefix("$ ").removeprefix(".venv/bin/")
        if line.startswith("python benchmarks/bench.py"):
            line = "shardbench bench" + line[len("python benchmarks/bench.py"):]
        if line.startswith("shardbench ") and not line.startswith("shardbench.") and "(" not in line.split()[1]:
            command = line.split("  #")[0].split(" # ")[0].strip()
            if command.count("'") % 2 == 0:  # not the tail of a quoted remote command (ssh --command='...')
                commands.append(command)
    return commands


def readme_commands() -> list[str]:
    """The README's shardbench command lines."""
    return page_commands(README)


def doc_commands() -> list[str]:
    """Every shardbench command line of the README and of the pages under docs/, each once (a command shown on
    several pages is checked once)."""
    return list(dict.fromkeys(c for page in (README, *DOCS) for c in page_commands(page)))


def help_sweep_file() -> str:
    """The sweep file `shardbench sweep --help` shows, as a user would copy it."""
    text = sweep_cmd.DESCRIPTION
    block = text[text.index("    preset ="):text.index("Runs are the cartesian")]
    return "\n".join(line[4:].split("  #")[0].rstrip() for line in block.splitlines())


def _image_tar(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for split in ("train", "test"):
            for label in range(10):
                buffer = io.BytesIO()
                Image.fromarray(np.full((32, 32, 3), 20 * label, np.uint8)).save(buffer, format="PNG")
                info = tarfile.TarInfo(f"cifar10/{split}/class{label}/0.png")
                info.size = buffer.tell()
                buffer.seek(0)
                tar.addfile(info, buffer)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding what the commands name: the tar (here and at ../shared/data), README.md, my-sweep.toml,
    the examples and the benchmarks' sweep files."""
    base = tmp_path_factory.mktemp("readme")
    work = base / "work"
    for tar in (work / "cifar10-jpeg.tar.gz", base / "shared" / "data" / "cifar10-jpeg.tar.gz"):
        _image_tar(tar)
    (work / "README.md").write_text(README.read_text())
    shutil.copytree(ROOT / "examples", work / "examples")  # commands name them relative to the checkout
    shutil.copytree(ROOT / "benchmarks", work / "benchmarks")
    (work / "my-sweep.toml").write_text(help_sweep_file())
    return work


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_the_readme_and_docs_have_the_commands_this_test_checks() -> None:
    commands = doc_commands()
    kinds = {c.split()[1] for c in commands}
    assert {"train", "sweep", "inspect", "launch", "bench", "plan", "report"} <= kinds, commands
    assert len(commands) >= 20
    pages = {page.name: page_commands(page) for page in DOCS}
    for name in ("training.md", "parallelism.md", "precision.md", "own-model.md", "cifar-recipe.md",
                 "sweeps-and-reports.md", "measurements.md", "planning.md", "benchmarks.md", "processes.md"):
        assert pages.get(name), f"docs/{name} shows no shardbench command this test can find"
    assert set(readme_commands()) <= set(commands)


def test_every_readme_command_runs_as_written(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("SHARDBENCH_CACHE", str(workdir / "cache"))
    parser = build_parser()
    configs: dict[str, dict[str, object]] = {}
    problems: list[str] = []
    # A sweep's dry run hands its runs' configurations to the checks of `shardbench train` (sweep.preflight's
    # check_in_processes: one child process per device count). Every sweep here gathers them instead, and they are
    # checked below with the train and launch commands' in one child process per device count, not one per sweep:
    # the same check of the same configurations, a refusal named with its command and run.
    from shardbench.sweep import preflight

    may_refuse: set[str] = set()  # runs of a sweep given --skip-refused, which runs the others

    def gather(current: str, skip_refused: bool) -> Callable[..., preflight.Checked]:
        def check_later(runs: dict[str, dict[str, object]], env: object = None) -> preflight.Checked:
            named = {f"{current} (run {name})": flat for name, flat in runs.items()}
            configs.update(named)
            may_refuse.update(named if skip_refused else ())
            return preflight.Checked({}, {})
        return check_later

    for command in doc_commands():
        if any(t in command for t in CLUSTER_ONLY):
            continue
        argv = shlex.split(command)[1:]
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            problems.append(f"{command}: the parser refused it: {capsys.readouterr().err.strip()[-300:]}")
            continue
        if args.command == "train":
            configs[command] = config_lib.flatten(config_from_args(args))
        elif args.command == "launch":
            inner = parser.parse_args([a for a in args.argv if a != "--"])
            flat = config_lib.flatten(config_from_args(inner))
            flat["parallel.devices"] = flat["parallel.devices"] or args.processes * args.devices_per_process
            configs[command] = flat
        elif args.command == "sweep":
            if args.status or args.cancel:  # following a SLURM sweep's jobs: nothing to follow here
                assert sweep_cmd.run(args) == 2
                assert "holds no sweep" in capsys.readouterr().err
                continue
            if args.resume:
                assert sweep_cmd.run(args) == 2  # nothing to resume here; the plan comes from the store
                assert "holds no sweep to resume" in capsys.readouterr().err
                continue
            args.dry_run = True
            with monkeypatch.context() as patched:
                patched.setattr(preflight, "check_in_processes", gather(command, args.skip_refused))
                code = sweep_cmd.run(args)
            printed = capsys.readouterr()
            if code != 0 or ("REFUSED" in printed.out and not args.skip_refused):
                problems.append(f"{command}: {printed.err.strip()[-300:]}"
                                f"{[l for l in printed.out.splitlines() if 'REFUSED' in l][:2]}")
        elif args.command == "inspect":
            done = subprocess.run([sys.executable, "-m", "shardbench", *argv], capture_output=True, text=True,
                                  env=_clean_env(), cwd=workdir)
            if done.returncode != 0:
                problems.append(f"{command}: {done.stderr.strip()[-300:]}")
        elif args.command == "bench":
            from shardbench.bench.bench_cmd import plan

            plan(args)
        elif args.command == "plan" and args.validate is None:  # every check a plan makes before compiling
            from shardbench.errors import ShardbenchError
            from shardbench.plan.plan_cmd import prepare
            from shardbench.plan.tpu import libtpu_installed

            try:
                prepare(args)
            except ShardbenchError as err:
                if not ("needs libtpu" in str(err) and not libtpu_installed()):
                    problems.append(f"{command}: {err}")
    refused = check_in_processes(configs, env=_clean_env()).refused
    problems += [f"{command}: {why}" for command, why in refused.items() if command not in may_refuse]
    assert not problems, "\n".join(problems)


def test_the_sweep_file_in_help_loads_and_expands(workdir: Path) -> None:
    from shardbench.sweep.grid import make_sweep
    from shardbench.sweep.sweep_file import load_sweep_file

    loaded = load_sweep_file(workdir / "my-sweep.toml")
    sweep = make_sweep(sweep_file=loaded)
    assert loaded.base == {"train.steps": 20, "parallel.devices": 8}
    assert [r.name for r in sweep.runs] == ["mesh_8_1_batch_128", "mesh_8_1_batch_1024", "mesh_4_2_batch_128",
                                            "mesh_4_2_batch_1024"]


def test_inspect_takes_the_device_count_its_mesh_names(workdir: Path) -> None:
    assert mesh_size("4x2") == 8 and mesh_size("model=8") == 8 and mesh_size("") is None
    done = subprocess.run([sys.executable, "-m", "shardbench", "inspect", "--preset", "vit-tiny", "--mesh", "4x2"],
                          capture_output=True, text=True, env=_clean_env(), cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert re.search(r"dev 0,2,4,6", done.stdout)


def test_presets_json_is_one_document_of_every_presets_configuration() -> None:
    done = subprocess.run([sys.executable, "-m", "shardbench", "presets", "--json"], capture_output=True, text=True,
                          env=_clean_env())
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)  # the whole output is one JSON value, as json.load or jq reads it
    assert list(printed) == sorted(PRESETS)
    for name, make in PRESETS.items():
        assert from_dict(printed[name]) == make()  # each is that preset's configuration, whole


def test_presets_print_first_paragraphs_in_each_kinds_terms() -> None:
    done = subprocess.run([sys.executable, "-m", "shardbench", "presets"], capture_output=True, text=True,
                          env=_clean_env())
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert set(lines) == set(PRESETS)
    for name, make in PRESETS.items():
        first, *rest = (make.__doc__ or "").split("\n\n")
        assert " ".join(first.split()) in lines[name]
        assert all(" ".join(more.split())[:60] not in lines[name] for more in rest)  # the details stay in config.py
    assert "vit: conv stem of 1 layer, embed 256, 7 layers, 4 heads, mlp 512, 10 classes, sequence pool" in \
        lines["vit-cifar-cct"]
    assert "vit: shifted patch 4, embed 192" in lines["vit-cifar-spt"] and "locality self-attention" in \
        lines["vit-cifar-spt"]
    assert "mlp: 24 layers of width 512 on 256 inputs, 10 outputs" in lines["mlp-small"]
    assert "heads" not in lines["mlp-small"] and "embed" not in lines["mlp-seed"]
    assert "lm: vocabulary 512, sequence 64" in lines["lm-seed"]
