"""FLOPs per step and MFU: a table of known accelerator peaks, or a measured matmul peak on CPU.

MFU = (analytic model FLOPs per step / median step time) / (peak FLOP/s per device x devices).
A device that is neither in the table nor a CPU gets no MFU rather than an invented one; on a CPU the
peak is the host's measured one, shared by every run (`shardbench.measure.peak`).
"""

from __future__ import annotations

from typing import Any

import jax

from shardbench.hardware import chip_for_kind
from shardbench.measure.peak import HostPeak

def compute_class(dtype: str, matmul_precision: str) -> str:
    if dtype in ("bfloat16", "float16"):
        return "bf16"
    # float32: NVIDIA GPUs run default-precision float32 matmuls as TF32, TPUs as bfloat16 passes.
    return "f32" if matmul_precision == "highest" else "tf32"


def table_peak(device_kind: str, dtype: str, matmul_precision: str) -> tuple[float, str] | None:
    """(dense peak FLOP/s per chip, its source) from the data-sheet table (`shardbench.hardware`)."""
    chip = chip_for_kind(device_kind)
    if chip is None:
        return None
    cls = compute_class(dtype, matmul_precision)
    return chip.peaks[cls], f"table: {chip.name} {cls} ({chip.source})"


def peak_per_device(device: jax.Device, devices: int, dtype: str, matmul_precision: str,
                    host: HostPeak | None = None) -> tuple[float | None, str | None]:
    """(peak FLOP/s per device, where it came from), or (None, None) for an unknown accelerator. On the CPU
    the host's measured matmul peak (`host`, see `shardbench.measure.peak`) is split among the simulated
    devices, which share the host's cores."""
    if device.platform == "cpu":
        if host is None:
            return None, None
        return host.flops_per_s / devices, (f"host {dtype} matmul peak {host.flops_per_s / 1e9:.1f} GFLOP/s "
                                             f"measured {host.measured_at}, split over {devices} device(s)")
    found = table_peak(getattr(device, "device_kind", ""), dtype, matmul_precision)
    return (found[0], found[1]) if found else (None, None)


def xla_cost(compiled: Any, key: str = "flops") -> float | None:
    """One figure of XLA's cost analysis of one call of the compiled per-device program: "flops" or
    "bytes accessed" (memory traffic). A loop body counts once, however often it runs."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    value = (cost or {}).get(key)
    return float(value) if value else None


def xla_flops(compiled: Any) -> float | None:
    """FLOPs of one call of the compiled per-device program, from XLA's cost analysis."""
    return xla_cost(compiled, "flops")


def mfu(flops_per_step: float, step_time_s: float | None, peak: float | None, devices: int) -> float | None:
    if not step_time_s or not peak:
        return None
    return flops_per_step / step_time_s / (peak * devices)
