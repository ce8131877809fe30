"""Training end to end: a run learns and writes its record (every strategy matches one device: test_equivalence)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.train.loop import run


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
