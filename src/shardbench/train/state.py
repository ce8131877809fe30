"""The train state (step, parameters, optimizer state) and its creation directly in its shardings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.models import axis_fields, build_model, custom
from shardbench.parallel.rules import Layout, param_axes, param_shapes

Params = dict[str, Any]


@jax.tree_util.register_dataclass
@dataclass
class TrainState:
    """Everything that changes during training and is checkpointed."""

    step: jax.Array
    params: Params
    opt_state: optax.OptState


@dataclass(frozen=True)
class ModelSpec:
    """A model's structure without its values: enough to shard, check and rebuild it."""

    graphdef: nnx.GraphDef
    abstract: nnx.State  # parameters as ShapeDtypeStructs, with their logical axes
    axes: Params  # logical axes per parameter, as a nested dict
    shapes: Params
    axis_fields: dict[str, str]  # which configuration field each logical axis comes from
    takes_rng: bool = True  # the model's __call__ takes the step's key as `rng`
    unmapped: tuple[str, ...] = ()  # a model of your own: axis names no strategy table maps (kept whole)
    rngs: nnx.State | None = None  # a model of your own that keeps RNG streams (flax's linen bridge): held fixed

    def apply(self, params: Params, inputs: jax.Array, rng: jax.Array | None) -> jax.Array:
        """Run the model on `params` (a pure dict, as held in TrainState)."""
        state = jax.tree.map(lambda x: x, self.abstract)  # fresh Variables for this trace
        nnx.replace_by_pure_dict(state, params)
        streams = () if self.rngs is None else (jax.tree.map(lambda x: x, self.rngs),)  # fresh, in this trace
        model = nnx.merge(self.graphdef, state, *streams)
        return model(inputs, rng=rng) if self.takes_rng else model(inputs)


def describe_model(cfg: Config) -> ModelSpec:
    """Trace the model's construction abstractly: no parameter is materialised."""
    try:
        model = nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(cfg.train.seed)))
    except ConfigError:
        raise
    except Exception as err:
        if not cfg.model.factory:
            raise
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"--model {cfg.model.factory}: building the model failed: {type(err).__name__}: "
                          f"{first}") from None
    if not cfg.model.factory:
        graphdef, abstract = nnx.split(model, nnx.Param)
        return ModelSpec(graphdef, abstract, param_axes(abstract), param_shapes(abstract), axis_fields(cfg))
    graphdef, abstract, streams, rest = nnx.split(model, nnx.Param, nnx.RngState, ...)
    held = [(path, type(var).__name__) for path, var in nnx.to_flat_state(rest)]
    if held:
        path, kind = held[0]
        raise ConfigError(
            f"--model {cfg.model.factory}: the module holds state other than parameters ({'/'.join(map(str, path))}: "
            f"{kind}{f' and {len(held) - 1} more' if len(held) > 1 else ''}); shardbench trains nnx.Param only: "
            f"use LayerNorm rather than BatchNorm")
    axes, unmapped = custom.logical_axes(abstract, custom.parse_rules(cfg.parallel.rules))
    rngs = None
    if jax.tree.leaves(streams):  # their values, without materialising a parameter (XLA drops the rest)
        rngs = jax.jit(lambda: nnx.split(build_model(cfg, nnx.Rngs(cfg.train.seed)), nnx.Param, nnx.RngState)[2])()
    return ModelSpec(graphdef, abstract, axes, param_shapes(abstract), axis_fields(cfg), custom.takes_rng(model),
                     unmapped, rngs)


def check_layout(spec: ModelSpec, layout: Layout) -> None:
    layout.check_divisible(spec.axes, spec.shapes, spec.axis_fields)


def state_shardings(spec: ModelSpec, layout: Layout, tx: optax.GradientTransformation) -> TrainState:
    """Shardings for every leaf: optimizer moments follow their parameter, counters are replicated."""
    params = layout.param_shardings(spec.axes, spec.shapes)
    abstract_params = nnx.to_pure_dict(spec.abstract)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt = optax.tree_map_params(
        tx, lambda _, sharding: sharding, abstract_opt, params,
        transform_non_params=lambda _: layout.replicated,
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
    )
    return TrainState(step=layout.replicated, params=params, opt_state=opt)


def init_state(cfg: Config, spec: ModelSpec, layout: Layout, tx: optax.GradientTransformation) -> TrainState:
    """Create parameters and optimizer state inside one jit whose outputs are already sharded,
    so no array is ever materialised whole on one device."""
    shardings = state_shardings(spec, layout, tx)

    def create() -> TrainState:
        model = build_model(cfg, nnx.Rngs(cfg.train.seed))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    # On CPU, partitionable threefry (JAX's default) makes this program's compilation 4x slower (6.6 s against
    # 1.6 s for a 24k-parameter ViT, with or without a mesh); the CPU devices share one memory, so drawing each
    # array whole before it is split costs nothing there. Accelerators keep the partitionable draws, which never
    # materialise a whole array on one device.
    with jax.threefry_partitionable(layout.device.platform != "cpu"):
        return jax.jit(create, out_shardings=shardings)()


def abstract_train_state(spec: ModelSpec, layout: Layout, tx: optax.GradientTransformation) -> TrainState:
    """ShapeDtypeStructs with shardings: the target a checkpoint is restored into."""
    shardings = state_shardings(spec, layout, tx)
    params = nnx.to_pure_dict(spec.abstract)
    shapes = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                        opt_state=jax.eval_shape(tx.init, params))
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
