"""The data-sheet table: its figures against the vendors' data sheets (written here, not read from the table), and
JAX's device kinds find their chip."""

from __future__ import annotations

import pytest

from shardbench.hardware import BY_NAME, CHIPS, chip_for_kind
from shardbench.measure.flops import table_peak


@pytest.mark.parametrize(("kind", "name"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"), ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L4", "l4"), ("Tesla V100-SXM2-32GB", "v100"),
    ("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"), ("TPU v5", "tpu-v5p"), ("TPU v6 lite", "tpu-v6e"),
    ("TPU v3", "tpu-v3"), ("TPU v2", "tpu-v2"), ("NVIDIA H200 NVL", "h200-nvl"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA A100 80GB PCIe", "a100"), ("Tesla V100S-PCIE-32GB", "v100"), ("TPU v5e", "tpu-v5e"),
    ("TPU v5p", "tpu-v5p"), ("TPU v6e", "tpu-v6e"),
])
def test_device_kinds_find_their_chip(kind: str, name: str) -> None:
    chip = chip_for_kind(kind)
    assert chip is not None and chip.name == name


def test_unknown_kinds_find_none() -> None:
    assert chip_for_kind("cpu") is None and chip_for_kind("NVIDIA L40S") is None  # not taken for an L4


@pytest.mark.parametrize("kind", ["NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e", "NVIDIA GB200", "NVIDIA GH100",
                                  "Quadro GV100", "NVIDIA RTX A1000", "TPU v4 lite"])
def test_a_longer_name_holding_a_chips_is_not_that_chip(kind: str) -> None:
    """A Grace Hopper (GH200), a Grace Blackwell (GB200), a Quadro GV100, an RTX A1000 and the TPU v4i ("TPU v4
    lite") are other chips with other figures: none of them is taken for the h200, b200, v100, a100 or tpu-v4 row
    whose name it holds."""
    assert chip_for_kind(kind) is None


GB, GiB, TB = 1e9, 2**30, 1e12
SPARSE = 0.5  # NVIDIA's Hopper, Ada and Blackwell sheets print tensor-core peaks with 2:4 sparsity; dense is half

# As each data sheet prints it, per chip: tensor bf16/fp16, tf32 and fp32 FLOP/s; memory in bytes and bytes/s;
# links per chip in bytes/s as printed, bidirectional ("bidir") or per direction; chips per node.
DATASHEET: dict[str, dict[str, float | str | None]] = {
    # NVIDIA H100 Tensor Core GPU data sheet, H100 SXM column: BF16 1,979 TF*, TF32 989 TF*, FP32 67 TF
    # (* with sparsity), 80 GB, 3.35 TB/s, NVLink 900 GB/s; DGX H100: 8 GPUs, 8x 400 Gb/s ConnectX-7.
    "h100": {"bf16": 1979e12 * SPARSE, "tf32": 989e12 * SPARSE, "f32": 67e12, "memory": 80 * GB, "bandwidth": 3.35 * TB,
             "nvlink_bidir": 900 * GB, "nic_per_chip": 400e9 / 8, "per_node": 8},
    # Same sheet, H100 PCIe column: BF16 1,513 TF*, TF32 756 TF*, FP32 51 TF, 80 GB, 2 TB/s, NVLink bridge 600 GB/s.
    "h100-pcie": {"bf16": 1513e12 * SPARSE, "tf32": 756e12 * SPARSE, "f32": 51e12, "memory": 80 * GB,
                  "bandwidth": 2 * TB, "nvlink_bidir": 600 * GB, "nic_per_chip": 400e9 / 8, "per_node": 8},
    # Same sheet, H100 NVL column: BF16 1,671 TF*, TF32 835 TF*, FP32 60 TF, 94 GB, 3.9 TB/s, NVLink 600 GB/s
    # (a bridge between pairs of cards). One 400 Gb/s NIC per GPU and 8 per node are the table's assumption.
    "h100-nvl": {"bf16": 1671e12 * SPARSE, "tf32": 835e12 * SPARSE, "f32": 60e12, "memory": 94 * GB,
                 "bandwidth": 3.9 * TB, "nvlink_bidir": 600 * GB, "nic_per_chip": 400e9 / 8, "per_node": 8},
    # NVIDIA H200 Tensor Core GPU data sheet, H200 NVL column: BF16 1,671 TF*, TF32 835 TF*, FP32 60 TF, 141 GB,
    # 4.8 TB/s, 2- or 4-way NVLink bridge 900 GB/s per GPU. NIC and node as for the H100 NVL.
    "h200-nvl": {"bf16": 1671e12 * SPARSE, "tf32": 835e12 * SPARSE, "f32": 60e12, "memory": 141 * GB,
                 "bandwidth": 4.8 * TB, "nvlink_bidir": 900 * GB, "nic_per_chip": 400e9 / 8, "per_node": 8},
    # NVIDIA H200 Tensor Core GPU data sheet, H200 SXM column: BF16 1,979 TF*, TF32 989 TF*, FP32 67 TF, 141 GB,
    # 4.8 TB/s, NVLink 900 GB/s; HGX H200: 8 GPUs, one 400 Gb/s ConnectX-7 per GPU.
    "h200": {"bf16": 1979e12 * SPARSE, "tf32": 989e12 * SPARSE, "f32": 67e12, "memory": 141 * GB, "bandwidth": 4.8 * TB,
             "nvlink_bidir": 900 * GB, "nic_per_chip": 400e9 / 8, "per_node": 8},
    # NVIDIA HGX B200 specifications (8 GPUs): FP16/BF16 36 PF*, TF32 18 PF*, FP32 600 TF, NVLink 1.8 TB/s per GPU;
    # DGX B200 data sheet: 1,440 GB of GPU memory, 64 TB/s HBM3e, 8x 400 Gb/s ConnectX-7.
    "b200": {"bf16": 36e15 / 8 * SPARSE, "tf32": 18e15 / 8 * SPARSE, "f32": 600e12 / 8, "memory": 1440 * GB / 8,
             "bandwidth": 64 * TB / 8, "nvlink_bidir": 1.8 * TB, "nic_per_chip": 400e9 / 8, "per_node": 8},
    # NVIDIA A100 Tensor Core GPU data sheet, A100 80GB SXM column (dense figures printed): BF16 312 TF, TF32 156 TF,
    # FP32 19.5 TF, 80 GB HBM2e, 2,039 GB/s, NVLink 600 GB/s; DGX A100: 8 GPUs, 8x 200 Gb/s HDR InfiniBand.
    "a100": {"bf16": 312e12, "tf32": 156e12, "f32": 19.5e12, "memory": 80 * GB, "bandwidth": 2039 * GB,
             "nvlink_bidir": 600 * GB, "nic_per_chip": 200e9 / 8, "per_node": 8},
    # NVIDIA L4 Tensor Core GPU data sheet: BF16 242 TF*, TF32 120 TF*, FP32 30.3 TF, 24 GB, 300 GB/s,
    # PCIe Gen4 x16 64 GB/s (bidirectional), no NVLink. (8 per node is the table's assumption, not the sheet's.)
    "l4": {"bf16": 242e12 * SPARSE, "tf32": 120e12 * SPARSE, "f32": 30.3e12, "memory": 24 * GB, "bandwidth": 300 * GB,
           "nvlink_bidir": 64 * GB, "nic_per_chip": None, "per_node": 8},
    # NVIDIA V100 Tensor Core GPU data sheet, V100 SXM2 column: tensor 125 TF, FP32 15.7 TF (no TF32), 32 GB HBM2,
    # 900 GB/s, NVLink 300 GB/s.
    "v100": {"bf16": 125e12, "tf32": 15.7e12, "f32": 15.7e12, "memory": 32 * GB, "bandwidth": 900 * GB,
             "nvlink_bidir": 300 * GB, "nic_per_chip": None, "per_node": 8},
    # Cloud TPU v6e system architecture: 918 TF bf16, 32 GB, 1,638 GBps, bidirectional ICI 800 GBps per chip,
    # 8 chips per host.
    "tpu-v6e": {"bf16": 918e12, "memory": 32 * GB, "bandwidth": 1638 * GB, "nvlink_bidir": 800 * GB,
                "nic_per_chip": None, "per_node": 8},
    # Cloud TPU v5e system architecture: 197 TF bf16, 16 GB, 819 GBps, bidirectional ICI 400 GBps per chip,
    # 8 chips per host, 2 x 100 Gbps NICs per host.
    "tpu-v5e": {"bf16": 197e12, "memory": 16 * GB, "bandwidth": 819 * GB, "nvlink_bidir": 400 * GB,
                "nic_per_chip": 2 * 100e9 / 8 / 8, "per_node": 8},
    # Cloud TPU v5p system architecture: 459 TF bf16, 95 GB, 2,765 GBps, bidirectional ICI 1,200 GBps per chip
    # (older versions of the page: 4,800 Gbps, the same 600 GB/s each way), 4 chips per VM.
    "tpu-v5p": {"bf16": 459e12, "memory": 95 * GB, "bandwidth": 2765 * GB, "nvlink_bidir": 1200 * GB,
                "nic_per_chip": None, "per_node": 4},
    # Cloud TPU v4 system architecture: 275 TF bf16, 32 GiB, 1,200 GBps; no per-chip ICI figure; 4 chips per host.
    "tpu-v4": {"bf16": 275e12, "memory": 32 * GiB, "bandwidth": 1200 * GB, "nvlink_bidir": None,
               "nic_per_chip": None, "per_node": 4},
    # Cloud TPU v3 system architecture: 123 TF bf16, 32 GiB, 900 GBps.
    "tpu-v3": {"bf16": 123e12, "memory": 32 * GiB, "bandwidth": 900 * GB, "nvlink_bidir": None,
               "nic_per_chip": None, "per_node": 4},
    # Cloud TPU v2: 45 TF bf16, 16 GiB per chip. (Its bandwidth is not in the table.)
    "tpu-v2": {"bf16": 45e12, "memory": 16 * GiB, "bandwidth": None, "nvlink_bidir": None,
               "nic_per_chip": None, "per_node": 4},
}


def _close(table: float | None, sheet: float | None) -> bool:
    """Equal to three figures: the sheet's 989 TF sparse halves to 494.5, which the table gives as 494 (0.1%)."""
    return table == sheet if table is None or sheet is None else table == pytest.approx(sheet, rel=2e-3)


def test_every_chip_has_a_data_sheet_row() -> None:
    assert sorted(BY_NAME) == sorted(DATASHEET)


@pytest.mark.parametrize("name", list(DATASHEET))
def test_the_table_matches_the_data_sheet(name: str) -> None:
    chip, sheet = BY_NAME[name], DATASHEET[name]
    bf16 = float(sheet["bf16"])  # type: ignore[arg-type]
    # TPUs have no TF32: float32 matmuls at default precision run as one bf16 pass, at high precision as three,
    # at highest precision as six.
    tf32, f32 = sheet.get("tf32", bf16), sheet.get("f32", bf16 / 6)
    links = sheet["nvlink_bidir"]
    tpu = name.startswith("tpu-")
    assert ("bf16x3" in chip.peaks) == tpu, f"{name}: bf16x3 is a TPU's float32 at high precision, only a TPU's"
    pairs = {"bf16": (chip.peaks["bf16"], bf16), "tf32": (chip.peaks["tf32"], tf32), "f32": (chip.peaks["f32"], f32),
             **({"bf16x3": (chip.peaks["bf16x3"], bf16 / 3)} if tpu else {}),
             "memory_bytes": (chip.memory_bytes, sheet["memory"]),
             "memory_bandwidth": (chip.memory_bandwidth, sheet["bandwidth"]),
             "intra_bandwidth": (chip.intra_bandwidth, None if links is None else float(links) / 2),  # per direction
             "inter_bandwidth": (chip.inter_bandwidth, sheet["nic_per_chip"]),
             "per_node": (chip.per_node, sheet["per_node"])}
    wrong = {field: pair for field, pair in pairs.items() if not _close(*pair)}  # type: ignore[arg-type]
    assert not wrong, f"{name}: (table, data sheet) {wrong}"


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
    use the 16-bit peak; float32 at default precision the TF32 (GPU) or one-bf16-pass (TPU) peak; 'high' TF32 on
    a GPU but three bf16 passes on a TPU; 'highest' the full float32 peak; and the source names the chip and class
    it came from."""
    chip = chip_for_kind(kind)
    assert chip is not None
    tpu = kind.startswith("TPU")
    expected = {("bfloat16", "default"): "bf16", ("float16", "highest"): "bf16", ("float32", "default"): "tf32",
                ("float32", "high"): "bf16x3" if tpu else "tf32", ("float32", "highest"): "f32"}
    for (dtype, precision), cls in expected.items():
        peak, source = table_peak(kind, dtype, precision)
        assert peak == chip.peaks[cls] and source.startswith(f"table: {chip.name} {cls} (")
    assert table_peak(kind, "float32", "highest")[0] < table_peak(kind, "float32", "default")[0] <= \
        table_peak(kind, "bfloat16", "default")[0]
    assert table_peak("cpu", "float32", "default") is None


@pytest.mark.parametrize(("kind", "bf16"), [("TPU v4", 275e12), ("TPU v5 lite", 197e12)])
def test_float32_at_high_precision_on_a_tpu_runs_three_bf16_passes(kind: str, bf16: float) -> None:
    """XLA's TPU compiler runs a float32 matmul at Precision.HIGH as three bfloat16 passes (bf16_3x): a third of
    the data sheet's bf16 rate (v4 275 TF, v5e 197 TF), where NVIDIA's 'high' is TF32 (H100 SXM: 494 TF)."""
    assert table_peak(kind, "float32", "high")[0] == pytest.approx(bf16 / 3)
    assert table_peak(kind, "float32", "default")[0] == pytest.approx(bf16)
    assert table_peak("NVIDIA H100 80GB HBM3", "float32", "high")[0] == pytest.approx(494e12)


@pytest.mark.parametrize(("kind", "chip_bf16", "chip_gib"), [("TPU v3", 123e12, 32), ("TPU v2", 45e12, 16)])
def test_a_tpu_v2_or_v3_device_is_one_core_half_a_chip(kind: str, chip_bf16: float, chip_gib: int) -> None:
    """A JAX device on TPU v2 and v3 is one of the chip's two TensorCores: the data sheet's 123 TF bf16 and 32 GiB
    per v3 chip (45 TF and 16 GiB per v2 chip) are 61.5 TF and 16 GiB per device (22.5 TF and 8 GiB), and so
    are MFU's peak and the planner's memory; a v4 device (megacore) is its whole chip."""
    chip = chip_for_kind(kind)
    assert chip is not None and chip.devices_per_chip == 2
    assert table_peak(kind, "bfloat16", "default")[0] == pytest.approx(chip_bf16 / 2)
    assert chip.memory_per_device == chip_gib * 2**30 / 2
    v4 = chip_for_kind("TPU v4")
    assert v4 is not None and v4.peak_per_device("bf16") == 275e12 and v4.memory_per_device == 32 * 2**30


def test_a_cpu_run_over_several_hosts_divides_by_every_host_s_peak() -> None:
    """Four processes on two hosts (two per host), 16 simulated devices in all, each host measured at 100 GFLOP/s:
    the devices share 2 x 100 GFLOP/s, 12.5 GFLOP/s each, and a step of 100 GFLOP in 1 s is 100 / (12.5 x 16) =
    50% MFU (process 0's one host spread over all 16 devices would say 6.25 GFLOP/s and 100%)."""
    import jax

    from shardbench.measure.flops import host_count, mfu, peak_per_device
    from shardbench.measure.peak import HostPeak

    processes = [{"process": i, "host": f"node{i // 2}"} for i in range(4)]
    assert host_count(processes) == 2 and host_count([{"process": 0, "host": "a"}, {"process": 1, "host": "a"}]) == 1
    host = HostPeak("float32", 100e9, "2026-01-01T00:00:00Z", "node0")
    peak, source = peak_per_device(jax.devices("cpu")[0], 16, "float32", "default", host, host_count(processes))
    assert peak == pytest.approx(12.5e9) and "x 2 hosts, split over 16 device(s)" in (source or "")
    assert mfu(100e9, 1.0, peak, 16) == pytest.approx(0.5)
