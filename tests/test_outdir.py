"""Default output folders: runs/<name>-<time> is stamped to the second, so commands started in the same second name
the same folder. Each takes its folder by making it, and a refusal leaves none it made behind."""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from shardbench import outdir
from shardbench.bench import bench_cmd
from shardbench.plan import plan_cmd
from shardbench.sweep import sweep_cmd
from shardbench.tune import tune_cmd
from shardbench.cli import build_parser
from shardbench.errors import ConfigError
from shardbench.flags import config_from_args
from shardbench.train.loop import run

STAMP = "20261129-120000"
TINY = ["train", "--preset", "mlp-small", "--model.num-layers", "2", "--model.mlp-dim", "16", "--model.input-dim", "8",
        "--model.num-classes", "4", "--data.synthetic-train", "64", "--data.synthetic-test", "32", "--batch-size", "16",
        "--steps", "2", "--devices", "1", "--no-train.progress", "--no-train.eval"]


@pytest.fixture
def same_second(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every stamp in this test is the same second, and runs/ is a folder of this test's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(outdir, "time", SimpleNamespace(strftime=lambda fmt: STAMP))  # outdir's clock alone
    return tmp_path / "runs"


def test_claims_of_one_name_each_make_a_folder_of_their_own(tmp_path: Path) -> None:
    base = tmp_path / "runs" / f"train-{STAMP}"
    assert outdir.claim(base) == outdir.Claim(base, tmp_path / "runs") and base.is_dir()  # runs/ made on the way
    assert outdir.claim(base) == outdir.Claim(*2 * [base.with_name(f"{base.name}-2")])
    (base.with_name(f"{base.name}-3")).mkdir()  # made by someone else: skipped, not shared
    assert outdir.claim(base).path == base.with_name(f"{base.name}-4")
    # Eight claimants released at once on one name (os.mkdir, which decides, lets the GIL go): eight folders, none
    # shared. Threads race on the file system as processes do, without eight JAX start-ups.
    race = tmp_path / "runs" / "race"
    go = threading.Barrier(8)

    def claimant() -> Path:
        go.wait()
        return outdir.claim(race).path

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        folders = sorted(pool.map(lambda _: claimant(), range(8)), key=str)
    assert folders == sorted([race, *(race.with_name(f"race-{n}") for n in range(2, 9))], key=str)
    assert sorted(os.listdir(tmp_path / "runs")) == sorted(
        [base.name, *(f"{base.name}-{n}" for n in (2, 3, 4)), "race", *(f"race-{n}" for n in range(2, 9))])


def test_a_claimed_folder_goes_on_an_error_only_while_empty(tmp_path: Path) -> None:
    empty, written = outdir.claim(tmp_path / "a"), outdir.claim(tmp_path / "b")
    with pytest.raises(ConfigError), outdir.released_on_error(empty):
        raise ConfigError("refused")
    assert not empty.path.exists() and tmp_path.exists()  # the claim made "a" alone
    with pytest.raises(ConfigError), outdir.released_on_error(written):
        (written.path / "config.json").write_text("{}")
        raise ConfigError("refused")
    assert (written.path / "config.json").exists()
    with outdir.released_on_error(written):  # no error: kept
        pass
    assert written.path.exists()
    deep = outdir.claim(tmp_path / "new" / "runs" / "c")  # its parents made on the way go too, and no further
    with pytest.raises(ConfigError), outdir.released_on_error(deep):
        raise ConfigError("refused")
    assert sorted(os.listdir(tmp_path)) == ["b"]
    with pytest.raises(ConfigError), outdir.released_on_error(None):  # --out given: nothing of ours to remove
        raise ConfigError("refused")


def test_two_trains_in_the_same_second_write_two_folders(same_second: Path) -> None:
    """The second run of a second takes <name>-2: it neither refuses (its folder "already holds a run") nor writes
    into the first's; a run refused by its checks leaves no folder behind."""
    first = run(config_from_args(build_parser().parse_args([*TINY, "--seed", "1"])))
    second = run(config_from_args(build_parser().parse_args([*TINY, "--seed", "2", "--batch-size", "32"])))
    name = f"mlp-small-auto-{STAMP}"
    assert (first["out"], second["out"]) == (f"runs/{name}", f"runs/{name}-2")
    for out, seed, batch in ((first["out"], 1, 16), (second["out"], 2, 32)):
        config = json.loads((Path(out) / "config.json").read_text())
        assert (config["train"]["seed"], config["train"]["batch_size"]) == (seed, batch)
        assert (Path(out) / "summary.json").exists()
    refused = [*TINY, "--batch-size", "20", "--devices", "8", "--strategy", "dp"]
    with pytest.raises(ConfigError, match="--batch-size 20"):  # refused by the checks, after the folder was named
        run(config_from_args(build_parser().parse_args(refused)))
    assert sorted(p.name for p in same_second.iterdir()) == [name, f"{name}-2"]
    shutil.rmtree(same_second)  # where runs/ did not exist, the refusal leaves none
    with pytest.raises(ConfigError, match="--batch-size 20"):
        run(config_from_args(build_parser().parse_args(refused)))
    assert not same_second.exists()


def test_plan_bench_sweep_and_tune_each_take_a_folder_of_their_own(same_second: Path) -> None:
    """The other commands' default folders, twice each in one second; a given --out is taken as it is."""
    cfg = SimpleNamespace(train=SimpleNamespace(out=""), model=SimpleNamespace(factory=""), preset="vit-tiny")
    target = SimpleNamespace(spec="tpu-v5e:4x4")
    made = {
        "plan": [plan_cmd.claim_out(cfg, target)[0] for _ in range(2)],
        "tune": [tune_cmd.claim_out(cfg, target) for _ in range(2)],
        "bench": [bench_cmd.claim_out(None) for _ in range(2)],
        "sweep": [sweep_cmd.sweep_dir(SimpleNamespace(out=None), SimpleNamespace(label="strategies"))
                  for _ in range(2)],
    }
    names = {"plan": f"plan-vit-tiny-tpu-v5e-4x4-{STAMP}", "tune": f"tune-vit-tiny-tpu-v5e-4x4-{STAMP}",
             "bench": f"bench-{STAMP}", "sweep": f"sweep-strategies-{STAMP}"}
    for command, name in names.items():
        assert made[command] == [Path("runs") / name, Path("runs") / f"{name}-2"], command
    assert sorted(p.name for p in same_second.iterdir()) == sorted(n + e for n in names.values() for e in ("", "-2"))
    given = SimpleNamespace(train=SimpleNamespace(out="mine"), model=cfg.model, preset=cfg.preset)
    assert (plan_cmd.claim_out(given, target), tune_cmd.claim_out(given, target), bench_cmd.claim_out("mine"),
            sweep_cmd.sweep_dir(SimpleNamespace(out="mine"), None)) == ((Path("mine"), None), *3 * [Path("mine")])
    assert not Path("mine").exists()  # made by the command's own checks later, not here
