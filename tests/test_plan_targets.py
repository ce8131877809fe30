"""Planning: targets by count and chip, and the candidate layouts for a device count."""

from __future__ import annotations

import pytest

from shardbench.errors import ConfigError
from shardbench.plan.candidates import candidates, factorisations
from shardbench.plan.target import parse_target


def test_targets_by_count_and_chip() -> None:
    one = parse_target("8xh100")
    assert (one.chip.name, one.devices, one.per_node, one.nodes) == ("h100", 8, 8, 1)
    two = parse_target("2x8xh100")
    assert (two.devices, two.per_node, two.nodes) == (16, 8, 2)
    slice_ = parse_target("tpu-v5e:16x16")
    assert (slice_.chip.name, slice_.devices, slice_.topology, slice_.nodes) == ("tpu-v5e", 256, (16, 16), 32)
    assert parse_target("tpu-v4:4x4x4").devices == 64 and parse_target("cpu", 8).devices == 8


@pytest.mark.parametrize(("spec", "message"), [
    ("8xh900", "unknown chip 'h900'"), ("eight h100", "is not a target"), ("tpu-v5e:16", "a TPU slice is"),
    ("8xtpu-v5e", "give a TPU slice by its topology"), ("h100:2x4", "a topology (:2x4) is for TPU chips"),
])
def test_bad_targets_are_named_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        parse_target(spec)
    assert "\n" not in str(err.value)


def test_candidates_cover_every_usable_mesh() -> None:
    assert factorisations(8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    found = {(c.strategy, c.mesh) for c in candidates(8, 4096, ["dp", "fsdp", "tp", "dp+tp", "fsdp+tp"],
                                                        ["none"], ["bfloat16"])}
    assert found == {("dp", "8x1"), ("fsdp", "8x1"), ("tp", "1x8"), ("dp+tp", "2x4"), ("dp+tp", "4x2"),
                     ("fsdp+tp", "2x4"), ("fsdp+tp", "4x2")}
    assert len(candidates(8, 4096, ["dp", "tp"], ["none", "block"], ["float32", "bfloat16"])) == 2 * 2 * 2
    # batch 6 on 8 devices: only layouts whose data axis divides it (tp: 1; dp+tp 2x4: 2)
    assert {(c.strategy, c.mesh) for c in candidates(8, 6, ["dp", "tp", "dp+tp"], ["none"], ["float32"])} == {
        ("tp", "1x8"), ("dp+tp", "2x4")}
    with pytest.raises(ConfigError, match="--batch-size 7 is divisible by no candidate's data-parallel size"):
        candidates(8, 7, ["dp", "fsdp"], ["none"], ["float32"])
    with pytest.raises(ConfigError, match="no candidate mesh uses 8 devices"):
        candidates(8, 8, ["single"], ["none"], ["float32"])
