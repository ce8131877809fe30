"""The train state (step, parameters, optimizer state, the model's other variables) and its creation directly in
its shardings."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from shardbench.config import Config
from shardbench.models import build_model
from shardbench.models.spec import ModelSpec, Params, state_shapes, stored_state
from shardbench.parallel.pipeline import schedule_repeats, store_in_stage_order, uses_pipeline
from shardbench.parallel.rules import Layout, is_axes


@jax.tree_util.register_dataclass
@dataclass
class TrainState:
    """Everything that changes during training and is checkpointed."""

    step: jax.Array
    params: Params
    opt_state: optax.OptState
    # A model of your own: its variables other than parameters (BatchNorm statistics, RNG streams with their
    # keys as raw uint32 data, Variables of its own), as a nested dict; empty for the built-in models.
    model_state: Params = field(default_factory=dict)


def model_state_shardings(spec: ModelSpec, layout: Layout) -> Params:
    """The non-parameter variables: replicated, unless their metadata names axes; then the strategy's table
    places them as it places parameters."""
    def one(axes: tuple[str | None, ...], shape: tuple[int, ...]) -> jax.sharding.Sharding:
        if all(a is None for a in axes):
            return layout.replicated
        return layout.sharding(layout.param_spec(axes, shape))

    return jax.tree.map(one, spec.state_axes, state_shapes(spec), is_leaf=is_axes)


def state_shardings(spec: ModelSpec, layout: Layout, tx: optax.GradientTransformation) -> TrainState:
    """Shardings for every leaf: optimizer moments are placed by the strategy's optimizer tactics (its
    parameter's placement unless the strategy says otherwise, as ZeRO-1/2 do), counters are replicated."""
    model_state = model_state_shardings(spec, layout)
    params = layout.param_shardings(spec.axes, spec.shapes)
    moments = layout.shardings(layout.strategy.optimizer_tactics, spec.axes, spec.shapes)
    abstract_params = nnx.to_pure_dict(spec.abstract)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt = optax.tree_map_params(
        tx, lambda _, sharding: sharding, abstract_opt, moments,
        transform_non_params=lambda _: layout.replicated,
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
    )
    return TrainState(step=layout.replicated, params=params, opt_state=opt,
                      model_state=model_state)


def gradient_shardings(spec: ModelSpec, layout: Layout) -> Params | None:
    """Where the step hands the gradients to the optimizer, a tree like the parameters; None where the strategy
    places them as the parameters (every strategy but ZeRO-2), which is how the step leaves them by default."""
    if layout.strategy.gradients is None:
        return None
    return layout.shardings(layout.strategy.gradients, spec.axes, spec.shapes)


def init_state(cfg: Config, spec: ModelSpec, layout: Layout, tx: optax.GradientTransformation) -> TrainState:
    """Create parameters and optimizer state inside one jit whose outputs are already sharded,
    so no array is ever materialised whole on one device."""
    shardings = state_shardings(spec, layout, tx)

    def create() -> TrainState:
        model = build_model(cfg, nnx.Rngs(cfg.train.seed))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        if uses_pipeline(layout):  # circular: each stage's chunks where its devices hold the stack
            params = store_in_stage_order(params, spec.axes, layout.shape.stage, schedule_repeats(cfg.parallel))
        rest = stored_state(nnx.state(model, nnx.Not(nnx.Param))) if spec.custom else {}
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                          model_state=rest)

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
                        opt_state=jax.eval_shape(tx.init, params), model_state=spec.state_stored)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
