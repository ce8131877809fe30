"""The data-sheet table: JAX's device kinds find their chip, and the figures are consistent."""

from __future__ import annotations

import pytest

from shardbench.hardware import BY_NAME, CHIPS, chip_for_kind
from shardbench.measure.flops import table_peak


@pytest.mark.parametrize(("kind", "name"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"), ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L4", "l4"), ("Tesla V100-SXM2-32GB", "v100"),
    ("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"), ("TPU v5", "tpu-v5p"), ("TPU v6 lite", "tpu-v6e"),
    ("TPU v3", "tpu-v3"), ("TPU v2", "tpu-v2"),
])
def test_device_kinds_find_their_chip(kind: str, name: str) -> None:
    chip = chip_for_kind(kind)
    assert chip is not None and chip.name == name


def test_unknown_kinds_find_none() -> None:
    assert chip_for_kind("cpu") is None and chip_for_kind("NVIDIA L40S") is None  # not taken for an L4


def test_the_figures_are_consistent() -> None:
    assert len(BY_NAME) == len(CHIPS)
    for chip in CHIPS:
        assert chip.peaks["bf16"] >= chip.peaks["tf32"] >= chip.peaks["f32"] > 0, chip.name
        assert chip.memory_bytes > 0 and chip.per_node > 0 and chip.source, chip.name
        if chip.intra_bandwidth and chip.inter_bandwidth:
            assert chip.intra_bandwidth > chip.inter_bandwidth, chip.name  # NVLink/ICI beyond the network
    # The figures the issues quote: an H100's 989 TFLOP/s bfloat16 and 80 GB.
    assert BY_NAME["h100"].peaks["bf16"] == 989e12 and BY_NAME["h100"].memory_bytes == 80e9
    assert table_peak("NVIDIA H100 80GB HBM3", "bfloat16", "default") == (
        989e12, "table: h100 bf16 (NVIDIA H100 Tensor Core GPU data sheet (SXM); DGX H100)")
    assert table_peak("TPU v5 lite", "float32", "highest")[0] == pytest.approx(197e12 / 6)
    assert table_peak("cpu", "float32", "default") is None
