"""FLOPs per step and MFU: a table of known accelerator peaks, or a measured matmul peak on CPU.

MFU = (analytic model FLOPs per step / median step time) / (peak FLOP/s per device x devices).
A device that is neither in the table nor a CPU gets no MFU rather than an invented one; on a CPU the
peak is the host's measured one, shared by every run (`shardbench.measure.peak`).
"""

from __future__ import annotations

from typing import Any

import jax

from shardbench.measure.peak import HostPeak

# Dense peak FLOP/s per chip from the vendors' data sheets (no structured sparsity).
# Keys: (substring of device_kind, lower-case), then compute class: "bf16" (bfloat16/float16),
# "tf32" (float32 matmuls at default precision on NVIDIA), "f32" (float32 at highest precision).
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("h200", {"bf16": 989e12, "tf32": 494e12, "f32": 67e12}),
    ("h100 pcie", {"bf16": 756e12, "tf32": 378e12, "f32": 51e12}),
    ("h100", {"bf16": 989e12, "tf32": 494e12, "f32": 67e12}),
    ("b200", {"bf16": 2250e12, "tf32": 1100e12, "f32": 75e12}),
    ("a100", {"bf16": 312e12, "tf32": 156e12, "f32": 19.5e12}),
    ("l4", {"bf16": 121e12, "tf32": 60e12, "f32": 30e12}),
    ("v100", {"bf16": 125e12, "tf32": 15.7e12, "f32": 15.7e12}),
    ("tpu v6 lite", {"bf16": 918e12, "tf32": 918e12, "f32": 918e12 / 6}),
    ("tpu v5 lite", {"bf16": 197e12, "tf32": 197e12, "f32": 197e12 / 6}),
    ("tpu v5p", {"bf16": 459e12, "tf32": 459e12, "f32": 459e12 / 6}),
    ("tpu v5", {"bf16": 459e12, "tf32": 459e12, "f32": 459e12 / 6}),
    ("tpu v4", {"bf16": 275e12, "tf32": 275e12, "f32": 275e12 / 6}),
    ("tpu v3", {"bf16": 123e12, "tf32": 123e12, "f32": 123e12 / 6}),
    ("tpu v2", {"bf16": 45e12, "tf32": 45e12, "f32": 45e12 / 6}),
)


def compute_class(dtype: str, matmul_precision: str) -> str:
    if dtype in ("bfloat16", "float16"):
        return "bf16"
    # float32: NVIDIA GPUs run default-precision float32 matmuls as TF32, TPUs as bfloat16 passes.
    return "f32" if matmul_precision == "highest" else "tf32"


def table_peak(device_kind: str, dtype: str, matmul_precision: str) -> tuple[float, str] | None:
    kind = device_kind.lower()
    cls = compute_class(dtype, matmul_precision)
    for needle, peaks in PEAKS:
        if needle in kind:
            return peaks[cls], f"table: {needle} {cls}"
    return None


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


def xla_flops(compiled: Any) -> float | None:
    """FLOPs of one call of the compiled per-device program, from XLA's cost analysis."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    value = (cost or {}).get("flops")
    return float(value) if value else None


def mfu(flops_per_step: float, step_time_s: float | None, peak: float | None, devices: int) -> float | None:
    if not step_time_s or not peak:
        return None
    return flops_per_step / step_time_s / (peak * devices)
