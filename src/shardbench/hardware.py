"""Accelerators from their data sheets: dense peak FLOP/s by compute class, memory, and the links between chips.

One table, each number with its source. MFU divides by these peaks (`shardbench.measure.flops`); the planner
(`shardbench.plan`) reads the memory and link figures too. Peaks are dense (no structured sparsity), per chip. Compute
classes: "bf16" (bfloat16/float16 matmuls), "tf32" (float32 matmuls at default precision: TF32 on NVIDIA,
one bfloat16 pass on TPUs; at "high" precision too on NVIDIA), "bf16x3" (TPUs only: float32 at "high" precision,
three bfloat16 passes), "f32" (float32 at highest precision: six bfloat16 passes on TPUs). Link bandwidths are per chip and per
direction; None where the data sheet gives none.

A JAX device is a whole chip except on TPU v2 and v3, whose two TensorCores are two devices each with half the
chip's peak and its own half of the HBM (v4 and v5p join a chip's two cores into one device, "megacore"):
`Chip.devices_per_chip`, and `peak_per_device`, `memory_per_device` and `memory_bandwidth_per_device` divide by
it; `devices_per_node` and `chips` count between the two.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GB = 1e9
# What a platform's links are called, inside a node (or slice) and across nodes, where the chip names none of its
# own (`Chip.intra_link`); the plan's table and recommendation use these names.
LINK_NAMES = {"gpu": ("NVLink", "InfiniBand"), "tpu": ("ICI", "DCN"), "cpu": ("memory copies", "memory copies")}


@dataclass(frozen=True)
class Chip:
    """One accelerator as its data sheet gives it."""

    name: str  # what `--target` calls it, e.g. "h100"
    # A regular expression for JAX's device_kind (lower case) that identifies it, bounded (\b) so that a longer
    # name holding it (a GH200's "gh200", a GB200's "gb200", an RTX A1000's "a1000") is not taken for this chip.
    kind_match: str
    peaks: dict[str, float]  # compute class -> dense FLOP/s per chip
    memory_bytes: float  # HBM (or GDDR) capacity per chip
    memory_bandwidth: float | None  # bytes/s per chip
    intra_bandwidth: float | None  # bytes/s per chip per direction to chips of the same node/slice (NVLink, ICI)
    inter_bandwidth: float | None  # bytes/s per chip per direction to other nodes (InfiniBand, DCN)
    per_node: int  # chips a node (host) holds
    source: str
    devices_per_chip: int = 1  # JAX devices one chip appears as: 2 on TPU v2 and v3 (one per TensorCore)
    # Sides of a TPU slice's topology, in chips: 2 (AxB) where the pod is a 2-D torus, 3 (AxBxC) where it is a 3-D
    # mesh or torus; None for a GPU (no topology).
    slice_dims: int | None = None
    pod_chips: int | None = None  # the chips of a whole pod, the largest slice; None for a GPU
    intra_link: str = ""  # what the link inside a node is called where it is not the platform's (the L4's PCIe)

    @property
    def platform(self) -> str:
        """"tpu" or "gpu": the table holds no other kind of chip."""
        return "tpu" if self.name.startswith("tpu-") else "gpu"

    @property
    def link_names(self) -> tuple[str, str]:
        """What its links inside a node (or slice) and across nodes are called."""
        intra, inter = LINK_NAMES[self.platform]
        return self.intra_link or intra, inter

    def peak_per_device(self, cls: str) -> float:
        """Dense FLOP/s of one JAX device in compute class `cls`: the chip's peak over its devices."""
        return self.peaks[cls] / self.devices_per_chip

    @property
    def memory_per_device(self) -> float:
        """HBM bytes of one JAX device: the chip's capacity over its devices."""
        return self.memory_bytes / self.devices_per_chip

    @property
    def memory_bandwidth_per_device(self) -> float | None:
        """HBM bytes/s of one JAX device (each TensorCore of a TPU v2/v3 reads its own half of the HBM); None when
        the data sheet gives none."""
        return None if self.memory_bandwidth is None else self.memory_bandwidth / self.devices_per_chip

    @property
    def devices_per_node(self) -> int:
        """JAX devices a node (host) holds: its chips x each chip's devices."""
        return self.per_node * self.devices_per_chip

    def chips(self, devices: int) -> int:
        """The chips `devices` JAX devices occupy: a device of a two-device chip still takes the whole chip."""
        return math.ceil(devices / self.devices_per_chip)


CHIPS: tuple[Chip, ...] = (
    # The NVL parts are PCIe cards whose NVLink bridge joins 2 (H100 NVL) or up to 4 (H200 NVL) of them; a node's
    # other cards talk over PCIe Gen5 (128 GB/s bidirectional). The planner has one link inside a node, so, as for
    # the H100 PCIe, it takes the bridge's for all 8: optimistic for a collective over more cards than a bridge
    # joins. NVIDIA H200 data sheet, H200 NVL column: 1,671 TF BF16, 835 TF TF32 (with sparsity: 835 and 418
    # dense), 60 TF FP32, 141 GB HBM3e at 4.8 TB/s, NVLink bridge 900 GB/s per GPU (bidirectional), up to 600 W.
    Chip("h200-nvl", r"\bh200 nvl\b", {"bf16": 835.5e12, "tf32": 417.5e12, "f32": 60e12}, 141 * GB, 4.8e12, 450 * GB,
         50 * GB, 8, "NVIDIA H200 Tensor Core GPU data sheet (NVL)"),
    # NVIDIA H200 SXM data sheet: 989 TF BF16, 494 TF TF32, 67 TF FP32 (dense), 141 GB HBM3e at 4.8 TB/s, NVLink
    # 900 GB/s (bidirectional); HGX H200: 8 GPUs, one 400 Gb/s ConnectX-7 NIC per GPU.
    Chip("h200", r"\bh200\b", {"bf16": 989e12, "tf32": 494e12, "f32": 67e12}, 141 * GB, 4.8e12, 450 * GB, 50 * GB, 8,
         "NVIDIA H200 Tensor Core GPU data sheet (SXM); HGX H200"),
    # NVIDIA H100 data sheet, H100 NVL column: 1,671 TF BF16, 835 TF TF32 (with sparsity), 60 TF FP32, 94 GB HBM3
    # at 3.9 TB/s, NVLink bridge 600 GB/s (bidirectional), 350-400 W.
    Chip("h100-nvl", r"\bh100 nvl\b", {"bf16": 835.5e12, "tf32": 417.5e12, "f32": 60e12}, 94 * GB, 3.9e12, 300 * GB,
         50 * GB, 8, "NVIDIA H100 Tensor Core GPU data sheet (NVL)"),
    # NVIDIA H100 PCIe: 756 TF BF16, 378 TF TF32, 51 TF FP32, 80 GB HBM2e at 2.0 TB/s; NVLink bridge 600 GB/s.
    Chip("h100-pcie", r"\bh100 pcie\b", {"bf16": 756e12, "tf32": 378e12, "f32": 51e12}, 80 * GB, 2.0e12, 300 * GB,
         50 * GB, 8, "NVIDIA H100 Tensor Core GPU data sheet (PCIe)"),
    # NVIDIA H100 SXM: 989 TF BF16, 494 TF TF32, 67 TF FP32, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s
    # (bidirectional); DGX/HGX H100: 8 GPUs, 8x 400 Gb/s ConnectX-7 (one per GPU).
    Chip("h100", r"\bh100\b", {"bf16": 989e12, "tf32": 494e12, "f32": 67e12}, 80 * GB, 3.35e12, 450 * GB, 50 * GB, 8,
         "NVIDIA H100 Tensor Core GPU data sheet (SXM); DGX H100"),
    # NVIDIA HGX B200 (8 GPUs): 36 PF FP16/BF16 and 18 PF TF32 (sparse) -> 2.25 PF BF16 and 1.125 PF TF32 dense
    # per GPU, 600 TF FP32 -> 75 TF; DGX B200: 1,440 GB HBM3e in all (180 GB per GPU) at 64 TB/s (8 TB/s per GPU);
    # NVLink 5 1.8 TB/s (bidirectional); 8x 400 Gb/s ConnectX-7.
    Chip("b200", r"\bb200\b", {"bf16": 2250e12, "tf32": 1125e12, "f32": 75e12}, 180 * GB, 8e12, 900 * GB, 50 * GB, 8,
         "NVIDIA HGX B200 specifications; DGX B200 data sheet"),
    # NVIDIA A100 80GB SXM: 312 TF BF16, 156 TF TF32, 19.5 TF FP32, 2,039 GB/s HBM2e, NVLink 600 GB/s
    # (bidirectional); DGX A100: 8 GPUs, 8x 200 Gb/s HDR InfiniBand.
    Chip("a100", r"\ba100\b", {"bf16": 312e12, "tf32": 156e12, "f32": 19.5e12}, 80 * GB, 2.039e12, 300 * GB,
         25 * GB, 8, "NVIDIA A100 Tensor Core GPU data sheet (80GB SXM); DGX A100"),
    # NVIDIA L4: 121 TF BF16 and 60 TF TF32 dense (242 / 120 with sparsity), 30.3 TF FP32, 24 GB GDDR6 at
    # 300 GB/s; PCIe Gen4 x16 (32 GB/s per direction), no NVLink.
    Chip("l4", r"\bl4\b", {"bf16": 121e12, "tf32": 60e12, "f32": 30.3e12}, 24 * GB, 300 * GB, 32 * GB, None, 8,
         "NVIDIA L4 Tensor Core GPU data sheet", intra_link="PCIe"),
    # NVIDIA V100 SXM2: 125 TF (FP16 tensor), 15.7 TF FP32 (no TF32); 32 GB HBM2 at 900 GB/s, NVLink 300 GB/s.
    # The V100S ("Tesla V100S-PCIE-32GB") is taken for it too, as it always was; a Quadro GV100 is not.
    Chip("v100", r"\bv100s?\b", {"bf16": 125e12, "tf32": 15.7e12, "f32": 15.7e12}, 32 * GB, 900 * GB, 150 * GB,
         None, 8, "NVIDIA V100 Tensor Core GPU data sheet (SXM2)"),
    # Cloud TPU v6e (Trillium) system architecture: 918 TF bf16, 32 GB HBM at 1,638 GB/s, ICI 800 GB/s
    # bidirectional per chip, 8 chips per host, 256-chip pod (2D torus). float32 matmuls run as bf16 passes:
    # "f32" at highest precision takes six passes (XLA's default), hence / 6.
    # JAX names it "TPU v6 lite" (or "TPU v6e"). Its slices are 2-D, 1x1 to 16x16 (the page's "2D slice shapes").
    Chip("tpu-v6e", r"\btpu v6( lite|e)\b",
         {"bf16": 918e12, "tf32": 918e12, "bf16x3": 918e12 / 3, "f32": 918e12 / 6}, 32 * GB, 1638 * GB,
         400 * GB, None, 8, "Cloud TPU v6e system architecture", slice_dims=2, pod_chips=256),
    # Cloud TPU v5e: 197 TF bf16, 16 GB HBM2 at 819 GB/s, ICI 400 GB/s bidirectional per chip, 8 chips per host,
    # 2 x 100 Gb/s NICs per host (DCN), 256-chip pod (2D torus). JAX names it "TPU v5 lite" (or "TPU v5e"). Its
    # slices are 2-D, --topology AxB: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16 (the page's "2D slice shapes").
    Chip("tpu-v5e", r"\btpu v5( lite|e)\b",
         {"bf16": 197e12, "tf32": 197e12, "bf16x3": 197e12 / 3, "f32": 197e12 / 6}, 16 * GB, 819 * GB,
         200 * GB, 2 * 12.5 * GB / 8, 8, "Cloud TPU v5e system architecture", slice_dims=2, pod_chips=256),
    # Cloud TPU v5p: 459 TF bf16, 95 GB HBM2e at 2,765 GB/s, bidirectional ICI 1,200 GB/s per chip (older versions
    # of the page: "4,800 Gbps", which is the same 600 GB/s each way), 3D torus; 4 chips per host, 8,960 a pod.
    # JAX names it "TPU v5" (or "TPU v5p"); "TPU v5 lite" is the v5e. Its slices are 3-D, --topology AxBxC (2x2x1
    # the smallest), as MaxText's accelerator_to_spec_map spells them for libtpu ("v5:2x2x1" for v5p-8).
    Chip("tpu-v5p", r"\btpu v5p?\b(?! lite)",
         {"bf16": 459e12, "tf32": 459e12, "bf16x3": 459e12 / 3, "f32": 459e12 / 6}, 95 * GB, 2765 * GB,
         1200 * GB / 2, None, 4, "Cloud TPU v5p system architecture", slice_dims=3, pod_chips=8960),
    # Cloud TPU v4: 275 TF bf16, 32 GiB HBM2 at 1,200 GB/s, 3D mesh/torus; 4 chips per host, 4,096 chips a pod. The data sheet
    # gives no per-chip ICI bandwidth. "TPU v4 lite" (the v4i, another chip) is not a v4. Its slices are 3-D: "the
    # v4 topology is AxBxC" (Cloud TPU types and topologies; --topology 2x2x4), 2x2x1 the smallest (MaxText's
    # accelerator_to_spec_map: "v4:2x2x1" for v4-8).
    Chip("tpu-v4", r"\btpu v4\b(?! lite)",
         {"bf16": 275e12, "tf32": 275e12, "bf16x3": 275e12 / 3, "f32": 275e12 / 6}, 32 * 2**30, 1200 * GB, None,
         None, 4, "Cloud TPU v4 system architecture", slice_dims=3, pod_chips=4096),
    # Cloud TPU v3: 123 TF bf16 per chip, 32 GiB HBM2 at 900 GB/s, a pod of 1,024 chips (2,048 TensorCores);
    # Cloud TPU v2: 45 TF, 16 GiB, a pod of 256 chips (512 TensorCores) (the TPU v2/v3 documentation). Each chip has two TensorCores, each its own JAX device with half the HBM (16 GiB on v3). Both
    # pods are a 2D torus ("Interconnect topology: 2D torus"), so their slices are 2-D (a v3-32 is 4x4 chips).
    Chip("tpu-v3", r"\btpu v3\b",
         {"bf16": 123e12, "tf32": 123e12, "bf16x3": 123e12 / 3, "f32": 123e12 / 6}, 32 * 2**30, 900 * GB, None,
         None, 4, "Cloud TPU v3 documentation", devices_per_chip=2, slice_dims=2, pod_chips=1024),
    Chip("tpu-v2", r"\btpu v2\b",
         {"bf16": 45e12, "tf32": 45e12, "bf16x3": 45e12 / 3, "f32": 45e12 / 6}, 16 * 2**30, None, None,
         None, 4, "Cloud TPU v2 documentation", devices_per_chip=2, slice_dims=2, pod_chips=256),
)
BY_NAME: dict[str, Chip] = {c.name: c for c in CHIPS}


def chip_for_kind(device_kind: str) -> Chip | None:
    """The table's chip for JAX's `device_kind` (the first that matches; more specific ones come first)."""
    kind = device_kind.lower()
    return next((c for c in CHIPS if re.search(c.kind_match, kind)), None)
