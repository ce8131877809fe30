"""Strategies as tables from logical axis names to mesh axes, and the shardings a layout derives from them.

A strategy has two tables (as Levanter separates parameter and compute axis mappings): one for where
parameters and optimizer state live, one for how activations and batches are split. FSDP (and FSDP+TP) is not a
table alone: it is the table of DP (or TP) plus a rule, `Strategy.fsdp`, applied per array by
`Layout.param_spec`: each parameter takes one more dim over the data axis, 'embed' where the data size divides
it, else its largest dim that does (never the stacked 'layers' dim), and stays replicated where none does. A
table could not say this, since which dim divides depends on each array's shape; the parameters are gathered
for compute by XLA (ZeRO-3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.models.axes import BATCH, EMBED, HEADS, LAYERS, MLP, Axes
from shardbench.parallel.mesh import DATA, MODEL, MeshShape, build_mesh, parse_mesh

Rules = Mapping[str, str]
_TP: Rules = {HEADS: MODEL, MLP: MODEL}


@dataclass(frozen=True)
class Strategy:
    """Where parameters live (`params`) and how compute is split (`compute`), by logical axis."""

    name: str
    params: Rules
    compute: Rules
    axes: tuple[str, ...]  # mesh axes this strategy may give more than one device
    primary: str = DATA  # where a bare `--mesh N` puts its devices
    description: str = ""
    fsdp: bool = False  # also shard every parameter over the data axis (ZeRO-3), see Layout.param_spec


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("single", {}, {}, (), DATA, "one device, no mesh"),
        Strategy("dp", {}, {BATCH: DATA}, (DATA,), DATA,
                 "parameters and optimizer state replicated; batch split over data"),
        Strategy("fsdp", {}, {BATCH: DATA}, (DATA,), DATA,
                 "parameters and optimizer state sharded over data (ZeRO-3); batch split over data", fsdp=True),
        Strategy("tp", _TP, {BATCH: DATA, **_TP}, (MODEL,), MODEL,
                 "Megatron tensor parallelism: heads and MLP hidden split over model"),
        Strategy("dp+tp", _TP, {BATCH: DATA, **_TP}, (DATA, MODEL), DATA,
                 "batch split over data, Megatron tensor parallelism over model"),
        Strategy("fsdp+tp", _TP, {BATCH: DATA, **_TP}, (DATA, MODEL), DATA,
                 "parameters sharded over data and model; batch over data; Megatron over model", fsdp=True),
    )
}


# The names live in one place (shardbench.config.STRATEGIES, with 'auto'); this is what each one does.
if set(STRATEGIES) != set(config_lib.STRATEGIES) - {"auto"}:
    raise RuntimeError(f"strategy tables {sorted(STRATEGIES)} and config.STRATEGIES {config_lib.STRATEGIES} disagree")


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy '{name}': choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def spec_for(axes: Axes, rules: Rules) -> PartitionSpec:
    """PartitionSpec for logical `axes`; a mesh axis is used at most once per array."""
    used: set[str] = set()
    out: list[str | None] = []
    for name in axes:
        mesh_axis = rules.get(name) if name is not None else None
        if mesh_axis is not None and mesh_axis in used:
            mesh_axis = None
        if mesh_axis is not None:
            used.add(mesh_axis)
        out.append(mesh_axis)
    return PartitionSpec(*out)


@dataclass(frozen=True)
class Layout:
    """A strategy applied to a concrete mesh (or to one device for 'single')."""

    strategy: Strategy
    shape: MeshShape
    mesh: Mesh | None
    device: jax.Device

    @property
    def data_size(self) -> int:
        return self.shape.data

    def sharding(self, spec: PartitionSpec) -> jax.sharding.Sharding:
        if self.mesh is None:
            return SingleDeviceSharding(self.device)
        return NamedSharding(self.mesh, spec)

    @property
    def replicated(self) -> jax.sharding.Sharding:
        return self.sharding(PartitionSpec())

    def param_spec(self, axes: Axes, shape: tuple[int, ...]) -> PartitionSpec:
        """The strategy's table, then for FSDP one more dim over 'data': 'embed' where it divides, else the
        largest dim that divides (never the stacked-layer dim, which the scan slices); tiny arrays that
        nothing divides stay replicated."""
        spec = list(spec_for(axes, self.strategy.params))
        if self.strategy.fsdp and DATA not in spec and self.shape.data > 1:
            free = [d for d, (name, mesh_axis) in enumerate(zip(axes, spec))
                    if mesh_axis is None and name != LAYERS and shape[d] % self.shape.data == 0]
            preferred = [d for d in free if axes[d] == EMBED] or sorted(free, key=lambda d: -shape[d])
            if preferred:
                spec[preferred[0]] = DATA
        return PartitionSpec(*spec)

    def param_shardings(self, axes_tree: dict[str, Any], shapes: dict[str, Any]) -> dict[str, Any]:
        return jax.tree.map(lambda axes, shape: self.sharding(self.param_spec(axes, tuple(shape))),
                            axes_tree, shapes, is_leaf=is_axes)

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

    def constrain(self, x: jax.Array, axes: Axes) -> jax.Array:
        """The activation hook models call through `shardbench.models.axes.constrain`."""
        if self.mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec_for(axes, self.strategy.compute)))

    def check_divisible(self, axes_tree: dict[str, Any], shapes: dict[str, Any],
                        axis_fields: Mapping[str, str]) -> None:
        """Every sharded dim must divide by its mesh axis: say which field to change if not."""
        sizes = {DATA: self.shape.data, MODEL: self.shape.model}
        flat_axes, flat_shapes = flat_by_path(axes_tree), flat_by_path(shapes)
        for path, axes in sorted(flat_axes.items()):
            spec = spec_for(axes, self.strategy.params)  # the table's demands; FSDP picks only dims that divide
            for dim, (logical, mesh_axis) in enumerate(zip(axes, spec)):
                if mesh_axis is None or flat_shapes[path][dim] % sizes[mesh_axis] == 0:
                    continue
                size = flat_shapes[path][dim]
                fld = axis_fields.get(logical, f"the '{logical}' dimension")
                raise ConfigError(
                    f"{self.strategy.name}: {fld} = {size} is not divisible by the {mesh_axis} axis "
                    f"({sizes[mesh_axis]} devices, parameter {path}): choose a multiple of {sizes[mesh_axis]} "
                    f"or another mesh"
                )


def flat_by_path(tree: dict[str, Any]) -> dict[str, Any]:
    """{'encoder/mlp2_kernel': leaf}: a nested dict's leaves by their '/'-joined path (list indices of a model
    that keeps its layers in a list become numbers in the path)."""
    return {"/".join(map(str, path)): leaf for path, leaf in traverse_util.flatten_dict(tree).items()}


def is_axes(x: Any) -> bool:
    """A tuple of logical axis names: a leaf of the axes tree."""
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


NO_MESH = ("none", "single")


def resolve_strategy(strategy_name: str, mesh_spec: str, num_devices: int) -> str:
    """'auto' picks the strategy the mesh implies, as the seed's experiments use meshes:
    no mesh -> single, data axis only -> dp, model axis only -> tp, both -> dp+tp."""
    if strategy_name != "auto":
        return strategy_name
    spec = mesh_spec.strip().lower()
    if spec in NO_MESH:
        return "single"
    shape = parse_mesh(spec, num_devices, DATA)
    if shape.model == 1:
        return "dp"
    return "tp" if shape.data == 1 else "dp+tp"


def make_layout(strategy_name: str, mesh_spec: str, devices: list[jax.Device]) -> Layout:
    """Check the mesh against the strategy and devices, then build it (no compilation happens here)."""
    strategy = get_strategy(resolve_strategy(strategy_name, mesh_spec, len(devices)))
    spec = mesh_spec.strip().lower()
    if strategy.name == "single":
        if jax.process_count() > 1:
            raise ConfigError(f"strategy single runs on one device, but this run has {jax.process_count()} "
                              f"processes: use a mesh over all {len(devices)} devices (for example --strategy dp)")
        if spec not in ("", "1", "1x1", "auto", *NO_MESH):
            raise ConfigError(f"strategy single runs on one device and takes no mesh, got --mesh {mesh_spec}")
        return Layout(strategy, MeshShape(1, 1), None, devices[0])
    if spec in NO_MESH:
        raise ConfigError(
            f"--mesh {mesh_spec} means one device without a mesh, but strategy {strategy.name} needs a mesh: "
            f"use --strategy single (or auto), or give a mesh such as {len(devices)}"
        )
    shape = parse_mesh(mesh_spec, len(devices), strategy.primary)
    for axis, size in ((DATA, shape.data), (MODEL, shape.model)):
        if size > 1 and axis not in strategy.axes:
            other = {"dp": "dp+tp", "fsdp": "fsdp+tp", "tp": "dp+tp"}.get(strategy.name, "a 2-D strategy")
            raise ConfigError(
                f"strategy {strategy.name} does not use the {axis} axis but --mesh {shape} gives it {size} "
                f"devices: use --strategy {other}, or put every device on "
                f"{'/'.join(strategy.axes)}"
            )
    return Layout(strategy, shape, build_mesh(shape, devices), devices[0])
