"""Scalar logs: our hand-written TensorBoard event files read back with TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.train.events import ScalarWriter, crc32c


def test_crc32c_known_vectors() -> None:
    # RFC 3720 test vectors for CRC-32C.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA


def test_event_file_is_read_by_tensorboard(tmp_path: Path) -> None:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                      reason="tensorboard (the 'test' extra) is not installed")
    writer = ScalarWriter(tmp_path)
    for step in range(1, 6):
        writer.write(step, {"train/loss": 1.0 / step, "val/accuracy": 0.1 * step})
    writer.close()
    acc = accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"train/loss", "val/accuracy"}
    losses = acc.Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2, 3, 4, 5]
    assert [e.value for e in losses] == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2], rel=1e-6)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5] and lines[2]["val/accuracy"] == pytest.approx(0.3)
