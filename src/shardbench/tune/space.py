"""The layout space `shardbench tune` searches: every strategy of the strategies' table (pipelines, ZeRO,
context and expert parallelism included) on every mesh of the devices, x remat x dtype x microbatches per update
x the pipeline's microbatches and schedules x the batch sizes asked for, as the planner's candidates
(`shardbench.plan.candidates`). What cannot even be a candidate (a batch that does not split over a layout's
data shards, microbatches that do not divide a shard) is kept with its reason, never silently left out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from dataclasses import dataclass

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.parallel.rules import STRATEGIES, batch_shards
from shardbench.parsing import override
from shardbench.plan.candidates import PER_STAGE, USES, Candidate, candidate_config, candidates, meshes


# The fields a layout sets (a planner candidate's, `candidate_config`) and the batch.
LAYOUT_KEYS = ("parallel.strategy", "parallel.mesh", "parallel.devices", "model.remat", "precision.dtype",
               "train.grad_accum", "parallel.microbatches", "parallel.schedule", "train.batch_size")


@dataclass(frozen=True)
class Space:
    """The dimensions of the search; every one a list of the values to try."""

    strategies: tuple[str, ...] = tuple(USES)  # the strategies' table, in its order
    remats: tuple[str, ...] = ("none", "block")
    dtypes: tuple[str, ...] = ("float32",)
    accums: tuple[int, ...] = (1,)  # microbatches per update (--train.grad-accum)
    batches: tuple[int, ...] = (128,)  # global batch sizes
    per_stage: tuple[int, ...] = PER_STAGE  # a pipeline's microbatches per stage
    schedules: tuple[str, ...] = config_lib.PIPELINE_SCHEDULES


@dataclass(frozen=True)
class Point:
    """One layout of the space: a planner candidate at a global batch size."""

    candidate: Candidate
    batch: int

    @property
    def name(self) -> str:
        return f"{self.candidate.name} batch={self.batch}"


@dataclass(frozen=True)
class Dropped:
    """A part of the space dropped before planning, and why (one line)."""

    what: str
    reason: str


def _layout_drops(devices: int, strategy: str, batch: int, accums: Sequence[int], kept: set[str]) -> list[Dropped]:
    """The meshes of `strategy` that `candidates` leaves out at `batch` (no candidate of that mesh), with why."""
    if strategy == "single":
        return [] if devices == 1 else [Dropped(f"single batch={batch}",
                                                f"one device, and the target has {devices}")]
    out = []
    for shape in meshes(devices, USES[strategy]):
        if str(shape) in kept:
            continue
        data = batch_shards(STRATEGIES[strategy], shape)
        if batch % data:
            why = f"--batch-size {batch} does not split over its {data} data shards"
        else:
            share = batch // data
            why = (f"no microbatch count of {', '.join(map(str, accums))} (and, with stages, no pipeline microbatch "
                   f"count) divides its {share} examples per data shard")
        out.append(Dropped(f"{strategy} {shape} batch={batch}", why))
    return out


def enumerate_space(devices: int, space: Space) -> tuple[list[Point], list[Dropped]]:
    """Every layout of `space` on `devices` devices that the planner can consider, and what was dropped before
    planning with its reason. A one-line ConfigError for an unknown strategy."""
    unknown = sorted(set(space.strategies) - set(USES))
    if unknown:
        raise ConfigError(f"--candidates: unknown strategy '{unknown[0]}': choose from {', '.join(USES)}")
    layouts: list[Point] = []
    dropped: list[Dropped] = []
    for batch in space.batches:
        for strategy in space.strategies:
            try:
                found = candidates(devices, batch, [strategy], list(space.remats), list(space.dtypes),
                                   [k for k in space.accums], space.per_stage, space.schedules)
            except ConfigError as err:  # no mesh, or no layout of it divides the batch or takes one K
                found = [c for k in space.accums for c in _quiet(devices, batch, strategy, space, k)]
                if not found:
                    dropped.append(Dropped(f"{strategy} batch={batch}", str(err)))
                    continue
            layouts += [Point(c, batch) for c in found]
            dropped += _layout_drops(devices, strategy, batch, space.accums, {c.mesh for c in found})
    return layouts, dropped


def _quiet(devices: int, batch: int, strategy: str, space: Space, accum: int) -> list[Candidate]:
    """`candidates` for one microbatch count, [] where it refuses (a K that divides no shard of this strategy
    is dropped for this strategy alone, not for the whole space)."""
    try:
        return candidates(devices, batch, [strategy], list(space.remats), list(space.dtypes), [accum],
                          space.per_stage, space.schedules)
    except ConfigError:
        return []


def layout_settings(cfg: config_lib.Config, point: Point, devices: int) -> dict[str, Any]:
    """What `shardbench train` is told for `point`: the candidate's fields (`candidate_config`) and batch."""
    flat = candidate_config(override(cfg, {"train.batch_size": point.batch}), point.candidate, devices)
    return {k: flat[k] for k in LAYOUT_KEYS}


def user_settings(cfg: config_lib.Config) -> dict[str, Any]:
    """The fields the user set away from the preset (what the measured runs and the ready command repeat besides
    the layout): the reporting fields too (--prices, --data.cache-dir, ...), but not those a sweep sets for each
    run (its folder and name) or the preset's name."""
    from shardbench.presets import get_preset
    from shardbench.sweep.grid import SWEEP_OWNED

    preset = config_lib.flatten(get_preset(cfg.preset))
    return {k: v for k, v in config_lib.flatten(cfg).items()
            if preset.get(k) != v and k not in SWEEP_OWNED and k != "preset" and k not in LAYOUT_KEYS}


def parse_ints(flag: str, text: str) -> tuple[int, ...]:
    """A comma list of whole numbers of at least 1, or one line naming the flag."""
    values = [v.strip() for v in str(text).split(",") if v.strip()]
    if not values or not all(v.isdigit() and int(v) >= 1 for v in values):
        raise ConfigError(f"{flag} '{text}': give whole numbers, 1 or more, comma separated")
    return tuple(dict.fromkeys(int(v) for v in values))


def parse_names(flag: str, text: str, choices: Sequence[str]) -> tuple[str, ...]:
    """A comma list of names from `choices`, or one line naming the flag and the choices."""
    values = tuple(dict.fromkeys(v.strip() for v in str(text).split(",") if v.strip()))
    if not values:
        raise ConfigError(f"{flag} '{text}': give one value or a comma list")
    for v in values:
        if v not in choices:
            raise ConfigError(f"{flag} {v}: choose from {', '.join(choices)}")
    return values
