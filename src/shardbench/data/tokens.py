"""Token datasets for the language model: uniformly random tokens (the seed's toy data) and byte-level
tokens from any local text file. An example is seq_len + 1 tokens: the model reads the first seq_len
and predicts each next one.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from shardbench.data.arrays import Columns, Dataset
from shardbench.errors import DataError

BYTE_VOCAB = 256
TEST_FRACTION = 0.1  # of a text's windows, taken from its end


def uniform_tokens(num_train: int, num_test: int, *, seq_len: int, vocab_size: int, seed: int,
                   val_fraction: float) -> Dataset:
    """Every token drawn uniformly from the vocabulary, independently: nothing is learnable, so the best
    any model can do on held-out tokens is the entropy ln(vocab_size)."""
    if num_train < 1 or num_test < 1:
        raise DataError(f"tokens-uniform needs at least one train and one test sequence; got {num_train} and "
                        f"{num_test}: raise --data.synthetic-train / --data.synthetic-test")
    rng = np.random.Generator(np.random.PCG64([seed, 0x70CE]))
    n_val = int(round(num_train * val_fraction))
    draw = rng.integers(0, vocab_size, size=(num_train + num_test, seq_len + 1), dtype=np.int32)
    train, val, test = draw[: num_train - n_val], draw[num_train - n_val: num_train], draw[num_train:]
    floor = math.log(vocab_size)
    return Dataset(
        name="tokens-uniform", train=Columns({"tokens": train}), val=Columns({"tokens": val}),
        test=Columns({"tokens": test}),
        info={"vocab_size": vocab_size, "loss_floor": floor,
              "loss_floor_note": f"tokens are uniform over {vocab_size} ids, so no model can beat "
                                 f"ln({vocab_size}) = {floor:.3f} on held-out tokens (perplexity {vocab_size})"},
    )


def text_tokens(path: Path, *, seq_len: int, val_fraction: float) -> Dataset:
    """The file's bytes as tokens (vocabulary 256), cut into non-overlapping windows of seq_len + 1
    (consecutive windows share one token). The last 10% of the windows are the test split and the
    val_fraction of the rest before them the validation split: held-out text comes after the training text.
    Each split gets at least one window (validation only where val_fraction > 0), so the shortest file the
    refusal names really gives one window to each."""
    data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    windows = (len(data) - 1) // seq_len
    needed, splits = (3, "train, val and test") if val_fraction > 0 else (2, "train and test")
    if windows < needed:
        raise DataError(f"text {path} has {len(data):,} bytes, too few for {splits} windows of "
                        f"{seq_len + 1} tokens: give a longer file (at least {needed * seq_len + 1:,} bytes) or a "
                        f"smaller --model.seq-len")
    starts = np.arange(windows)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    tokens = data[starts].astype(np.int32)
    n_test = max(1, int(round(windows * TEST_FRACTION)))
    rest = windows - n_test
    n_val = min(max(1, int(round(rest * val_fraction))), rest - 1) if val_fraction > 0 else 0
    train, val, test = tokens[: rest - n_val], tokens[rest - n_val: rest], tokens[rest:]
    return Dataset(
        name=f"text:{path.name}", train=Columns({"tokens": train}), val=Columns({"tokens": val}),
        test=Columns({"tokens": test}),
        info={"vocab_size": BYTE_VOCAB, "bytes": int(len(data)), "loss_floor": None,
              "loss_floor_note": f"byte-level text ({len(data):,} bytes); uniform guessing would score "
                                 f"ln(256) = {math.log(BYTE_VOCAB):.3f}"},
    )
