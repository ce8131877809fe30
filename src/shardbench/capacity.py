"""Whether a run's train state fits its devices, checked before anything is compiled or written: the bytes the
fullest device holds as the layout places them, against one device's memory (the runtime's limit on a GPU or TPU;
on a CPU the host's memory split over the run's devices). Twice: the parameters alone, as soon as the layout is
known (`check_fits`), then the whole train state once the optimizer is (`check_state_fits`): parameters, optimizer
state (Adam's two moments, an EMA) and the model's other variables, which every device holds through the whole step.
Each is a lower bound on what a run needs (gradients and activations come on top), so a run this refuses could
never have fitted."""

from __future__ import annotations

import math
import os
from typing import Any

import jax
from flax import nnx, traverse_util

from shardbench.config import Config, flag_name
from shardbench.errors import ConfigError
from shardbench.models.spec import ModelSpec
from shardbench.parallel.rules import Layout
from shardbench.units import format_bytes


def param_bytes_per_device(spec: ModelSpec, layout: Layout) -> int:
    """Bytes of parameters one device holds as the layout places them (`shard_bytes` of the abstract parameters
    in the layout's shardings, after `check_layout` has found every split dim divisible), each in its own dtype,
    the run's --param-dtype for the built-in models."""
    shardings = layout.param_shardings(spec.axes, spec.shapes)
    return shard_bytes(jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
                                    nnx.to_pure_dict(spec.abstract), shardings))


def shard_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of `jax.ShapeDtypeStruct`s with shardings (an abstract train state): each
    leaf's shard shape in its dtype. Python ints, so a state of any size is counted."""
    return sum(math.prod(int(d) for d in leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               for leaf in jax.tree.leaves(tree))


def device_memory(layout: Layout) -> tuple[int, str] | None:
    """(bytes, how said) of one of the run's devices: the runtime's limit where it gives one (GPU, TPU); on a CPU,
    the host's memory split over the run's devices (simulated devices share it); None where neither is known."""
    device = layout.device
    try:
        stats = device.memory_stats()
    except Exception:  # a backend without the call
        stats = None
    if stats and stats.get("bytes_limit"):
        limit = int(stats["bytes_limit"])
        return limit, f"a {device.platform} device has {format_bytes(limit)}"
    if device.platform != "cpu":
        return None
    try:  # the host's physical memory: the most any run could have (a lower bound stays one)
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    mesh = layout.mesh
    n = 1 if mesh is None else sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
    if n <= 1:
        return host, f"a cpu device has {format_bytes(host)}"
    return host // n, f"a cpu device has {format_bytes(host // n)} (this host's {format_bytes(host)} over {n} devices)"


def size_flags(cfg: Config, spec: ModelSpec) -> str:
    """The flags (with their values) of the largest parameter's dims but those of size 1, e.g. '--model.mlp-dim
    4096'; 'the model' where they come from no flag (a model of your own)."""
    flat = traverse_util.flatten_dict(spec.shapes)
    axes = traverse_util.flatten_dict(spec.axes)
    path = max(flat, key=lambda p: math.prod(flat[p]))
    keys = dict.fromkeys(spec.axis_fields[a] for a, size in zip(axes[path], flat[path])
                         if a in spec.axis_fields and size > 1)
    if not keys:
        return "the model"
    return " ".join(f"{flag_name(k)} {getattr(getattr(cfg, k.split('.')[0]), k.split('.')[1])}" for k in keys)


def _advice(tactics: tuple[object, ...], splitting: str) -> str:
    """What would make room: more devices where `tactics` split the part already, else a strategy that does."""
    if tactics:
        return "more devices, with sizes they divide (a dim the mesh does not divide stays whole)"
    return f"a strategy that splits {splitting}"


def check_fits(cfg: Config, spec: ModelSpec, layout: Layout) -> None:
    """Refuse a run whose parameters alone, as the layout places them, exceed one device's memory: a lower bound
    on what the run needs (gradients, optimizer state and activations come on top), so nothing that fits is
    refused. Skipped where the device's memory is not known."""
    memory = device_memory(layout)
    if memory is None:
        return
    limit, said = memory
    held = param_bytes_per_device(spec, layout)
    if held <= limit:
        return
    raise ConfigError(f"{size_flags(cfg, spec)}: the parameters alone are {format_bytes(held)} on each device "
                      f"({layout.strategy.name} on mesh {layout.shape}), and {said}; use a smaller model or "
                      f"{_advice(layout.strategy.params, 'the parameters (fsdp, tp)')}")


def check_state_fits(cfg: Config, spec: ModelSpec, layout: Layout, params: Any, state: Any) -> None:
    """Refuse a run whose train state (`state`, abstract, with its shardings; `params` its parameters), as the
    layout places it, exceeds one device's memory: every device holds it through the whole step, so it is a lower
    bound too. Skipped where the device's memory is not known."""
    memory = device_memory(layout)
    if memory is None:
        return
    limit, said = memory
    held = shard_bytes(state)
    if held <= limit:
        return
    of_params = shard_bytes(params)
    lighter = (", --optim.mu-dtype bfloat16 (Adam's first moment in half the bytes)"
               if cfg.optim.optimizer in ("adam", "adamw") and not cfg.optim.mu_dtype
               and cfg.precision.param_dtype == "float32" else "")
    raise ConfigError(f"{size_flags(cfg, spec)}: the train state alone is {format_bytes(held)} on each device "
                      f"(parameters {format_bytes(of_params)}, optimizer state and other variables "
                      f"{format_bytes(held - of_params)}; {layout.strategy.name} on mesh {layout.shape}), and {said}; "
                      f"use a smaller model{lighter} or "
                      f"{_advice(layout.strategy.optimizer_tactics, 'the optimizer state (zero1, zero2, fsdp, tp)')}")
