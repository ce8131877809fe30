"""Training end to end: every strategy matches one device, and a run learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.train.loop import run


def _losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]


@pytest.fixture(scope="module")
def single_losses(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    from conftest import micro_config

    tmp = tmp_path_factory.mktemp("single")
    run(micro_config(tmp, **{"parallel.strategy": "single"}))
    return _losses(tmp / "run")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "mesh", "devices"),
    [("dp", "8", 8), ("fsdp", "8", 8), ("tp", "model=4", 4), ("dp+tp", "4x2", 8), ("fsdp+tp", "4x2", 8)],
)
def test_strategy_gives_the_same_losses_as_one_device(micro, single_losses, strategy, mesh, devices) -> None:
    cfg = micro(**{"parallel.strategy": strategy, "parallel.mesh": mesh, "parallel.devices": devices})
    summary = run(cfg)
    losses = _losses(Path(cfg.train.out))
    assert len(losses) == len(single_losses) == 4
    # Same data, same initial parameters, same augmentation: only the reduction order differs.
    assert losses == pytest.approx(single_losses, rel=2e-5, abs=2e-6)
    assert summary["devices"] == devices


@pytest.mark.slow
def test_training_learns_synthetic_classes(micro) -> None:
    cfg = micro(**{"train.steps": 0, "train.epochs": 6, "train.eval": True, "data.synthetic_train": 2048,
                   "data.synthetic_test": 512, "train.batch_size": 64, "optim.lr": 2e-3})
    summary = run(cfg)
    assert summary["test_accuracy"] > 0.25, summary  # ten classes: chance is 0.1
    assert len(summary["epochs"]) == 6 and "val_accuracy" in summary["epochs"][-1]
    out = Path(cfg.train.out)
    assert json.loads((out / "config.json").read_text())["model"]["embed_dim"] == 32
    assert (out / "summary.json").exists()
