"""What a report shows, computed once and rendered twice (Markdown and HTML): each run as the report reads it
from its record (`ReportedRun`), the table's columns, the charts written, and the content both renderings share.
Kept apart from the renderers so that they all depend on it and on nothing of each other.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from shardbench.config import REPORTING_ONLY, Config
from shardbench.errors import ConfigError, ShardbenchError
from shardbench.measure.kernels import TraceTime
from shardbench.measure.run_record import (
    Breakdown, Collective, CompileTimes, Measurements, Memory, Mfu, RunRecord, StepTimes, Throughput, from_json,
)
from shardbench.parallel.mesh import MESH_AXES, parse_mesh
from shardbench.parsing import override
from shardbench.prices import significant
from shardbench.report.cost import COST_COLUMNS
from shardbench.store import RunRow
from shardbench.validation import inert_fields

MIB = 1024 * 1024
DASH = "-"
INCOMPLETE = "incomplete"  # a run folder without summary.json
# Fields that differ between runs by construction (where each run writes) or that do not change results:
# they are never "what was swept" and never stop two runs from being compared.
NOISE = REPORTING_ONLY  # never what was swept: see shardbench.config


def fixed(value: float | None, fmt: str) -> str:
    return DASH if value is None else format(value, fmt)


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class ReportedRun:
    """One run as the report sees it, from the store or from a run directory; figures are None when absent.
    Its record is read through `shardbench.measure.run_record`, the one schema."""

    name: str
    status: str
    error_kind: str | None
    error: str | None
    overrides: dict[str, Any]
    config: dict[str, Any]  # flattened {"section.field": value}
    record: RunRecord | None  # summary.json when complete
    predicted: dict[str, Any] | None = None  # the planner's prediction of this run (`shardbench plan --validate`)
    losses: tuple[tuple[int, float], ...] | None = None  # (step, train loss) as logged, where the run folder has them
    bubble: float | None = None  # pipeline stages: the bubble measured against a one-stage run (report.pipeline)
    folder: Path | None = None  # the folder its summary.json lies in, for a run read from a folder of runs
    # False for a run folder without config.json: its settings are the few its record gives (strategy, mesh,
    # devices, spmd, model kind, global batch), too few to say that two runs compute the same thing.
    configured: bool = True
    traced: TraceTime | None = None  # its profiler trace's op time by kind (report.traces), where --profile left one
    trace_error: str | None = None  # why a trace it recorded could not be read
    # What it read that its settings do not say (`report.write._inputs`): {"data": data.json's sha1, "model": a
    # model of your own's file's sha256}, where its folder keeps them
    inputs: dict[str, str] = dataclass_field(default_factory=dict)
    # What an unfinished run started with, from its layout.json: {"parallel.strategy": "pp", "parallel.mesh":
    # "stage=2"} (`auto` and the default mesh resolved). Shown where its record would be; never a setting, so a
    # default left to resolve is not taken for a value swept.
    started: dict[str, str] = dataclass_field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "complete" and self.record is not None

    @property
    def settings(self) -> dict[str, Any]:
        """The configuration that defines what ran: two runs with equal settings are the same experiment."""
        return {k: v for k, v in self.config.items() if k not in NOISE}

    @property
    def rec(self) -> RunRecord:
        """The record, or an empty one (every figure None) for a run without one."""
        return self.record or EMPTY

    @property
    def m(self) -> Measurements:
        return self.rec.measurements or Measurements()

    @property
    def simulated(self) -> bool:
        """Its devices are several simulated on a CPU host (XLA's host platform): they share the host's cores."""
        return (self.m.platform or "").lower() == "cpu" and (self.devices or 1) > 1

    @property
    def step_median(self) -> float | None:
        return number((self.m.step_time_s or StepTimes()).median)

    @property
    def step_p90(self) -> float | None:
        return number((self.m.step_time_s or StepTimes()).p90)

    @property
    def measured_steps(self) -> int | None:
        """How many step intervals the median and p90 were taken over (None where the record does not say)."""
        value = number((self.m.step_time_s or StepTimes()).measured_steps)
        return None if value is None else int(value)

    @property
    def compile_s(self) -> float | None:
        return number((self.m.compile or CompileTimes()).compile_s)

    @property
    def cache_hits(self) -> tuple[int, int] | None:
        """(hits, requests) of the persistent compilation cache where it answered at least one of the run's
        programs; None where it answered none or was off."""
        cache = self.m.compile_cache
        hits, requests = (None, None) if cache is None else (number(cache.hits), number(cache.requests))
        return (int(hits), int(requests or hits)) if hits else None

    @property
    def compiled_from_cache(self) -> bool:
        """Some or all of the run's programs were loaded from the persistent compilation cache: its compile time
        is partly or wholly a load from disk, which compares with no run's compilation."""
        return self.cache_hits is not None

    @property
    def cache_note(self) -> str:
        """'cache' where every program came from the cache, 'cache 7/8' where some did; '' where none."""
        if self.cache_hits is None:
            return ""
        hits, requests = self.cache_hits
        return "cache" if hits >= requests else f"cache {hits}/{requests}"

    @property
    def mfu(self) -> Mfu:
        return self.m.mfu or Mfu()

    @property
    def mfu_value(self) -> float | None:
        return number(self.mfu.mfu)

    def rate(self, key: str) -> float | None:
        """A throughput figure: examples_per_s, units_per_s, and their _per_device: the global batch over the
        median step (derived so for records before schema 2, which divided by the epochs' wall time)."""
        if key.startswith("units") and self.unit == "images":  # an image is the example: records before schema
            key = "examples" + key.removeprefix("units")      # 2 kept no units_per_s for them
        recorded = self.m.throughput or Throughput()
        # No step time (or an old record's median of 0.0, nothing to divide by): the figure as recorded.
        if self.rec.schema_version >= 2 or not self.step_median or self.batch is None:
            return number(getattr(recorded, key))
        examples = self.batch / self.step_median
        per_example = 1.0
        if key.startswith("units"):
            old_units, old_examples = number(recorded.units_per_s), number(recorded.examples_per_s)
            if not old_units or not old_examples:
                return None
            per_example = old_units / old_examples
        devices = self.devices or 1
        return examples * per_example / (devices if key.endswith("_per_device") else 1)

    def why_not(self, figure: str) -> str:
        """Why a complete run lacks its MFU or step time ("mfu", "step_time_s"), as its record says."""
        timing = (self.m.step_time_s or StepTimes()).not_measured
        said = self.mfu.not_measured if figure == "mfu" else timing
        if said:
            return str(said)
        if figure == "mfu" and timing:
            return f"no step time: {timing}"
        return "the record does not say why (written by an older shardbench)"

    def field(self, record_key: str, config_key: str) -> Any:
        # The record says what actually ran (e.g. the resolved mesh); an unfinished run's layout.json what it started
        # with; the config is all else a failed run has.
        value = getattr(self.rec, record_key)
        if value in (None, ""):
            value = self.started.get(config_key)
        return self.config.get(config_key) if value in (None, "") else value

    @property
    def strategy(self) -> str:
        return str(self.field("strategy", "parallel.strategy") or "?")

    @property
    def mesh_sizes(self) -> dict[str, int]:
        """The mesh it ran on as {axis: size} over every mesh axis: 1 where an axis is not split, and on every axis
        for one device ('none') or a mesh the report cannot read."""
        text = str(self.field("mesh", "parallel.mesh") or "none")
        try:
            sizes = parse_mesh(text, None).as_dict() if text.lower() not in ("none", "") else {}
        except ConfigError:
            sizes = {}
        return {axis: sizes.get(axis, 1) for axis in MESH_AXES}

    @property
    def devices(self) -> int | None:
        if not self.rec.devices and self.strategy == "single":  # a failed run's config may say --devices 8:
            return 1                                             # single runs on one device, as its record says
        value = number(self.field("devices", "parallel.devices"))
        return int(value) if value else None  # 0 in a config means "all", which is unknown here

    @property
    def batch(self) -> int | None:
        """The global batch: as configured, else as the record measured it (a run folder without config.json)."""
        value = number(self.config.get("train.batch_size"))
        if value is None:
            value = number(self.m.global_batch)
        return None if value is None else int(value)

    @property
    def wall_rate(self) -> bool:
        """Its throughput figures are its record's wall-clock rate (examples over the epochs' wall time, data
        loading included), not the global batch over the median step: a record from before schema 2 with no step
        time (or no batch) to derive them from."""
        return self.ok and self.rec.schema_version < 2 and not (self.step_median and self.batch)

    @property
    def unit(self) -> str:
        """What throughput counts: images (vit, and records from before other models), tokens or examples."""
        return str((self.m.throughput or Throughput()).unit or "images")

    @property
    def images_per_s(self) -> float | None:
        if self.unit != "images":
            return None
        # Records written before measurements existed still carry the top-level figure.
        measured = self.rate("examples_per_s")
        return measured if measured is not None else number(self.rec.images_per_s)

    def per_s(self, unit: str) -> float | None:
        """Throughput in `unit`s per second, for runs that count that unit."""
        return self.rate("units_per_s") if self.unit == unit else None

    @property
    def rate_text(self) -> str:
        """Throughput with its unit, for one line: '1300 img/s', '52,000 tokens/s'."""
        if self.unit == "images":
            return f"{fixed(self.images_per_s, '.0f')} img/s"
        return f"{fixed(self.per_s(self.unit), ',.0f')} {self.unit}/s"

    @property
    def epoch_s(self) -> float | None:
        times = [t for t in map(number, self.m.epoch_time_s or []) if t is not None]
        return statistics.fmean(times) if times else None

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps in a whole epoch, where the record says (a run cut short by --steps records its partial epoch)."""
        for partial in self.m.partial_epochs:
            if partial.of:
                return int(partial.of)
        return None

    @property
    def epoch_projected_s(self) -> float | None:
        """For a run that trained no whole epoch: steps per epoch x median step (data loading not included)."""
        if self.epoch_s is not None or not self.steps_per_epoch or not self.step_median:
            return None
        return self.steps_per_epoch * self.step_median

    @property
    def why_no_epoch(self) -> str:
        """Why a complete run has no epoch time: it trained only part of an epoch (from its record)."""
        if self.m.partial_epochs:
            p = self.m.partial_epochs[0]
            return f"partial epoch only: {p.steps} of {p.of} steps in {p.time_s or 0:.1f} s"
        return "not measured"

    @property
    def memory(self) -> tuple[float | None, str]:
        """Per-device memory in MiB and its source: the runtime peak where reported, else XLA's compiled total."""
        memory = self.m.memory or Memory()
        peak = _mib(memory.peak_bytes_in_use)
        return (peak, "peak") if peak is not None else (_mib(memory.total_bytes), "compiled")

    def part(self, name: str) -> float | None:
        """One entry of the memory breakdown in MiB: params, optimizer, model_state, gradients,
        activations_temporaries, other."""
        return _mib(getattr((self.m.memory or Memory()).breakdown or Breakdown(), f"{name}_bytes"))

    @property
    def state_mib(self) -> float | None:
        """Parameters + optimizer state + gradients: the bytes the parameter dtype governs."""
        parts = [self.part(p) for p in ("params", "optimizer", "gradients")]
        return None if None in parts else sum(p for p in parts if p is not None)

    @property
    def comms(self) -> dict[str, Collective]:
        return self.m.comms or {}

    @property
    def comms_sent(self) -> bool:
        """Whether the record keeps the bytes each device sends per collective; records written before it did
        give only the payload (the collectives' buffers), which the report then shows instead, saying so."""
        return self.m.comms_total_sent_bytes is not None or not self.comms or all(
            c.sent_bytes is not None for c in self.comms.values())

    def comms_bytes(self, kind: str) -> float:
        """One kind's bytes per device per step: sent on a ring, or the payload where the record has no more."""
        if kind not in self.comms:
            return 0.0
        collective = self.comms[kind]
        return number(collective.sent_bytes if self.comms_sent else collective.bytes) or 0.0

    @property
    def comms_mib(self) -> float | None:
        """Every collective's bytes per device per step, in MiB: sent on a ring, or the payload (`comms_sent`)."""
        total = _mib(self.m.comms_total_sent_bytes) if self.comms_sent else None
        if total is None and (not self.comms_sent or not self.comms):  # the payload, or no collectives at all
            total = _mib(self.m.comms_total_bytes)
        if total is None and self.ok and self.m.comms:
            total = sum(self.comms_bytes(kind) for kind in self.comms) / MIB
        return total

    @property
    def stage_mib(self) -> float | None:
        """A pipeline's stage-to-stage transfers per step, in MiB: what its fullest device sends, or the payload
        where the record has no more (`comms_sent`, as `comms_mib`); None without stages."""
        moved = self.m.pipeline_transfers
        if (self.m.pipeline_stages or 1) < 2:
            return None
        moved = moved or Collective()
        return _mib(moved.sent_bytes if self.comms_sent and moved.sent_bytes is not None else moved.bytes)

    @property
    def collectives(self) -> str:
        if not self.ok or self.record is None or self.record.measurements is None:
            return ""
        kinds = sorted(self.comms, key=lambda kind: -self.comms_bytes(kind))  # the heaviest first
        # No collectives is "none" where the record counted them; a record that never did (version 0) has no word.
        counted = self.comms or self.m.comms_total_bytes is not None
        return ", ".join(f"{k}×{int(number(self.comms[k].count) or 0)}" for k in kinds) or ("none" if counted else "")

    @property
    def label(self) -> str:
        return f"failed ({self.error_kind})" if self.error_kind else self.status


def comms_measure(runs: list[ReportedRun]) -> str:
    """What the collective figures of `runs` count: "sent" (the bytes each device sends on a ring), "payload"
    (the collectives' buffers: records written before bytes sent were kept) or "mixed"."""
    sent = {r.comms_sent for r in runs if r.ok and r.comms}
    return "mixed" if len(sent) > 1 else "payload" if sent == {False} else "sent"


def comms_phrase(run: ReportedRun) -> str:
    """What a run's collective figure is, after its MiB: 'sent in collectives' or 'of collective payload'."""
    return "sent in collectives" if run.comms_sent else "of collective payload"


def reported(row: RunRow, source: str = "the run's record") -> ReportedRun:
    """A stored run as the report reads it: its record through the one schema (`from_json`)."""
    record = None if row.record is None else from_json(row.record, source)
    return ReportedRun(row.name, row.status, row.error_kind, row.error, row.overrides, row.config, record)


def _mib(value: Any) -> float | None:
    found = number(value)
    return None if found is None else found / MIB


EMPTY = RunRecord()


def model_name(run: ReportedRun) -> str:
    """The model a run trained: its kind (vit, lm, mlp), or a model of your own's file and function."""
    factory = run.config.get("model.factory")
    return Path(str(factory)).name if factory else str(run.config.get("model.kind") or run.rec.model or "")


def setting_text(value: Any) -> str:
    """A setting as both renderings show it: '' (a field left at its default, such as the mesh) as "(default)"."""
    return "(default)" if value == "" else str(value)


@dataclass(frozen=True)
class Column:
    """One table column: `value` gives the sort key (None = missing), `text` what is shown."""

    key: str
    label: str
    numeric: bool
    value: Callable[[ReportedRun], Any]
    digits: int = 1
    optional: bool = False  # hidden also where every value is `usual` (every column is hidden where none has one)
    usual: Any = None  # an optional column whose every value is this one is not shown either (e.g. spmd jit)
    significant: bool = False  # `digits` are significant digits (the cost columns), not decimals

    def text(self, run: ReportedRun) -> str:
        value = self.value(run)
        if value is None or value == "":
            return "–"
        if self.key == "mem_mib":  # the figure alone would hide whether it is measured or compiled
            return f"{value:,.{self.digits}f} ({run.memory[1]})"
        if self.key in ("comms_mib", "stage_mib") and not run.comms_sent:  # an older record: its payload
            return f"{value:,.{self.digits}f} (payload)"
        if self.key == "compile_s" and run.compiled_from_cache:  # a load from disk, not a compilation
            return f"{value:,.{self.digits}f} ({run.cache_note})"
        if self.key in RATE_KEYS and run.wall_rate:  # an old record's wall-clock rate, not batch / median step
            return f"{value:,.{self.digits}f} (wall clock)"
        if self.significant and self.numeric:
            return significant(value, self.digits)
        return f"{value:,.{self.digits}f}" if self.numeric else str(value)


RATE_KEYS = ("img_s", "img_s_device", "tokens_s", "examples_s")  # the throughput columns


def _scaled(get: Callable[[ReportedRun], float | None], factor: float) -> Callable[[ReportedRun], float | None]:
    def scaled(run: ReportedRun) -> float | None:
        value = get(run)
        return None if value is None else value * factor

    return scaled


COLUMNS: tuple[Column, ...] = (
    Column("run", "run", False, lambda r: r.name),
    Column("status", "status", False, lambda r: r.label),
    Column("model", "model", False, lambda r: model_name(r), optional=True, usual="vit"),
    Column("strategy", "strategy", False, lambda r: r.strategy),
    Column("spmd", "spmd", False, lambda r: r.config.get("parallel.spmd") or r.rec.spmd, optional=True,
           usual="jit"),
    Column("mesh", "mesh", False, lambda r: r.field("mesh", "parallel.mesh")),
    Column("devices", "devices", True, lambda r: r.devices, 0),
    Column("processes", "processes", True, lambda r: r.m.processes, 0, optional=True, usual=1),
    Column("batch", "batch", True, lambda r: r.batch, 0),
    Column("param_dtype", "param dtype", False, lambda r: r.config.get("precision.param_dtype")),
    Column("dtype", "dtype", False, lambda r: r.config.get("precision.dtype")),
    Column("epoch_s", "epoch time s", True, lambda r: r.epoch_s, 2),
    Column("step_ms_median", "step ms median", True, _scaled(lambda r: r.step_median, 1e3)),
    Column("step_ms_predicted", "step ms predicted", True,
           _scaled(lambda r: number((r.predicted or {}).get("step_s")), 1e3), optional=True),
    Column("step_ms_p90", "step ms p90", True, _scaled(lambda r: r.step_p90, 1e3)),
    Column("compile_s", "compile s", True, lambda r: r.compile_s, 2),
    Column("img_s", "img/s", True, lambda r: r.images_per_s, 0, optional=True),
    Column("img_s_device", "img/s/device", True,
           lambda r: r.rate("examples_per_s_per_device") if r.unit == "images" else None, 0,
           optional=True),
    Column("tokens_s", "tokens/s", True, lambda r: r.per_s("tokens"), 0, optional=True),
    Column("examples_s", "examples/s", True, lambda r: r.per_s("examples"), 0, optional=True),
    Column("mfu_pct", "MFU %", True, _scaled(lambda r: r.mfu_value, 100.0)),
    Column("mem_mib", "memory/device MiB", True, lambda r: r.memory[0]),
    Column("mem_mib_predicted", "memory/device MiB predicted", True,
           lambda r: _mib((r.predicted or {}).get("total_bytes")), optional=True),
    Column("params_mib", "params MiB", True, lambda r: r.part("params")),
    Column("optimizer_mib", "optimizer MiB", True, lambda r: r.part("optimizer")),
    Column("model_state_mib", "model state MiB", True, lambda r: r.part("model_state"), optional=True, usual=0.0),
    Column("gradients_mib", "gradients MiB", True, lambda r: r.part("gradients")),
    Column("activations_mib", "activations MiB", True, lambda r: r.part("activations_temporaries")),
    Column("comms_mib", "comms/step MiB", True, lambda r: r.comms_mib, 2),
    Column("stage_mib", "stage-to-stage MiB/step", True, lambda r: r.stage_mib, 2, optional=True),
    Column("trace_step_ms", "traced step ms", True, lambda r: r.traced.span_ms if r.traced else None,
           optional=True),
    Column("trace_collective_ms", "collectives ms/step (trace)", True,
           lambda r: r.traced.collectives_ms if r.traced else None, digits=2, optional=True),
    Column("bubble_formula_pct", "bubble % formula", True,
           lambda r: None if r.m.pipeline_bubble is None else 100.0 * r.m.pipeline_bubble, optional=True),
    Column("bubble_measured_pct", "bubble % measured", True,
           lambda r: None if r.bubble is None else 100.0 * r.bubble, optional=True),
    Column("collectives", "collectives", False, lambda r: r.collectives),
    Column("test_acc_pct", "test acc %", True, _scaled(lambda r: number(r.rec.test_accuracy), 100.0)),
    Column("test_loss", "test loss", True, lambda r: number(r.rec.test_loss), 4, optional=True),
    Column("test_ppl", "test perplexity", True, lambda r: number(r.rec.test_perplexity), 2, optional=True),
    Column("loss_floor", "best possible loss", True, lambda r: number(r.rec.dataset.get("loss_floor")), 4,
           optional=True),
    # Dollars and kWh per epoch and per billion tokens or million images (shardbench.report.cost).
    *(Column(key, label, numeric, value, digits, optional=True, significant=True)
      for key, label, numeric, digits, value in COST_COLUMNS),
)


def shown(columns: tuple[Column, ...], runs: list[ReportedRun]) -> tuple[Column, ...]:
    """The columns to show for `runs`: those in which some run has a value (a column of dashes says nothing the
    table note does not), an optional one only where some value is not its usual one."""
    return tuple(c for c in columns
                 if any(c.value(r) not in (None, "", c.usual if c.optional else None) for r in runs))


@dataclass(frozen=True)
class Chart:
    """One written chart: `name` is the file stem, `note` says what was left out or assumed ('' = nothing);
    `clipped` lists any text the figure's edges cut (none, unless a label outgrew its room)."""

    name: str
    title: str
    path: Path
    note: str = ""
    clipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReportContent:
    """Everything both renderings show, computed once."""

    title: str
    source: str
    runs: list[ReportedRun]
    columns: tuple[Column, ...]
    swept: dict[str, list[Any]]
    findings: dict[str, list[str]]
    charts: list[Chart]
    table_note: str
    omitted: tuple[str, ...] = ()  # one line per chart left out because it would have nothing to show
    base: dict[str, Any] = dataclass_field(default_factory=dict)  # what the sweep set for every run (its store's base)
    # A stopped sweep: per field, the values its runs not recorded yet would set that no recorded run has.
    unrecorded: dict[str, list[Any]] = dataclass_field(default_factory=dict)

    @property
    def failed(self) -> list[ReportedRun]:
        return [r for r in self.runs if not r.ok]

    @property
    def varied(self) -> dict[str, list[Any]]:
        """The swept fields that took more than one value."""
        return {k: v for k, v in self.swept.items() if len(v) > 1}

    def varied_text(self) -> dict[str, str]:
        """Each field that took more than one value, with its values as shown: a mesh left to its default says the
        mesh it ran as, which may be one the sweep also wrote out ('(default, ran as 8x1), 8x1')."""
        shown = {}
        for key, values in self.varied.items():
            texts = []
            for value in values:
                ran = sorted({str(r.rec.mesh) for r in self.runs if key == "parallel.mesh" and value == "" and
                              r.rec.mesh and r.overrides.get(key, r.config.get(key)) == ""})
                texts.append(f"(default, ran as {', '.join(ran)})" if ran else setting_text(value))
            shown[key] = ", ".join(texts)
        return shown

    def nothing_varied(self) -> str:
        return ("Nothing among the runs recorded so far: they share one configuration." if self.unrecorded else
                "Nothing: the runs share one configuration.")

    def unrecorded_text(self, code: Callable[[str], str], text: Callable[[str], str]) -> str:
        """The sentence naming what the runs not recorded yet would sweep, each field through `code` and each
        value through `text` (the renderer's quoting)."""
        return "Planned but not recorded yet: " + "; ".join(
            f"{code(key)} = {text(', '.join(map(setting_text, values)))}" for key, values in self.unrecorded.items()
        ) + "."

    @property
    def fixed(self) -> dict[str, Any]:
        """What the sweep set for every run (its base: a preset's own settings, the flags given one value) and the
        overridden fields with one value over these runs (e.g. a sweep stopped before its second value)."""
        return {**{k: v for k, v in self.base.items() if k not in self.varied and k not in NOISE},
                **{k: v[0] for k, v in self.swept.items() if len(v) == 1}}

    def unread(self) -> dict[str, list[str]]:
        """{field: the runs that never read it} (`validation.inert_fields`): a sweep's --devices 8 is set for
        single's run too, which trains on one device. Runs whose configuration is not known are left out."""
        found: dict[str, list[str]] = {}
        for run in self.runs:
            if not run.configured:
                continue
            try:
                cfg = override(Config(), {k: v for k, v in run.config.items() if k != "preset"})
            except (ShardbenchError, TypeError, ValueError):  # an older record's fields: nothing said of it
                continue
            for key in inert_fields(cfg):
                found.setdefault(key, []).append(run.name)
        return found

    def fixed_text(self) -> list[tuple[str, str]]:
        """Each field set the same for every run, and its value as shown, with the runs that never read it."""
        shown = []
        never = self.unread() if self.fixed else {}
        for key, value in self.fixed.items():
            unread = never.get(key, [])
            more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
            shown.append((key, setting_text(value) + (f" (not read by {', '.join(unread[:3])}{more})" if unread
                                                      else "")))
        return shown
