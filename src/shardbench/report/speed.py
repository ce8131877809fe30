"""The report's first answers: which run trained fastest and by how much (with what differs, never a cause no
measurement shows), and whether runs that differ only in layout computed the same thing.

Speed is the steady state: the global batch over the median step, the figure MFU and the throughput column use,
so every speed figure of the report ranks the runs alike. Two runs whose difference is within the spread of
their own step times (median to p90) tie.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardbench.report.content import ReportedRun

# Fields that change how a step is laid out or compiled, never what it computes: runs that differ only in these
# must give the same losses (up to floating-point reordering).
LAYOUT_ONLY = frozenset({
    "parallel.strategy", "parallel.mesh", "parallel.devices", "parallel.spmd", "parallel.rules",
    "parallel.microbatches", "parallel.schedule", "parallel.repeats",  # a pipeline's, which computes as one device
    "parallel.context", "parallel.context_order", "parallel.sequence_parallel",  # context and sequence parallelism
    "model.unroll", "model.remat", "model.attention", "model.qkv_layout", "model.attention_pad_multiple",
    "train.xla_presets", "train.compile_cache", "train.timing_warmup", "train.profile", "train.profile_skip",
    "train.profile_steps", "train.checkpoint_every", "train.keep_checkpoints", "train.eval_batch_size",
})
# Relative loss difference allowed between runs of one computation, by compute dtype: float32 reorders sums
# across devices (measured: 1e-6 to 1e-5 over 20 steps of vit-tiny); bfloat16 rounds every activation.
LOSS_RTOL = {"float32": 2e-3, "bfloat16": 5e-2, "float16": 5e-2}
COMPARED_STEPS = 200  # losses logged after this many steps may drift apart chaotically, and are not compared
COMMS_NAMED_MIB = 1.0  # collectives below this per step are not named as a difference
# Said once under the slowdowns whenever some are listed with what differs.
NOT_A_CAUSE = ("What differs beside each slowdown is what the records show, not a measured cause: a run records "
               "how many bytes its collectives move, not how long they take (a profile, --profile, shows that).")


def _throughput(run: ReportedRun) -> float | None:
    step, batch = run.step_median, run.batch
    return batch / step if step and batch else None


def _spread(run: ReportedRun) -> float:
    """The run's own noise: its p90 step over its median, minus one."""
    step, p90 = run.step_median, run.step_p90
    return max(0.0, p90 / step - 1.0) if step and p90 else 0.0


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{1e3 * seconds:,.1f} ms"


def _differences(run: ReportedRun, fastest: ReportedRun) -> list[str]:
    """What the records show differs between `run` and `fastest`, as facts: none of it is a measured cause. A run
    records its collectives' bytes, not their time, and bytes alone do not say how long they took (on simulated
    devices sharing a host's cores, a few MiB cost next to nothing)."""
    out = []
    if (run.devices or 1) != (fastest.devices or 1):
        out.append(f"{run.devices or 1} device(s) against {fastest.devices or 1}")
    for k in sorted(set(run.settings) | set(fastest.settings)):
        if (k in ("model.remat", "precision.dtype", "precision.param_dtype", "parallel.spmd")
                and run.settings.get(k) != fastest.settings.get(k)):
            out.append(f"{k.split('.')[-1]} {run.settings.get(k)} against {fastest.settings.get(k)}")
    mine, theirs = run.comms_mib or 0.0, fastest.comms_mib or 0.0
    if max(mine, theirs) >= COMMS_NAMED_MIB and not math.isclose(mine, theirs, rel_tol=0.5):
        kinds = sorted(run.comms, key=lambda k: -run.comms_bytes(k))
        out.append(f"{mine:,.1f} MiB of collectives per device per step" + (f" ({', '.join(kinds)})" if kinds else "")
                   + f" against {theirs:,.1f} MiB")
    if not out and run.mfu_value is not None and fastest.mfu_value is not None:
        out.append(f"MFU {100 * run.mfu_value:.1f}% against {100 * fastest.mfu_value:.1f}%")
    return out


Model = tuple[tuple[str, str], ...]


def _model(run: ReportedRun) -> Model:
    """What a run trains, as far as ranking goes: its model kind (or the file of a model of your own) and every
    model setting that changes what an example computes (its sequence length, widths, depth ...; not those of
    LAYOUT_ONLY, such as remat): a 1k-token step and an 8k-token one are not the same work."""
    kind = str(run.settings.get("model.factory") or run.settings.get("model.kind") or "")
    shape = sorted((k, str(v)) for k, v in run.settings.items()
                   if k.startswith("model.") and k not in LAYOUT_ONLY and k not in ("model.kind", "model.factory"))
    return (("model", kind), *shape)


def _label(model: Model, models: list[Model]) -> str:
    """How a ranking names its runs where the sweep trains several models: the kind where the kinds differ and
    the settings in which the models differ ('lm run', 'run at seq_len 1024', 'lm run at seq_len 1024')."""
    varying = [(k, v) for k, v in model if len({dict(m).get(k) for m in models}) > 1]
    kind = "".join(v + " " for k, v in varying if k == "model")
    shape = ", ".join(f"{k.removeprefix('model.')} {v}" for k, v in varying if k != "model")
    return f"{kind}run" + (f" at {shape}" if shape else "")


def speed_findings(runs: list[ReportedRun]) -> list[str]:
    """Per model the sweep trains (a model kind or a model of your own at one shape: examples of different models,
    or of one model at another sequence length, are not alike), the fastest run, then every other run's slowdown
    against it as a ratio of steady-state throughput (of median step time where the batches are equal), what
    differs between them, and ties within the noise."""
    timed = [r for r in runs if r.ok and _throughput(r) is not None]
    models = sorted({_model(r) for r in timed}, key=lambda m: [(k, (len(v), v)) for k, v in m])
    found = [s for m in models
             for s in _ranking([r for r in timed if _model(r) == m], _label(m, models) if len(models) > 1 else "")]
    if any(NOT_A_CAUSE == s for s in found):
        found = [s for s in found if s != NOT_A_CAUSE] + [NOT_A_CAUSE]
    compiles = [(r.compile_s, r.name) for r in timed if r.compile_s is not None]
    if len(compiles) > 1 and max(compiles)[0] > 1.5 * min(compiles)[0]:
        (slow, slow_name), (quick, quick_name) = max(compiles), min(compiles)
        found.append(f"Compilation, which the step times leave out, took {quick:.1f} s ({quick_name}) to "
                     f"{slow:.1f} s ({slow_name}).")
    return found


def _ranking(timed: list[ReportedRun], model: str) -> list[str]:
    """One model's runs ranked; `model` names them where the sweep trains several ('lm run')."""
    if not timed:
        return []
    ranked = sorted(timed, key=lambda r: -(_throughput(r) or 0.0))
    fastest = ranked[0]
    same_batch = len({r.batch for r in ranked}) == 1
    unit = "step time" if same_batch else "throughput (batch / median step)"
    head = (f"Fastest{f' {model}' if model else ''}: {fastest.name}, {_ms(fastest.step_median)} per step"
            + ("" if same_batch else f" at batch {fastest.batch}, {_throughput(fastest):,.0f} examples/s")
            + (f" (ranked by median {unit})" if len(ranked) > 1
               else "."))
    sentences = [head if head.endswith(".") else head + "."]
    listed = False
    for run in ranked[1:]:
        ratio = (_throughput(fastest) or 0.0) / (_throughput(run) or 1.0)
        noise = max(_spread(run), _spread(fastest))
        figures = (f"{_ms(run.step_median)} against {_ms(fastest.step_median)}" if same_batch else
                   f"{_throughput(run):,.0f} against {_throughput(fastest):,.0f} examples/s")
        if ratio - 1.0 <= noise:
            sentences.append(f"{run.name} ties with {fastest.name} ({figures}): the {100 * (ratio - 1):.1f}% "
                             f"difference is within the spread of their step times (median to p90, up to "
                             f"{100 * noise:.1f}%), so this ranking cannot tell them apart.")
            continue
        differs = _differences(run, fastest)
        listed = listed or bool(differs)
        sentences.append(f"{run.name} is {ratio:.2f}x slower ({figures})"
                         + (f"; it differs in: {'; '.join(differs)}." if differs else "."))
    if listed:
        sentences.append(NOT_A_CAUSE)
    return sentences


@dataclass(frozen=True)
class Equivalence:
    """Runs that differ only in layout, and how far apart their losses are."""

    runs: tuple[str, ...]
    largest: float  # relative difference of their losses, the largest over the compared steps
    where: str  # the step (or "test loss") where it is largest
    tolerance: float
    dtype: str
    compared: int  # losses compared per run

    @property
    def same(self) -> bool:
        return self.largest <= self.tolerance


def _computation(run: ReportedRun) -> str:
    return json.dumps({k: v for k, v in run.settings.items() if k not in LAYOUT_ONLY}, sort_keys=True, default=str)


def _series(run: ReportedRun) -> dict[str, float]:
    """The losses a run can be compared on: each logged train loss within COMPARED_STEPS, and the test loss."""
    losses = {f"step {step}": loss for step, loss in (run.losses or ()) if step <= COMPARED_STEPS}
    steps = run.rec.steps or 0
    if run.rec.test_loss is not None and steps <= COMPARED_STEPS:
        losses["test loss"] = float(run.rec.test_loss)
    if not losses and run.rec.train_loss is not None and steps <= COMPARED_STEPS:
        losses[f"step {steps}"] = float(run.rec.train_loss)
    return losses


def equivalences(runs: list[ReportedRun]) -> list[Equivalence]:
    """Every group of two or more complete runs with the same model, data, seed, steps and precision that differ
    only in layout (LAYOUT_ONLY), with the largest relative difference of their common losses."""
    groups: dict[str, list[ReportedRun]] = {}
    for run in runs:
        if run.ok:
            groups.setdefault(_computation(run), []).append(run)
    found = []
    for group in groups.values():
        if len(group) < 2:
            continue
        series = [_series(r) for r in group]
        common = sorted(set.intersection(*(set(s) for s in series)))
        if not common:
            continue
        largest, where = 0.0, common[0]
        for key in common:
            values = [s[key] for s in series]
            scale = max(abs(v) for v in values) or 1.0
            gap = (max(values) - min(values)) / scale
            if gap > largest or not math.isfinite(gap):
                largest, where = gap, key
        dtype = str(group[0].config.get("precision.dtype", "float32"))
        found.append(Equivalence(tuple(r.name for r in group), largest, where, LOSS_RTOL.get(dtype, 5e-2), dtype,
                                 len(common)))
    return found


def equivalence_findings(runs: list[ReportedRun]) -> list[str]:
    sentences = []
    for eq in equivalences(runs):
        names = ", ".join(eq.runs)
        if eq.same:
            sentences.append(f"{names} are the same computation in different layouts: their losses differ by at "
                             f"most {eq.largest:.1e} (relative, over {eq.compared} compared losses), within the "
                             f"{eq.dtype} tolerance of {eq.tolerance:.0e}.")
        else:
            sentences.append(f"{names} should be the same computation but differ: their losses are {eq.largest:.1e} "
                             f"apart (relative) at {eq.where}, beyond the {eq.dtype} tolerance of "
                             f"{eq.tolerance:.0e}. Check the layouts' results before comparing their speed.")
    return sentences


def differing(runs: list[ReportedRun]) -> list[Equivalence]:
    """The groups whose losses differ beyond their tolerance (for the sweep's closing warning)."""
    return [eq for eq in equivalences(runs) if not eq.same]
