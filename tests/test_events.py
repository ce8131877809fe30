"""Scalar logs: the event files read back with TensorBoard's own reader, value for value and step for step."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shardbench.train.events import ScalarWriter

accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                  reason="tensorboard (the 'test' extra) is not installed")


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in `logdir`, as TensorBoard loads the folder (all its event files, in order)."""
    acc = accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _f32(x: float) -> float:
    """The value an event holds: TensorBoard's `simple_value` is a 32-bit float."""
    return float(np.float32(x))


def test_event_file_is_read_by_tensorboard(tmp_path: Path) -> None:
    writer = ScalarWriter(tmp_path)
    for step in range(1, 6):
        # numpy scalars as the loop's metrics are, and a value that float32 cannot hold exactly
        writer.write(step, {"train/loss": np.float64(1.0 / step), "val/accuracy": 0.1 * step,
                            "train/images_per_s": 12345.678 * step})
    writer.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    assert _scalars(tmp_path) == {
        "train/loss": [(s, _f32(1.0 / s)) for s in range(1, 6)],
        "val/accuracy": [(s, _f32(0.1 * s)) for s in range(1, 6)],
        "train/images_per_s": [(s, _f32(12345.678 * s)) for s in range(1, 6)],
    }
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5]
    assert [x["val/accuracy"] for x in lines] == [0.1 * s for s in range(1, 6)]  # the JSON twin keeps float64


def test_a_second_writer_in_the_same_folder_keeps_the_first(tmp_path: Path) -> None:
    # A resumed run opens a new writer in the same folder, possibly within the same second.
    first = ScalarWriter(tmp_path)
    first.write(1, {"train/loss": 2.0})
    first.close()
    second = ScalarWriter(tmp_path)
    second.write(2, {"train/loss": 1.5})
    second.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert _scalars(tmp_path) == {"train/loss": [(1, 2.0), (2, 1.5)]}
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_write_reaches_the_file_before_close(tmp_path: Path) -> None:
    # A killed run keeps its curves to within a second: no close, no further call.
    # Two records: tensorboardX flushes its first one at once whatever its interval, so only the second
    # shows whether later ones reach the file too.
    writer = ScalarWriter(tmp_path)
    writer.write(3, {"train/loss": 0.5})
    writer.write(4, {"train/loss": 0.25})
    try:
        # The JSON twin, which shardbench reads back itself, holds both at once: `write` flushed it.
        lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [(x["step"], x["train/loss"]) for x in lines] == [(3, 0.5), (4, 0.25)]
        # The event file within tensorboardX's interval (it writes from a thread of its own).
        for _ in range(50):
            if _scalars(tmp_path).get("train/loss") == [(3, 0.5), (4, 0.25)]:
                break
            time.sleep(0.1)  # no flush here: `write` must have done what it takes
        assert _scalars(tmp_path) == {"train/loss": [(3, 0.5), (4, 0.25)]}
    finally:
        writer.close()


@pytest.mark.parametrize("deleted", ["folder", "event file"])
def test_logs_deleted_during_a_run_are_written_again_and_the_run_says_so(
        tmp_path: Path, deleted: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`rm -rf <out>/tensorboard` while a run trains: the writer's open files are gone from the folder, and
    writing on into them would lose every later step without a word. It says so and writes new files there."""
    import shutil

    logdir = tmp_path / "tensorboard"
    writer = ScalarWriter(logdir)
    writer.write(1, {"train/loss": 2.0})
    writer.write(2, {"train/loss": 1.5})
    if deleted == "folder":
        shutil.rmtree(logdir)
    else:
        for path in logdir.glob("events.out.tfevents.*"):
            path.unlink()
    writer.write(3, {"train/loss": 1.0})
    writer.write(4, {"train/loss": 0.5})
    writer.close()
    err = capsys.readouterr().err
    gone = "metrics.jsonl and the event file" if deleted == "folder" else "the event file"
    held = "they held" if deleted == "folder" else "it held"
    assert err.count("shardbench: warning: ") == 1, err
    assert (f"shardbench: warning: {gone} in {logdir} deleted during the run: what {held} before step 3 is lost, and "
            f"new files there hold the steps from 3 on") in err
    assert _scalars(logdir) == {"train/loss": [(3, 1.0), (4, 0.5)]}
    steps = [json.loads(x)["step"] for x in (logdir / "metrics.jsonl").read_text().splitlines()]
    assert steps == ([3, 4] if deleted == "folder" else [1, 2, 3, 4])  # the JSON-lines file was not deleted


def test_a_disabled_writer_writes_nothing(tmp_path: Path) -> None:
    writer = ScalarWriter(tmp_path / "tb", enabled=False)
    writer.write(1, {"train/loss": 1.0})
    writer.flush()
    writer.close()
    assert not (tmp_path / "tb").exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed: nothing to keep out")
def test_the_training_loop_starts_without_importing_torch() -> None:
    """tensorboardX imports torch wherever it is installed (a second of every run's start); a training process
    never imports it, yet writes its events (the tests above), while a process that has torch keeps it."""
    check = ("import sys; import shardbench.train.loop; assert 'torch' not in sys.modules, 'torch was imported'; "
             "import torch; assert torch.ones(2).sum().item() == 2.0")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
