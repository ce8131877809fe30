"""FLOPs per step and MFU: a table of known accelerator peaks, or a measured matmul peak on CPU.

MFU = (analytic model FLOPs per step / median step time) / (peak FLOP/s per device x devices).
A device that is neither in the table nor a CPU gets no MFU rather than an invented one; on a CPU the
peak is the host's measured one, shared by every run (`shardbench.measure.peak`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardbench.hardware import chip_for_kind
from shardbench.measure.peak import HostPeak

if TYPE_CHECKING:
    import jax

def compute_class(dtype: str, matmul_precision: str, tpu: bool = False) -> str:
    """The data sheet's peak a matmul in `dtype` at `matmul_precision` runs at. float32 at default precision:
    TF32 on NVIDIA GPUs, one bfloat16 pass on TPUs (the "tf32" class, which TPU chips give at the bf16 rate);
    at "high": still TF32 on NVIDIA, but three bfloat16 passes on TPUs ("bf16x3", a third of the bf16 rate);
    at "highest": full float32 (six bfloat16 passes on TPUs)."""
    if dtype in ("bfloat16", "float16"):
        return "bf16"
    if matmul_precision == "highest":
        return "f32"
    return "bf16x3" if tpu and matmul_precision == "high" else "tf32"


def table_peak(device_kind: str, dtype: str, matmul_precision: str) -> tuple[float, str] | None:
    """(dense peak FLOP/s per JAX device, its source) from the data-sheet table (`shardbench.hardware`): the
    chip's peak, over its devices where a chip is several (TPU v2 and v3: one per TensorCore)."""
    chip = chip_for_kind(device_kind)
    if chip is None:
        return None
    cls = compute_class(dtype, matmul_precision, tpu=chip.platform == "tpu")
    per = f", over its {chip.devices_per_chip} devices" if chip.devices_per_chip > 1 else ""
    return chip.peak_per_device(cls), f"table: {chip.name} {cls} ({chip.source}){per}"


def host_count(per_process: list[dict[str, Any]]) -> int:
    """Distinct hosts among a run's processes (their `host` names; two processes on one machine share it)."""
    return max(1, len({p.get("host") for p in per_process if p.get("host")}))


def peak_per_device(device: jax.Device, devices: int, dtype: str, matmul_precision: str,
                    host: HostPeak | None = None, hosts: int = 1) -> tuple[float | None, str | None]:
    """(peak FLOP/s per device, where it came from), or (None, None) for an unknown accelerator. On the CPU
    the host's measured matmul peak (`host`, see `shardbench.measure.peak`) is split among the simulated
    devices on it, which share its cores: the run's `devices` spread over `hosts` machines have `hosts` times
    that peak between them (every host taken as fast as the one that measured it)."""
    if device.platform == "cpu":
        if host is None:
            return None, None
        over = f" x {hosts} hosts" if hosts > 1 else ""
        return host.flops_per_s * hosts / devices, (f"host {dtype} matmul peak {host.flops_per_s / 1e9:.1f} "
                                                    f"GFLOP/s measured {host.measured_at}{over}, split over "
                                                    f"{devices} device(s)")
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
