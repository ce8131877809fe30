"""`--data text:PATH`: the shortest file the refusal names gives a window to every split, and one byte less is
refused in one line saying how long a file must be."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardbench.data.tokens import text_tokens
from shardbench.errors import DataError

SEQ = 16


def _text(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(i % 251 for i in range(size)))
    return path


@pytest.mark.parametrize(("val_fraction", "windows", "splits"), [
    (0.1, 3, "train, val and test"),
    (0.5, 3, "train, val and test"),
    (0.0, 2, "train and test"),
])
def test_the_shortest_file_the_refusal_names_gives_every_split_a_window(tmp_path: Path, val_fraction: float,
                                                                        windows: int, splits: str) -> None:
    """3 * seq_len + 1 bytes are 3 windows: one each for train, val and test (the 10% of 2 windows held out for
    validation rounds to none, which left no validation at all); without validation 2 windows are enough."""
    least = windows * SEQ + 1
    ds = text_tokens(_text(tmp_path, least), seq_len=SEQ, val_fraction=val_fraction)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (1, 1 if val_fraction else 0, 1)
    with pytest.raises(DataError, match=rf"has {least - 1} bytes, too few for {splits} windows of {SEQ + 1} "
                                        rf"tokens: give a longer file \(at least {least} bytes\)"):
        text_tokens(_text(tmp_path, least - 1), seq_len=SEQ, val_fraction=val_fraction)


def test_a_longer_file_keeps_its_proportions(tmp_path: Path) -> None:
    """100 windows: 10 test, then 9 validation (10% of the 90 before them), 81 train, as before the minimum. Window
    k holds bytes 16k to 16k + 16 (each starts where the last ended, its first token that one's target); the
    training windows come first in the file, then validation's, then the test's at its end."""
    ds = text_tokens(_text(tmp_path, 100 * SEQ + 1), seq_len=SEQ, val_fraction=0.1)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (81, 9, 10)
    windows = {"train": range(0, 81), "val": range(81, 90), "test": range(90, 100)}
    for name, split in (("train", ds.train), ("val", ds.val), ("test", ds.test)):
        want = [[(SEQ * k + j) % 251 for j in range(SEQ + 1)] for k in windows[name]]  # the file's bytes are i % 251
        assert np.asarray(split.data["tokens"]).tolist() == want, name


def test_a_text_runs_mistakes_of_the_model_are_its_configuration_and_name_the_sequence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Byte-level text with a vocabulary under 256 is a configuration that cannot run (exit 2; it exited 4, the
    code of a corrupt file), and a batch larger than the text's examples says that the sequence length sets how
    many windows the file holds (it named the count alone)."""
    from shardbench.cli import main
    from shardbench.errors import EXIT_CODES

    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 12)  # 3,072 bytes
    common = ["train", "--preset", "lm-tiny", "--devices", "1", "--mesh", "none", "--data", f"text:{text}",
              "--steps", "2", "--no-train.progress", "--data.cache-dir", str(tmp_path / "cache")]
    assert main([*common, "--model.vocab-size", "128", "--out", str(tmp_path / "a")]) == EXIT_CODES["configuration"]
    assert capsys.readouterr().err.strip().endswith("--model.vocab-size is 128: pass --model.vocab-size 256")
    assert main([*common, "--model.seq-len", "512", "--out", str(tmp_path / "b")]) == EXIT_CODES["configuration"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        f"training examples (text:{text.name} cut into windows of --model.seq-len 512 + 1 tokens: a shorter sequence "
        f"makes more)"), err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
