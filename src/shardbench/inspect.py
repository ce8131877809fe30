"""What `shardbench inspect` prints: the parameter table under a layout, and pictures of arrays over the mesh.

Nothing is allocated or compiled: shapes and shardings come from the abstract model.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx


from shardbench import config as config_lib
from shardbench import models
from shardbench.config import Config
from shardbench.validation import inert_notes
from shardbench.errors import ConfigError
from shardbench.measure.memory import gradient_buffers, per_device_bytes
from shardbench.measure.params import ParamRow, format_placements, format_table, param_table, picture
from shardbench.models.axes import EXPERT, LAYERS
from shardbench.parallel.mesh import DATA, MESH_AXES, MODEL, SEQUENCE, STAGE
from shardbench.parallel.rules import Layout, flat_by_path
from shardbench.optim import build_optimizer
from shardbench.preflight import check_runnable
from shardbench.models.spec import ModelSpec
from shardbench.parallel.checks import layout_notes, sequence_length
from shardbench.parallel.context import positions, uses_context
from shardbench.parallel.pipeline import (
    bubble_fraction, microbatch_count, schedule_repeats, stage_layers, uses_pipeline,
)
from shardbench.train.state import abstract_train_state, gradient_shardings

DEFAULT_ARRAY = "encoder/mlp2_kernel"  # the seed pictured the second MLP layer's kernel
# Per model kind: the array pictured by default, and the batch's shape and name.
DEFAULT_ARRAYS = {"vit": DEFAULT_ARRAY, "lm": "blocks/mlp2_kernel", "mlp": "hidden_kernel"}


def _batch(cfg: Config) -> tuple[str, tuple[int, ...]]:
    b, m = cfg.train.batch_size, cfg.model
    if m.kind == "lm":
        return "batch tokens", (b, m.seq_len + 1)
    if m.kind == "mlp":
        return "batch inputs", (b, m.input_dim)
    return "batch images", (b, cfg.data.image_size, cfg.data.image_size, 3)


def model_state_lines(spec: ModelSpec, model_state: Any) -> list[str]:
    """A model of your own's variables besides its parameters (BatchNorm statistics, RNG streams, Variables of
    its own): one line each with its layout, then their bytes per device, which the step carries too."""
    kinds = {"/".join(map(str, p)): type(v).__name__ for p, v in nnx.to_flat_state(spec.state_abstract)}
    lines = [f"model state ({', '.join(spec.state_kinds)}): carried and checkpointed with the parameters; "
             f"replicated unless its metadata names axes"]
    for path, leaf in sorted(flat_by_path(model_state).items()):
        device_shape = tuple(leaf.sharding.shard_shape(leaf.shape))
        lines.append(f"  {path}  {kinds.get(path, '')}  {tuple(leaf.shape)} {leaf.dtype}  per device "
                     f"{device_shape}  {math.prod(device_shape) * leaf.dtype.itemsize:,} bytes")
    lines.append(f"model state: {per_device_bytes(model_state):,} bytes per device")
    return lines


def pipeline_lines(cfg: Config, rows: list[ParamRow], layout: Layout) -> list[str]:
    """The schedule (microbatches, iterations, the bubble), and which layers each stage holds, on which devices,
    and what else splits them within a stage (fsdp+pp over data, pp+tp over model): the PartitionSpec column
    says it per parameter."""
    stages, m = layout.shape.stage, microbatch_count(cfg.parallel.microbatches, layout)
    schedule, r = cfg.parallel.schedule, schedule_repeats(cfg.parallel)
    stacked = [row for row in rows if LAYERS in row.axes]
    depth = stacked[0].shape[stacked[0].axes.index(LAYERS)]
    work = {"gpipe": f"{m + stages - 1} iterations per pass, each stage idle (S-1)/(M+S-1)",
            "1f1b": f"{m + stages - 1} forward and as many backward slots, each stage idle (S-1)/(M+S-1)",
            "circular": f"{r} repeats, {r * m + stages - 1} iterations of 1/{r} of a stage's layers, each stage "
                        f"idle (S-1)/(R*M+S-1)"}[schedule]
    within = sorted({a for row in stacked for a in row.spec if a not in (None, STAGE)}, key=MESH_AXES.index)
    split = (f" (within its stage, each stacked parameter is split further over {' and '.join(within)}, as its "
             f"PartitionSpec says)" if within else "")
    lines = [f"pipeline ({schedule}): {stages} stages, each holding 1/{stages} of every stacked parameter (its "
             f"layers dim over stage, above)",
             f"{m} microbatches of {_microbatch_rows(cfg, layout, m)}; {work} = "
             f"{bubble_fraction(stages, m, r):.1%} of them (the bubble)",
             f"which stage holds which layers, on which devices{split}:"]
    devices = layout.mesh.devices if layout.mesh is not None else None
    for s in range(stages):
        ids = ",".join(str(d.id) for d in np.take(devices, s, axis=MESH_AXES.index(STAGE)).flat)
        lines.append(f"  stage {s}: layers {_spans(stage_layers(s, depth, stages, r))} on devices {ids}")
    return lines


def _microbatch_rows(cfg: Config, layout: Layout, m: int) -> str:
    """A pipeline microbatch's examples: the batch over --train.grad-accum's parts, then over M, then per data
    shard where the data axis splits it."""
    k, data = cfg.train.grad_accum, layout.data_size
    rows = cfg.train.batch_size // k // m
    text = f"{rows} examples" + (f" ({rows // data} per data shard)" if data > 1 else "")
    return text + (f", in each of the {k} accumulated parts of the batch (--train.grad-accum {k})" if k > 1 else "")


def context_lines(cfg: Config, layout: Layout) -> list[str]:
    """Which tokens of the sequence each device's block holds, by their true positions (head-tail: chunks i and
    2N-1-i), on which devices, and how attention reaches the others' keys and values."""
    n, length, order = layout.shape.seq, sequence_length(cfg), cfg.parallel.context_order
    table = positions(length, n, order).reshape(n, -1)
    how = {"all-gather": "each device gathers every key and value (an all-gather per layer, a reduce-scatter of "
                         "their gradients back)",
           "ring": f"key/value blocks passed around the seq axis, {n - 1} ppermutes per layer forward and as many "
                   f"back, an online softmax"}[cfg.parallel.context]
    lines = [f"context ({cfg.parallel.context}, {order}): {length} tokens over {n} seq devices, {length // n} each; "
             f"{how}", "which tokens each seq block holds (true positions), on which devices:"]
    devices = layout.mesh.devices if layout.mesh is not None else None
    for i in range(n):
        ids = ",".join(str(d.id) for d in np.take(devices, i, axis=MESH_AXES.index(SEQUENCE)).flat)
        lines.append(f"  seq {i}: tokens {_spans(sorted(table[i].tolist()))} on devices {ids}")
    return lines


def expert_lines(rows: list[ParamRow], layout: Layout) -> list[str]:
    """Which experts each device holds (of every block: the stacked experts share their placement), read off the
    sharding of the first parameter with an expert dim; devices holding the same experts on one line."""
    row = next(r for r in rows if EXPERT in r.axes)
    dim, count = row.axes.index(EXPERT), row.shape[row.axes.index(EXPERT)]
    held: dict[str, list[int]] = {}
    for device, index in sorted(layout.sharding(row.spec).devices_indices_map(row.shape).items(),
                                key=lambda item: item[0].id):
        part = index[dim]
        start, stop = part.start or 0, count if part.stop is None else part.stop
        held.setdefault(_spans(list(range(start, stop))), []).append(device.id)
    split = row.spec[dim] if dim < len(row.spec) else None
    lines = [f"experts: {count} per block, {'split over ' + str(split) if split else 'whole on every device'} "
             f"({row.path}); which devices hold which experts:"]
    lines += [f"  experts {experts} on devices {_spans(ids) if len(ids) > 2 else ','.join(map(str, ids))}"
              for experts, ids in held.items()]
    return lines


def _spans(layers: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2, 5-6'."""
    spans: list[list[int]] = []
    for n in layers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def kernel_lines(cfg: Config, layout: Layout) -> list[str]:
    """The attention and the q/k/v projection the blocks will run on these devices, `auto` resolved as the run
    record's `measurements.attention` and `qkv_layout` will say them; none for a model without shardbench's
    attention (the mlp, a model of your own)."""
    attention = models.attention_ran(cfg)
    if attention is None:
        return []
    ran = "context (the sequence split over seq brings its own)" if uses_context(layout) else attention
    return [f"attention: {ran} (--model.attention {cfg.model.attention}); q/k/v projection: "
            f"{models.qkv_layout_kind(cfg, attention)} (--model.qkv-layout {cfg.model.qkv_layout})"]


# The training options inspect reads: the batch it pictures, and the checks of its split that train makes
# (accumulation, the evaluation batch). Every other train option changes nothing it prints.
READ_TRAIN = frozenset({"train.batch_size", "train.grad_accum", "train.eval_batch_size"})


def unread_notes(cfg: Config, given: Collection[str]) -> list[str]:
    """train's `note:` lines for the options this configuration never reads (`--devices 2` under single), then one
    line naming the training options given (`given`: the fields the command line named) that inspect never reads;
    none when there are none."""
    inert = inert_notes(cfg, given, sections=[s for s in config_lib.SECTIONS if s != "train"])  # train's: below
    declared = config_lib.declarations()
    unread = [declared[key][2].short or "--" + key.replace("_", "-") for key in sorted(given)
              if key.startswith("train.") and key not in READ_TRAIN and key in declared]
    if not unread:
        return inert
    return [*inert, f"{', '.join(unread)} {'does' if len(unread) == 1 else 'do'} nothing here: inspect lays out the "
                    f"parameters and the batch, and trains, measures, saves and prices nothing"]


def inspect(cfg: Config, array: str = "") -> str:
    """The parameter table, one array's picture (`array`, '' = the model's default) and the batch's."""
    # train's checks that read no data and compile nothing (the dataset's name, path and kind, your model's outputs,
    # the layout and the batch): what it refuses, refused here in the same line
    _, layout, spec = check_runnable(cfg)
    rows = param_table(spec.axes, spec.shapes, cfg.precision.param_dtype, layout)
    tx: optax.GradientTransformation = build_optimizer(cfg.optim, 100)
    target = abstract_train_state(spec, layout, tx)
    gradients = gradient_buffers(target.params, gradient_shardings(spec, layout))
    split = " x ".join(axis for axis, size in layout.shape.items() if size > 1)
    two_axes = all(size == 1 for axis, size in layout.shape.items() if axis not in (DATA, MODEL))  # '4x2'
    mesh = "none" if layout.mesh is None else (f"{layout.shape} (data x model)" if two_axes
                                               else f"{layout.shape} ({split})")
    notes = [*spec.axis_notes(), *layout_notes(spec, layout, cfg.parallel.mesh)]
    lines = [
        f"{cfg.model.factory or cfg.preset}: strategy {layout.strategy.name} ({layout.strategy.description}); mesh {mesh}; "
        f"{layout.shape.size} {layout.device.platform} device(s)"
        + ("" if cfg.parallel.spmd == "jit" else f"; --spmd {cfg.parallel.spmd}"),  # jit: as every doc shows it
        *(f"note: {note}" for note in notes),  # as train's first lines say them
        *kernel_lines(cfg, layout),
        "",
        format_table(rows),
        "",
        f"optimizer state ({cfg.optim.optimizer}{', with an EMA of the weights' if cfg.optim.ema else ''}): "
        f"{per_device_bytes(target.opt_state):,} bytes per device; "
        f"parameters: {per_device_bytes(target.params):,} bytes per device; "
        f"gradients: {per_device_bytes(gradients):,} bytes per device",
        "",
    ]
    if layout.strategy.optimizer is not None or layout.strategy.gradients is not None:
        lines[-1:-1] = ["", "optimizer state (each per-parameter array, e.g. Adam's two moments) and gradients, "
                        "placed apart from the parameters:", format_placements(spec.axes, spec.shapes, layout)]
    if uses_pipeline(layout):
        lines[-1:-1] = ["", *pipeline_lines(cfg, rows, layout)]
    if any(EXPERT in r.axes for r in rows):
        lines[-1:-1] = ["", *expert_lines(rows, layout)]
    if uses_context(layout):
        lines[-1:-1] = ["", *context_lines(cfg, layout)]
    if layout.sequence_parallel:
        length = sequence_length(cfg)
        lines[-1:-1] = ["", f"sequence parallelism: LayerNorm, dropout and the residual stream split along the "
                            f"sequence over model, {length // layout.shape.model} of {length} tokens per device; "
                            f"q/k/v and the MLP's hidden width over model as tp splits them"]
    if jax.tree.leaves(target.model_state):
        lines[-1:-1] = ["", *model_state_lines(spec, target.model_state)]
    by_path = {r.path: r for r in rows}
    if not array and cfg.model.factory:  # a model of your own: its largest parameter
        array = max(rows, key=lambda r: math.prod(r.shape)).path
    if not array and cfg.model.num_experts and cfg.model.kind == "lm":
        array = "blocks/expert2_kernel"  # the experts' second kernel, where the dense MLP's would be
    array = array or DEFAULT_ARRAYS.get(cfg.model.kind, DEFAULT_ARRAY)
    if array not in by_path:
        raise ConfigError(f"--array {array}: no such parameter; choose one of {', '.join(sorted(by_path))}")
    row = by_path[array]
    lines.append(picture(row.path, row.shape, layout.sharding(row.spec)))
    lines.append("")
    name, shape = _batch(cfg)
    lines.append(picture(name, shape, layout.batch_sharding()))
    return "\n".join(lines)


__all__ = ["DEFAULT_ARRAY", "READ_TRAIN", "inspect", "unread_notes"]
