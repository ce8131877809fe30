"""Memory per device: the runtime's peak where reported, the compiled program's analysis, and a breakdown.

The breakdown names what the bytes are: parameters and optimizer state are the per-device shards of the
train state (in the parameter dtype); gradients are laid out like the parameters; activations and other
temporaries are the compiled temporaries minus the gradients. So a change of compute dtype moves only the
last figure, which is why precision alone barely moves memory when the batch is small.
"""

from __future__ import annotations

import math
from typing import Any

import jax


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of the arrays (or ShapeDtypeStructs with shardings) in `tree`."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += math.prod(shape) * leaf.dtype.itemsize
    return total


def device_bytes(tree: Any) -> dict[int, int]:
    """Bytes each of this process's devices holds of the arrays in `tree`, by device id, counted from the
    shards that are really there (so uneven or replicated layouts count what they hold)."""
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


def per_device_report(params: Any, opt_state: Any, devices: list[jax.Device]) -> list[dict[str, Any]]:
    """One entry per device of this process: what it holds of the state, and its runtime peak where known."""
    params_b, opt_b = device_bytes(params), device_bytes(opt_state)
    return [{"device": d.id, "process": d.process_index, "params_bytes": params_b.get(d.id, 0),
             "optimizer_bytes": opt_b.get(d.id, 0), "peak_bytes_in_use": runtime_peak([d])} for d in devices]


def memory_report(compiled: Any, params: Any, opt_state: Any, devices: list[jax.Device]) -> dict[str, Any]:
    analysis = compiled_memory(compiled)
    params_b = per_device_bytes(params)
    opt_b = per_device_bytes(opt_state)
    grads_b = params_b
    report: dict[str, Any] = {"peak_bytes_in_use": runtime_peak(devices), "compiled": analysis}
    if analysis is not None:
        report["total_bytes"] = (analysis["argument_bytes"] + analysis["output_bytes"]
                                 - analysis["alias_bytes"] + analysis["temp_bytes"])
        activations = max(analysis["temp_bytes"] - grads_b, 0)
    else:
        report["total_bytes"] = None
        activations = None
    # What the compiled total holds beyond the state and the temporaries: the batch among the arguments,
    # and outputs not aliased to a donated input (the step's metrics), so the parts add up to the total.
    other = (None if report["total_bytes"] is None or activations is None
             else max(report["total_bytes"] - params_b - opt_b - grads_b - activations, 0))
    report["breakdown"] = {"params_bytes": params_b, "optimizer_bytes": opt_b, "gradients_bytes": grads_b,
                           "activations_temporaries_bytes": activations, "other_bytes": other}
    return report
