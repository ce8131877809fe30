"""From what the compiler says about a candidate to what it will cost on the target: memory per device and
whether it fits, communication per link, and a step time (`shardbench.plan.steptime`).

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

from shardbench.hardware import LINK_NAMES
from shardbench.measure.comms import sent_fraction
from shardbench.measure.memory import breakdown
from shardbench.plan.steptime import LOW_PRECISION, Coefficients, StepFeatures, step_time

# Bytes each device sends for a collective whose per-device payload is S, over a group of n (ring algorithms):
# `sent_fraction` (shardbench.measure.comms, which the run record's sent bytes use too). A compiled candidate's
# collectives carry their bytes sent themselves (`sent`: the fullest device's; `sent_all`: every device's
# together), since a collective-permute is sent by its source devices alone; `collective_sent` falls back on the
# fraction for a result written before they were kept.

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
    link_names: tuple[str, str] = ()  # what the links inside a node and across nodes are called; () = the platform's

    def link_name(self, link: str) -> str:
        """What `link` ("intra" or "inter") is called here: the chip's own name for it, else its platform's."""
        return (self.link_names or LINK_NAMES[self.platform])[("intra", "inter").index(link)]


@dataclass
class Prediction:
    """One candidate's predicted figures (bytes per device, seconds per step) and their sources."""

    params_bytes: int
    optimizer_bytes: int
    gradients_bytes: int
    activations_bytes: float
    other_bytes: int  # the batch, unaliased outputs and a model of your own's other variables
    runtime_bytes: float  # what the target's runtime holds beyond the compiled program
    total_bytes: float
    memory_bytes: float  # usable per device
    fits: bool
    comm_bytes: dict[str, int]  # link -> bytes the fullest device sends on it per step (a ring's share)
    compute_s: float  # matmuls and memory traffic together (`StepTime.compute_s`)
    bound: str  # which: "compute" or "memory"
    kernels_s: float  # kernel launches and the step's fixed cost
    comm_s: dict[str, float]  # link -> seconds per step, before overlap
    exposed_comm_s: float
    step_s: float
    breakdown_s: dict[str, float]  # `shardbench.plan.steptime.StepTime.parts`: adds up to step_s
    flops_per_step: float
    examples_per_s: float
    mfu: float
    overlap: float
    compiler: str  # which compiler compiled the step: "gpu compiler (NVIDIA H100 80GB HBM3)", "cpu compiler"
    bubble: float = 0.0  # a pipeline's idle fraction by its schedule's formula, in step_s; 0 without stages
    stage_bytes: dict[str, int] = field(default_factory=dict)  # link -> stage-to-stage bytes sent per step (fullest)
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


@dataclass(frozen=True)
class PredictedMemory:
    """One device's predicted bytes: a run's breakdown (`shardbench.measure.memory.breakdown`) with the
    activations scaled where another compiler's temporaries stand in for the target's, and what the target's
    runtime holds beyond the program."""

    params_bytes: int
    optimizer_bytes: int
    model_state_bytes: int
    gradients_bytes: int
    activations_bytes: float
    other_bytes: int
    runtime_bytes: float

    @property
    def total_bytes(self) -> float:
        return (self.params_bytes + self.optimizer_bytes + self.model_state_bytes + self.gradients_bytes
                + self.activations_bytes + self.other_bytes + self.runtime_bytes)


def memory(result: dict[str, Any], activation_scale: float, runtime_bytes: float = 0.0) -> PredictedMemory:
    """One device's bytes (`shardbench.measure.memory.breakdown`, the breakdown a run records): the state is
    exact, the activations alone are scaled when another compiler's temporaries are borrowed, and
    `runtime_bytes` is what the target's runtime holds beyond the program."""
    state = result["state"]
    compiled = result["compiled"] or {"argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": 0}
    b = breakdown(compiled, state["params_bytes"], state["optimizer_bytes"], state.get("model_state_bytes", 0),
                  state.get("gradients_bytes", state["params_bytes"]))
    return PredictedMemory(b.params_bytes, b.optimizer_bytes, b.model_state_bytes, b.gradients_bytes,
                           b.activations_temporaries_bytes * activation_scale, b.other_bytes, runtime_bytes)


def step_features(result: dict[str, Any], hw: Hardware, remat: str, dtype: str) -> StepFeatures:
    """The step-time model's terms at unit coefficients (`shardbench.plan.steptime`): matmul seconds at the
    peak, memory-traffic seconds at the bandwidth, kernels launched, collectives run, and seconds on each
    link at its bandwidth; 16-bit compute is flagged where another platform's compiler counted the traffic."""
    devices = result["devices"]
    flops = result["flops"]["analytic_per_step"]
    if flops is not None:  # the matmuls by formula, which leave out what the remat policy recomputes
        per_device = flops / devices * REMAT_FLOPS.get(remat, 1.0)
    else:  # XLA's count of the compiled program (a model of your own): its recomputation is in it already
        per_device = result["flops"]["xla_per_device"] or 0.0
    # A pipeline's stage computes its useful matmuls times the schedule's program work: GPipe's 1/(1 - b) (b the
    # bubble by the schedule's formula; its idle stages compute on placeholders in one SPMD program), circular's
    # and 1F1B's recomputation and 1F1B's both passes per tick besides (`parallel.pipeline.stack_work`). The
    # compiled step's traffic and kernels already count every iteration of the schedule's loop.
    per_device *= pipeline_work(result)
    # Simulated CPU devices take turns on the host's cores and share its memory bus: their kernels, traffic and
    # collectives add up (the peak is already split between them).
    share = devices if hw.shared_host else 1
    collectives = 0.0
    links = {"intra": 0.0, "inter": 0.0}
    for c in result["collectives"]:
        collectives += c["count"] * share
        sent = collective_sent(c, devices) if hw.shared_host else collective_sent(c)
        links[c["link"]] += sent / hw.bandwidth.get(c["link"], float("inf"))
    return StepFeatures(compute_s=per_device / hw.peak_flops,
                        traffic_s=(result.get("bytes_accessed") or 0.0) * share / hw.memory_bandwidth,
                        kernels=float(result["kernels"] * share), collectives=collectives, link_s=links,
                        low_precision=dtype in LOW_PRECISION and result["platform"] != hw.platform)


def collective_sent(c: dict[str, Any], devices: int | None = None) -> float:
    """Bytes per step one entry of a compiled candidate's collectives sends: its fullest device's, or with
    `devices` every device's together (simulated devices sharing a host, whose copies add up). A result written
    before bytes sent were kept: the payload x `sent_fraction` on every device (a collective-permute's whole
    buffer, which overcounts a permute that only some devices send)."""
    key = "sent" if devices is None else "sent_all"
    if key in c:
        return float(c[key])
    return c["bytes"] * sent_fraction(c["kind"], int(c["group"])) * (devices or 1)


def pipeline_work(result: dict[str, Any]) -> float:
    """What a compiled pipeline's program computes over its useful work (1 without stages; a plan written
    before the figure was kept: 1/(1 - the bubble))."""
    pipeline = result.get("pipeline") or {}
    return float(pipeline.get("work") or 1.0 / (1.0 - pipeline_bubble(result)))


def pipeline_bubble(result: dict[str, Any]) -> float:
    """The schedule's idle fraction of a compiled pipeline (0 without stages)."""
    return float((result.get("pipeline") or {}).get("bubble") or 0.0)


def compiler_name(result: dict[str, Any]) -> str:
    """The compiler that compiled a candidate, as every prediction names it: "gpu compiler (NVIDIA H100 ...)"."""
    kind = result.get("device_kind") or result["platform"]
    return f"{result['platform']} compiler" + (f" ({kind})" if kind != result["platform"] else "")


def predict(result: dict[str, Any], hw: Hardware, coeff: Coefficients, *, batch: int, remat: str, dtype: str,
            activation_scale: float, activation_source: str, runtime_bytes: float = 0.0) -> Prediction:
    mem = memory(result, activation_scale, runtime_bytes)
    f = step_features(result, hw, remat, dtype)
    t = step_time(f, coeff)
    step = t.total_s
    # What the run's MFU divides: the model's count, the one-device count of a model of your own without one (the
    # same for every layout), else the compiled program's x devices.
    flops = (result["flops"]["analytic_per_step"] or result["flops"].get("traced_per_step")
             or (result["flops"]["xla_per_device"] or 0.0) * result["devices"])
    comm_bytes: dict[str, int] = {}
    stage_bytes: dict[str, int] = {}
    for c in result["collectives"]:
        # what the fullest device sends on the link, as the step time counts it and the run record's comms
        comm_bytes[c["link"]] = comm_bytes.get(c["link"], 0) + round(collective_sent(c))
        if c.get("stage"):  # what the fullest device sends between stages, as the record's pipeline_transfers
            stage_bytes[c["link"]] = stage_bytes.get(c["link"], 0) + round(collective_sent(c))
    staged = result.get("pipeline")
    compiler = compiler_name(result)
    on_paper = ("data sheet, not measured: no multi-GPU run has checked it" if hw.platform == "gpu"
                and comm_bytes else "")
    return Prediction(
        params_bytes=mem.params_bytes, optimizer_bytes=mem.optimizer_bytes, gradients_bytes=mem.gradients_bytes,
        activations_bytes=mem.activations_bytes, other_bytes=mem.other_bytes + mem.model_state_bytes,
        runtime_bytes=mem.runtime_bytes, total_bytes=mem.total_bytes, memory_bytes=hw.memory_bytes,
        fits=mem.total_bytes <= hw.memory_bytes, comm_bytes=comm_bytes, compute_s=t.compute_s, bound=t.bound,
        kernels_s=t.kernels_s + t.fixed_s, comm_s={k: v for k, v in f.link_s.items() if v > 0},
        exposed_comm_s=t.exposed_comm_s, step_s=step, breakdown_s=t.parts(), flops_per_step=flops,
        examples_per_s=batch / step if step > 0 else 0.0,
        mfu=flops / step / (hw.peak_flops * result["devices"]) if step > 0 else 0.0, overlap=coeff.overlap,
        compiler=compiler, bubble=pipeline_bubble(result), stage_bytes=stage_bytes,
        sources={
            "compiler": compiler,
            "state": f"exact: the compiled step's sharded state ({compiler})",
            "collectives": f"exact: every collective of the compiled step ({compiler}), placed {hw.name}",
            "activations": activation_source,
            "runtime": (f"{runtime_bytes / 2**20:.1f} MiB the runtime holds beyond the program ({activation_source})"
                        if runtime_bytes else "none added"),
            "memory": hw.memory_source,
            "compute": f"{hw.peak_source} at {coeff.efficiency:.0%}; XLA's bytes accessed ({compiler}) at "
                       f"{coeff.memory_efficiency:.0%} of {hw.memory_bandwidth_source} ({coeff.source})",
            "kernels": f"{coeff.kernel_s * 1e6:.1f} us per kernel, {coeff.fixed_s * 1e3:.2f} ms per step "
                       f"({coeff.source})",
            "communication": f"{hw.bandwidth_source}; {coeff.collective_s * 1e6:.1f} us per collective, "
                             f"{coeff.overlap:.0%} overlapped with compute ({coeff.source})"
                             + (f"; {on_paper}" if on_paper else ""),
            **({"pipeline": f"{staged['stages']} stages, {staged['microbatches']} microbatches, "
                            f"{staged['schedule']}: the schedule's bubble {staged['bubble']:.1%} by its formula "
                            f"stretches the matmuls by 1/(1 - bubble); stage-to-stage transfers: the compiled "
                            f"step's permutes along the stage axis alone, on the link each crosses"}
               if staged else {}),
        })
