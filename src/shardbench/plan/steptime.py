"""The step-time model, in one place: its typed inputs, its coefficients, and the one function that turns
them into seconds per step with their breakdown. The prediction, the fit (`shardbench.plan.calibration`), the
printed assumptions and docs/planning.md all go through `step_time`.

    matmuls  = compute / efficiency
    traffic  = memory traffic x (low_precision_traffic if 16-bit on a borrowed compiler) / memory_efficiency
    core     = max(matmuls, traffic) + (1 - compute_memory_overlap) x min(matmuls, traffic)
    step     = core + kernels x kernel_s + fixed_s
               + (1 - overlap) x (collectives x collective_s + link seconds)

- `compute`: the step's matmul FLOPs per device at the peak; `memory traffic`: the compiled step's bytes read
  and written at the memory bandwidth. `compute_memory_overlap` 1 is a roofline (the slower of the two), 0 a
  sum (they take turns).
- `low_precision_traffic`: the CPU compiler runs 16-bit element-wise work in float32, so the bytes it counts
  for a bfloat16 step overstate what a GPU moves; this is the fraction a GPU really moves, relative to float32.
- `kernels x kernel_s + fixed_s`: launching kernels and a step's own cost (dispatch, the host's share), which a
  small step is made of.
- Communication: each collective's fixed cost and its bytes at each link's bandwidth, `overlap` of it hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The formula in one line, as plans print it and docs/planning.md quotes it.
FORMULA = ("step = max(matmuls, traffic) + (1 - compute/traffic overlap) x min(matmuls, traffic) + kernels x "
           "per-kernel cost + per-step cost + (1 - overlap) x (collectives x per-collective cost + link bytes / "
           "link bandwidth)")
LOW_PRECISION = ("bfloat16", "float16")  # compute dtypes whose traffic `low_precision_traffic` scales


@dataclass(frozen=True)
class Coefficients:
    """What turns the features into seconds, per platform; `source` says what they were fitted to."""

    efficiency: float  # fraction of the peak FLOP/s the matmul work reaches
    memory_efficiency: float  # fraction of the memory bandwidth the counted traffic reaches
    kernel_s: float  # seconds per kernel (per device program)
    collective_s: float  # seconds per collective, besides its bytes
    fixed_s: float  # seconds per step whatever it holds (dispatch, the host's share)
    overlap: float  # fraction of communication hidden behind compute
    source: str
    compute_memory_overlap: float = 1.0  # 1: the slower of matmuls and traffic; 0: their sum
    low_precision_traffic: float = 1.0  # bytes a 16-bit step moves per byte the CPU compiler counted for it

    def describe(self) -> str:
        return (f"matmuls at {self.efficiency:.1%} of the peak, memory traffic at {self.memory_efficiency:.1%} of "
                f"the bandwidth (16-bit steps: x {self.low_precision_traffic:.2f} of the counted bytes), "
                f"{self.compute_memory_overlap:.0%} of the shorter of the two hidden behind the longer, "
                f"{self.kernel_s * 1e6:.2f} us per kernel, {self.fixed_s * 1e3:.2f} ms per step, "
                f"{self.collective_s * 1e6:.2f} us per collective, {self.overlap:.0%} overlap ({self.source})")


@dataclass(frozen=True)
class StepFeatures:
    """One compiled step's terms at unit coefficients, per device (`shardbench.plan.predict.step_features`)."""

    compute_s: float  # matmul FLOPs at the peak
    traffic_s: float  # bytes read and written at the memory bandwidth, as the compiling compiler counted them
    kernels: float  # kernels launched
    collectives: float  # collectives run
    link_s: dict[str, float]  # link ("intra", "inter") -> payload seconds at its bandwidth
    low_precision: bool = False  # 16-bit compute whose traffic another platform's compiler (the CPU's) counted


@dataclass(frozen=True)
class StepTime:
    """Seconds per step and what they are made of: `parts()` adds up to `total_s`."""

    matmul_s: float  # compute / efficiency
    traffic_s: float  # the step's memory traffic at the reached bandwidth
    compute_s: float  # matmuls and traffic together (the core)
    kernels_s: float  # kernels x kernel_s
    fixed_s: float
    collectives_s: float  # exposed: (1 - overlap) x collectives x collective_s
    links_s: dict[str, float]  # exposed: (1 - overlap) x each link's payload seconds
    total_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.matmul_s >= self.traffic_s else "memory"

    @property
    def exposed_comm_s(self) -> float:
        return self.collectives_s + sum(self.links_s.values())

    def parts(self) -> dict[str, float]:
        return {"compute": self.compute_s, "kernels": self.kernels_s, "fixed": self.fixed_s,
                "collectives": self.collectives_s, **{f"link {k}": v for k, v in self.links_s.items()}}


def step_time(f: StepFeatures, c: Coefficients) -> StepTime:
    """The model (see the module docstring): seconds per step for features `f` under coefficients `c`."""
    matmuls = f.compute_s / c.efficiency
    traffic = f.traffic_s * (c.low_precision_traffic if f.low_precision else 1.0) / c.memory_efficiency
    core = max(matmuls, traffic) + (1.0 - c.compute_memory_overlap) * min(matmuls, traffic)
    hidden = 1.0 - c.overlap
    total = (core + f.kernels * c.kernel_s + c.fixed_s
             + hidden * (f.collectives * c.collective_s + sum(f.link_s.values())))
    return StepTime(matmul_s=matmuls, traffic_s=traffic, compute_s=core, kernels_s=f.kernels * c.kernel_s,
                    fixed_s=c.fixed_s, collectives_s=hidden * f.collectives * c.collective_s,
                    links_s={k: hidden * v for k, v in f.link_s.items() if v > 0}, total_s=total)


LINEAR = ("kernel_s", "collective_s", "fixed_s")  # the coefficients the step time is linear in


def linear_split(f: StepFeatures, c: Coefficients) -> tuple[float, list[float]]:
    """(the step time with the `LINEAR` coefficients at 0, its derivative by each of them), both from
    `step_time` itself, so a fit solves for exactly the formula the prediction uses."""
    zero = replace(c, **{name: 0.0 for name in LINEAR})
    base = step_time(f, zero).total_s
    return base, [step_time(f, replace(zero, **{name: 1.0})).total_s - base for name in LINEAR]
