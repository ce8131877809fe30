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



@pytest.mark.parametrize("kind", ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "TPU v5 lite", "TPU v4"])
def test_a_run_gets_the_peak_of_its_compute_class(kind: str) -> None:
    """What MFU divides by follows the run's precision through the device's kind: bfloat16 and float16 compute
    use the 16-bit peak; float32 at default precision the TF32 (GPU) or bf16-pass (TPU) peak; 'highest' the
    full float32 peak; and the source names the chip and class it came from."""
    chip = chip_for_kind(kind)
    assert chip is not None
    expected = {("bfloat16", "default"): "bf16", ("float16", "highest"): "bf16", ("float32", "default"): "tf32",
                ("float32", "high"): "tf32", ("float32", "highest"): "f32"}
    for (dtype, precision), cls in expected.items():
        peak, source = table_peak(kind, dtype, precision)
        assert peak == chip.peaks[cls] and source.startswith(f"table: {chip.name} {cls} (")
    assert table_peak(kind, "float32", "highest")[0] < table_peak(kind, "float32", "default")[0] <= \
        table_peak(kind, "bfloat16", "default")[0]
    assert table_peak("cpu", "float32", "default") is None
