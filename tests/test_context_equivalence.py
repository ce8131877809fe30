"""Context parallelism (cp, dp+cp, fsdp+cp, cp+tp; keys and values all-gathered or passed around a ring) and tp with
sequence parallelism train the LM as one device does: the loss and the gradients' global norm at every step, against
the one-device computation of tests/equivalence.py; the ring's runs count its key/value blocks by hand."""

# ruff: noqa: F811 - `reference` is a fixture imported from tests/equivalence.py
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shardbench.parallel.mesh import parse_mesh
from equivalence import SHAPES, config, logged, reference, trains_as_one_device  # noqa: F401 - a fixture
from shardbench.train.loop import run

pytestmark = pytest.mark.slow

RING = {"parallel.context": "ring"}
# The LM of 16 tokens: 2 x seq = 8 head-tail chunks divide them. Head-tail order everywhere but fsdp+cp's; cp's
# all-gather in head-tail order, with dropout, in `test_dropout_masks_a_token_as_one_device_does` below.
CASES = [("cp", "seq=4", 4, RING), ("dp+cp", "data=2,seq=4", 8, RING),
         ("fsdp+cp", "data=2,seq=4", 8, {**RING, "parallel.context_order": "contiguous"}),
         ("cp+tp", "model=2,seq=4", 8, RING), ("dp+tp", "4x2", 8, {"parallel.sequence_parallel": True})]


@pytest.mark.parametrize(("strategy", "mesh", "devices", "extra"), CASES,
                         ids=[f"{s}-{m}-" + "-".join(map(str, e.values())) for s, m, _, e in CASES])
def test_context_and_sequence_parallel_train_as_one_device(
        tmp_path: Path, reference: Callable[[str], tuple[list[float], list[float]]], strategy: str, mesh: str,
        devices: int, extra: dict[str, object]) -> None:
    layout = trains_as_one_device(tmp_path, reference, "lm-seed", strategy, mesh, devices, "jit", **extra)
    if extra.get("parallel.context") != "ring":
        return
    # N - 1 key/value blocks per layer forward, each one device's keys and values in float32: 2 x its rows x its
    # tokens x its share of the width (heads over model); as many back, each a block with its gradient (2 blocks).
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["measurements"]
    assert record["attention"] == "context"  # the ring replaces the model's own attention
    axes, shape = parse_mesh(mesh, devices), SHAPES["lm-seed"]
    batch, tokens, width, layers = (int(shape[k]) for k in (  # type: ignore[call-overload]
        "train.batch_size", "model.seq_len", "model.embed_dim", "model.num_layers"))
    block = 2 * (batch // axes.data) * (tokens // axes.seq) * (width // axes.model) * 4
    ring, moved = 2 * (axes.seq - 1) * layers, record["context_transfers"]
    ring_bytes = 3 * (axes.seq - 1) * layers * block
    # Beside the ring, XLA splits the seq + 1 token ids along seq too and hands each device its neighbour's edge
    # for the task's shift by one (one or two permutes of a few int32s: 13 or 14 in all, as measured).
    assert ring <= moved["count"] <= ring + 2, (layout, moved)
    assert 0 <= moved["bytes"] - ring_bytes < 1024, (layout, moved, block)


@pytest.mark.parametrize(("preset", "model"), [("lm-seed", {}), ("vit-tiny", {"model.pool": "mean"})])
def test_dropout_masks_a_token_as_one_device_does(tmp_path: Path, preset: str, model: dict[str, object]) -> None:
    """With dropout, cp (all-gather, head-tail order) trains as one device with dropout trains: a token's mask is
    drawn for its true position. The LM's was drawn for its place in head-tail order, and its gradient norm moved
    off one device's from the first step; the ViT, which keeps its patches in order (its attention is not causal), must not
    have its masks reordered. The one-device computation of tests/equivalence.py has no dropout: a one-device run
    is the reference here (dropout's masks hash global positions, so its draws do not depend on the layout)."""
    runs = {}
    for name, strategy, mesh, devices, rate in (("single", "single", "none", 1, 0.1), ("cp", "cp", "seq=4", 4, 0.1),
                                                ("plain", "single", "none", 1, 0.0)):
        run(config(tmp_path, preset, name, **{"parallel.strategy": strategy, "parallel.mesh": mesh,
                                              "parallel.devices": devices, "model.dropout": rate, **model}))
        runs[name] = logged(tmp_path / name)
    (want_loss, want_norm), (got_loss, got_norm) = runs["single"], runs["cp"]
    # Dropout was drawn at all: one device with it trains otherwise than without (else both runs would agree
    # whatever the masks).
    assert not np.allclose(want_norm, runs["plain"][1], rtol=1e-3), f"{preset}: dropout 0.1 changed nothing"
    np.testing.assert_allclose(got_norm, want_norm, rtol=1e-5, err_msg=f"{preset}: cp with dropout: gradient norm")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, err_msg=f"{preset}: cp with dropout: loss differs")
