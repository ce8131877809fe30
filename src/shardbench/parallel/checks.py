"""Whether a layout can run, said before anything compiles: the SPMD style (`--spmd`) against the layout, the
model's dims against the layout's tactics, and the batch against its data axis."""

from __future__ import annotations

import math

import jax

from shardbench.errors import ConfigError
from shardbench.models.spec import ModelSpec, state_shapes
from shardbench.parallel.rules import Layout


def check_style(style: str, layout: Layout) -> None:
    """Say before any compilation when a style cannot run a layout."""
    if style == "pmap":
        if not hasattr(jax, "pmap"):
            raise ConfigError(f"--spmd pmap: this JAX ({jax.__version__}) no longer provides jax.pmap; use "
                              f"--spmd shard_map for explicit per-device programs")
        if layout.shape.model > 1:
            raise ConfigError(f"--spmd pmap maps over one axis of devices but --mesh {layout.shape} has a model axis "
                              f"of {layout.shape.model}: use a 1-D mesh (--mesh {layout.shape.size}) with --strategy "
                              f"dp, or --spmd jit / shard_map for 2-D meshes")
        if not layout.strategy.replicates_everything:
            raise ConfigError(f"--spmd pmap replicates parameters on every device, with their gradients and "
                              f"optimizer state (data parallelism), so it cannot run --strategy "
                              f"{layout.strategy.name}: use --strategy dp, or --spmd shard_map / jit")


def check_layout(spec: ModelSpec, layout: Layout) -> None:
    """Every dim of the model's parameters, and of its other variables, that a tactic splits divides by its axis."""
    layout.check_divisible(spec.axes, spec.shapes, spec.axis_fields)
    if spec.state_axes:
        layout.check_divisible(spec.state_axes, state_shapes(spec), spec.axis_fields)


def check_batch(flag: str, size: int, layout: Layout) -> None:
    """A batch splits evenly over the data axis, and over the processes that each read their own share of it."""
    divisor = layout.data_size
    if size % divisor == 0:
        divisor = math.lcm(divisor, layout.process_share(size)[1])
    if size % divisor:
        raise ConfigError(
            f"{flag} {size} is not divisible by the data-parallel size {divisor} ({layout.strategy.name} on "
            f"mesh {layout.shape}): use a multiple of {divisor}"
        )


def check_accumulation(k: int, batch: int, spec: ModelSpec, layout: Layout) -> None:
    """`--train.grad-accum K` splits each data shard's examples into K microbatches of equal size, and a model
    that keeps batch statistics would normalise each microbatch by its own, which no full batch does."""
    if k == 1:
        return
    per = batch // layout.data_size
    if per % k:
        works = [str(d) for d in range(2, per + 1) if per % d == 0]
        instead = (f"--train.grad-accum {' or '.join(works[:5])}{' or more' if len(works) > 5 else ''}" if works
                   else "--train.grad-accum 1")
        raise ConfigError(f"--train.grad-accum {k} does not divide the {per} examples per data shard (--batch-size "
                          f"{batch} over {layout.data_size} data shards, {layout.strategy.name} on mesh "
                          f"{layout.shape}): use {instead}, or a batch of {k * layout.data_size * -(-per // k)}")
    if spec.has_statistics:
        raise ConfigError(f"--train.grad-accum {k}: the model keeps BatchNorm statistics, which would be each "
                          f"microbatch's rather than the batch's: train it with --train.grad-accum 1")
