"""The target's numbers the model needs, per JAX device: peak FLOP/s in the candidate's compute class, usable
memory, and each link's bandwidth; from the data sheet (`shardbench.hardware`) or, for `cpu`, measured on
this host. The data sheet is per chip: a TPU v2 or v3 chip is two devices, each with half its peak, HBM and HBM
bandwidth."""

from __future__ import annotations

import os
from pathlib import Path

from shardbench.errors import ConfigError
from shardbench.hardware import Chip
from shardbench.measure.flops import compute_class
from shardbench.plan.predict import Hardware
from shardbench.plan.target import Target, unlinked

# JAX preallocates 75% of a GPU's memory and allocates from that pool (XLA_PYTHON_CLIENT_MEM_FRACTION).
GPU_MEMORY_FRACTION = 0.75


def gpu_memory_fraction() -> tuple[float, str]:
    given = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if given:
        try:
            return float(given), f"XLA_PYTHON_CLIENT_MEM_FRACTION={given}"
        except ValueError:
            pass
    return GPU_MEMORY_FRACTION, "JAX's default pool: 75% of it (XLA_PYTHON_CLIENT_MEM_FRACTION)"


def host_memory_bytes() -> float:
    """This host's available memory (MemAvailable), else its physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def hardware(target: Target, dtype: str, matmul_precision: str, cache_dir: Path,
             host_peak: tuple[float, str] | None = None) -> Hardware:
    """`host_peak`: (the host's whole matmul FLOP/s, its source) for a `cpu` target; measured (and cached)
    when not given."""
    chip = target.chip
    if chip is None:
        from shardbench.measure.peak import host_bandwidth
        from shardbench.measure.peak import host_peak as measured_peak

        if host_peak is None:
            peak = measured_peak(dtype, cache_dir)
            host_peak = (peak.flops_per_s, f"host {dtype} matmul peak {peak.flops_per_s / 1e9:.1f} GFLOP/s "
                                           f"measured {peak.measured_at}")
        bandwidth, bw_source = host_bandwidth(cache_dir)
        devices = target.devices
        return Hardware(
            name=f"{devices} simulated CPU device(s) on this host", platform="cpu",
            peak_flops=host_peak[0] / devices, peak_source=f"{host_peak[1]}, split over {devices} device(s)",
            memory_bytes=host_memory_bytes() / devices,
            memory_source=f"this host's available memory, split over {devices} device(s)",
            bandwidth={"intra": bandwidth, "inter": bandwidth}, bandwidth_source=bw_source,
            memory_bandwidth=bandwidth, memory_bandwidth_source=bw_source, shared_host=True)
    if unlinked(target):  # `parse_target` refuses these: never time traffic across nodes at another link's rate
        raise ConfigError(f"{target.spec}: the {chip.name}'s data sheet gives no bandwidth between nodes, and it "
                          f"spans {target.nodes} nodes: plan one node")
    tpu = chip.platform == "tpu"
    cls = compute_class(dtype, matmul_precision, tpu=tpu)
    fraction, fraction_source = (1.0, "the whole HBM") if tpu else gpu_memory_fraction()
    placement = (f"a {'x'.join(map(str, target.topology))} slice (ICI throughout)" if tpu else
                 f"{target.nodes} node(s) x {target.per_node}")
    name = (f"{target.devices} {chip.name} on {placement}" if chip.devices_per_chip == 1 else
            f"{target.counted()} on {placement}")
    intra = chip.intra_bandwidth or 0.0
    # One node's traffic crosses no node (`unlinked` targets are refused): where the data sheet gives no bandwidth
    # between nodes, none is timed or claimed.
    inter = chip.inter_bandwidth or (intra if tpu else 0.0)
    hbm = chip.memory_bandwidth_per_device
    return Hardware(
        name=name, platform=chip.platform, link_names=chip.link_names,
        peak_flops=chip.peak_per_device(cls), peak_source=_peak_source(chip, cls),
        memory_bytes=chip.memory_per_device * fraction,
        memory_source=f"{_memory_source(chip)}, {fraction_source}",
        bandwidth={"intra": intra or float("inf"), "inter": inter or float("inf")},
        bandwidth_source=(f"data sheet: {intra / 1e9:.0f} GB/s per direction inside a node"
                          + (f", {inter / 1e9:.0f} GB/s across nodes" if not tpu and inter else "")
                          if intra else "no link bandwidth on the data sheet: transfers not timed"),
        memory_bandwidth=hbm or float("inf"),
        memory_bandwidth_source=(_per_device(chip, f"data sheet: {(chip.memory_bandwidth or 0) / 1e12:.2f} TB/s",
                                             f"{hbm / 1e12:.2f} TB/s") if hbm
                                 else "no memory bandwidth on the data sheet: traffic not timed"))


def _per_device(chip: Chip, whole: str, each: str) -> str:
    """`whole` (a chip's figure), and `each` (a device's) where the chip is more than one device."""
    if chip.devices_per_chip == 1:
        return whole
    return f"{whole} a chip, {each} per device ({chip.devices_per_chip} devices a chip, one per TensorCore)"


def _peak_source(chip: Chip, cls: str) -> str:
    """Where the per-device peak in compute class `cls` comes from."""
    whole = f"data sheet: {chip.name} {cls} {chip.peaks[cls] / 1e12:.0f} TFLOP/s"
    return f"{_per_device(chip, whole, f'{chip.peak_per_device(cls) / 1e12:.3g} TFLOP/s')} ({chip.source})"


def _memory_source(chip: Chip) -> str:
    """Where the per-device memory comes from."""
    if chip.devices_per_chip == 1:
        return f"data sheet: {chip.memory_bytes / 1e9:.0f} GB"
    return _per_device(chip, f"data sheet: {chip.memory_bytes / 2**30:.0f} GiB",
                       f"{chip.memory_per_device / 2**30:.0f} GiB")
