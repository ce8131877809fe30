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
from typing import TYPE_CHECKING, Any

from shardbench.measure.timing import MIN_MEASURED_STEPS
from shardbench.report.content import comms_phrase, number

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
# A step figure from fewer timed steps than MIN_MEASURED_STEPS has no spread to judge a difference by (one
# interval: p90 = median). Between such runs a gap within FEW_STEPS_MARGIN is called undecided: 15% lay above the
# upper quartile (13%) of the p90-over-median spreads of the 64 CPU records under benchmarks/data timed over 7 to
# 17 steps when it was set (their median 6.9%); the 119 there on 2026-11-29 give a median of 7.9% and an upper
# quartile of 17% (benchmarks/step_spreads.py), so a gap within it is within what one step's noise often is.
FEW_STEPS_MARGIN = 0.15
COMMS_NAMED_MIB = 1.0  # collectives below this per step are not named as a difference
# Bytes are counted from the compiled program, not timed: any gap is a fact, and one over this share of the larger
# is named (a factor of 2, as accumulating twice sends twice, went unnamed under the 50% it was).
COMMS_NAMED_REL = 0.1
# Said once under the slowdowns whenever some are listed with what differs.
NOT_A_CAUSE = ("What differs beside each slowdown is what the records show, not a measured cause: a run records "
               "how many bytes its collectives move, not how long they take (a profile, --profile, shows that).")
# Said instead where the ranked runs were profiled: their collective time is measured, but is not the gap either.
NOT_A_CAUSE_TRACED = ("What differs beside each slowdown is what the records show, not a measured cause: the bytes "
                      "are counted from each compiled step and the time in collectives is measured in each run's "
                      "trace (the Profiles section says what that time is on these devices), but neither says how "
                      "much of the gap it made, as collectives can overlap compute.")


def _throughput(run: ReportedRun) -> float | None:
    step, batch = run.step_median, run.batch
    return batch / step if step and batch else None


def _rate(run: ReportedRun) -> tuple[float, str]:
    """The steady-state throughput in the unit the table counts the run in (images, tokens, examples): the
    ranking's own figure (`_throughput`) x the units of one example."""
    examples = _throughput(run) or 0.0
    units, per = run.rate("units_per_s"), run.rate("examples_per_s")
    if run.unit == "tokens" and units and per:
        return examples * units / per, "tokens/s"
    return examples, "images/s" if run.unit == "images" else "examples/s"


def _rates(*runs: ReportedRun) -> str:
    """The runs' throughputs in their unit, as a sentence gives them: '32,768 against 40,960 tokens/s'."""
    rates = [_rate(r) for r in runs]
    return " against ".join(f"{value:,.0f}" for value, _ in rates) + f" {rates[-1][1]}"


def _spread(run: ReportedRun) -> float:
    """The run's own noise: its p90 step over its median, minus one."""
    step, p90 = run.step_median, run.step_p90
    return max(0.0, p90 / step - 1.0) if step and p90 else 0.0


def few_steps(run: ReportedRun) -> bool:
    """Its step figures rest on fewer than MIN_MEASURED_STEPS timed steps (a record that does not say is not)."""
    steps = run.measured_steps
    return steps is not None and steps < MIN_MEASURED_STEPS


def steps_note(runs: list[ReportedRun]) -> str:
    """How many timed steps the figures of `runs` rest on, for those with fewer than MIN_MEASURED_STEPS ('' for
    none): 'from 1 timed step each' or 'a from 1 timed step, b from 3'."""
    few = [r for r in runs if few_steps(r)]
    if not few:
        return ""
    counts = {r.measured_steps for r in few}
    if len(few) == len(runs) and len(counts) == 1:
        n = few[0].measured_steps
        return f"from {n} timed step{'' if n == 1 else 's'}" + (" each" if len(runs) > 1 else "")
    return ", ".join(f"{r.name} from {r.measured_steps} timed step{'' if r.measured_steps == 1 else 's'}"
                     for r in few)


def undecided(a: ReportedRun, b: ReportedRun, gap: float) -> bool:
    """A relative gap between two runs too small to rank them: one of them timed fewer than MIN_MEASURED_STEPS
    steps (its p90 says nothing of its noise) and the gap is within FEW_STEPS_MARGIN."""
    return (few_steps(a) or few_steps(b)) and abs(gap) <= FEW_STEPS_MARGIN


def noise(a: ReportedRun, b: ReportedRun) -> float:
    """The larger of two runs' own spreads (p90 over median, minus one): a gap within it is a tie."""
    return max(_spread(a), _spread(b))


UNDECIDED, TIE, APART = "undecided", "tie", "apart"


def verdict(a: ReportedRun, b: ReportedRun, gap: float) -> str:
    """How a relative gap between two runs (the slower's figure over the faster's, minus one) ranks them, by the one
    rule every section of the report uses, so that none calls faster what another calls a tie: UNDECIDED where
    either timed fewer than MIN_MEASURED_STEPS steps and the gap is within FEW_STEPS_MARGIN, TIE where it is
    within the spread of their step times (median to p90), else APART."""
    if undecided(a, b, gap):
        return UNDECIDED
    return TIE if abs(gap) <= noise(a, b) else APART


def _ms(seconds: float | None) -> str:
    """A step time as a sentence gives it: tenths of a millisecond, and three significant figures below 1 ms,
    where tenths made two steps 1.36x apart read "0.2 ms against 0.2 ms"."""
    if seconds is None:
        return "–"
    return f"{1e3 * seconds:.3g} ms" if 1e3 * seconds < 1 else f"{1e3 * seconds:,.1f} ms"


def _value(value: object) -> str:
    return "(default)" if value == "" else str(value)


# Settings whose `auto` a run resolves on its devices, and the record's field that says what it ran.
RESOLVED_IN_RECORD = {"model.attention": "attention", "model.qkv_layout": "qkv_layout"}


def _named_setting(run: ReportedRun, key: str) -> str:
    """A run's setting as the report names it: an `auto` with what the run's record says it ran ('auto
    (seq-major)'), where the record keeps it."""
    value = run.settings.get(key)
    ran = getattr(run.m, RESOLVED_IN_RECORD[key], None) if key in RESOLVED_IN_RECORD and value == "auto" else None
    return f"{_value(value)} ({ran})" if ran else _value(value)


def _differences(run: ReportedRun, fastest: ReportedRun) -> list[str]:
    """What the records show differs between `run` and `fastest`, as facts: none of it is a measured cause. Every
    setting whose value differs (NOISE left out), the device count where the settings do not show it, the
    process count (launch's, not a setting), and the collectives' bytes. A run records its collectives' bytes, not
    their time, and bytes alone do not say how long they took (on simulated devices sharing a host's cores, a few
    MiB cost next to nothing); where both runs were profiled, their traces' time in collectives is named too."""
    mine, theirs = run.settings, fastest.settings
    keys = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    out = [f"{k} {_named_setting(run, k)} against {_named_setting(fastest, k)}" for k in keys]
    for what, said in (("data", "the data it read (data.json's digest)"),
                       ("model", "its model file (model.json's digest)")):
        if run.inputs.get(what) and fastest.inputs.get(what) and run.inputs[what] != fastest.inputs[what]:
            out.append(said)
    if (run.devices or 1) != (fastest.devices or 1) and "parallel.devices" not in keys:
        out.append(f"{run.devices or 1} device(s) against {fastest.devices or 1}")
    if (run.m.processes or 1) != (fastest.m.processes or 1):  # not a setting: the launch's (or the sweep's)
        out.append(f"{run.m.processes or 1} process(es) against {fastest.m.processes or 1}")
    mine_mib, theirs_mib = run.comms_mib or 0.0, fastest.comms_mib or 0.0
    if max(mine_mib, theirs_mib) >= COMMS_NAMED_MIB and not math.isclose(mine_mib, theirs_mib,
                                                                                  rel_tol=COMMS_NAMED_REL):
        kinds = sorted(run.comms, key=lambda k: -run.comms_bytes(k))
        # A run without collectives reads in the other's terms (nothing sent is no payload); where both have
        # some and one record gives payloads only, each figure says what it is.
        mine = comms_phrase(run if run.comms else fastest)
        theirs = f" {comms_phrase(fastest)}" if run.comms and fastest.comms and fastest.comms_sent != run.comms_sent \
            else ""
        out.append(f"{mine_mib:,.1f} MiB {mine} per device per step"
                   + (f" ({', '.join(kinds)})" if kinds else "") + f" against {theirs_mib:,.1f} MiB{theirs}")
    if run.traced and fastest.traced and not math.isclose(run.traced.collectives_ms, fastest.traced.collectives_ms,
                                                          rel_tol=COMMS_NAMED_REL):
        # timed, not counted: where both runs were profiled, their traces say how long the collectives took
        theirs_ms = f"{fastest.traced.collectives_ms:,.1f} ms" if fastest.traced.collective_ms else "none"
        out.append(f"{run.traced.collectives_ms:,.1f} ms per device per step in collectives in its trace against "
                   f"{theirs_ms}")
    return out


Model = tuple[tuple[str, str], ...]


# Data settings that change what one example computes (a ViT at 64 pixels has four times the patches of one at 32).
WORK_DATA = ("data.image_size",)


def _model(run: ReportedRun) -> Model:
    """What a run trains, as far as ranking goes: its model kind (or the file of a model of your own), every
    model setting that changes what an example computes (its sequence length, widths, depth ...; not those of
    LAYOUT_ONLY, such as remat) and the data settings of WORK_DATA (the image size): a 1k-token step and an
    8k-token one are not the same work."""
    kind = str(run.settings.get("model.factory") or run.settings.get("model.kind") or "")
    shape = sorted((k, str(v)) for k, v in run.settings.items()
                   if (k.startswith("model.") and k not in LAYOUT_ONLY and k not in ("model.kind", "model.factory"))
                   or k in WORK_DATA)
    return (("model", kind), *shape)


def comparable(run: ReportedRun) -> Model:
    """Runs whose step times rank layouts of one piece of work: the same model at the same shape (`_model`) and
    the same global batch."""
    return (*_model(run), ("train.batch_size", str(run.batch)))


def _varying(key: Model, keys: list[Model]) -> list[tuple[str, str]]:
    """The settings of `key` that tell it from the others: its kind where the kinds differ, and each other setting
    that differs among the keys of its own kind that give it (an LM's sequence length does not tell it from an
    MLP, and a run folder without config.json, whose key gives no shape, tells no shape apart). Such a key, among
    kin that give settings it lacks, gets UNKNOWN_SHAPE."""
    kind = dict(key)["model"]
    kin = [dict(m) for m in keys if dict(m)["model"] == kind]
    varying = [(k, v) for k, v in key
               if len({m[k] for m in (map(dict, keys) if k == "model" else kin) if k in m}) > 1]
    lacks = any(k not in dict(key) for m in kin for k in m)
    if lacks:
        return [*varying, UNKNOWN_SHAPE]
    # Beside such a group, a group whose settings alone would not tell it apart is the one that gives them.
    others_lack = any(k not in m for m in kin for k in dict(key))
    return varying + ([KNOWN_SHAPE] if others_lack and all(k == "model" for k, _ in varying) else [])


UNKNOWN_SHAPE = ("", "without config.json")  # a group whose runs' folders do not say the model's shape
KNOWN_SHAPE = ("", "with config.json")  # its one other group, beside one of UNKNOWN_SHAPE


def _setting(k: str, v: str) -> str:
    return v if k in ("model", "") else f"{k.split('.')[-1]} {v}"


def label(key: Model, keys: list[Model]) -> str:
    """A group's name among `keys`, from `_varying` ('lm, seq_len 1024, batch_size 4'); '' where there is one."""
    return ", ".join(_setting(k, v) for k, v in _varying(key, keys))


def _label(model: Model, models: list[Model]) -> str:
    """How a ranking names its runs where the sweep trains several models: the kind where the kinds differ and
    the settings in which the models differ ('lm run', 'run at seq_len 1024', 'lm run at seq_len 1024', 'run
    without config.json')."""
    varying = _varying(model, models)
    kind = "".join(v + " " for k, v in varying if k == "model")
    unknown = "".join(f" {v}" for k, v in varying if k == "")
    shape = ", ".join(_setting(k, v) for k, v in varying if k not in ("model", ""))
    return f"{kind}run{unknown}" + (f" at {shape}" if shape else "")


def speed_findings(runs: list[ReportedRun]) -> list[str]:
    """Per model the sweep trains (a model kind or a model of your own at one shape: examples of different models,
    or of one model at another sequence length, are not alike), the fastest run, then every other run's slowdown
    against it as a ratio of steady-state throughput (of median step time where the batches are equal), what
    differs between them, and ties within the noise."""
    timed = [r for r in runs if r.ok and _throughput(r) is not None]
    models = sorted({_model(r) for r in timed}, key=lambda m: [(k, (len(v), v)) for k, v in m])
    found = [s for m in models
             for s in _ranking([r for r in timed if _model(r) == m], _label(m, models) if len(models) > 1 else "")]
    for said in (NOT_A_CAUSE, NOT_A_CAUSE_TRACED):  # once, after every model's ranking
        if said in found:
            found = [s for s in found if s != said] + [said]
    unranked = [r for r in runs if r.ok and _throughput(r) is None]
    if unranked:  # a complete run is never left out of the ranking without a word
        found.append("Left out of the ranking: " + "; ".join(
            f"{r.name} (" + (f"no step time: {r.why_not('step_time_s')}" if r.step_median is None else
                             "its record gives no batch size") + ")" for r in unranked) + ".")
    found += _compile_finding([r for r in timed if r.compile_s is not None])
    return found


def _compile_finding(runs: list[ReportedRun]) -> list[str]:
    """The range of compile times where it is wide, among the runs that compiled every program; those that took
    some or all from the persistent compilation cache loaded them from disk, which compares with no compilation."""
    cached = [r for r in runs if r.compiled_from_cache]
    compiles = [(r.compile_s, r.name) for r in runs if not r.compiled_from_cache]
    found = []
    if len(compiles) > 1 and max(compiles)[0] > 1.5 * min(compiles)[0]:
        (slow, slow_name), (quick, quick_name) = max(compiles), min(compiles)
        found.append(f"Compilation, which the step times leave out, took {quick:.1f} s ({quick_name}) to "
                     f"{slow:.1f} s ({slow_name}).")
    if cached:
        took = ", ".join(f"{r.name} {_share(*r.cache_hits)}" for r in cached if r.cache_hits)
        found.append(f"From the persistent compilation cache (--train.compile-cache), {took}: "
                     f"{'its' if len(cached) == 1 else 'their'} compile time is wholly or partly a load from disk, "
                     f"not a compilation, and is compared with no other run's.")
    return found


def _share(hits: int, requests: int) -> str:
    return "every program" if hits >= requests else f"{hits} of its {requests} programs"


def _ranking(timed: list[ReportedRun], model: str) -> list[str]:
    """One model's runs ranked; `model` names them where the sweep trains several ('lm run')."""
    if not timed:
        return []
    ranked = sorted(timed, key=lambda r: -(_throughput(r) or 0.0))
    fastest = ranked[0]
    same_batch = len({r.batch for r in ranked}) == 1
    unit = "step time" if same_batch else "throughput (batch / median step)"
    few = steps_note([fastest])
    lead = f"Fastest{f' {model}' if model else ''}" if len(ranked) > 1 else f"The only timed {model or 'run'}"
    asides = [a for a in (few, f"ranked by median {unit}" if len(ranked) > 1 else "") if a]
    head = (f"{lead}: {fastest.name}, {_ms(fastest.step_median)} per step"
            + ("" if same_batch else f" at batch {fastest.batch}, {_rates(fastest)}")
            + (f" ({'; '.join(asides)})" if asides else ""))
    sentences = [head + "."]
    listed = False
    for run in ranked[1:]:
        sentence, differs = _against(run, fastest, same_batch)
        listed = listed or differs
        sentences.append(sentence)
    if listed:
        timed = fastest.traced is not None and any(r.traced for r in ranked[1:])  # a traced time was named
        sentences.append(NOT_A_CAUSE_TRACED if timed else NOT_A_CAUSE)
    return sentences


def _against(run: ReportedRun, fastest: ReportedRun, same_batch: bool) -> tuple[str, bool]:
    """One run against the fastest: a tie within their spread, undecided within FEW_STEPS_MARGIN where either
    timed fewer than MIN_MEASURED_STEPS steps, or the slowdown with what differs (and whether anything was
    listed)."""
    ratio = (_throughput(fastest) or 0.0) / (_throughput(run) or 1.0)
    figures = (f"{_ms(run.step_median)} against {_ms(fastest.step_median)}" if same_batch else
               _rates(run, fastest))
    few = steps_note([run, fastest])
    ranked = verdict(run, fastest, ratio - 1.0)
    if ranked == UNDECIDED:
        return (f"{run.name} against {fastest.name} is undecided ({figures}, {few}): the {100 * (ratio - 1):.1f}% "
                f"difference is within the {100 * FEW_STEPS_MARGIN:.0f}% margin the report requires of figures "
                f"from fewer than {MIN_MEASURED_STEPS} timed steps, so this ranking cannot tell them apart."), False
    if ranked == TIE:
        return (f"{run.name} ties with {fastest.name} ({figures}): the {100 * (ratio - 1):.1f}% "
                f"difference is within the spread of their step times (median to p90, up to "
                f"{100 * noise(run, fastest):.1f}%), so this ranking cannot tell them apart."), False
    differs = _differences(run, fastest)
    return (f"{run.name} is {ratio:.2f}x slower ({figures}{f', {few}' if few else ''})"
            + (f"; it differs in: {'; '.join(differs)}." if differs else
               f"; its recorded settings are the same as {fastest.name}'s.")), bool(differs)


@dataclass(frozen=True)
class Equivalence:
    """Runs that differ only in layout, and how far apart their losses are (or why they could not be compared)."""

    runs: tuple[str, ...]
    largest: float  # relative difference of their losses, the largest over the compared steps
    where: str  # the step (or "test loss") where it is largest
    tolerance: float
    dtype: str
    compared: int  # losses compared per run; 0: none in common (`why_not` says why)
    why_not: str = ""
    one_layout: bool = False  # every run of the group has the same layout too: repeats of one run (a resume)

    @property
    def same(self) -> bool:
        return self.largest <= self.tolerance


def _computation(run: ReportedRun) -> str:
    """What a run computes: its settings but its layout's. Gradient accumulation is part of the layout where
    nothing draws masks per microbatch (a built-in model without dropout or drop-path): each update is then the
    whole batch's, up to the order of its sums (docs/training.md)."""
    masks = run.settings.get("model.factory") or any(number(run.settings.get(k)) for k in RANDOM_LAYERS)
    ignored = LAYOUT_ONLY if masks else LAYOUT_ONLY | {"train.grad_accum"}
    # The data and a model file, where its folder says what they held: the same flags over regenerated data, or
    # an edited model file, are another computation, not a layout whose results differ.
    return json.dumps({**{k: v for k, v in run.settings.items() if k not in ignored}, "inputs": run.inputs},
                      sort_keys=True, default=str)


RANDOM_LAYERS = ("model.dropout", "model.drop_path")  # masks a microbatch draws of its own under accumulation


def _series(run: ReportedRun) -> dict[str, float]:
    """The losses a run can be compared on: each logged train loss within COMPARED_STEPS, and the test loss."""
    losses = {f"step {step}": loss for step, loss in (run.losses or ()) if step <= COMPARED_STEPS}
    steps = run.rec.steps or 0
    if run.rec.test_loss is not None and steps <= COMPARED_STEPS:
        losses["test loss"] = float(run.rec.test_loss)
    if not losses and run.rec.train_loss is not None and steps <= COMPARED_STEPS:
        losses[f"step {steps}"] = float(run.rec.train_loss)
    return losses


def _names(runs: list[ReportedRun]) -> str:
    return ", ".join(r.name for r in runs)


def _not_compared(group: list[ReportedRun]) -> str:
    """Why a group of runs has no loss in common to compare: a test or last loss after COMPARED_STEPS is not
    compared, and a run without logged train losses within them has nothing else."""
    def who(runs: list[ReportedRun]) -> str:
        return "they" if len(runs) == len(group) else _names(runs)

    reasons = []
    past = [r for r in group if (r.rec.steps or 0) > COMPARED_STEPS]
    if past:
        steps = ", ".join(f"{s:,}" for s in sorted({r.rec.steps or 0 for r in past}))
        reasons.append(f"{who(past)} trained {steps} steps, and a test or last loss after step {COMPARED_STEPS} is "
                       f"not compared, as the losses of layouts may drift apart chaotically by then")
    unlogged = [r for r in group if not any(step <= COMPARED_STEPS for step, _ in (r.losses or ()))]
    if unlogged:
        reasons.append(f"{who(unlogged)} logged no train loss within the first {COMPARED_STEPS} steps that the "
                       f"report found (in the metrics.jsonl of a run's folder)")
    return "; ".join(reasons) or "their losses were logged at different steps"


def equivalences(runs: list[ReportedRun]) -> list[Equivalence]:
    """Every group of two or more complete runs with the same model, data, seed, steps and precision that differ
    only in layout (LAYOUT_ONLY), with the largest relative difference of their common losses, or why they have
    none in common. A run without its configuration (`ReportedRun.configured`) is in no group: its record's few
    settings cannot tell whether it computes what another run does."""
    groups: dict[str, list[ReportedRun]] = {}
    for run in runs:
        if run.ok and run.configured:
            groups.setdefault(_computation(run), []).append(run)
    found = []
    for group in groups.values():
        if len(group) < 2:
            continue
        series = [_series(r) for r in group]
        common = sorted(set.intersection(*(set(s) for s in series)))
        dtype = str(group[0].config.get("precision.dtype", "float32"))
        names, tolerance = tuple(r.name for r in group), LOSS_RTOL.get(dtype, 5e-2)
        layouts = {_layout(r) for r in group}
        if not common:
            found.append(Equivalence(names, 0.0, "", tolerance, dtype, 0, _not_compared(group)))
            continue
        largest, where = 0.0, common[0]
        for key in common:
            values = [s[key] for s in series]
            scale = max(abs(v) for v in values) or 1.0
            gap = (max(values) - min(values)) / scale
            if gap > largest or not math.isfinite(gap):
                largest, where = gap, key
        found.append(Equivalence(names, largest, where, tolerance, dtype, len(common), one_layout=len(layouts) == 1))
    return found


def _layout(run: ReportedRun) -> str:
    """A run's layout, for telling repeats of one run from layouts: its layout settings (accumulation among them,
    where it groups runs, `_computation`), with the strategy, mesh and devices as its record says they resolved: a
    mesh left to its default and the same one written out ('' and '8x1') are one layout."""
    values: dict[str, Any] = {k: run.settings.get(k) for k in LAYOUT_ONLY | {"train.grad_accum"}}
    if run.rec.mesh:  # what ran; a record that does not say keeps the settings
        values.update({"parallel.strategy": run.strategy, "parallel.mesh": run.mesh_sizes,
                       "parallel.devices": run.devices})
    return json.dumps(values, sort_keys=True, default=str)


def equivalence_findings(runs: list[ReportedRun]) -> list[str]:
    sentences = []
    for eq in equivalences(runs):
        names = ", ".join(eq.runs)
        if not eq.compared:
            sentences.append(f"{names} differ only in layout but their losses were not compared: {eq.why_not}.")
        elif eq.same:
            how = "in one layout (repeats of one run)" if eq.one_layout else "in different layouts"
            sentences.append(f"{names} are the same computation {how}: their losses differ by at "
                             f"most {eq.largest:.1e} (relative, over {eq.compared} compared losses), within the "
                             f"{eq.dtype} tolerance of {eq.tolerance:.0e}.")
        else:
            sentences.append(f"{names} should be the same computation but differ: their losses are {eq.largest:.1e} "
                             f"apart (relative) at {eq.where}, beyond the {eq.dtype} tolerance of "
                             f"{eq.tolerance:.0e}. Check the layouts' results before comparing their speed.")
    unknown = [r for r in runs if r.ok and not r.configured]
    if unknown and sum(r.ok for r in runs) > 1:
        sentences.append(_unconfigured(unknown))
    return sentences


def _unconfigured(runs: list[ReportedRun]) -> str:
    """Why runs read without their config.json were compared with no run."""
    one = len(runs) == 1
    folder, record, verb = (("its folder has", "its record gives", "it computes") if one else
                            ("their folders have", "their records give", "they compute"))
    return (f"{_names(runs)} {'was' if one else 'were'} not compared with any run: {folder} no config.json, so the "
            f"report knows only the strategy, mesh, devices, SPMD style, model kind and global batch {record}, not "
            f"whether {verb} what another run does (a model's shape, the data, seed, steps and precision).")


def differing(runs: list[ReportedRun]) -> list[Equivalence]:
    """The groups compared whose losses differ beyond their tolerance (for the sweep's closing warning)."""
    return [eq for eq in equivalences(runs) if eq.compared and not eq.same]
