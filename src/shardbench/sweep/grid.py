"""Sweep grids: axes of {"section.field": value} overrides from the command line, a sweep file or a preset,
expanded into named runs (the cartesian product of the axes, first axis outermost).
"""

from __future__ import annotations

import itertools
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.naming import run_name
from shardbench.parallel.mesh import DATA, MODEL, same_mesh
from shardbench.parallel.strategies import STRATEGIES
from shardbench.parsing import override, parse_value
from shardbench.presets import PRESETS, get_preset
from shardbench.validation import inert_fields

if TYPE_CHECKING:
    from shardbench.store import Store

Override = dict[str, Any]
Axis = list[Override]

# Set by the sweep for every run: a sweep that overrode them would write runs over each other.
SWEEP_OWNED = frozenset({"train.out", "train.resume", "train.run_name", "train.profile_root"})

@dataclass(frozen=True)
class Grid:
    """Fixed overrides plus axes; its runs are the cartesian product of the axes on top of `base`."""

    axes: list[Axis]
    base: Override = field(default_factory=dict)


@dataclass(frozen=True)
class SweepPreset:
    """A named sweep: a run preset to start from, fixed overrides, and grids whose runs are concatenated."""

    base_preset: str
    base: Override
    grids: list[Grid]
    doc: str


@dataclass(frozen=True)
class PlannedRun:
    """One planned run: `overrides` are its swept values (they name it), `base` everything else it sets."""

    name: str
    overrides: Override
    base: Override

    @property
    def settings(self) -> Override:
        return {**self.base, **self.overrides}


@dataclass(frozen=True)
class Sweep:
    """Everything a sweep runs: the run preset each run starts from, and the runs in order."""

    label: str  # names the sweep directory: the sweep preset, sweep file or run preset
    base_preset: str
    base: Override
    grids: list[Grid]
    runs: list[PlannedRun]
    origin: str = "preset"  # what the label names: "sweep preset", "sweep file" or (run) "preset"
    # runs planned by two grids that make the same configuration: the one kept -> the names it stands for
    same: dict[str, list[str]] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------- values
def field_kind(key: str) -> Any:
    """The type of a 'section.field' key, or a one-line error naming the unknown field."""
    section, _, name = key.partition(".")
    if section in config_lib.SECTIONS:
        kinds = config_lib.field_types(type(getattr(config_lib.Config(), section)))
        if name in kinds:
            return kinds[name]
    raise config_lib.unknown_field(key)


def normalize_key(key: str) -> str:
    section, dot, name = key.strip().lstrip("-").partition(".")
    return f"{section}{dot}{name.replace('-', '_')}"


def typed_value(key: str, value: Any) -> Any:
    """Check a value from the command line or a sweep file against its field's type and convert it."""
    kind = field_kind(key)
    if isinstance(value, str) and kind is not str:
        return parse_value(key, value, kind)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if typing.get_origin(kind) is tuple:
        if isinstance(value, (list, tuple)) and len(value) == len(typing.get_args(kind)) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return tuple(float(v) for v in value)
    elif (kind is bool and isinstance(value, bool)) or (kind is int and number and isinstance(value, int)):
        return value
    elif kind is float and number:
        return float(value)
    elif kind is str and (number or isinstance(value, str)):  # TOML writes `mesh = 8` naturally
        return str(value)
    name = "pair of numbers" if typing.get_origin(kind) is tuple else getattr(kind, "__name__", str(kind))
    shown = json.dumps(value) if isinstance(value, bool) else repr(value)  # as a sweep file writes it: true, false
    allowed = config_lib.RANGES.get(key)
    raise ConfigError(f"--{key.replace('_', '-')}: {shown} is not a valid {name}"
                      + (f": give one in {allowed.text()}" if allowed is not None else ""))


def check_key(key: str) -> str:
    key = normalize_key(key)
    field_kind(key)
    if key in SWEEP_OWNED:
        raise ConfigError(f"--{key.replace('_', '-')} is set by the sweep for each run; it cannot be swept or fixed")
    return key


def split_alternatives(key: str, text: str) -> list[str]:
    """The alternatives in one command-line value: 'a,b,c'; ';' where one value itself holds commas.

    Tuple fields (data.crop_scale '0.5,1.0'), meshes in 'data=4,model=2' form and --rules take commas inside one value,
    so their alternatives are separated by ';' ('0.5,1.0;0.9,1.0'). Any value holding ';' is split on ';' only.
    """
    if ";" in text:
        parts = text.split(";")
    elif typing.get_origin(field_kind(key)) is tuple or (key in ("parallel.mesh", "parallel.rules") and "=" in text):
        parts = [text]
    else:
        parts = text.split(",")
    parts = [p.strip() for p in parts]
    if len(parts) > 1 and any(p == "" for p in parts):
        raise ConfigError(f"--{key.replace('_', '-')} '{text}': an empty alternative in a sweep list")
    return parts


def _as_run(entry: Mapping[str, Any]) -> str:
    """An axis entry as the run it makes: a mesh by its sizes, so that '4x2' and 'data=4,model=2' are one run."""
    return json.dumps({k: same_mesh(v) if k == "parallel.mesh" and isinstance(v, str) else v
                       for k, v in entry.items()}, sort_keys=True, default=str)


def unique(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The axis entries, each run once: the first spelling of a value kept (see `_as_run`). Entries compare as
    JSON, so their values must already be typed (`typed_value`): 1 and 1.0 would differ."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in entries:
        if (key := _as_run(entry)) not in seen:
            seen.add(key)
            out.append(entry)
    return out


def once(where: str, entries: list[dict[str, Any]]) -> Axis:
    """An axis whose every entry is a run of its own: one listed twice (or as another spelling of the same run,
    '4x2' and 'data=4,model=2'; 64 and 064) is refused, not run once without a word."""
    kept = unique(entries)
    if len(kept) < len(entries):
        twice = next(e for i, e in enumerate(entries) if len(unique(entries[: i + 1])) <= i)
        said = ", ".join(f"{k} = {v!r}" for k, v in twice.items())
        raise ConfigError(f"{where} lists {said} twice (or as two spellings of one run): list each once")
    return kept


def axes_from_values(values: Mapping[str, Any]) -> tuple[Override, list[Axis]]:
    """Command-line values -> (fixed overrides, axes): a value listing several alternatives becomes an axis."""
    fixed: Override = {}
    axes: list[Axis] = []
    for raw_key, value in values.items():
        key = check_key(raw_key)
        texts = split_alternatives(key, value) if isinstance(value, str) else [value]
        flag = f"--{key.replace('_', '-')}"
        entries = once(f"{flag} {value!r}" if isinstance(value, str) else flag,
                       [{key: typed_value(key, t)} for t in texts])
        if len(entries) == 1:
            fixed.update(entries[0])
        else:
            axes.append(entries)
    return fixed, axes


# ------------------------------------------------------------------------------------------ sweep presets
def mesh_grid() -> SweepPreset:
    """The seed's mesh experiment: no mesh, 8x1 and 4x2 (strategy auto) at batch 128, 1024 and 4096."""
    meshes = [{"parallel.mesh": "none"}, {"parallel.mesh": "8x1"}, {"parallel.mesh": "4x2"}]
    batches = [{"train.batch_size": b} for b in (128, 1024, 4096)]
    return SweepPreset("vit-seed", {"parallel.strategy": "auto"}, [Grid([meshes, batches])],
                       mesh_grid.__doc__ or "")


def precision_grid() -> SweepPreset:
    """The seed's precision experiments: parameter dtype, compute dtype x batch, and matmul precision. float16
    parameters are left out: under the preset's AdamW (no float32 master copy) their first update is NaN, and the
    run is refused."""
    pdtypes = Grid([[{"precision.param_dtype": d} for d in ("float32", "bfloat16")]],
                   {"precision.dtype": "float32", "train.batch_size": 128})
    dtypes = Grid([[{"precision.dtype": d} for d in ("float32", "bfloat16")],
                   [{"train.batch_size": b} for b in (128, 4096)]], {"precision.param_dtype": "float32"})
    matmul = Grid([[{"precision.matmul_precision": p} for p in ("default", "high", "highest")]])
    return SweepPreset("vit-seed", {"parallel.strategy": "auto"}, [pdtypes, dtypes, matmul],
                       precision_grid.__doc__ or "")


def strategies() -> SweepPreset:
    """Every strategy side by side on the same work, on 8 devices: each one in shardbench's table of strategies,
    on a mesh that splits every axis it uses (none for single, 8 over data, model=8, 4x2), but those with pipeline
    stages (pp, dp+pp, ...: any that uses the stage axis), whose stages must divide the model's layers and which
    refuse dropout, those with experts (ep, dp+ep, ...: the expert axis), which need a mixture of experts, and
    context parallelism (cp, ...: the seq axis), which needs a sequence the seq axis splits (vit-seed's 65 tokens
    do not); the `pipeline`, `moe` and `long-context` presets run them."""
    meshes = {(): "none", (DATA,): "8", (MODEL,): "model=8", (DATA, MODEL): "4x2"}
    layouts = [{"parallel.strategy": name, "parallel.mesh": meshes[strategy.axes]}
               for name, strategy in STRATEGIES.items() if strategy.axes in meshes]
    return SweepPreset("vit-seed", {"parallel.devices": 8}, [Grid([layouts])], strategies.__doc__ or "")


def lm_replicated_vs_fsdp() -> SweepPreset:
    """The seed's LM experiment: replicated (dp) against FSDP-sharded parameters, lm-seed for 50 steps."""
    layouts = [{"parallel.strategy": "dp", "parallel.mesh": ""}, {"parallel.strategy": "fsdp", "parallel.mesh": ""}]
    return SweepPreset("lm-seed", {"train.steps": 50}, [Grid([layouts])], lm_replicated_vs_fsdp.__doc__ or "")


def zero() -> SweepPreset:
    """Where the training state's memory goes: dp, zero1 (optimizer state sharded), zero2 (and gradients) and fsdp
    (and parameters) on lm-seed over 8 devices, 20 steps."""
    layouts = [{"parallel.strategy": name, "parallel.mesh": ""} for name in ("dp", "zero1", "zero2", "fsdp")]
    return SweepPreset("lm-seed", {"train.steps": 20, "parallel.devices": 8}, [Grid([layouts])],
                       zero.__doc__ or "")


def moe() -> SweepPreset:
    """A mixture of experts under each way of splitting it: lm-moe (8 experts, top-2) under dp and fsdp (every
    device holds or gathers every expert), ep (experts over expert=8), dp+ep (data=2,expert=4) and ep+tp
    (expert=4,model=2), 8 devices, 20 steps; the report says how many token assignments each run dropped."""
    layouts = [{"parallel.strategy": "dp", "parallel.mesh": "8"}, {"parallel.strategy": "fsdp", "parallel.mesh": "8"},
               {"parallel.strategy": "ep", "parallel.mesh": "expert=8"},
               {"parallel.strategy": "dp+ep", "parallel.mesh": "data=2,expert=4"},
               {"parallel.strategy": "ep+tp", "parallel.mesh": "expert=4,model=2"}]
    return SweepPreset("lm-moe", {"train.steps": 20, "parallel.devices": 8}, [Grid([layouts])], moe.__doc__ or "")


# The pipeline preset's models, CPU-sized: the seed's MLP (mlp-small, 32 stacked layers of width 256) and a narrow
# 16-block LM, so that 8 stages hold 4 and 2 layers each (2 repeats of a circular schedule divide both).
PIPELINE_STAGES = 8
PIPELINE_MICROBATCHES = (8, 16, 32)  # the bubble (S-1)/(M+S-1) at S = 8: 47%, 30%, 18%
PIPELINE_MODELS: dict[str, tuple[str, Override]] = {
    "mlp": ("mlp-small", {"model.num_layers": 33, "model.mlp_dim": 256}),
    "lm": ("lm-seed", {"model.num_layers": 16, "model.embed_dim": 64, "model.num_heads": 4, "model.mlp_dim": 256,
                       "model.seq_len": 32, "data.synthetic_test": 256}),
}
# What a schedule needs beyond its name, where the configuration has the field (the circular schedule's repeats).
SCHEDULE_SETTINGS: dict[str, Override] = {"circular": {"parallel.repeats": config_lib.CIRCULAR_REPEATS}}


def _schedule_settings(schedule: str) -> Override:
    kinds = config_lib.field_types(config_lib.ParallelConfig)
    return {k: v for k, v in SCHEDULE_SETTINGS.get(schedule, {}).items() if k.partition(".")[2] in kinds}


def pipeline() -> SweepPreset:
    """What pipeline stages cost and save: seed 004's MLP (mlp-small, 32 stacked layers of width 256) and a
    16-block LM under dp and fsdp, and under pp on 8 stages with each pipeline schedule at 8, 16 and 32
    microbatches, on 8 devices, 10 steps; beside them a one-stage run (pp on one device) at each microbatch count,
    the same microbatch size, whose step time the report sets against each pipeline's to measure its bubble."""
    mlp_base, _ = PIPELINE_MODELS["mlp"]
    start = config_lib.flatten(get_preset(mlp_base))
    layouts: Axis = [{"parallel.strategy": "dp", "parallel.mesh": str(PIPELINE_STAGES)},
                     {"parallel.strategy": "fsdp", "parallel.mesh": str(PIPELINE_STAGES)}]
    layouts += [{"parallel.strategy": "pp", "parallel.mesh": f"stage={PIPELINE_STAGES}", "parallel.microbatches": m,
                 "parallel.schedule": schedule, **_schedule_settings(schedule)}
                for schedule in config_lib.PIPELINE_SCHEDULES for m in PIPELINE_MICROBATCHES]
    layouts += [{"parallel.strategy": "pp", "parallel.mesh": "stage=1", "parallel.devices": 1,
                 "parallel.microbatches": m} for m in PIPELINE_MICROBATCHES]
    base: Override = {"parallel.devices": PIPELINE_STAGES, "train.steps": 10}
    grids = []
    for kind, (preset, sizes) in PIPELINE_MODELS.items():
        # Each model's grid sets what its preset and sizes change from the sweep's run preset (mlp-small); the
        # kind is an axis of one value, so that it names the runs.
        own = config_lib.flatten(override(get_preset(preset), sizes))
        differs = {k: v for k, v in own.items() if v != start[k] and k not in base and k != "model.kind"}
        grids.append(Grid([[{"model.kind": kind}], layouts], differs))
    return SweepPreset(mlp_base, base, grids, pipeline.__doc__ or "")


# The long-context preset: a narrow 2-block LM on 4 devices at batch 4 (one sequence per data shard), sized for
# two CPU cores and this 23 GiB host. Every layout but the ring holds a score matrix of every query against every
# key for the backward: dp and fsdp one sequence's (batch 1 x 2 heads x T^2), tp one head of two sequences, the
# all-gather a quarter of the queries of all four; in each, batch x heads x T^2 x 4 bytes / 4 devices per layer,
# 512 MiB at 8k tokens and 2 GiB at 16k. Compiled, they need 2.1-2.6 GiB per device at 8k (8.3-10.2 GiB for the 4
# devices), and the scores alone four times as much at 16k: beyond the host, so they stop at 8k. The ring
# keeps O(T/N) rows and one tile of scores: 93 MiB per device at 8k, 186 MiB at 16k (peak RSS of the whole
# 16k run, 3 steps: 1.55 GiB), and runs on to 16k.
LONG_CONTEXT_DEVICES = 4
LONG_CONTEXT_MODEL: Override = {"model.num_layers": 2, "model.embed_dim": 32, "model.num_heads": 2,
                                "model.mlp_dim": 64, "model.vocab_size": 256, "train.batch_size": 4,
                                "train.eval": False, "data.synthetic_train": 64, "data.synthetic_test": 8}
LONG_CONTEXT_WHOLE = (1024, 2048, 4096, 8192)  # every layout
LONG_CONTEXT_RING = (16384,)  # the ring alone: the others' scores would need 33-40 GiB
LONG_CONTEXT_SHORT = (256, 512)  # the two context modes alone: where the all-gather might still win


def long_context() -> SweepPreset:
    """Long sequences on the LM: 2 blocks of width 32 on 4 devices at batch 4, 3 steps, at 1k, 2k, 4k and 8k
    tokens under dp, fsdp, dp+tp without and with sequence parallelism (data=2,model=2), and context parallelism
    with the keys and values all-gathered and with ring attention (seq=4, head-tail order); the ring alone at 16k,
    and the two context modes alone at 256 and 512 tokens. Not at 16k but for the ring: every other layout keeps
    a score matrix of batch x heads x T^2 x 4 bytes / 4 devices per layer (2 GiB at 16k), 8.2-10.1 GiB per device
    compiled, 33-40 GiB on the 4 simulated devices of a 23 GiB host; at 8k they need 8.3-10.2 GiB in all, so the
    sweep wants about 11 GiB free. The report says where the ring's step time falls below the all-gather's."""
    n = LONG_CONTEXT_DEVICES
    whole: Axis = [{"parallel.strategy": "dp", "parallel.mesh": str(n)},
                   {"parallel.strategy": "fsdp", "parallel.mesh": str(n)},
                   {"parallel.strategy": "dp+tp", "parallel.mesh": f"data={n // 2},model=2"},
                   {"parallel.strategy": "dp+tp", "parallel.mesh": f"data={n // 2},model=2",
                    "parallel.sequence_parallel": True},
                   {"parallel.strategy": "cp", "parallel.mesh": f"seq={n}", "parallel.context": "all-gather"},
                   {"parallel.strategy": "cp", "parallel.mesh": f"seq={n}", "parallel.context": "ring"}]
    ring: Axis = [whole[-1]]
    grids = [Grid([[{"model.seq_len": t} for t in LONG_CONTEXT_WHOLE], whole]),
             Grid([[{"model.seq_len": t} for t in LONG_CONTEXT_RING], ring]),
             Grid([[{"model.seq_len": t} for t in LONG_CONTEXT_SHORT], whole[-2:]])]
    base: Override = {"parallel.devices": n, "train.steps": 3, **LONG_CONTEXT_MODEL}
    return SweepPreset("lm-seed", base, grids, long_context.__doc__ or "")


def mlp_spmd_styles() -> SweepPreset:
    """The seed's MLP modes: one device with jit, jit on all devices, pmap, and shard_map (data parallel)."""
    runs = [{"parallel.strategy": "single", "parallel.mesh": "none", "parallel.spmd": "jit"},
            {"parallel.strategy": "dp", "parallel.mesh": "", "parallel.spmd": "jit"},
            {"parallel.strategy": "dp", "parallel.mesh": "", "parallel.spmd": "pmap"},
            {"parallel.strategy": "dp", "parallel.mesh": "", "parallel.spmd": "shard_map"}]
    return SweepPreset("mlp-seed", {}, [Grid([runs])], mlp_spmd_styles.__doc__ or "")


def precision_accuracy() -> SweepPreset:
    """The seed's precision question in accuracy: vit-cifar (the winning recipe) at float32, bfloat16 compute, and
    bfloat16 parameters and compute, seeds 0 and 1 each, at vit-cifar's own 100 epochs (--epochs changes it). The
    report says whether each precision's accuracy difference exceeds the seed-to-seed spread."""
    # Sized for about 30 minutes on one H100: vit-cifar trained 8,700 steps (100 epochs at batch 512) in 152 s in
    # bfloat16 there, and vit-seed's float32 step took 1.67x its bfloat16 one (14.0 against 8.4 ms at batch 256,
    # 51.1 against 30.6 at 1024); 2 x (254 + 152 + 157) s of training plus about 40 s of compilation, evaluation
    # and start per run = about 23 minutes.
    precisions = [{"precision.param_dtype": "float32", "precision.dtype": "float32"},
                  {"precision.param_dtype": "float32", "precision.dtype": "bfloat16"},
                  {"precision.param_dtype": "bfloat16", "precision.dtype": "bfloat16"}]
    seeds = [{"train.seed": seed} for seed in (0, 1)]
    return SweepPreset("vit-cifar", {"train.epochs": 100}, [Grid([precisions, seeds])],
                       precision_accuracy.__doc__ or "")


SWEEP_PRESETS: dict[str, Callable[[], SweepPreset]] = {
    "mesh-grid": mesh_grid, "precision-grid": precision_grid, "strategies": strategies,
    "lm-replicated-vs-fsdp": lm_replicated_vs_fsdp, "zero": zero, "mlp-spmd-styles": mlp_spmd_styles,
    "precision-accuracy": precision_accuracy, "pipeline": pipeline, "moe": moe, "long-context": long_context,
}


# ---------------------------------------------------------------------------------------------- expansion
def _strip(axes: list[Axis], keys: set[str]) -> list[Axis]:
    """Drop fields the command line fixes or re-sweeps from an axis; an axis left with nothing goes."""
    out = []
    for axis in axes:
        kept = unique([{k: v for k, v in entry.items() if k not in keys} for entry in axis])
        if kept != [{}]:
            out.append(kept)
    return out


def expand(grids: list[Grid], base: Override) -> list[PlannedRun]:
    """Runs of every grid, concatenated; a name seen before is the same run when it sets the same values
    (dropped), else a different one (a counter is appended)."""
    runs: list[PlannedRun] = []
    by_name: dict[str, PlannedRun] = {}
    for grid in grids:
        for combo in itertools.product(*grid.axes):
            overrides: Override = {}
            for entry in combo:
                overrides.update(entry)
            run = PlannedRun(run_name(overrides), overrides, {**base, **grid.base})
            if run.name in by_name and by_name[run.name].settings == run.settings:
                continue
            name, n = run.name, 2
            while name in by_name:
                name, n = f"{run.name}_{n}", n + 1
            run = PlannedRun(name, run.overrides, run.base)
            by_name[name] = run
            runs.append(run)
    return runs


@dataclass(frozen=True)
class SweepFile:
    """A sweep file's content (see `shardbench.sweep.sweep_file`): run preset, fixed overrides and axes."""

    label: str
    preset: str | None
    base: Override
    axes: list[Axis]


def make_sweep(preset: str | None = None, base_preset: str | None = None, sweep_file: SweepFile | None = None,
               values: Mapping[str, Any] | None = None, stored: Sweep | None = None) -> Sweep:
    """Combine the sources: a sweep preset or file gives grids; `base_preset` swaps their run preset; command-line
    values fix fields (replacing them in every axis) or, listing alternatives, add axes to every grid. `stored`:
    a sweep being resumed with values alone, which apply to its own grids as they would to a preset's."""
    fixed, cli_axes = axes_from_values(values or {})
    label, start, base, grids = "", "vit-seed", {}, [Grid([])]
    origin = "preset"
    if stored is not None:
        label, start, base, grids = stored.label, stored.base_preset, dict(stored.base), list(stored.grids)
        origin = stored.origin
    if preset in SWEEP_PRESETS:
        if sweep_file is not None:
            raise ConfigError(f"--preset {preset} is a sweep preset and --sweep-file gives another sweep: pick one")
        made = SWEEP_PRESETS[preset]()
        label, start, base, grids = preset, made.base_preset, dict(made.base), list(made.grids)
        origin = "sweep preset"
    elif preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset '{preset}': choose one of "
                              f"{', '.join([*PRESETS, *SWEEP_PRESETS])}")
        if base_preset is not None and base_preset != preset:
            raise ConfigError(f"--base {base_preset} and the run preset --preset {preset} disagree: give one")
        label, start = preset, preset
    if sweep_file is not None:
        label, origin = sweep_file.label, "sweep file"
        start = preset if preset in PRESETS else (sweep_file.preset or start)
        base, grids = dict(sweep_file.base), [Grid(list(sweep_file.axes))]
    if base_preset is not None:
        if base_preset not in PRESETS:
            raise ConfigError(f"--base '{base_preset}' is not a run preset: choose one of "
                              f"{', '.join(PRESETS)}")
        start = base_preset
    # A single value the sweep's own base already sets (`--devices 8` on the pipeline preset, which runs on 8)
    # confirms it: the entries that set their own (the one-stage reference runs, on 1 device) keep it.
    replaced = ({k for k, v in fixed.items() if k not in base or base[k] != v}
                | {k for axis in cli_axes for entry in axis for k in entry})
    grids = [Grid(_strip(g.axes, replaced) + cli_axes, {k: v for k, v in g.base.items() if k not in replaced})
             for g in grids]
    base = {**{k: v for k, v in base.items() if k not in replaced}, **fixed}
    label = label or start
    # Every run must make a Config (known fields, right types); whether it can run is its own process's
    # business: an impossible mesh is a result, recorded as failed, not a reason to stop the sweep.
    runs, same = distinct(start, expand(grids, base))
    return Sweep(label, start, base, grids, runs, origin, same)


def distinct(base_preset: str, runs: list[PlannedRun]) -> tuple[list[PlannedRun], dict[str, list[str]]]:
    """The runs whose configurations differ, each first as planned, and for each run kept the later names
    that make its configuration (two grids can meet: precision-grid's float32 at batch 128 is in three)."""
    first: dict[str, str] = {}
    kept: list[PlannedRun] = []
    same: dict[str, list[str]] = {}
    for run in runs:
        key = json.dumps(run_config(base_preset, run), sort_keys=True, default=str)
        if key in first:
            same.setdefault(first[key], []).append(run.name)
        else:
            first[key] = run.name
            kept.append(run)
    return kept, same


def same_notes(sweep: Sweep) -> list[str]:
    """A note for each run that stands for others: the sweep runs it once, under its first name."""
    return [f"{' and '.join([', '.join(names[:-1]), names[-1]] if len(names) > 1 else names)} "
            f"{'make' if len(names) > 1 else 'makes'} the same configuration as {name}: run once, as {name}"
            for name, names in sweep.same.items()]


def run_config(base_preset: str, run: PlannedRun) -> dict[str, Any]:
    """The flattened configuration a run asks for (what its process resolves before it validates anything)."""
    return config_lib.flatten(override(get_preset(base_preset), run.settings))


def inert_swept(sweep: Sweep, profile: bool = False) -> list[str]:
    """A note for each swept field that no run of the sweep reads (`validation.inert_fields`: --model.num-heads on
    the MLP): the runs that differ only in it compute the same, and a report would rank them apart. `profile`:
    the sweep's --profile, which traces every run (so every run reads the profile window's fields)."""
    swept = [k for k in dict.fromkeys(k for g in sweep.grids for axis in g.axes for entry in axis for k in entry)
             if len({json.dumps(r.settings.get(k), default=str) for r in sweep.runs}) > 1]
    why: dict[str, set[str]] = {k: set() for k in swept}
    for run in sweep.runs:
        traced = {"train.profile": True} if profile else {}
        inert = inert_fields(override(get_preset(sweep.base_preset), {**run.settings, **traced}))
        for key in swept:
            why[key].add(inert.get(key, ""))
    return [f"--{key.replace('_', '-')} is swept, but no run reads it ({'; '.join(sorted(reasons))}): runs that "
            f"differ only in it compute the same" for key, reasons in why.items() if "" not in reasons]


def stored_sweep(store: Store) -> Sweep:
    """The sweep a store holds, as planned when it started."""
    runs = [PlannedRun(r["name"], r["overrides"], {k: v for k, v in r["settings"].items() if k not in r["overrides"]})
            for r in store.get_meta("runs", [])]
    grids = [Grid(g["axes"], g["base"]) for g in store.get_meta("grids", [])]
    return Sweep(store.get_meta("preset"), store.get_meta("base_preset"), store.get_meta("base", {}), grids, runs,
                 store.get_meta("origin") or "preset")
