"""Strategies as data: ordered tactics that place each parameter on the mesh, and a table for activations.

A strategy names where parameters live as an ordered tuple of tactics, as big_vision
writes sharding as ordered rules of tactics, and how activations and batches are split as a table from logical
axis names to mesh axes (as Levanter separates parameter and compute axis mappings). Each tactic fills only the
dims the tactics before it left whole and never reuses a mesh axis an array already uses:
- `ByName(rules)` splits every dim whose logical name the table maps to a mesh axis (Megatron's tensor
  parallelism is `ByName({'heads': 'model', 'mlp': 'model'})`); a dim the axis does not divide is refused before
  compiling, naming the field to change;
- `Largest(axis)` is FSDP (ZeRO-3): one more dim over `axis`, 'embed' where the axis divides it, else the
  largest dim that it divides (never the stacked 'layers' dim, which the scan slices); an array that nothing
  divides stays replicated, since which dim divides depends on each array's shape. XLA gathers the parameters
  for compute.
The optimizer state and the gradients (as the optimizer receives them) are placed by tactics of their own,
which default to the parameters': ZeRO-1 keeps the parameters whole and splits the optimizer state over data,
ZeRO-2 splits the gradients too, so each device updates its slice and the parameters are gathered after.
Adding a way of splitting is adding a tactic or an entry to `STRATEGIES`, not a branch in `Layout`. This module is
plain data and imports no JAX (the command line reads it for its choices and help); `shardbench.parallel.rules`
applies a strategy to a mesh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from shardbench import config as config_lib
from shardbench.axis_names import BATCH, EMBED, EXPERT, HEADS, LAYERS, MLP, NORM_SEQ, SEQ, Axes
from shardbench.errors import ConfigError
from shardbench.fields import unknown_choice
from shardbench.parallel.mesh import DATA, MODEL, SEQUENCE, STAGE, MeshShape
from shardbench.parallel.mesh import EXPERT as EXPERT_AXIS

# A logical name -> a mesh axis, or several (outermost first): expert parallelism splits the batch outside the
# experts over data and expert at once.
Rules = Mapping[str, str | tuple[str, ...]]
Spec = tuple[str | tuple[str, ...] | None, ...]  # one mesh axis, several, or None per dim of an array


class Tactic(Protocol):
    """One rule of a strategy's parameter placement."""

    def place(self, spec: Spec, axes: Axes, shape: tuple[int, ...], mesh: MeshShape) -> Spec:
        """`spec` with this tactic's mesh axes added to dims that are still whole."""
        ...

    def indivisible(self, axes: Axes, shape: tuple[int, ...], mesh: MeshShape) -> list[tuple[int, str]]:
        """(dim, mesh axis) pairs this tactic demands that the axis does not divide; empty if it only takes
        dims that divide."""
        ...


@dataclass(frozen=True)
class ByName:
    """Split each dim whose logical name `rules` maps to a mesh axis; the first such dim takes the axis."""

    rules: Rules

    def place(self, spec: Spec, axes: Axes, shape: tuple[int, ...], mesh: MeshShape) -> Spec:
        return by_name(spec, axes, self.rules)

    def indivisible(self, axes: Axes, shape: tuple[int, ...], mesh: MeshShape) -> list[tuple[int, str]]:
        spec = self.place((None,) * len(axes), axes, shape, mesh)
        return [(dim, a) for dim, a in enumerate(spec) if a is not None and shape[dim] % mesh[a]]


@dataclass(frozen=True)
class Largest:
    """FSDP over `axis`: `prefer` where the axis divides it, else the largest dim it divides; never `skip`."""

    axis: str
    prefer: str = EMBED
    skip: tuple[str, ...] = (LAYERS,)

    def place(self, spec: Spec, axes: Axes, shape: tuple[int, ...], mesh: MeshShape) -> Spec:
        size = mesh[self.axis]
        if size == 1 or self.axis in spec:
            return spec
        free = [d for d, (name, taken) in enumerate(zip(axes, spec))
                if taken is None and name not in self.skip and shape[d] % size == 0]
        preferred = [d for d in free if axes[d] == self.prefer] or sorted(free, key=lambda d: -shape[d])
        if not preferred:
            return spec  # tiny arrays that nothing divides stay replicated
        out = list(spec)
        out[preferred[0]] = self.axis
        return tuple(out)

    def indivisible(self, axes: Axes, shape: tuple[int, ...], mesh: MeshShape) -> list[tuple[int, str]]:
        return []


_TP: Rules = {HEADS: MODEL, MLP: MODEL}
# Pipeline stages: each stage holds a contiguous block of the stacked layers (the 'layers' dim over stage); in
# compute, the pipeline's buffer of one microbatch per stage is split over stage along the same logical name
# (shardbench.parallel.pipeline).
_PP: Rules = {LAYERS: STAGE}
# Expert parallelism: a mixture's experts over expert; outside the experts the batch is split over data and expert
# together (each device holds its own tokens), so dispatching tokens to their experts and back is an all-to-all
# over expert (shardbench.models.moe constrains the dispatched tokens to (expert, batch, ...), the batch taking what
# the experts leave: data).
_EP: Rules = {EXPERT: EXPERT_AXIS}
_EP_BATCH: Rules = {BATCH: (DATA, EXPERT_AXIS)}
# Context parallelism: activations split along the sequence over seq; parameters as the strategy it joins places
# them (the position table's 'seq' dim is never split: no parameter tactic names it). Attention reaches the other
# devices' keys and values as --parallel.context says (shardbench.parallel.context).
_CP: Rules = {SEQ: SEQUENCE, NORM_SEQ: SEQUENCE}
# Megatron's sequence parallelism inside tp (--parallel.sequence-parallel): the residual stream, where LayerNorm and
# dropout work (the models name its sequence 'norm_seq'), is split along the sequence over model; the matmuls'
# inputs ('seq') stay whole there, so XLA gathers them before and reduce-scatters after.
SEQUENCE_PARALLEL: Rules = {NORM_SEQ: MODEL}


@dataclass(frozen=True)
class Strategy:
    """Where parameters live (`params`, tactics applied in order), how compute is split (`compute`), and where
    the optimizer state and the gradients live (`optimizer`, `gradients`; None: as the parameters)."""

    name: str
    params: tuple[Tactic, ...]
    compute: Rules
    axes: tuple[str, ...]  # mesh axes this strategy may give more than one device
    primary: str = DATA  # where a bare `--mesh N` puts its devices
    description: str = ""
    optimizer: tuple[Tactic, ...] | None = None
    gradients: tuple[Tactic, ...] | None = None

    @property
    def optimizer_tactics(self) -> tuple[Tactic, ...]:
        return self.params if self.optimizer is None else self.optimizer

    @property
    def gradient_tactics(self) -> tuple[Tactic, ...]:
        return self.params if self.gradients is None else self.gradients

    @property
    def replicates_everything(self) -> bool:
        """Parameters, gradients and optimizer state all whole on every device (what pmap can run)."""
        return not (self.params or self.optimizer_tactics or self.gradient_tactics)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("single", (), {}, (), DATA, "one device, no mesh"),
        Strategy("dp", (), {BATCH: DATA}, (DATA,), DATA,
                 "parameters and optimizer state replicated; batch split over data"),
        Strategy("fsdp", (Largest(DATA),), {BATCH: DATA}, (DATA,), DATA,
                 "parameters and optimizer state sharded over data (ZeRO-3); batch split over data"),
        Strategy("tp", (ByName(_TP),), {BATCH: DATA, **_TP}, (MODEL,), MODEL,
                 "Megatron tensor parallelism: attention heads and MLP hidden units split over model, where the "
                 "model has them"),
        Strategy("dp+tp", (ByName(_TP),), {BATCH: DATA, **_TP}, (DATA, MODEL), DATA,
                 "batch split over data, Megatron tensor parallelism over model"),
        Strategy("zero1", (), {BATCH: DATA}, (DATA,), DATA,
                 "parameters and gradients replicated, optimizer state sharded over data (ZeRO-1); batch split "
                 "over data", optimizer=(Largest(DATA),)),
        Strategy("zero2", (), {BATCH: DATA}, (DATA,), DATA,
                 "parameters replicated, gradients and optimizer state sharded over data (ZeRO-2); batch split "
                 "over data", optimizer=(Largest(DATA),), gradients=(Largest(DATA),)),
        Strategy("fsdp+tp", (ByName(_TP), Largest(DATA)), {BATCH: DATA, **_TP}, (DATA, MODEL), DATA,
                 "parameters sharded over data and model; batch over data; Megatron over model"),
        Strategy("pp", (ByName(_PP),), {BATCH: DATA, **_PP}, (STAGE,), STAGE,
                 "pipeline: stacked layers split into stages over stage, microbatches flow through them"),
        Strategy("dp+pp", (ByName(_PP),), {BATCH: DATA, **_PP}, (DATA, STAGE), DATA,
                 "batch split over data; stacked layers split into pipeline stages over stage"),
        # Pipelines combined: each stage's block of layers is split further as the other strategy splits a whole
        # parameter (fsdp: one more dim over data, never 'layers'; tp: heads and MLP hidden over model).
        Strategy("fsdp+pp", (ByName(_PP), Largest(DATA)), {BATCH: DATA, **_PP}, (DATA, STAGE), DATA,
                 "stacked layers split into pipeline stages over stage, every parameter sharded over data (ZeRO-3) "
                 "within its stage; batch split over data"),
        Strategy("pp+tp", (ByName({**_PP, **_TP}),), {BATCH: DATA, **_PP, **_TP}, (STAGE, MODEL), STAGE,
                 "stacked layers split into pipeline stages over stage, Megatron tensor parallelism over model "
                 "within each stage"),
        Strategy("dp+pp+tp", (ByName({**_PP, **_TP}),), {BATCH: DATA, **_PP, **_TP}, (DATA, STAGE, MODEL), DATA,
                 "batch split over data; stacked layers split into pipeline stages over stage; Megatron tensor "
                 "parallelism over model within each stage"),
        Strategy("fsdp+pp+tp", (ByName({**_PP, **_TP}), Largest(DATA)), {BATCH: DATA, **_PP, **_TP},
                 (DATA, STAGE, MODEL), DATA,
                 "stacked layers split into pipeline stages over stage, Megatron tensor parallelism over model and "
                 "every parameter sharded over data within each stage; batch split over data"),
        Strategy("ep", (ByName(_EP),), {**_EP_BATCH, **_EP}, (EXPERT_AXIS,), EXPERT_AXIS,
                 "expert parallelism: experts split over expert, batch split over expert, tokens dispatched to "
                 "their experts and back by all-to-all"),
        Strategy("dp+ep", (ByName(_EP),), {**_EP_BATCH, **_EP}, (DATA, EXPERT_AXIS), DATA,
                 "experts split over expert, the rest replicated; batch split over data and expert; tokens "
                 "dispatched by all-to-all over expert"),
        Strategy("fsdp+ep", (ByName(_EP), Largest(DATA)), {**_EP_BATCH, **_EP}, (DATA, EXPERT_AXIS), DATA,
                 "experts split over expert, and every parameter sharded over data (ZeRO-3) besides; batch split "
                 "over data and expert; tokens dispatched by all-to-all over expert"),
        Strategy("ep+tp", (ByName({**_EP, **_TP}),), {**_EP_BATCH, **_EP, **_TP}, (EXPERT_AXIS, MODEL), EXPERT_AXIS,
                 "experts split over expert and each expert's MLP hidden (and attention's heads) over model as "
                 "Megatron splits them; batch split over expert; tokens dispatched by all-to-all"),
        Strategy("cp", (), {BATCH: DATA, **_CP}, (SEQUENCE,), SEQUENCE,
                 "context parallelism: the sequence split over seq, parameters replicated"),
        Strategy("dp+cp", (), {BATCH: DATA, **_CP}, (DATA, SEQUENCE), DATA,
                 "batch split over data, the sequence over seq; parameters replicated"),
        Strategy("fsdp+cp", (Largest(DATA),), {BATCH: DATA, **_CP}, (DATA, SEQUENCE), DATA,
                 "parameters sharded over data (ZeRO-3); batch split over data, the sequence over seq"),
        Strategy("cp+tp", (ByName(_TP),), {BATCH: DATA, **_TP, **_CP}, (MODEL, SEQUENCE), SEQUENCE,
                 "the sequence split over seq, Megatron tensor parallelism over model"),
    )
}


# The names live in one place (shardbench.config.STRATEGIES, with 'auto'); this is what each one does.
if set(STRATEGIES) != set(config_lib.STRATEGIES) - {"auto"}:
    raise RuntimeError(f"strategy tables {sorted(STRATEGIES)} and config.STRATEGIES {config_lib.STRATEGIES} disagree")


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(unknown_choice("--strategy", name, tuple(STRATEGIES)) or name)
    return STRATEGIES[name]


def batch_shards(strategy: Strategy, shape: MeshShape) -> int:
    """How many shards `strategy` splits the batch into on a mesh of `shape`: the product of the sizes of the mesh
    axes its compute table gives the batch."""
    split = strategy.compute.get(BATCH, DATA)
    return math.prod(shape[a] for a in ((split,) if isinstance(split, str) else split))


def by_name(spec: Spec, axes: Axes, rules: Rules) -> Spec:
    """`spec` with each whole dim whose name `rules` maps to a mesh axis the array does not use yet split over
    it (the first such dim takes the axis); a name mapped to several axes takes those still free (the batch over
    data and expert keeps data where a dim before it took expert)."""
    out = list(spec)
    for dim, name in enumerate(axes):
        wanted = rules.get(name) if name is not None else None
        if out[dim] is not None or wanted is None:
            continue
        used = {a for s in out if s is not None for a in ((s,) if isinstance(s, str) else s)}
        free = tuple(a for a in ((wanted,) if isinstance(wanted, str) else wanted) if a not in used)
        if free:
            out[dim] = free[0] if len(free) == 1 else free
    return tuple(out)
