"""The layout space `shardbench tune` searches: every strategy of the strategies' table (pipelines, ZeRO,
context and expert parallelism included) on every mesh of the devices, x remat x dtype x microbatches per update
x the pipeline's microbatches and schedules x the batch sizes asked for, as the planner's candidates
(`shardbench.plan.candidates`). What cannot even be a candidate (a batch that does not split over a layout's
data shards, microbatches that do not divide a shard) is kept with its reason, never silently left out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.fields import list_refusal
from shardbench.parallel.strategies import STRATEGIES, batch_shards
from shardbench.parsing import override
from shardbench.plan.candidates import (PER_STAGE, USES, Candidate, candidate_config, candidates, meshes,
                                        one_per_layout)


# The fields a layout sets (a planner candidate's, `candidate_config`) and the batch.
# What each measured run and the ready command are told per candidate: every field `candidate_config` sets
# (a circular pipeline's repeats among them: without it the run measured GPipe's program at one repeat).
LAYOUT_KEYS = ("parallel.strategy", "parallel.mesh", "parallel.devices", "model.remat", "precision.dtype",
               "train.grad_accum", "parallel.microbatches", "parallel.schedule", "parallel.repeats",
               "train.batch_size")


# The configuration fields a comma list of the space stands for, and the flag that gives it: the configuration
# holds the list's first value, the space the whole list.
LIST_FLAGS = {"precision.dtype": "--dtype", "model.remat": "--remat", "train.grad_accum": "--grad-accum",
              "train.batch_size": "--batch-size"}


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
    examples: int | None = None  # training examples in an epoch, where the configuration says (None: not known)
    repeats: int = 1  # --data.repeat-augment: a batch holds batch / repeats distinct examples


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


def _layout_drops(devices: int, strategy: str, batch: int, space: Space) -> list[Dropped]:
    """Every part of `strategy`'s space at `batch` that `candidates` leaves out, with why: a mesh whose data shards
    do not split the batch, and on the others each microbatch count K (and, with stages, each pipeline
    microbatch count M) that does not divide its examples per data shard."""
    if strategy == "single":
        if devices != 1:
            return [Dropped(f"single batch={batch}", f"one device, and the target has {devices}")]
        return _microbatch_drops("single", "none", 0, batch, batch, space)
    out = []
    for shape in meshes(devices, USES[strategy]):
        data = batch_shards(STRATEGIES[strategy], shape)
        if batch % data:
            out.append(Dropped(f"{strategy} {shape} batch={batch}",
                               f"--batch-size {batch} does not split over its {data} data shards"))
        else:
            stages = shape.stage if "stage" in USES[strategy] else 0
            out += _microbatch_drops(strategy, str(shape), stages, batch // data, batch, space)
    return out


def _microbatch_drops(strategy: str, mesh: str, stages: int, share: int, batch: int, space: Space) -> list[Dropped]:
    """The microbatch counts of `space` that do not divide a layout's `share` examples per data shard: each K of
    --grad-accum, and with `stages` (0: none) each M = k x stages of --microbatches-per-stage (every schedule)."""
    out = []
    for k in space.accums:
        if share % k:
            out.append(Dropped(f"{strategy} {mesh} accum={k} batch={batch}",
                               f"--grad-accum {k} does not divide its {share} examples per data shard"))
            continue
        for per in dict.fromkeys(space.per_stage) if stages else ():
            m = stages * per
            if (share // k) % m:
                each = f"{share // k} examples per data shard" + (f" in each of {k} microbatches" if k > 1 else "")
                accum = f" accum={k}" if k > 1 else ""
                out.append(Dropped(f"{strategy} {mesh} M={m}{accum} batch={batch}",
                                   f"{m} pipeline microbatches ({per} per stage x {stages} stages) do not divide its "
                                   f"{each}"))
    return out


def _epoch_drop(batch: int, space: Space) -> Dropped | None:
    """A batch larger than the epoch's training examples (where the configuration says how many) makes no step:
    `shardbench train` refuses it (`preflight.check_run`), so it is dropped here, before planning."""
    from shardbench.data.epochs import steps_per_epoch

    if space.examples is None:
        return None
    if batch < space.repeats:  # not one distinct example in the batch (`shardbench train` refuses it too)
        return Dropped(f"batch={batch}", f"--batch-size {batch} holds no whole example repeated "
                                         f"--data.repeat-augment {space.repeats} times")
    if steps_per_epoch(space.examples, batch, space.repeats):
        return None
    return Dropped(f"batch={batch}", f"--batch-size {batch} is larger than the {space.examples} training examples")


def _folded_drops(found: list[Candidate], folded: dict[str, str], batch: int) -> list[Dropped]:
    """Each strategy of `found` left out for laying out as another on one device (`one_per_layout`), with why."""
    meshes_of = {c.strategy: c.mesh for c in found}
    return [Dropped(f"{strategy} {meshes_of[strategy]} batch={batch}",
                    f"on 1 device {strategy} lays out as {kept} (every array whole, nothing sent): planned and "
                    f"measured once, as {kept}") for strategy, kept in folded.items()]


def enumerate_space(devices: int, space: Space) -> tuple[list[Point], list[Dropped]]:
    """Every layout of `space` on `devices` devices that the planner can consider, one per distinct layout (on one
    device dp, fsdp, tp, ... are `single`'s layout: planned and measured once), and what was dropped before
    planning with its reason. A one-line ConfigError for an unknown strategy."""
    refusal = list_refusal("--candidates", space.strategies, choices=tuple(USES))
    if refusal:
        raise ConfigError(refusal)
    layouts: list[Point] = []
    dropped: list[Dropped] = []
    for batch in space.batches:
        too_large = _epoch_drop(batch, space)
        if too_large is not None:
            dropped.append(too_large)
            continue
        at_batch: list[Candidate] = []
        for strategy in space.strategies:
            try:
                found = candidates(devices, batch, [strategy], list(space.remats), list(space.dtypes),
                                   [k for k in space.accums], space.per_stage, space.schedules)
            except ConfigError as err:  # no mesh, or no layout of it divides the batch or takes one K
                found = [c for k in space.accums for c in _quiet(devices, batch, strategy, space, k)]
                if not found:
                    dropped.append(Dropped(f"{strategy} batch={batch}", str(err)))
                    continue
            at_batch += found
            dropped += _layout_drops(devices, strategy, batch, space)
        kept, folded = one_per_layout(at_batch, devices)
        layouts += [Point(c, batch) for c in kept]
        dropped += _folded_drops(at_batch, folded, batch)
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


