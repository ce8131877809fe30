"""The layouts a plan considers: every strategy on every mesh factorisation of the target's devices that the
strategy can use, at the given global batch, for each remat policy, dtype and number of accumulated
microbatches asked for; on one device, where strategies differ only in name, one candidate per layout
(`one_per_layout`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.fields import list_refusal
from shardbench.parallel.mesh import EXPERT, MeshShape, parse_mesh
from shardbench.parallel.strategies import STRATEGIES, batch_shards


@dataclass(frozen=True)
class Candidate:
    strategy: str
    mesh: str  # 'none' or the mesh as --mesh takes it ('4x2')
    remat: str
    dtype: str
    grad_accum: int = 1  # microbatches per update (--train.grad-accum)
    microbatches: int = 0  # a pipeline's microbatches (--parallel.microbatches); 0 without stages
    schedule: str = ""  # a pipeline's schedule (--parallel.schedule); '' without stages

    @property
    def name(self) -> str:
        accum = f" accum={self.grad_accum}" if self.grad_accum > 1 else ""
        piped = f" M={self.microbatches} {self.schedule}" if self.microbatches else ""
        return f"{self.strategy} {self.mesh}{piped} remat={self.remat} {self.dtype}{accum}"


# Which mesh axes each strategy may give more than one device, from the strategies' own table.
USES: dict[str, tuple[str, ...]] = {name: strategy.axes for name, strategy in STRATEGIES.items()}
# What a plan considers unless --candidates names others: every strategy but the pipelines, each of which
# multiplies into stages x microbatches x schedules (a compile each), so they are planned when named, and but the
# expert-parallel ones, which a plan adds for a model with experts (`default_strategies`), and context parallelism,
# which only a model with attention runs (the mlp is refused): planned when named.
DEFAULT: tuple[str, ...] = tuple(name for name, axes in USES.items()
                                 if "stage" not in axes and EXPERT not in axes and "seq" not in axes)
EXPERT_PARALLEL: tuple[str, ...] = tuple(name for name, axes in USES.items() if EXPERT in axes)


def default_strategies(cfg: config_lib.Config) -> list[str]:
    """The strategies a plan of `cfg` considers unless told: DEFAULT, and with experts the ep strategies too."""
    return [*DEFAULT, *(EXPERT_PARALLEL if cfg.model.num_experts and not cfg.model.factory else ())]
PER_STAGE: tuple[int, ...] = (1, 4)  # microbatches per stage a pipeline candidate takes: M = S and M = 4S


def factorisations(devices: int, parts: int = 2) -> list[tuple[int, ...]]:
    """Every way to write `devices` as an ordered product of `parts` sizes ((data, model) for two)."""
    if parts == 1:
        return [(devices,)]
    return [(d, *rest) for d in range(1, devices + 1) if devices % d == 0
            for rest in factorisations(devices // d, parts - 1)]


def meshes(devices: int, axes: tuple[str, ...]) -> list[MeshShape]:
    """The meshes of `devices` that split every one of `axes` (a strategy over several axes on a mesh that
    leaves one of them whole is the strategy of fewer axes) and no other axis."""
    if len(axes) == 1:
        return [MeshShape.of(**{axes[0]: devices})]
    return [MeshShape.of(**dict(zip(axes, sizes))) for sizes in factorisations(devices, len(axes))
            if min(sizes) > 1]


def candidates(devices: int, batch: int, strategies: list[str], remats: list[str], dtypes: list[str],
               accums: Sequence[int] = (1,), per_stage: Sequence[int] = PER_STAGE,
               schedules: Sequence[str] = config_lib.PIPELINE_SCHEDULES) -> list[Candidate]:
    """Every candidate: each layout (strategy x mesh) whose data-parallel size divides `batch`, x every remat,
    dtype and number of microbatches K in `accums` that divides the layout's examples per data shard (as
    `shardbench train` requires); a layout with S pipeline stages also x every pipeline microbatch count
    M = k x S (k in `per_stage`) that divides each accumulated microbatch's examples per data shard, x every
    schedule. A one-line ConfigError when no mesh uses `devices`, no layout divides `batch`, or a K divides no
    layout's share."""
    refusal = list_refusal("--candidates", strategies, choices=tuple(USES))
    if refusal:
        raise ConfigError(refusal)
    layouts: list[tuple[str, str, int]] = []  # (strategy, mesh, data-parallel size)
    for strategy in strategies:
        if strategy == "single":
            if devices == 1:
                layouts.append((strategy, "none", 1))
            continue
        layouts += [(strategy, str(shape), batch_shards(STRATEGIES[strategy], shape))
                    for shape in meshes(devices, USES[strategy])]
    if not layouts:
        raise ConfigError(f"no candidate mesh uses {devices} devices with strategies {', '.join(strategies)}")
    fitting = [(s, m, batch // data) for s, m, data in layouts if batch % data == 0]
    if not fitting:
        sizes = sorted({data for _, _, data in layouts})
        raise ConfigError(f"--batch-size {batch} is divisible by no candidate's data-parallel size "
                          f"({', '.join(map(str, sizes))}): use a multiple of one of them")
    for k in accums:
        if not any(share % k == 0 for _, _, share in fitting):
            shares = ", ".join(map(str, sorted({share for _, _, share in fitting})))
            raise ConfigError(f"--grad-accum {k} divides no candidate's examples per data shard ({shares} at "
                              f"--batch-size {batch}): use a divisor of one of them")
    out = []
    for s, m, share in fitting:
        stages = parse_mesh(m, None).stage if m != "none" else 1
        for k in accums:
            if share % k:
                continue
            piped = ([(stages * p, sched) for p in dict.fromkeys(per_stage) if (share // k) % (stages * p) == 0
                      for sched in schedules] if "stage" in USES[s] else [(0, "")])
            out += [Candidate(s, m, r, d, k, mb, sched) for mb, sched in piped for r in remats for d in dtypes]
    return out


def _beside_layout(c: Candidate) -> tuple[str, str, int, int, str]:
    """What shapes a candidate's step besides where its arrays live: remat, dtype, K, and a pipeline's M and
    schedule (a pipeline of one stage still runs its microbatches through its schedule: another step)."""
    return (c.remat, c.dtype, c.grad_accum, c.microbatches, c.schedule)


def one_per_layout(cands: list[Candidate], devices: int) -> tuple[list[Candidate], dict[str, str]]:
    """`cands` with one candidate per distinct layout, and each strategy left out -> the strategy it lays out as.
    On one device every mesh axis is 1: dp, fsdp, tp, zero1, zero2, ep and cp keep every array whole and send
    nothing, so each compiles the step `single` does (the same memory, time and cost), and planning, ranking or
    measuring it again says nothing new. Of candidates alike but for strategy and mesh the one kept is `single`'s
    where it is among them, else the one whose strategy comes first in the strategies' table (dp before cp or ep,
    which refuse models that `single` runs). On more than one device every candidate is its own layout."""
    if devices != 1:
        return cands, {}
    order = list(USES)
    kept: dict[tuple[str, str, int, int, str], Candidate] = {}
    for c in sorted(cands, key=lambda c: order.index(c.strategy)):
        kept.setdefault(_beside_layout(c), c)
    folded = {c.strategy: kept[_beside_layout(c)].strategy for c in cands if kept[_beside_layout(c)] != c}
    return [c for c in cands if kept[_beside_layout(c)] == c], folded


def folded_line(folded: dict[str, str]) -> str:
    """One line naming the strategies planned as another (`one_per_layout`) and why; '' when none were."""
    by_kept: dict[str, list[str]] = {}
    for strategy, kept in folded.items():
        by_kept.setdefault(kept, []).append(strategy)
    parts = [f"{', '.join(names)} {'lays' if len(names) == 1 else 'lay'} out as {kept}"
             for kept, names in by_kept.items()]
    if not parts:
        return ""
    return (f"on 1 device {'; '.join(parts)}: every array whole on the one device, nothing sent, the same step, "
            f"so each layout is planned once")


def candidate_config(cfg: config_lib.Config, c: Candidate, devices: int) -> dict[str, Any]:
    """The flattened configuration `shardbench train` would run for candidate `c`. A circular candidate loops its
    microbatches --parallel.repeats times (CIRCULAR_REPEATS where the configuration leaves it at 1: at 1 the schedule
    is GPipe's); every other candidate runs once through the stages, and a candidate without stages once."""
    single = c.strategy == "single"
    schedule = c.schedule or cfg.parallel.schedule
    circular = cfg.parallel.repeats if cfg.parallel.repeats > 1 else config_lib.CIRCULAR_REPEATS
    repeats = circular if schedule == "circular" and c.microbatches else 1
    return {**config_lib.flatten(cfg), "parallel.strategy": c.strategy, "parallel.mesh": c.mesh,
            "parallel.devices": 1 if single else devices, "model.remat": c.remat, "precision.dtype": c.dtype,
            "train.grad_accum": c.grad_accum, "parallel.spmd": cfg.parallel.spmd,
            "parallel.microbatches": c.microbatches, "parallel.schedule": schedule, "parallel.repeats": repeats}
