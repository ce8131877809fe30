"""A strategy applied to a mesh: the `Layout` that gives each parameter, gradient, optimizer state, activation and
batch its sharding, and how a strategy and a mesh are chosen for a run and checked against each other
(`make_layout`). What each strategy does is data (`shardbench.parallel.strategies`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from shardbench.axis_names import BATCH, Axes
from shardbench.devices import process_count
from shardbench.errors import ConfigError
from shardbench.parallel.mesh import DATA, MESH_AXES, MeshShape, build_mesh, parse_mesh
from shardbench.parallel.strategies import (
    SEQUENCE_PARALLEL, STRATEGIES, Rules, Spec, Strategy, Tactic, batch_shards, by_name, get_strategy,
)

def spec_for(axes: Axes, rules: Rules) -> PartitionSpec:
    """PartitionSpec for logical `axes` by a table; a mesh axis is used at most once per array."""
    return PartitionSpec(*by_name((None,) * len(axes), axes, rules))



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
        return spec_for(axes, {**self.strategy.compute, **SEQUENCE_PARALLEL} if self.sequence_parallel else self.strategy.compute)

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
