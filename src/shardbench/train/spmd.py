"""The train and eval steps compiled in the SPMD style `--spmd` names (`make_steps` picks one); state donated,
shardings fixed up front. Each style runs the same `StepParts` (`shardbench.train.step`).

- `jit`: one global program; XLA partitions it from the shardings of the state and the batch. Gradients a
  strategy places apart from their parameters (ZeRO-2) are constrained to that placement, so XLA reduces them
  with a reduce-scatter instead of an all-reduce.
  Pipeline strategies (pp) run the model's stacked layers in stages (`shardbench.parallel.pipeline`); under
  1F1B the gradients are the schedule's own (`shardbench.train.one_f_one_b`). Context-parallel strategies (cp)
  run attention over the sequence split over seq (`shardbench.parallel.context`).
- `shard_map`: the step's forward and backward pass is a per-device program over the 'data' axis, with
  its collectives written out: replicated parameters have their gradients averaged with `pmean`; FSDP
  parameters are all-gathered before use and their gradients reduce-scattered (`psum_scatter`), as are the
  gradients of a strategy that splits them while the parameters stay whole (ZeRO-2). The
  optimizer update then runs element-wise on the shards in the enclosing jit. With a 'model' axis the
  program is manual over 'data' only and XLA partitions the model axis (tensor parallelism) inside it.
- `pmap`: the older style. Parameters and optimizer state are replicated with a leading device axis,
  the batch is reshaped to (devices, batch / devices, ...), gradients are averaged with `pmean`, and every
  device applies the same update. Data parallelism only.

Both average per-device means, which equals the global mean because every device gets as many examples
(and targets) as the others in a training batch. Per-example randomness (augmentation) is drawn for the
global batch and sliced, so all three styles see the same inputs; dropout masks are drawn per device
(the same in distribution, not element for element), from the model's own RNG streams too (the device's
index is folded into their keys).

A model of your own that keeps BatchNorm statistics: a layer that names an axis (`axis_name='batch'`) gets
the data axis bound under that name (the mapped mesh's data axis, or pmap's axis, carries it), so its
statistics span the global batch as under jit. One that names none normalises each device's examples with
their own statistics; the running averages it keeps are then averaged over the devices after every step, so
every device holds the same ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.models.axes import constraints
from shardbench.optim import learning_rate
from shardbench.parallel.mesh import DATA, MESH_AXES, MODEL
from shardbench.parallel.rules import Layout, is_axes, spec_for
from shardbench.parallel.strategies import Tactic
from shardbench.parallel.checks import check_style
from shardbench.parallel.context import context_parallel
from shardbench.parallel.pipeline import pipelined
from shardbench.tasks import Rows, Task
from shardbench.models.spec import ModelSpec
from shardbench.train.one_f_one_b import hand_written_backward
from shardbench.train.state import TrainState, gradient_shardings, state_shardings
from shardbench.train.step import (
    Batch, HostBatch, Metrics, StepParts, Steps, eval_sums, place_batch,
)

PMAP_AXIS = "devices"


def _mesh(layout: Layout) -> Mesh:
    """The layout's mesh, or a one-device mesh for `single`: the explicit styles always map over one."""
    if layout.mesh is not None:
        return layout.mesh
    return Mesh(np.asarray([layout.device]).reshape((1,) * len(MESH_AXES)), MESH_AXES)


def data_axis_name(spec: ModelSpec, default: str) -> str:
    """The name the data axis is bound under in the per-device program: the one the model's layers name
    (BatchNorm's axis_name), else shardbench's own."""
    return spec.axis_names[0] if spec.axis_names else default


def sync_statistics(spec: ModelSpec, model_state: Any, axis: str) -> Any:
    """Per-shard statistics (no layer names the data axis): average the floating-point variables the step
    left over the devices, so each keeps the same running averages; counters and RNG state are the same on
    every device already. Where the axis is bound, statistics are global and nothing is averaged."""
    if spec.axis_names or not spec.has_statistics:
        return model_state
    return jax.tree.map(lambda x: jax.lax.pmean(x, axis) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
                        else x, model_state)


def _data_dims(layout: Layout, spec: ModelSpec, tactics: tuple[Tactic, ...]) -> Any:
    """Per parameter: the dim `tactics` (the parameters' or the gradients') shard over 'data', or None where
    the array is whole on each device."""
    def dim(axes: tuple[str | None, ...], shape: Any) -> int | None:
        parts = list(layout.placed(tactics, axes, tuple(shape)))
        return parts.index(DATA) if DATA in parts else None

    return jax.tree.map(dim, spec.axes, spec.shapes, is_leaf=is_axes)


def _manual_spec(dim: int | None, ndim: int, data: str = DATA) -> PartitionSpec:
    parts: list[str | None] = [None] * ndim
    if dim is not None:
        parts[dim] = data
    return PartitionSpec(*parts)


def jit_steps(parts: StepParts, layout: Layout, shardings: TrainState, batch_keys: tuple[str, ...]) -> Steps:
    """The global program: the batch is split over data by its sharding, parameters by theirs."""
    global_batch = parts.cfg.train.batch_size
    grad_shardings = gradient_shardings(parts.spec, layout)

    def like_gradients(grads: Any) -> Any:
        """An accumulator of gradients laid out as the gradients are (as the parameters, FSDP split as they are,
        unless the strategy places gradients itself: ZeRO-2's slices)."""
        return jax.lax.with_sharding_constraint(grads, grad_shardings or shardings.params)

    parallel = parts.cfg.parallel
    by_schedule = hand_written_backward(layout, parallel)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        with constraints(layout.constrain), pipelined(layout, parallel), context_parallel(layout, parallel):
            g = parts.gradients(state.params, state.model_state, batch, state.step, Rows(0, global_batch),
                                constrain=like_gradients, by_schedule=by_schedule)
        grads = g.grads
        if grad_shardings is not None:  # each device keeps only its slice of the summed gradients
            grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
        metrics = parts.train_metrics(state, g.loss, g.correct, g.count, grads, g.moe)
        return parts.apply_update(state, grads, g.model_state), metrics

    def eval_step(state: TrainState, batch: Batch) -> Metrics:
        with constraints(layout.constrain), pipelined(layout, parallel), context_parallel(layout, parallel):
            t, _ = parts.terms(parts.eval_params(state), state.model_state, batch, state.step, train=False,
                               rows=Rows(0, batch["mask"].shape[0]))
        return eval_sums(t, batch["mask"])

    batch_sharding = layout.batch_sharding()
    batch_shardings = {k: batch_sharding for k in (*batch_keys, "mask")}
    train = jax.jit(train_step, in_shardings=(shardings, batch_shardings),
                    out_shardings=(shardings, layout.replicated), donate_argnums=0)
    evaluate = jax.jit(eval_step, in_shardings=(shardings, batch_shardings), out_shardings=layout.replicated)
    return Steps(train=train, evaluate=evaluate, place=lambda b: place_batch(b, batch_sharding))


def shard_map_steps(parts: StepParts, layout: Layout, shardings: TrainState,
                    batch_keys: tuple[str, ...]) -> Steps:
    outer = _mesh(layout)
    data = data_axis_name(parts.spec, DATA)
    if data in MESH_AXES[1:]:
        raise ConfigError(f"--spmd shard_map: the model's layers name the collective axis '{data}', which is the "
                          f"mesh's model axis: name the data axis something else in the model (axis_name='batch')")
    # The per-device program maps over the same devices, its data axis named as the model's layers name it.
    mesh = outer if data == DATA else Mesh(outer.devices, (data, *outer.axis_names[1:]))
    dims = _data_dims(layout, parts.spec, layout.strategy.params)
    grad_dims = _data_dims(layout, parts.spec, layout.strategy.gradient_tactics)
    is_dim = lambda x: x is None or isinstance(x, int)  # noqa: E731
    flat_dims, treedef = jax.tree.flatten(dims, is_leaf=is_dim)
    shapes = treedef.flatten_up_to(parts.spec.shapes)
    param_specs = treedef.unflatten([_manual_spec(d, len(s), data) for d, s in zip(flat_dims, shapes)])
    grad_specs = treedef.unflatten([_manual_spec(d, len(s), data)
                                    for d, s in zip(jax.tree.leaves(grad_dims, is_leaf=is_dim), shapes)])
    state_specs = jax.tree.map(lambda _: PartitionSpec(), shardings.model_state)
    batch_specs = {k: PartitionSpec(data) for k in (*batch_keys, "mask")}
    # Manual over every axis unless the model axis carries tensor parallelism, which XLA keeps partitioning.
    manual = frozenset({data}) if layout.shape.model > 1 else frozenset(mesh.axis_names)
    auto_rules = {k: v for k, v in layout.strategy.compute.items() if v == MODEL}

    # XLA rejects collectives over a manual axis of one device next to an automatic axis: skip them there.
    one = layout.shape.data == 1

    def psum(x: jax.Array) -> jax.Array:
        return x if one else jax.lax.psum(x, data)

    def pmean(x: jax.Array) -> jax.Array:
        return x if one else jax.lax.pmean(x, data)

    def gather(p: jax.Array, dim: int | None) -> jax.Array:
        return p if dim is None or one else jax.lax.all_gather(p, data, axis=dim, tiled=True)

    def reduce(g: jax.Array, dim: int | None) -> jax.Array:
        if dim is None or one:
            return pmean(g)
        return jax.lax.psum_scatter(g, data, scatter_dimension=dim, tiled=True) / jax.lax.axis_size(data)

    def within(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
        """Inside the per-device program only the automatic model axis may be constrained."""
        return jax.lax.with_sharding_constraint(x, spec_for(axes, auto_rules))

    constraint = within if MODEL not in manual else None

    def local_train(params: Any, model_state: Any, batch: Batch, step: jax.Array) -> tuple[Any, Any, Metrics]:
        index, size = jax.lax.axis_index(data), jax.lax.axis_size(data)
        b = batch["mask"].shape[0]
        whole = jax.tree.map(gather, params, dims)
        _, drop = parts.keys(step)

        with constraints(constraint):
            g = parts.gradients(whole, model_state, batch, step, Rows(index * b, b * size),
                                jax.random.fold_in(drop, index), index)
        # Reduced once per update, after any accumulation over microbatches, by the gradients' placement.
        grads = jax.tree.map(reduce, g.grads, grad_dims)
        sums = {"loss": pmean(g.loss), "count": psum(g.count)}
        if g.correct is not None:
            sums["correct"] = psum(g.correct)
        return grads, (g.model_state if one else sync_statistics(parts.spec, g.model_state, data)), sums

    def local_eval(params: Any, model_state: Any, batch: Batch, step: jax.Array) -> Metrics:
        whole = jax.tree.map(gather, params, dims)
        with constraints(constraint):
            t, _ = parts.terms(whole, model_state, batch, step, train=False, rows=Rows(0, batch["mask"].shape[0]))
        return jax.tree.map(psum, eval_sums(t, batch["mask"]))

    def mapped(fn: Any, out: Any) -> Any:
        return jax.shard_map(fn, mesh=mesh, in_specs=(param_specs, state_specs, batch_specs, PartitionSpec()),
                             out_specs=out, axis_names=manual, check_vma=False)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        grads, model_state, sums = mapped(local_train, (grad_specs, state_specs, PartitionSpec()))(
            state.params, state.model_state, batch, state.step)
        metrics = parts.train_metrics(state, sums["loss"], sums.get("correct"), sums["count"], grads)
        return parts.apply_update(state, grads, model_state), metrics

    def eval_step(state: TrainState, batch: Batch) -> Metrics:
        return mapped(local_eval, PartitionSpec())(parts.eval_params(state), state.model_state, batch, state.step)

    batch_sharding = NamedSharding(outer, PartitionSpec(DATA))
    state_sh = shardings if layout.mesh is not None else jax.tree.map(
        lambda _: NamedSharding(outer, PartitionSpec()), shardings)
    batch_sh = {k: batch_sharding for k in batch_specs}
    replicated = NamedSharding(outer, PartitionSpec())
    train = jax.jit(train_step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, replicated),
                    donate_argnums=0)
    evaluate = jax.jit(eval_step, in_shardings=(state_sh, batch_sh), out_shardings=replicated)
    if layout.mesh is None:  # `single` keeps its state on one device; the program maps over a 1-device mesh
        return Steps(train=train, evaluate=evaluate, place=lambda hb: place_batch(hb, batch_sharding),
                     adopt=jax.jit(lambda s: s, out_shardings=state_sh),
                     release=jax.jit(lambda s: s, out_shardings=shardings))
    return Steps(train=train, evaluate=evaluate, place=lambda hb: place_batch(hb, batch_sharding))


def pmap_steps(parts: StepParts, layout: Layout, shardings: TrainState, batch_keys: tuple[str, ...]) -> Steps:
    mesh = _mesh(layout)
    axis = data_axis_name(parts.spec, PMAP_AXIS)
    devices = list(mesh.devices.flat)
    n = len(devices)
    stacked = NamedSharding(mesh, PartitionSpec(DATA))
    local_devices = [d for d in devices if d.process_index == jax.process_index()]

    def device_train(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        index = jax.lax.axis_index(axis)
        b = batch["mask"].shape[0]
        _, drop = parts.keys(state.step)

        g = parts.gradients(state.params, state.model_state, batch, state.step, Rows(index * b, b * n),
                            jax.random.fold_in(drop, index), index)
        grads = jax.lax.pmean(g.grads, axis)
        correct = None if g.correct is None else jax.lax.psum(g.correct, axis)
        metrics = parts.train_metrics(state, jax.lax.pmean(g.loss, axis), correct, jax.lax.psum(g.count, axis), grads)
        return parts.apply_update(state, grads, sync_statistics(parts.spec, g.model_state, axis)), metrics

    def device_eval(state: TrainState, batch: Batch) -> Metrics:
        t, _ = parts.terms(parts.eval_params(state), state.model_state, batch, state.step, train=False,
                           rows=Rows(0, batch["mask"].shape[0]))
        return jax.tree.map(lambda x: jax.lax.psum(x, axis), eval_sums(t, batch["mask"]))

    def place(host: HostBatch) -> Batch:
        k = len(local_devices)
        return {name: jax.make_array_from_process_local_data(stacked, v.reshape(k, v.shape[0] // k, *v.shape[1:]))
                for name, v in host.items()}

    def stack(state: TrainState) -> TrainState:
        return jax.tree.map(lambda x: jax.numpy.broadcast_to(x[None], (n, *x.shape)), state)

    train = jax.pmap(device_train, axis_name=axis, devices=devices, donate_argnums=0)
    evaluate = jax.pmap(device_eval, axis_name=axis, devices=devices)
    adopt = jax.jit(stack, out_shardings=jax.tree.map(lambda _: stacked, shardings))
    release = jax.jit(lambda s: jax.tree.map(lambda x: x[0], s), out_shardings=shardings)
    return Steps(train=train, evaluate=evaluate, place=place, adopt=adopt, release=release)


def make_steps(cfg: Config, task: Task, spec: ModelSpec, layout: Layout, tx: optax.GradientTransformation,
               batch_keys: tuple[str, ...], total_steps: int = 0) -> Steps:
    """The steps of `cfg.parallel.spmd` for a state laid out as `state_shardings` places it; `batch_keys` are the
    dataset's columns (the mask comes on top); `total_steps`, the run's length, for the learning-rate schedule
    and augmentation that changes over training (0: not known, for a step compiled only to be measured)."""
    check_style(cfg.parallel.spmd, layout)
    parts = StepParts(cfg, task, spec, tx, learning_rate(cfg.optim, total_steps), total_steps)
    builders = {"jit": jit_steps, "shard_map": shard_map_steps, "pmap": pmap_steps}
    steps = builders[cfg.parallel.spmd](parts, layout, state_shardings(spec, layout, tx), batch_keys)
    return replace(steps, gradient_shardings=gradient_shardings(spec, layout))
