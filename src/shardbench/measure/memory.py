"""Memory per device: the runtime's peak where reported, the compiled program's analysis, and a breakdown.

The breakdown names what the bytes are: parameters and optimizer state are the per-device shards of the
train state (each leaf counted in its own dtype: a bfloat16 first moment, --optim.mu-dtype, counts 2 bytes), and a model of your own's other variables (BatchNorm statistics, RNG
streams, Variables of its own) are its model state; gradients are laid out like the parameters; activations
and other temporaries are the compiled temporaries minus the gradients. So a change of compute dtype moves only the
last figure, which is why precision alone barely moves memory when the batch is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


def per_device_report(params: Any, opt_state: Any, devices: list[jax.Device],
                      model_state: Any = None) -> list[dict[str, Any]]:
    """One entry per device of this process: what it holds of the state, and its runtime peak where known."""
    params_b, opt_b, model_b = device_bytes(params), device_bytes(opt_state), device_bytes(model_state)
    return [{"device": d.id, "process": d.process_index, "params_bytes": params_b.get(d.id, 0),
             "optimizer_bytes": opt_b.get(d.id, 0), "model_state_bytes": model_b.get(d.id, 0),
             "peak_bytes_in_use": runtime_peak([d])} for d in devices]


@dataclass(frozen=True)
class Breakdown:
    """One device's bytes by what they hold; the parts add up to `total_bytes`."""

    params_bytes: int
    optimizer_bytes: int
    model_state_bytes: int
    gradients_bytes: int
    activations_bytes: float  # the compiled temporaries minus the gradients, scaled where another compiler's
    other_bytes: int  # the batch among the arguments, outputs not aliased to a donated input (the metrics)
    runtime_bytes: float  # what the runtime holds beyond the compiled program (0 where it is not estimated)

    @property
    def total_bytes(self) -> float:
        return (self.params_bytes + self.optimizer_bytes + self.model_state_bytes + self.gradients_bytes
                + self.activations_bytes + self.other_bytes + self.runtime_bytes)


def compiled_total(analysis: dict[str, int]) -> int:
    """XLA's compiled total: arguments + outputs - aliased + temporaries."""
    return (analysis["argument_bytes"] + analysis["output_bytes"] - analysis["alias_bytes"]
            + analysis["temp_bytes"])


def breakdown(analysis: dict[str, int], params_b: int, opt_b: int, model_b: int = 0, *,
              activation_scale: float = 1.0, runtime_bytes: float = 0.0) -> Breakdown:
    """The one breakdown of a compiled step's memory, for a run's record and for a plan alike: gradients are
    laid out like the parameters, the activations are the temporaries beyond them (times `activation_scale`
    where another compiler's temporaries stand in for the target's), the rest of the compiled total beyond the
    state is `other`. Unscaled and without runtime bytes, the parts add up to the compiled total."""
    grads_b = params_b
    activations = max(analysis["temp_bytes"] - grads_b, 0)
    other = max(compiled_total(analysis) - params_b - opt_b - model_b - grads_b - activations, 0)
    return Breakdown(params_b, opt_b, model_b, grads_b, activations * activation_scale, other, runtime_bytes)


def memory_report(compiled: Any, params: Any, opt_state: Any, devices: list[jax.Device],
                  model_state: Any = None) -> dict[str, Any]:
    """The peak, the compiled analysis and the breakdown of one device's bytes; `model_state` is a model of
    your own's non-parameter variables (None or empty for the built-in models)."""
    analysis = compiled_memory(compiled)
    params_b = per_device_bytes(params)
    opt_b = per_device_bytes(opt_state)
    model_b = per_device_bytes(model_state)
    report: dict[str, Any] = {"peak_bytes_in_use": runtime_peak(devices), "compiled": analysis}
    parts = breakdown(analysis, params_b, opt_b, model_b) if analysis is not None else None
    report["total_bytes"] = compiled_total(analysis) if analysis is not None else None
    report["breakdown"] = {"params_bytes": params_b, "optimizer_bytes": opt_b, "model_state_bytes": model_b,
                           "gradients_bytes": params_b,
                           "activations_temporaries_bytes": None if parts is None else int(parts.activations_bytes),
                           "other_bytes": None if parts is None else parts.other_bytes}
    return report
