"""Training end to end: a run learns and writes its record (every strategy matches one device: test_equivalence)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
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


def _terminal_and_pipe(argv: list[str], tmp_path: Path) -> tuple[str, str]:
    """What `shardbench train` writes, stdout and stderr together, to a terminal (a pseudo-terminal 120 columns
    wide) and to a pipe."""
    env = {**os.environ, "COLUMNS": "120", "LINES": "40"}
    command = [sys.executable, "-m", "shardbench", "train", *argv]
    piped = subprocess.run([*command, "--out", str(tmp_path / "piped")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=300)
    assert piped.returncode == 0, piped.stdout[-2000:]
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    on_tty = subprocess.Popen([*command, "--out", str(tmp_path / "tty")], env=env, stdin=subprocess.DEVNULL,
                              stdout=side, stderr=side)
    os.close(side)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end closed: the process has ended
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert on_tty.wait(timeout=300) == 0, seen.decode(errors="replace")[-2000:]
    return seen.decode(errors="replace"), piped.stdout


@pytest.mark.slow
def test_the_progress_bar_draws_on_a_terminal_and_a_pipe_gets_the_epoch_lines_alone(tmp_path: Path) -> None:
    """A log file or a pipe (`2>&1 | tee`, a batch job's output) held the bar's every redraw, carriage returns and
    all; it gets the epoch lines, which a terminal shows under the bar."""
    argv = ["--preset", "mlp-small", "--model.num-layers", "2", "--model.mlp-dim", "16", "--model.input-dim", "8",
            "--model.num-classes", "4", "--batch-size", "16", "--data.synthetic-train", "64", "--data.synthetic-test",
            "16", "--steps", "12", "--devices", "1", "--data.cache-dir", str(tmp_path / "cache")]
    terminal, pipe = _terminal_and_pipe(argv, tmp_path)
    for said in (terminal, pipe):
        assert "epoch 1 (step 3)" in said and "epoch 4 (step 12)" in said
    assert "12/12" in terminal and "step/s" in terminal and "\r" in terminal  # the bar, redrawn in place
    assert "step/s" not in pipe and "\r" not in pipe


@pytest.mark.slow
def test_a_closed_output_pipe_stops_the_run_in_one_line_that_says_so(tmp_path: Path) -> None:
    """`shardbench train ... | head -1`: the reader ends after the first line. The run stops at its next line, and
    says why, with the status a shell gives a command SIGPIPE ended (141). It said "a file: Broken pipe", exit 6:
    a path that cannot be used, naming none."""
    argv = [sys.executable, "-m", "shardbench", "train", "--preset", "mlp-small", "--model.num-layers", "2",
            "--model.mlp-dim", "16", "--model.input-dim", "8", "--batch-size", "16", "--data.synthetic-train", "640",
            "--data.synthetic-test", "16", "--steps", "400", "--devices", "1", "--data.cache-dir",
            str(tmp_path / "cache"), "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("shardbench: mlp-small")
    proc.stdout.close()  # as `head -1` exits
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("shardbench: stopped: its output was closed (a pipe whose reader "
                                                   "ended"), err[-2000:]
    assert not (tmp_path / "run" / "summary.json").exists()
