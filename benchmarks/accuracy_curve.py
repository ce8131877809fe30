"""Accuracy curves from runs' logged scalars: validation (and train) accuracy per epoch, one line per run.

    python benchmarks/accuracy_curve.py RUN_DIR [RUN_DIR ...] --out curve.png [--label NAME ...]

Reads each run's `tensorboard/metrics.jsonl` (the scalars `shardbench train` writes beside its TensorBoard
event file) and its `config.json` for the steps per epoch; the test accuracy from `summary.json` is marked at
the end of each curve.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curve(run: Path) -> tuple[list[float], list[float], float | None]:
    """(epochs, validation accuracy, test accuracy) of one run directory."""
    rows = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    val = [(r["step"], r["val/accuracy"]) for r in rows if "val/accuracy" in r]
    per_epoch = val[0][0] if val else 1
    return [s / per_epoch for s, _ in val], [100 * a for _, a in val], (
        100 * summary["test_accuracy"] if summary.get("test_accuracy") is not None else None)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", action="append", default=[])
    parser.add_argument("--title", default="CIFAR-10 validation accuracy")
    args = parser.parse_args(argv)
    labels = args.label + [r.name for r in args.runs[len(args.label):]]
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for run, label in zip(args.runs, labels):
        epochs, accuracy, test = curve(run)
        line, = ax.plot(epochs, accuracy, marker="o", label=label + (f" (test {test:.1f}%)" if test else ""))
        if test is not None:
            ax.plot([epochs[-1]], [test], marker="*", markersize=12, color=line.get_color())
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy %")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
