"""From what the compiler says about a candidate to what it will cost on the target: memory per device and
whether it fits, communication per link, and a step time = compute + kernel overhead + exposed communication.

Every figure carries its source:
- the sharded state (parameters, optimizer state, gradients) and every collective's bytes and device groups
  are exact: they are the compiled program's, whatever compiler compiled it;
- temporaries (activations) are the target compiler's own where it compiled them (a TPU through libtpu, a
  GPU host for its own GPUs, the CPU for `cpu`); otherwise the CPU compiler's, scaled by the calibration's
  activation ratio for the target's platform, never passed off as the target's own;
- time comes from the data sheet (peak FLOP/s, link bandwidth) or this host's measurements (`cpu`), times
  efficiencies and per-kernel and per-collective costs fitted to measured runs (`shardbench.plan.calibration`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardbench.plan.calibration import Coefficients

# Bytes each device sends for a collective whose per-device payload is S, over a group of n (ring algorithms):
# all-reduce 2(n-1)/n S (reduce-scatter then all-gather), all-gather and reduce-scatter (n-1)/n S, all-to-all
# (n-1)/n S, a collective-permute S.
def sent_fraction(kind: str, n: int) -> float:
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2.0 * (n - 1) / n
    if kind == "collective-permute":
        return 1.0
    return (n - 1) / n


# FLOPs a remat policy adds to the analytic (matmul) count: full recomputes each block's forward (x 4/3 of
# forward + backward); block keeps matmul outputs and recomputes element-wise work, which the count leaves out.
REMAT_FLOPS = {"none": 1.0, "block": 1.0, "full": 4.0 / 3.0}


@dataclass(frozen=True)
class Hardware:
    """What the time and memory model needs of the target, per device, with where each number comes from."""

    name: str
    platform: str  # cpu, gpu, tpu
    peak_flops: float  # FLOP/s per device in the candidate's compute class
    peak_source: str
    memory_bytes: float  # usable bytes per device
    memory_source: str
    bandwidth: dict[str, float]  # link ("intra", "inter") -> bytes/s per device per direction
    bandwidth_source: str
    memory_bandwidth: float  # bytes/s per device (the host's, shared, on a CPU)
    memory_bandwidth_source: str
    shared_host: bool = False  # cpu: every simulated device shares the host's cores and memory bus


@dataclass
class Prediction:
    """One candidate's predicted figures (bytes per device, seconds per step) and their sources."""

    params_bytes: int
    optimizer_bytes: int
    gradients_bytes: int
    activations_bytes: float
    other_bytes: int
    total_bytes: float
    memory_bytes: float  # usable per device
    fits: bool
    comm_bytes: dict[str, int]  # link -> bytes per device per step (payload)
    compute_s: float  # the slower of matmuls and memory traffic
    bound: str  # which: "compute" or "memory"
    kernels_s: float  # kernel launches and the step's fixed cost
    comm_s: dict[str, float]  # link -> seconds per step, before overlap
    exposed_comm_s: float
    step_s: float
    flops_per_step: float
    examples_per_s: float
    mfu: float
    overlap: float
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def headroom(self) -> float:
        return 1.0 - self.total_bytes / self.memory_bytes

    @property
    def comm_share(self) -> float:
        """The fraction of the step spent communicating and not overlapped (bytes and per-collective cost)."""
        return self.exposed_comm_s / self.step_s if self.step_s else 0.0

    @property
    def main_link(self) -> str | None:
        """The link that carries the most bytes per step (None: no communication)."""
        return max(self.comm_bytes, key=lambda k: self.comm_bytes[k]) if self.comm_bytes else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headroom": self.headroom}


def memory(result: dict[str, Any], activation_scale: float) -> tuple[int, int, int, float, int, float]:
    """(params, optimizer, gradients, activations, other, total) bytes per device. The compiled total is
    arguments + outputs - aliased + temporaries; temporaries hold the gradients (exact: laid out like the
    parameters) and the activations, which alone are scaled when another compiler's are borrowed."""
    state, compiled = result["state"], result["compiled"] or {}
    params, opt, grads = state["params_bytes"], state["optimizer_bytes"], state["gradients_bytes"]
    temp = compiled.get("temp_bytes", 0)
    total = (compiled.get("argument_bytes", 0) + compiled.get("output_bytes", 0) - compiled.get("alias_bytes", 0)
             + temp)
    activations = max(temp - grads, 0)
    other = max(total - temp - params - opt, 0)
    scaled = activations * activation_scale
    return params, opt, grads, scaled, other, params + opt + grads + scaled + other


def step_features(result: dict[str, Any], hw: Hardware, remat: str) -> dict[str, float]:
    """The step-time model's terms at unit coefficients (`shardbench.plan.calibration`): matmul seconds at the
    peak, memory-traffic seconds at the bandwidth, kernels launched, collectives run, and seconds on each
    link at its bandwidth."""
    devices = result["devices"]
    flops = result["flops"]["analytic_per_step"]
    per_device = (flops / devices if flops is not None else (result["flops"]["xla_per_device"] or 0.0))
    per_device *= REMAT_FLOPS.get(remat, 1.0)
    # Simulated CPU devices take turns on the host's cores and share its memory bus: their kernels, traffic and
    # collectives add up (the peak is already split between them).
    share = devices if hw.shared_host else 1
    features = {"compute": per_device / hw.peak_flops,
                "traffic": (result.get("bytes_accessed") or 0.0) * share / hw.memory_bandwidth,
                "kernels": float(result["kernels"] * share), "collectives": 0.0, "link_intra": 0.0,
                "link_inter": 0.0}
    for c in result["collectives"]:
        features["collectives"] += c["count"] * share
        sent = c["bytes"] * sent_fraction(c["kind"], int(c["group"])) * share
        features[f"link_{c['link']}"] += sent / hw.bandwidth.get(c["link"], float("inf"))
    return features


def predict(result: dict[str, Any], hw: Hardware, coeff: Coefficients, *, batch: int, remat: str,
            activation_scale: float, activation_source: str) -> Prediction:
    params, opt, grads, acts, other, total = memory(result, activation_scale)
    f = step_features(result, hw, remat)
    matmuls, traffic = f["compute"] / coeff.efficiency, f["traffic"] / coeff.memory_efficiency
    kernels_s = f["kernels"] * coeff.kernel_s + coeff.fixed_s
    comm_s = {link: f[f"link_{link}"] for link in ("intra", "inter") if f[f"link_{link}"] > 0}
    exposed = (1.0 - coeff.overlap) * (sum(comm_s.values()) + f["collectives"] * coeff.collective_s)
    step = coeff.step(f)
    flops = (result["flops"]["analytic_per_step"] or (result["flops"]["xla_per_device"] or 0.0) * result["devices"])
    comm_bytes: dict[str, int] = {}
    for c in result["collectives"]:
        comm_bytes[c["link"]] = comm_bytes.get(c["link"], 0) + int(c["bytes"])
    compiler = f"{result['platform']} compiler"
    return Prediction(
        params_bytes=params, optimizer_bytes=opt, gradients_bytes=grads, activations_bytes=acts, other_bytes=other,
        total_bytes=total, memory_bytes=hw.memory_bytes, fits=total <= hw.memory_bytes, comm_bytes=comm_bytes,
        compute_s=max(matmuls, traffic), bound="compute" if matmuls >= traffic else "memory", kernels_s=kernels_s,
        comm_s=comm_s, exposed_comm_s=exposed, step_s=step, flops_per_step=flops,
        examples_per_s=batch / step if step > 0 else 0.0,
        mfu=flops / step / (hw.peak_flops * result["devices"]) if step > 0 else 0.0, overlap=coeff.overlap,
        sources={
            "state": f"exact: the compiled step's sharded state ({compiler})",
            "collectives": f"exact: every collective of the compiled step ({compiler}), placed {hw.name}",
            "activations": activation_source,
            "memory": hw.memory_source,
            "compute": f"{hw.peak_source} at {coeff.efficiency:.0%}; XLA's bytes accessed ({compiler}) at "
                       f"{coeff.memory_efficiency:.0%} of {hw.memory_bandwidth_source} ({coeff.source})",
            "kernels": f"{coeff.kernel_s * 1e6:.1f} us per kernel, {coeff.fixed_s * 1e3:.1f} ms per step "
                       f"({coeff.source})",
            "communication": f"{hw.bandwidth_source}; {coeff.collective_s * 1e6:.1f} us per collective, "
                             f"{coeff.overlap:.0%} overlapped with compute ({coeff.source})",
        })
