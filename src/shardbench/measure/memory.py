"""Memory per device: the runtime's peak where reported, the compiled program's analysis, and a breakdown.

The breakdown names what the bytes are: parameters and optimizer state are the per-device shards of the
train state (each leaf counted in its own dtype: a bfloat16 first moment, --optim.mu-dtype, counts 2 bytes), and a model of your own's other variables (BatchNorm statistics, RNG
streams, Variables of its own) are its model state; gradients are counted from their own buffers (shapes, dtypes
and layout of what the step differentiates: `gradient_buffers`); activations and other temporaries are the
compiled temporaries minus the gradients. So a change of compute dtype moves only the last figure, which is why
precision alone barely moves memory when the batch is small. Everything is returned as the run record's own types
(`shardbench.measure.run_record`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from shardbench.measure.run_record import Breakdown, Memory

if TYPE_CHECKING:  # JAX where arrays are counted: the breakdown's arithmetic, which the planner shares, needs none
    import jax


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of the arrays (or ShapeDtypeStructs with shardings) in `tree`."""
    import jax

    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += math.prod(shape) * leaf.dtype.itemsize
    return total


def device_bytes(tree: Any) -> dict[int, int]:
    """Bytes each of this process's devices holds of the arrays in `tree`, by device id, counted from the
    shards that are really there (so uneven or replicated layouts count what they hold)."""
    import jax

    out: dict[int, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", ()):
            shape = [len(range(*sl.indices(dim))) for sl, dim in zip(shard.index, leaf.shape)]
            out[shard.device.id] = out.get(shard.device.id, 0) + math.prod(shape) * leaf.dtype.itemsize
    return out


def compiled_memory(compiled: Any) -> dict[str, int] | None:
    try:
        stats = compiled.memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    return {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "generated_code_bytes": int(stats.generated_code_size_in_bytes),
    }


def runtime_peak(devices: list[jax.Device]) -> int | None:
    """Largest 'peak_bytes_in_use' over local devices; None where the backend keeps no such count (CPU)."""
    peaks = []
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


def per_device_report(params: Any, opt_state: Any, devices: list[jax.Device],
                      model_state: Any = None) -> list[dict[str, Any]]:
    """One entry per device of this process: what it holds of the state, and its runtime peak where known."""
    params_b, opt_b, model_b = device_bytes(params), device_bytes(opt_state), device_bytes(model_state)
    return [{"device": d.id, "process": d.process_index, "params_bytes": params_b.get(d.id, 0),
             "optimizer_bytes": opt_b.get(d.id, 0), "model_state_bytes": model_b.get(d.id, 0),
             "peak_bytes_in_use": runtime_peak([d])} for d in devices]


def compiled_total(analysis: dict[str, int]) -> int:
    """XLA's compiled total: arguments + outputs - aliased + temporaries."""
    return (analysis["argument_bytes"] + analysis["output_bytes"] - analysis["alias_bytes"]
            + analysis["temp_bytes"])


def gradient_buffers(params: Any, shardings: Any = None) -> Any:
    """The gradients a step computes of `params`, as abstract arrays: shapes and dtypes as JAX's
    differentiation gives them (traced, not copied from the parameters: a cotangent of an integer leaf has no
    bytes), laid out by `shardings`, a tree like `params`: the strategy's gradient placement
    (`shardbench.train.state.gradient_shardings`; default, None: each parameter's own sharding, which is how
    every strategy's step but ZeRO-2's hands its gradients to the optimizer)."""
    import jax

    def loss(p: Any) -> jax.Array:
        return sum((x.astype(jax.numpy.float32).sum() for x in jax.tree.leaves(p)
                    if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)), jax.numpy.float32(0))

    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    grads = jax.eval_shape(jax.grad(loss, allow_int=True), abstract)
    if shardings is None:
        shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), params)
    return jax.tree.map(lambda g, s: jax.ShapeDtypeStruct(g.shape, g.dtype, sharding=s), grads, shardings)


def breakdown(analysis: dict[str, int], params_b: int, opt_b: int, model_b: int, grads_b: int) -> Breakdown:
    """The one breakdown of a compiled step's memory, for a run's record and for a plan alike: the state's
    parts and the gradients are counted from their own buffers; the activations are the compiled temporaries
    beyond the gradients (which XLA holds among its temporaries); `other` is the rest of the compiled total (the
    batch among the arguments, outputs not aliased to a donated input: the metrics)."""
    activations = max(analysis["temp_bytes"] - grads_b, 0)
    other = max(compiled_total(analysis) - params_b - opt_b - model_b - grads_b - activations, 0)
    return Breakdown(params_bytes=params_b, optimizer_bytes=opt_b, model_state_bytes=model_b,
                     gradients_bytes=grads_b, activations_temporaries_bytes=activations, other_bytes=other)


def memory_report(compiled: Any, params: Any, opt_state: Any, devices: list[jax.Device], *, gradients: Any,
                  model_state: Any = None) -> Memory:
    """The record's `Memory` of one device: the runtime peak, the compiled analysis and the breakdown;
    `gradients` are the step's gradient buffers (`gradient_buffers`), `model_state` a model of your own's
    non-parameter variables (None or empty for the built-in models)."""
    analysis = compiled_memory(compiled)
    parts = None if analysis is None else breakdown(analysis, per_device_bytes(params), per_device_bytes(opt_state),
                                                     per_device_bytes(model_state), per_device_bytes(gradients))
    return Memory(peak_bytes_in_use=runtime_peak(devices), compiled=analysis,
                  total_bytes=None if analysis is None else compiled_total(analysis), breakdown=parts)
