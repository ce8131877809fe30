"""Pipeline stages in a report: the bubble by the schedule's formula beside the bubble measured from step times,
the stage-to-stage transfers per step, and what each layout holds per device.

The measured bubble pairs each run with S > 1 stages and M microbatches (its step time T) with a one-stage run of
the same model at the same microbatch size (rows per microbatch per data shard), splitting each layer alike (the
same model, expert and seq axes; its own layout without stages where the report has it), with M1 microbatches
(step time T1). A stage holds L/S of the stack's L layers, so its useful work in a step is M microbatches through
L/S layers, 1/S of a one-stage run's M microbatches through all L; the one-stage run does that in T1 x M/M1.
Without a bubble, S stages working at once would take

    ideal = T1 x (M/M1) / S          measured bubble = 1 - ideal / T

(with gradient accumulation, M counts every microbatch of the update: accumulated x pipelined). It charges the
pipeline with everything it does not split S ways (fill and drain, stage-to-stage transfers, the replicated
layers outside the stack and their update, and the recomputation of circular and 1F1B), so on real devices it is an upper bound on the idle fraction the
schedule's formula gives ((S-1)/(M+S-1) for GPipe). On simulated CPU devices the S stages share the host's
cores and cannot compute at once, so the figure is not the bubble there: the report says so and sets T/T1 beside
the work the pipeline's single program does, whose idle stages compute on placeholders ((M+S-1)/M of the
one-stage stack's work for GPipe's M + S - 1 iterations; `shardbench.parallel.pipeline.stack_work` per schedule).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardbench.measure.run_record import Collective
from shardbench.parallel.mesh import DATA, STAGE
from shardbench.parallel.pipeline import stack_work

if TYPE_CHECKING:
    from shardbench.report.content import ReportedRun

MIB = 1024 * 1024
# Why a schedule's program computes more than the useful work (shardbench.parallel.pipeline.stack_work).
WORK = {"gpipe": "(M+S-1)/M: its idle stages compute on placeholders",
        "circular": "(R*M+S-1)/(R*M) x 4/3: idle stages compute on placeholders, and each chunk is recomputed in "
                    "the backward",
        "1f1b": "2(M+S-1)/M x 4/3: every tick computes a forward and a backward with its recomputed forward, and "
                "keeps the one the schedule gives the stage"}


@dataclass(frozen=True)
class Bubble:
    """One pipeline run's bubble, by formula and measured against its one-stage reference."""

    run: ReportedRun
    reference: ReportedRun
    stages: int
    passes: int  # microbatches per update: accumulated x pipelined
    reference_passes: int
    formula: float | None  # the record's pipeline_bubble: the schedule's own formula

    @property
    def ideal_s(self) -> float:
        """The step time with no bubble: the one-stage run's work for these microbatches, split over S stages."""
        return (self.reference.step_median or 0.0) * self.passes / self.reference_passes / self.stages

    @property
    def measured(self) -> float:
        return 1.0 - self.ideal_s / (self.run.step_median or 1.0)

    @property
    def time_ratio(self) -> float:
        """T / (T1 x M/M1): the pipeline's step over the one-stage run's for the same microbatches."""
        same_work = self.stages * self.ideal_s
        return (self.run.step_median or 0.0) / same_work if same_work else 0.0


def stages(run: ReportedRun) -> int | None:
    return run.m.pipeline_stages


def passes(run: ReportedRun) -> int | None:
    """Microbatches per update through the stack: accumulated x pipelined."""
    m, k = run.m.pipeline_microbatches, run.m.grad_accum or 1
    return None if not m else m * k


def rows(run: ReportedRun) -> float | None:
    """Rows of one pipelined microbatch per data shard: the size the stack runs on."""
    per_shard, m = run.m.microbatch_per_shard, run.m.pipeline_microbatches
    return None if not per_shard or not m else per_shard / m


def schedule(run: ReportedRun) -> str:
    return str(run.config.get("parallel.schedule") or "gpipe")


def _model(run: ReportedRun) -> str:
    """The model and what it computes in: runs with equal keys hold comparable bytes and time comparable work."""
    keys = sorted(k for k in run.config if k.startswith(("model.", "precision.")))
    return json.dumps({k: run.config.get(k) for k in [*keys, "optim.optimizer"]}, sort_keys=True, default=str)


def _axes(run: ReportedRun) -> dict[str, int]:
    """The run's mesh as axis sizes, its stage axis left out (a one-device run, 'none': every axis 1)."""
    return {axis: size for axis, size in run.mesh_sizes.items() if axis != STAGE}


def without_stages(run: ReportedRun, ref: ReportedRun) -> bool:
    """`ref` is `run`'s layout with one stage: the same size on every other axis."""
    return _axes(ref) == _axes(run)


def bubbles(runs: list[ReportedRun]) -> list[Bubble]:
    """Each timed pipeline run (S > 1) with a one-stage run of its model at its microbatch size that splits each
    layer as it does (the same model, expert and seq axes): its own layout without stages first, then one with
    as many microbatches. A one-stage run that splits a layer otherwise (a model axis of another size) does other
    work per device, and is no reference."""
    timed = [r for r in runs if r.ok and r.step_median and stages(r) and passes(r)]
    references = [r for r in timed if stages(r) == 1]
    found = []
    for run in timed:
        if (stages(run) or 1) < 2:
            continue
        inner = {axis: size for axis, size in _axes(run).items() if axis != DATA}
        same = [r for r in references if _model(r) == _model(run) and rows(r) == rows(run)
                and {axis: size for axis, size in _axes(r).items() if axis != DATA} == inner]
        if not same:
            continue
        ref = min(same, key=lambda r: (not without_stages(run, r), passes(r) != passes(run)))
        found.append(Bubble(run, ref, stages(run) or 1, passes(run) or 1, passes(ref) or 1,
                            run.m.pipeline_bubble))
    return found


def with_bubbles(runs: list[ReportedRun]) -> list[ReportedRun]:
    """The runs with their measured bubble (`ReportedRun.bubble`), where a one-stage run pairs with them."""
    measured = {b.run.name: b.measured for b in bubbles(runs)}
    return [dataclasses.replace(r, bubble=measured[r.name]) if r.name in measured else r for r in runs]


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _label(run: ReportedRun) -> str:
    return (f"{run.config.get('model.kind') or run.rec.model} {run.strategy} on {stages(run)} stages, "
            f"{schedule(run)}, M={run.m.pipeline_microbatches}")


def bubble_findings(runs: list[ReportedRun]) -> list[str]:
    """Per pipeline run: the formula's bubble and the measured one, with the step times they come from; where the
    stages are simulated, why the measured figure is not the bubble, and the time ratio beside the work ratio."""
    found = bubbles(runs)
    sentences = []
    for b in found:
        text = (f"{_label(b.run)}: bubble by the schedule's formula {_pct(b.formula)}, measured "
                f"{_pct(b.measured)} (step {1e3 * (b.run.step_median or 0):,.1f} ms against the ideal "
                f"{1e3 * b.ideal_s:,.1f} ms: the one-stage run's {1e3 * (b.reference.step_median or 0):,.1f} ms "
                f"x {b.passes}/{b.reference_passes} microbatches / {b.stages} stages, {b.reference.name}"
                + ("" if without_stages(b.run, b.reference) else
                   f", a one-stage run on mesh {b.reference.field('mesh', 'parallel.mesh')} (data axis "
                   f"{_axes(b.reference)[DATA]}, this run's {_axes(b.run)[DATA]}) at the same rows per device")
                + ")")
        if b.run.simulated and b.formula is not None and b.formula < 1:
            # In one SPMD program an idle stage computes on a placeholder, and circular and 1F1B recompute.
            kind = schedule(b.run)
            work = stack_work(kind, b.stages, b.run.m.pipeline_microbatches or 1, int(b.run.config.get("parallel.repeats") or 1))
            text += (f"; it took {b.time_ratio:.2f}x the one-stage step for the same microbatches, where its "
                     f"program computes {work:.2f}x the one-stage stack's work ({WORK[kind]})")
        sentences.append(text + ".")
    if any(b.run.simulated for b in found):
        sentences.append("These stages are simulated devices on one host: they share its cores, so the stages "
                         "cannot all compute at the same time, and the measured figure, which assumes they do, is "
                         "not the pipeline's bubble on this host. It is the figure to measure on real devices, one "
                         "per stage; here the time ratio beside the work ratio is the comparison that applies.")
    unpaired = [r for r in runs if r.ok and (stages(r) or 1) > 1 and r.name not in {b.run.name for b in found}]
    if unpaired:
        sentences.append(f"No one-stage run of the same model at the same microbatch size, splitting each layer alike, "
                         f"to measure the bubble of "
                         f"{', '.join(r.name for r in unpaired)} against (run its strategy on its mesh with "
                         f"stage=1, as many microbatches of as many rows: for pp alone, --mesh stage=1 --devices 1, "
                         f"which the `pipeline` sweep preset runs).")
    return sentences


def transfer_findings(runs: list[ReportedRun]) -> list[str]:
    """Per pipeline run: the stage-to-stage transfers its record counts per step, against all its collectives."""
    sentences = []
    for run in runs:
        moved: Collective | None = run.m.pipeline_transfers
        if not run.ok or (stages(run) or 1) < 2 or moved is None:
            continue
        total = run.comms_mib or 0.0
        # Bytes sent, the fullest device's (a permute is sent by its source devices alone), as the total is; an
        # older record's payloads for both, saying so.
        sent = run.comms_sent and moved.sent_bytes is not None
        shown = (moved.sent_bytes if sent else moved.bytes) or 0
        sentences.append(f"{_label(run)}: {moved.count or 0} stage-to-stage transfers per step, "
                         f"{shown / MIB:,.2f} MiB per device, of {total:,.2f} MiB in all its collectives"
                         + ("." if sent else " (payloads: the record has no bytes sent)."))
    return sentences


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def memory_findings(runs: list[ReportedRun]) -> list[str]:
    """Per model, what each layout holds per device: parameters + optimizer state (against dp's) and activations
    and temporaries, the pipelines' per schedule and microbatch count. One-stage runs are references, left out."""
    groups: dict[str, list[ReportedRun]] = {}
    for run in runs:
        if run.ok and (stages(run) or 0) != 1:
            groups.setdefault(_model(run), []).append(run)
    sentences = []
    for group in groups.values():
        if not any((stages(r) or 1) > 1 for r in group):
            continue
        kind = group[0].config.get("model.kind") or group[0].rec.model
        replica = next((r for r in group if r.strategy == "dp"), None)
        full = None if replica is None else _state(replica)
        held, acts = [], []
        names = [run.strategy if (stages(run) or 1) < 2 else
                 f"{run.strategy} {schedule(run)} M={run.m.pipeline_microbatches}" for run in group]
        # two layouts of one name (a strategy on two meshes) are told apart by their mesh, then by the run's name
        names = [f"{n} on {r.field('mesh', 'parallel.mesh')}" if names.count(n) > 1 else n
                 for n, r in zip(names, group, strict=True)]
        names = [f"{n} ({r.name})" if names.count(n) > 1 else n for n, r in zip(names, group, strict=True)]
        for run, name in zip(group, names, strict=True):
            state = _state(run)
            if state is not None:
                share = f" (1/{full / state:.1f} of dp's)" if full and state and run is not replica else ""
                held.append(f"{name} {_mib(state)}{share}")
            acts.append(f"{name} {_mib(run.part('activations_temporaries'))}")
        sentences.append(f"{kind}, MiB per device: parameters + optimizer state {'; '.join(held)}. Activations and "
                         f"temporaries (the compiled program's, less the gradients): {'; '.join(acts)}.")
        sentences += _microbatch_findings(kind, [r for r in group if (stages(r) or 1) > 1])
    return sentences


def _microbatch_findings(kind: str, piped: list[ReportedRun]) -> list[str]:
    """Activations and temporaries against the microbatch count, between runs that differ in it alone (their
    strategy, mesh, stages, schedule, batch and accumulation the same): runs that differ in more were compared
    ("at M=2 ... with the batch fixed", where M=2 was another mesh, or accumulated 2 microbatches of its own)."""
    alike: dict[str, list[ReportedRun]] = {}
    for run in piped:
        rest = {k: v for k, v in run.settings.items() if k != "parallel.microbatches"}
        alike.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(run)
    sentences = []
    for same in alike.values():
        same = sorted(same, key=lambda r: r.m.pipeline_microbatches or 0)
        values = [(r.m.pipeline_microbatches, r.part("activations_temporaries")) for r in same]
        if len({m for m, _ in values}) < 2 or any(v is None for _, v in values):
            continue
        (lo_m, lo), (hi_m, hi) = values[0], values[-1]
        sentences.append(f"{kind} {schedule(same[0])} ({same[0].name} against {same[-1].name}): activations and "
                         f"temporaries {_mib(lo)} MiB at M={lo_m} and {_mib(hi)} MiB at M={hi_m}, with all else the "
                         f"same (each microbatch smaller as M grows).")
    return sentences


def _state(run: ReportedRun) -> float | None:
    params, optimizer = run.part("params"), run.part("optimizer")
    return None if params is None or optimizer is None else params + optimizer


def pipeline_findings(runs: list[ReportedRun]) -> list[str]:
    return bubble_findings(runs) + transfer_findings(runs) + memory_findings(runs)
