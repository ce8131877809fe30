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
Adding a way of splitting is adding a tactic or an entry to `STRATEGIES`, not a branch in `Layout`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jax
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from shardbench import config as config_lib
from shardbench.devices import process_count
from shardbench.errors import ConfigError
from shardbench.fields import unknown_choice
from shardbench.models.axes import BATCH, EMBED, EXPERT, HEADS, LAYERS, MLP, NORM_SEQ, SEQ, Axes
from shardbench.parallel.mesh import (
    DATA, MESH_AXES, MODEL, SEQUENCE, STAGE, MeshShape, build_mesh, parse_mesh,
)
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
        return _by_name(spec, axes, self.rules)

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
_SP: Rules = {NORM_SEQ: MODEL}


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


def spec_for(axes: Axes, rules: Rules) -> PartitionSpec:
    """PartitionSpec for logical `axes` by a table; a mesh axis is used at most once per array."""
    return PartitionSpec(*_by_name((None,) * len(axes), axes, rules))


def _by_name(spec: Spec, axes: Axes, rules: Rules) -> Spec:
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


@dataclass(frozen=True)
class Layout:
    """A strategy applied to a concrete mesh (or to one device for 'single')."""

    strategy: Strategy
    shape: MeshShape
    mesh: Mesh | None
    device: jax.Device
    sequence_parallel: bool = False  # --parallel.sequence-parallel: the residual stream split along seq over model

    @property
    def data_size(self) -> int:
        """Shards of the batch: the product of the mesh axes the batch is split over (data; data x expert under
        expert parallelism)."""
        return batch_shards(self.strategy, self.shape)

    def sharding(self, spec: PartitionSpec) -> jax.sharding.Sharding:
        if self.mesh is None:
            return SingleDeviceSharding(self.device)
        return NamedSharding(self.mesh, spec)

    @property
    def replicated(self) -> jax.sharding.Sharding:
        return self.sharding(PartitionSpec())

    def placed(self, tactics: tuple[Tactic, ...], axes: Axes, shape: tuple[int, ...]) -> PartitionSpec:
        """`tactics` in order, each on the dims the ones before left whole."""
        spec: Spec = (None,) * len(axes)
        for tactic in tactics:
            spec = tactic.place(spec, axes, shape, self.shape)
        return PartitionSpec(*spec)

    def param_spec(self, axes: Axes, shape: tuple[int, ...]) -> PartitionSpec:
        return self.placed(self.strategy.params, axes, shape)

    def optimizer_spec(self, axes: Axes, shape: tuple[int, ...]) -> PartitionSpec:
        """Where the optimizer's per-parameter state (Adam's moments) of a parameter lives."""
        return self.placed(self.strategy.optimizer_tactics, axes, shape)

    def gradient_spec(self, axes: Axes, shape: tuple[int, ...]) -> PartitionSpec:
        """Where a parameter's gradient lives when the step hands it to the optimizer."""
        return self.placed(self.strategy.gradient_tactics, axes, shape)

    def shardings(self, tactics: tuple[Tactic, ...], axes_tree: dict[str, Any],
                  shapes: dict[str, Any]) -> dict[str, Any]:
        """A sharding per parameter by `tactics`, a tree like the parameters."""
        return jax.tree.map(lambda axes, shape: self.sharding(self.placed(tactics, axes, tuple(shape))),
                            axes_tree, shapes, is_leaf=is_axes)

    def param_shardings(self, axes_tree: dict[str, Any], shapes: dict[str, Any]) -> dict[str, Any]:
        return self.shardings(self.strategy.params, axes_tree, shapes)

    def batch_sharding(self) -> jax.sharding.Sharding:
        """Arrays whose leading dim is the batch: split over data, whole along everything else."""
        return self.sharding(spec_for((BATCH,), self.strategy.compute))

    def process_share(self, global_batch: int) -> tuple[int, int]:
        """(index, count): this process's devices hold rows [index * b, (index + 1) * b) of every global batch,
        b = global_batch / count. With the data axis across processes first, that is (process index, process
        count); when processes share a data slice (a model axis across processes) they load the same rows."""
        if self.mesh is None:
            return 0, 1
        spans = sorted({(s[0].start or 0, global_batch if s[0].stop is None else s[0].stop)
                        for s in self.batch_sharding().addressable_devices_indices_map((global_batch,)).values()})
        lo, hi = spans[0][0], spans[0][1]
        for start, stop in spans[1:]:
            if start > hi:
                raise ConfigError(f"this process's devices hold rows of the batch that are not next to each "
                                  f"other (mesh {self.shape}): put each process's devices on neighbouring data "
                                  f"slices (the data axis spans processes first)")
            hi = max(hi, stop)
        size = hi - lo
        return lo // size, global_batch // size

    def activation_spec(self, axes: Axes) -> PartitionSpec:
        """Where an activation with logical `axes` lives: the strategy's compute table, and under sequence
        parallelism the residual stream's sequence over model."""
        return spec_for(axes, {**self.strategy.compute, **_SP} if self.sequence_parallel else self.strategy.compute)

    def constrain(self, x: jax.Array, axes: Axes) -> jax.Array:
        """The activation hook models call through `shardbench.models.axes.constrain`."""
        if self.mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, self.activation_spec(axes)))

    def check_divisible(self, axes_tree: dict[str, Any], shapes: dict[str, Any],
                        axis_fields: Mapping[str, str]) -> None:
        """Every dim a tactic demands must divide by its mesh axis: say which field to change if not."""
        flat_axes, flat_shapes = flat_by_path(axes_tree), flat_by_path(shapes)
        s = self.strategy
        every = (*s.params, *s.optimizer_tactics, *s.gradient_tactics)
        tactics = [t for i, t in enumerate(every) if t not in every[:i]]
        for path, axes in sorted(flat_axes.items()):
            shape = tuple(flat_shapes[path])
            for tactic in tactics:
                for dim, mesh_axis in tactic.indivisible(axes, shape, self.shape)[:1]:
                    n = self.shape[mesh_axis]
                    fld = axis_fields.get(axes[dim], f"the '{axes[dim]}' dimension")
                    raise ConfigError(
                        f"{self.strategy.name}: {fld} = {shape[dim]} is not divisible by the {mesh_axis} axis "
                        f"({n} devices, parameter {path}): choose a multiple of {n} or another mesh"
                    )

def flat_by_path(tree: dict[str, Any]) -> dict[str, Any]:
    """{'encoder/mlp2_kernel': leaf}: a nested dict's leaves by their '/'-joined path (list indices of a model
    that keeps its layers in a list become numbers in the path)."""
    return {"/".join(map(str, path)): leaf for path, leaf in traverse_util.flatten_dict(tree).items()}


def is_axes(x: Any) -> bool:
    """A tuple of logical axis names: a leaf of the axes tree."""
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


NO_MESH = ("none", "single")
# What 'auto' may pick: per set of axes split, the strategy that splits only the batch and what the axes name.
AUTO = ("dp", "tp", "dp+tp", "pp", "dp+pp", "pp+tp", "dp+pp+tp", "ep", "dp+ep", "cp", "dp+cp", "cp+tp")


def resolve_strategy(strategy_name: str, mesh_spec: str, num_devices: int) -> str:
    """'auto' picks the strategy the mesh implies, as the seed's experiments use meshes:
    no mesh -> single, data axis only -> dp, model axis only -> tp, both -> dp+tp; stage axis only -> pp, data and
    stage -> dp+pp, stage and model -> pp+tp, all three -> dp+pp+tp; expert only -> ep, data and expert -> dp+ep;
    seq only -> cp, data and seq -> dp+cp, model and seq -> cp+tp (the plainest strategy over the axes split).
    'dp' where auto has no strategy for the axes split (a run's name compares it with the strategy that ran);
    `make_layout` refuses such a mesh under auto."""
    if strategy_name != "auto":
        return strategy_name
    spec = mesh_spec.strip().lower()
    if spec in NO_MESH:
        return "single"
    return auto_strategy(parse_mesh(spec, num_devices, DATA)) or "dp"


def split_axes(shape: MeshShape) -> tuple[str, ...]:
    """The mesh axes `shape` gives more than one device, outermost first."""
    return tuple(axis for axis, size in shape.items() if size > 1)


def auto_strategy(shape: MeshShape) -> str | None:
    """The strategy of `AUTO` over exactly the axes `shape` splits (dp where it splits none), or None."""
    split = frozenset(split_axes(shape))
    if not split:
        return "dp"
    return next((name for name in AUTO if frozenset(STRATEGIES[name].axes) == split), None)


def _axes_words(axes: tuple[str, ...] | frozenset[str]) -> str:
    """('stage', 'model', 'expert') -> 'stage, model and expert', in the mesh's order."""
    ordered = [a for a in MESH_AXES if a in axes]
    return ordered[0] if len(ordered) == 1 else f"{', '.join(ordered[:-1])} and {ordered[-1]}"


def nearest_strategies(split: tuple[str, ...]) -> list[tuple[frozenset[str], list[str]]]:
    """The table's axis sets that share the most axes with `split` (those with the fewest axes beyond it first),
    each with the strategies over exactly it: what a mesh that no strategy splits is nearest to."""
    by_axes: dict[frozenset[str], list[str]] = {}
    for name, s in STRATEGIES.items():
        if s.axes:
            by_axes.setdefault(frozenset(s.axes), []).append(name)
    wanted = set(split)
    most = max(len(wanted & axes) for axes in by_axes)
    near = [axes for axes in by_axes if len(wanted & axes) == most]
    fewest = min(len(axes - wanted) for axes in near)
    return [(axes, by_axes[axes]) for axes in near if len(axes - wanted) == fewest]


def check_auto(shape: MeshShape) -> None:
    """Under --strategy auto, a mesh whose split axes no strategy of `AUTO` covers is said in one line, naming the
    axes and the strategies over the nearest sets of them (rather than falling back to dp, whose refusal would
    name one axis at a time)."""
    split = split_axes(shape)
    if auto_strategy(shape) is not None:
        return
    fits = [s.name for s in STRATEGIES.values() if frozenset(s.axes) == frozenset(split)]
    if fits:  # a strategy splits them, though not the plainest auto picks (ep+tp over model and expert)
        raise ConfigError(f"--strategy auto: --mesh {shape} splits {_axes_words(split)}, which auto picks no "
                          f"strategy for: name one, --strategy {' or '.join(fits)}")
    near = ", ".join(f"{' or '.join(names)} over {_axes_words(axes)}" for axes, names in nearest_strategies(split))
    raise ConfigError(f"--strategy auto: no strategy splits {_axes_words(split)} together (--mesh {shape}); the "
                      f"nearest are {near}: give a mesh over one of those sets of axes, and name its strategy")


def make_layout(strategy_name: str, mesh_spec: str, devices: list[jax.Device],
                sequence_parallel: bool = False) -> Layout:
    """Check the mesh against the strategy and devices, then build it (no compilation happens here)."""
    spec = mesh_spec.strip().lower()
    if strategy_name == "auto" and spec not in NO_MESH:
        check_auto(parse_mesh(spec, len(devices), DATA))
    strategy = get_strategy(resolve_strategy(strategy_name, mesh_spec, len(devices)))
    if strategy.name == "single":
        if process_count() > 1:
            raise ConfigError(f"strategy single runs on one device, but this run has {process_count()} "
                              f"processes: use a mesh over all {len(devices)} devices (for example --strategy dp)")
        if spec not in ("", "1", "1x1", "auto", *NO_MESH):
            raise ConfigError(f"strategy single runs on one device and takes no mesh, got --mesh {mesh_spec}")
        return Layout(strategy, MeshShape.of(), None, devices[0])
    if spec in NO_MESH:
        raise ConfigError(
            f"--mesh {mesh_spec} means one device without a mesh, but strategy {strategy.name} needs a mesh: "
            f"use --strategy single (or auto), or give a mesh such as {len(devices)}"
        )
    shape = parse_mesh(mesh_spec, len(devices), strategy.primary)
    for axis, size in shape.items():
        if size > 1 and axis not in strategy.axes:
            wider = wider_strategy(strategy, split_axes(shape))
            instead = (f": use --strategy {wider}{_what_it_splits_too(strategy, wider, axis)}, or" if wider else
                       f", and no strategy splits {_axes_words(split_axes(shape))} together:")
            raise ConfigError(
                f"strategy {strategy.name} does not use the {axis} axis but --mesh {shape} gives it {size} "
                f"devices{instead} put every device on {'/'.join(strategy.axes)}"
            )
    return Layout(strategy, shape, build_mesh(shape, devices), devices[0], sequence_parallel)


def wider_strategy(strategy: Strategy, split: tuple[str, ...]) -> str | None:
    """A strategy that uses every axis in `split` and places parameters as `strategy` does (dp -> dp+tp for
    data and model): the one over exactly `strategy`'s axes and `split`, else the plainest over more; None if no
    strategy uses all of `split`."""
    wanted = set(strategy.axes) | set(split)
    over = sorted((s for s in STRATEGIES.values() if set(split) <= set(s.axes)),
                  key=lambda s: (set(s.axes) != wanted, len(s.axes)))
    # The same kinds of tactic (fsdp's Largest) and more, for the parameters, the optimizer state and the
    # gradients: fsdp+pp on a model axis is fsdp+pp+tp, not dp+pp+tp; zero1 is fsdp+tp, which keeps its split
    # optimizer state, not dp+tp.
    same = [s for s in over if all(_kinds(mine) <= _kinds(theirs) for mine, theirs in zip(
        (strategy.params, strategy.optimizer_tactics, strategy.gradient_tactics),
        (s.params, s.optimizer_tactics, s.gradient_tactics)))]
    pick = (same or over)[:1]
    return pick[0].name if pick else None


def _kinds(tactics: tuple[Tactic, ...]) -> set[type]:
    return {type(t) for t in tactics}


def _what_it_splits_too(strategy: Strategy, wider: str, axis: str) -> str:
    """Where `strategy` splits its optimizer state apart from its parameters (ZeRO-1/2) and `wider` cannot: no
    ZeRO strategy takes `axis`, and the one named splits the parameters too."""
    other = STRATEGIES[wider]
    if strategy.optimizer is None or other.optimizer is not None:
        return ""
    return (f" (no ZeRO strategy uses the {axis} axis: {wider} keeps the optimizer state"
            f"{' and gradients' if strategy.gradients is not None else ''} split over data, and splits the "
            f"parameters too)")
