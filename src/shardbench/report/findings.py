"""Explanatory sentences computed from a sweep's runs: whether its devices are simulated (and so which
comparisons carry to real devices), which run was fastest and whether the layouts computed the same thing
(`shardbench.report.speed`), then what the parameter and compute dtypes change in the memory breakdown, and
what each sharding strategy holds per device and sends per step.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from shardbench.parallel.strategies import STRATEGIES
from shardbench.report.content import comms_measure, comms_phrase
from shardbench.report.context import context_findings
from shardbench.report.pipeline import pipeline_findings
from shardbench.report.plan_chart import plan_findings
from shardbench.report.speed import (TIE, UNDECIDED, Model, _model, equivalence_findings, label, speed_findings,
                                     steps_note, verdict)
from shardbench.report.traces import trace_findings

if TYPE_CHECKING:
    from shardbench.report.content import ReportedRun

PRECISION_KEYS = ("precision.param_dtype", "precision.dtype")
# How the usual swept fields read in a sentence, in the order they are named ("at strategy fsdp, batch 128").
SHORT_NAMES: dict[str, str] = {"parallel.strategy": "strategy", "parallel.mesh": "mesh",
                               "parallel.devices": "devices", "train.batch_size": "batch"}
MEMORY_NAMES = {"peak": "runtime peak per device", "compiled": "compiled total per device"}
STRATEGY_ROLES: dict[str, str] = {
    "single": "A single device holds the whole model",
    "dp": "DP replicates parameters and optimizer state on every device",
    "zero1": "ZeRO-1 replicates parameters and gradients and shards the optimizer state over the data axis",
    "zero2": "ZeRO-2 replicates parameters and shards gradients and optimizer state over the data axis",
    "fsdp": "FSDP shards parameters and optimizer state over the data axis",
    "tp": "TP splits the weight matrices over the model axis",
    "dp+tp": "DP+TP splits the weight matrices over the model axis and replicates them over the data axis",
    "fsdp+tp": "FSDP+TP shards parameters and optimizer state over the data and model axes",
    "pp": "PP splits the stacked layers into stages over the stage axis and replicates the rest",
    "dp+pp": "DP+PP splits the stacked layers into stages and replicates them over the data axis",
    "fsdp+pp": "FSDP+PP splits the stacked layers into stages and shards every parameter over the data axis",
    "pp+tp": "PP+TP splits the stacked layers into stages and their weight matrices over the model axis",
    "dp+pp+tp": "DP+PP+TP splits the stacked layers into stages and their weight matrices over the model axis, "
                "and replicates them over the data axis",
    "fsdp+pp+tp": "FSDP+PP+TP splits the stacked layers into stages and their weight matrices over the model axis, "
                  "and shards every parameter over the data axis",
    "cp": "CP splits the sequence over the seq axis and replicates parameters and optimizer state",
    "dp+cp": "DP+CP splits the batch over the data axis and the sequence over the seq axis",
    "fsdp+cp": "FSDP+CP shards parameters and optimizer state over the data axis and splits the sequence over seq",
    "cp+tp": "CP+TP splits the sequence over the seq axis and the weight matrices over the model axis",
}


def _role(strategy: str, group: list[ReportedRun]) -> str:
    """What the strategy holds where (STRATEGY_ROLES), and the axes it names that no run of `group` split: fsdp+tp
    on 8 devices with no --mesh runs on 8x1, where nothing is split over model."""
    role = STRATEGY_ROLES.get(strategy, strategy)
    if (known := STRATEGIES.get(strategy)) is None:
        return role
    whole = [axis for axis in known.axes if all(run.mesh_sizes[axis] == 1 for run in group)]
    if not whole or len(whole) == len(known.axes):  # every axis split, or one device
        return role
    many = len(whole) > 1
    return (f"{role} (here its {' and '.join(whole)} {'axes have' if many else 'axis has'} one device"
            f"{' each' if many else ''}, so nothing is split over {'them' if many else 'it'})")


def _span(values: list[float], unit: str = "", digits: int = 1) -> str:
    """One figure, or the range of several, to `digits` decimals; below 1 to three significant figures (a small
    model's replica of 0.04 MiB read "0.0 MiB")."""
    lo, hi = min(values), max(values)
    small = 0 < abs(hi) < 1

    def show(value: float) -> str:
        return f"{value:.3g}" if small else f"{value:,.{digits}f}"

    same = math.isclose(lo, hi, rel_tol=0.01, abs_tol=0.0 if small else 10 ** -digits)
    return f"{show(lo)}{unit}" if same else f"{show(lo)}–{show(hi)}{unit}"


def _dtypes(run: ReportedRun) -> tuple[str, str]:
    return str(run.config.get("precision.param_dtype")), str(run.config.get("precision.dtype"))


def _context(run: ReportedRun, swept: dict[str, list[Any]]) -> str:
    order = list(SHORT_NAMES)
    keys = sorted((k for k, values in swept.items() if k not in PRECISION_KEYS and len(values) > 1),
                  key=lambda k: order.index(k) if k in order else len(order))
    parts = [f"{SHORT_NAMES.get(k, k)} {run.overrides.get(k, run.config.get(k))}" for k in keys]
    return f" at {', '.join(parts)}" if parts else ""


def _precision_sentence(a: ReportedRun, b: ReportedRun, swept: dict[str, list[Any]]) -> str | None:
    (pa, da), (pb, db) = _dtypes(a), _dtypes(b)
    what = (f"Compute dtype {db} vs {da}" if pa == pb else f"Parameter dtype {pb} vs {pa}" if da == db
            else f"Parameter/compute dtype {pb}/{db} vs {pa}/{da}")
    act_a, act_b = a.part("activations_temporaries"), b.part("activations_temporaries")
    state_a, state_b = a.state_mib, b.state_mib
    if act_a is None or act_b is None or state_a is None or state_b is None:
        return None
    acts = f"activations/temporaries {_pair(act_a, act_b)} MiB"
    if math.isclose(state_a, state_b, rel_tol=0.005):
        body = (f"{acts}, while parameters + optimizer state + gradients stay {_span([state_a])} MiB "
                f"(they are stored in the parameter dtype, {pa})")
    else:
        body = (f"parameters + optimizer state + gradients {_pair(state_a, state_b)} MiB "
                f"(they follow the parameter dtype) and {acts}")
    (total_a, source_a), (total_b, source_b) = a.memory, b.memory
    if total_a and total_b is not None:
        change = (total_b - total_a) / total_a * 100
        name = MEMORY_NAMES[source_a] if source_a == source_b else "memory per device"
        moves = ("stays within 1%" if abs(change) < 1 else
                 f"{'grows' if change > 0 else 'shrinks'} {'only ' if abs(change) < 15 else ''}{abs(change):.0f}%")
        body += f", so the {name} {moves} ({_pair(total_a, total_b)} MiB)"
    return f"{what}{_context(a, swept)}: {body}."


def _pair(before: float, after: float) -> str:
    """'0.579 -> 0.647', '1.80 -> 1.84': each as `_span` shows one figure, with more where that hides a change of
    1% or more."""
    shown = _span([before]), _span([after])
    if shown[0] == shown[1] and not math.isclose(before, after, rel_tol=0.01):
        return f"{before:.4g} -> {after:.4g}"
    return f"{shown[0]} -> {shown[1]}"


def precision_findings(runs: list[ReportedRun], swept: dict[str, list[Any]]) -> list[str]:
    """One sentence per pair of complete runs that differ only in parameter and/or compute dtype."""
    groups: dict[str, list[ReportedRun]] = {}
    for run in runs:
        if run.ok and run.configured and run.settings:  # a record's few settings would group other models
            rest = {k: v for k, v in run.settings.items() if k not in PRECISION_KEYS}
            groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(run)
    sentences = []
    for group in groups.values():
        reference = next((r for r in group if _dtypes(r) == ("float32", "float32")), group[0])
        compared = {_dtypes(reference)}
        for other in group:
            if _dtypes(other) not in compared and (sentence := _precision_sentence(reference, other, swept)):
                compared.add(_dtypes(other))
                sentences.append(sentence)
    return sentences


DOMINATE = 50.0  # activations dominate a breakdown from this share (%) of it on


Shares = tuple[dict[int, list[float]], list[float], list[float]]


def _shares(runs: list[ReportedRun]) -> dict[Model, Shares]:
    """Per model (`speed._model`): the activation share (%) of each complete run's whole breakdown (its other
    bytes and a model's own state included, as the breakdown chart shows them) by batch size, the bytes of
    parameters + optimizer state + gradients (MiB) of every such run, and the shares of those that compute in
    float32 (what 16-bit compute could halve)."""
    out: dict[Model, Shares] = {}
    for run in runs:
        parts = [run.part(p) for p in ("params", "optimizer", "gradients", "activations_temporaries")]
        rest = [run.part(p) or 0.0 for p in ("model_state", "other")]  # absent from older records
        batch = run.batch
        if not run.ok or None in parts or batch is None or not sum(p or 0.0 for p in parts):
            continue
        state = sum(p or 0.0 for p in parts[:3])
        shares, states, wide = out.setdefault(_model(run), ({}, [], []))
        share = (parts[3] or 0.0) / (state + (parts[3] or 0.0) + sum(rest)) * 100
        shares.setdefault(batch, []).append(share)
        states.append(state)
        if run.config.get("precision.dtype", "float32") == "float32":
            wide.append(share)
    return out


def _dominance(shares: dict[int, list[float]]) -> str:
    """Whether activations dominate, from every run's share: nowhere (the largest share under DOMINATE), at every
    batch size (the smallest share at or above it), from a batch size on, or in some runs only."""
    every = [v for values in shares.values() for v in values]
    batches = sorted(shares)
    if max(every) < DOMINATE:
        return (", so they do not dominate at this batch size" if len(batches) == 1
                else f", so they do not dominate here even at batch {batches[-1]}")
    if min(every) >= DOMINATE:
        return ", so they dominate it" if len(batches) == 1 else ", so they dominate at every batch size here"
    first = next((b for b in batches if all(min(shares[c]) >= DOMINATE for c in batches if c >= b)), None)
    below = [b for b in batches if first is not None and b < first]
    if first is not None and all(max(shares[b]) < DOMINATE for b in below):
        return (f", so they dominate only at batch {first}" if first == batches[-1]
                else f", so they dominate from batch {first} on")
    count = sum(v >= DOMINATE for v in every)
    return f", so they dominate in {count} of the {len(every)} runs here"


def _compute_compared(runs: list[ReportedRun], model: Model) -> bool:
    """Whether two complete runs of `model` differ in their precision alone, one computing in float32 and one in
    16 bits: a comparison the precision sentences measure."""
    groups: dict[str, set[bool]] = {}
    for run in runs:
        if run.ok and run.configured and run.settings and _model(run) == model:
            rest = {k: v for k, v in run.settings.items() if k not in PRECISION_KEYS}
            groups.setdefault(json.dumps(rest, sort_keys=True, default=str), set()).add(
                run.config.get("precision.dtype", "float32") == "float32")
    return any(wide == {True, False} for wide in groups.values())


def dtype_role_finding(runs: list[ReportedRun]) -> list[str]:
    """Which bytes each dtype governs, with the activation share of the breakdown measured per batch size: one
    sentence per model the sweep trains (a model's share says nothing of another's)."""
    grouped = _shares(runs)
    keys = list(grouped)
    sentences = []
    for key, (shares, states, wide) in grouped.items():
        name = label(key, keys) if len(keys) > 1 else ""
        small, large = min(shares), max(shares)
        if small == large:
            described = f"{_span(shares[large], '%', 0)} of the per-device breakdown at batch {large}"
        else:
            described = "; ".join(f"{_span(shares[b], '%', 0)} at batch {b}" for b in sorted(shares))
            described = f"{described.replace(' at batch', ' of the per-device breakdown at batch', 1)}"
        sentences.append(
            f"{f'{name}: ' if name else ''}The parameter dtype sets the bytes of parameters, optimizer state and "
            f"gradients (here {_span(states, ' MiB')} per device); the compute dtype changes only activations and "
            f"temporaries, which are {described}{_dominance(shares)}. "
            + _halving(wide, measured=_compute_compared(runs, key)))
    return sentences


def _halving(wide: list[float], measured: bool) -> str:
    """What 16-bit compute could save, bounded by the float32-compute runs' activation shares; nothing to halve
    where every run already computes in 16 bits. Where runs of both compute dtypes were measured, what 16-bit
    compute did is in the precision sentences: no bound from an assumed halving is put beside it (on a CPU the
    compiler may hold 16-bit work in float32, and activations grow)."""
    if not wide:
        return "Every run here already computes in 16 bits, so no further halving of them is in reach."
    if measured:
        return "What 16-bit compute did to them here is measured: see the compute dtype comparisons."
    return (f"Were 16-bit compute to halve them (not measured here), it would save at most about "
            f"{max(wide) / 2:.0f}% of it.")


def _replica_key(run: ReportedRun) -> str:
    # Runs whose parameter and optimizer bytes are comparable: same model, parameter dtype and optimizer.
    keys = [k for k in run.config if k.startswith("model.")] + ["precision.param_dtype", "optim.optimizer"]
    return json.dumps({k: run.config.get(k) for k in sorted(keys)}, sort_keys=True, default=str)


def _held(run: ReportedRun) -> float | None:
    """Parameter + optimizer-state MiB per device: what a strategy replicates or shards."""
    params, optimizer = run.part("params"), run.part("optimizer")
    return None if params is None or optimizer is None else params + optimizer


def strategy_findings(runs: list[ReportedRun]) -> list[str]:
    """One sentence per strategy: parameter + optimizer bytes per device against a replica, and comms per step.
    A pipeline's one-stage runs (the references its bubble is measured against) are not layouts of their own."""
    complete = [r for r in runs if r.ok and r.m.pipeline_stages != 1]
    replicas: dict[str, float] = {}
    for strategy in ("single", "dp"):  # a single-device run is the cleanest replica; DP holds the same bytes
        for run in complete:
            if run.strategy == strategy and (bytes_held := _held(run)) is not None:
                replicas.setdefault(_replica_key(run), bytes_held)
    sentences = []
    for strategy in dict.fromkeys(r.strategy for r in complete):
        group = [r for r in complete if r.strategy == strategy]
        held: list[float] = []
        ratios: list[float] = []
        for run in group:
            if (bytes_held := _held(run)) is None:
                continue
            held.append(bytes_held)
            if (full := replicas.get(_replica_key(run))) and bytes_held:
                ratios.append(full / bytes_held)
        if not held:
            continue
        devices = sorted({r.devices for r in group if r.devices})
        count = "/".join(map(str, devices)) or "?"
        text = (f"{_role(strategy, group)}: {_span(held, ' MiB')} of parameters + optimizer "
                f"state per device on {count} device{'' if devices == [1] else 's'}")
        if ratios and strategy != "single":
            replica = _span(sorted({replicas[_replica_key(r)] for r in group if _replica_key(r) in replicas}))
            text += (f", the same as a full replica ({replica} MiB)" if max(ratios) < 1.05
                     else f", 1/{_span(ratios)} of the {replica} MiB a full replica holds")
        comms = [c for c in (r.comms_mib for r in group) if c is not None]
        kinds = sorted({k for r in group for k in r.comms},
                       key=lambda k: (-sum(r.comms_bytes(k) for r in group), k))  # the heaviest first, ties by name
        measure = comms_measure(group)
        if comms and max(comms) > 0 and measure == "sent":
            text += f", and sends {_span(comms, ' MiB')} per device per step in collectives ({', '.join(kinds)})"
        elif comms and max(comms) > 0 and measure == "mixed":  # two measures, never one span
            sent, paid = ([c for r in group if r.comms and r.comms_sent == counts and (c := r.comms_mib) is not None]
                          for counts in (True, False))
            text += (f", and sends {_span(sent, ' MiB')} per device per step in collectives ({', '.join(kinds)}) "
                     f"where the record counts bytes sent, and has {_span(paid, ' MiB')} of collective payload "
                     f"where an older record counts only that")
        elif comms and max(comms) > 0:  # an older record: its buffers, not bytes sent (see comms_findings)
            text += (f", and has {_span(comms, ' MiB')} of collective payload per device per step "
                     f"({', '.join(kinds)})")
        elif comms:
            text += ", and needs no collectives"
        sentences.append(text + ".")
    return sentences


def _style(run: ReportedRun) -> str:
    return str(run.config.get("parallel.spmd") or run.rec.spmd or "jit")


def spmd_findings(runs: list[ReportedRun]) -> list[str]:
    """Per group of runs whose settings differ only in their SPMD style, run in more than one style: each style's
    step time, memory and collectives against jit's. Runs that differ in anything else (a batch, a mesh) are
    another group, said apart."""
    groups: dict[str, list[ReportedRun]] = {}
    for run in (r for r in runs if r.ok and r.configured):  # not a run whose settings are its record's few
        rest = {k: v for k, v in run.settings.items() if k != "parallel.spmd"}
        groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(run)
    groups = {k: g for k, g in groups.items() if len({_style(r) for r in g}) > 1}
    keys = list(groups)
    sentences = []
    for key, group in groups.items():
        where = _group_name(key, keys)
        strategy = group[0].strategy
        sentences.append(f"{_role(strategy, group)}{f' ({where})' if where else ''} in each SPMD "
                         f"style: " + "; ".join(_style_part(run, group) for run in group) + ".")
    return sentences


def _group_name(key: str, keys: list[str]) -> str:
    """The settings that set one group of runs apart from the others ('' where there is one), the strategy left
    out (each sentence names it)."""
    settings = [json.loads(k) for k in keys]
    mine = json.loads(key)
    varying = sorted(k for k in set().union(*settings) if len({json.dumps(s.get(k)) for s in settings}) > 1
                     and k != "parallel.strategy")
    return ", ".join(f"{SHORT_NAMES.get(k, k)} {mine.get(k)}" for k in varying)


def _style_part(run: ReportedRun, group: list[ReportedRun]) -> str:
    """One style's step, against jit's in the same group, its memory and its collectives."""
    base = next((r for r in group if _style(r) == "jit"), None)
    step = run.step_median
    memory, _ = run.memory
    text = f"{_style(run)} {'–' if step is None else format(1e3 * step, ',.1f')} ms/step"
    if base is not None and run is not base and step and (ref := base.step_median):
        # ranked by the report's one rule: a gap within the runs' spread, or from too few steps, is said as such
        how, few = verdict(run, base, max(step, ref) / min(step, ref) - 1.0), steps_note([run, base])
        said = ["within the spread of their step times"] if how == TIE else []
        said += [f"undecided: {few}" if how == UNDECIDED else few] if few else []
        text += f" ({', '.join([f'{step / ref:.2f}x jit', *said])})"
    if memory is not None:
        text += f", {memory:,.1f} MiB/device"
    # the kinds that sent bytes: one device's pmap compiles an all-reduce over itself that sends none
    kinds = sorted((k for k in run.comms if run.comms_bytes(k) > 0), key=lambda k: -run.comms_bytes(k))
    if run.comms_mib is not None:
        text += f", {run.comms_mib:,.2f} MiB {comms_phrase(run)}" + (f" ({', '.join(kinds)})" if kinds else "")
    return text


def loss_floor_findings(runs: list[ReportedRun]) -> list[str]:
    """Where the data sets a best possible loss (uniform tokens, noisy regression): how close the runs came."""
    sentences = []
    for note in dict.fromkeys(str(r.rec.dataset.get("loss_floor_note")) for r in runs if r.ok
                              and r.rec.dataset.get("loss_floor") is not None):
        group = [r for r in runs if r.ok and str(r.rec.dataset.get("loss_floor_note")) == note]
        tests = [float(t) for t in (r.rec.test_loss for r in group) if isinstance(t, (int, float))]
        text = note[0].upper() + note[1:]
        if tests:
            text += f"; the runs reached a test loss of {_span(tests, digits=4)}"
        sentences.append(text + ".")
    return sentences


def _setting(run: ReportedRun, swept: dict[str, list[Any]]) -> str:
    """What distinguishes a run from the others apart from its seed, in a few words."""
    keys = [k for k, values in swept.items() if len(values) > 1 and k != "train.seed"]
    if set(PRECISION_KEYS) & set(keys):
        p, d = _dtypes(run)
        rest = [k for k in keys if k not in PRECISION_KEYS]
        head = f"parameters {p}, compute {d}"
    else:
        rest, head = keys, ""
    parts = [head] if head else []
    parts += [f"{SHORT_NAMES.get(k, k)} {run.overrides.get(k, run.config.get(k))}" for k in rest]
    return ", ".join(parts) or "the one setting"


def seed_findings(runs: list[ReportedRun], swept: dict[str, list[Any]]) -> list[str]:
    """Test accuracy per setting over its seeds (mean ± half the range), and whether each difference between
    settings is larger than the seed-to-seed spread (the larger of the two ranges, max - min)."""
    if len(swept.get("train.seed", [])) < 2:
        return []
    groups: dict[str, list[float]] = {}
    for run in runs:
        accuracy = run.rec.test_accuracy if run.ok else None
        if isinstance(accuracy, (int, float)):
            groups.setdefault(_setting(run, swept), []).append(100.0 * accuracy)
    groups = {k: v for k, v in groups.items() if len(v) >= 2}
    if not groups:
        return []
    out = [f"{name}: test accuracy {sum(v) / len(v):.2f}% ± {(max(v) - min(v)) / 2:.2f} over {len(v)} seeds "
           f"({min(v):.2f}–{max(v):.2f}%)" for name, v in groups.items()]
    names = list(groups)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            va, vb = groups[a], groups[b]
            diff = sum(vb) / len(vb) - sum(va) / len(va)
            spread = max(max(va) - min(va), max(vb) - min(vb))
            verdict = "larger than" if abs(diff) > spread else "within"
            out.append(f"{b} vs {a}: {diff:+.2f} points, {verdict} the seed-to-seed spread ({spread:.2f} points)")
    return out


def simulated_findings(runs: list[ReportedRun]) -> list[str]:
    """Where runs used simulated CPU devices: that they share the host's cores, and which comparisons carry to
    real devices."""
    simulated = sorted({r.devices or 1 for r in runs if r.ok and r.simulated})
    if not simulated:
        return []
    counts = "/".join(map(str, simulated))
    return [f"The runs on {counts} devices use simulated devices on this host's CPU: they all share its cores "
            f"and its memory, so more devices bring no more compute, and their collectives cross no real "
            f"interconnect. Speed across device counts, strategies, "
            f"meshes and SPMD styles therefore compares how XLA splits a step on this CPU, not how real devices "
            f"would run it: do not carry those speed comparisons to GPUs or TPUs. What does carry: the bytes of "
            f"parameters, optimizer state and gradients each device holds, the FLOPs, and whether layouts compute "
            f"the same losses (activations and temporaries are the CPU compiler's, and differ on another). The bytes "
            f"each device sends carry where the collectives are the same: under jit the CPU compiler reduces "
            f"gradients that live in slices (zero2, fsdp) with an all-reduce and a slice, where GPU and TPU "
            f"compilers form a reduce-scatter, which sends half of it."]


def expert_findings(runs: list[ReportedRun]) -> list[str]:
    """Per run with a mixture of experts: how many token-to-expert assignments it dropped over capacity, of how
    many, and the all-to-all bytes its step moves (the tokens dispatched to their experts and back)."""
    out = []
    for run in runs:
        moe = run.rec.moe
        if not run.ok or moe is None or moe.dropped is None:
            continue
        steps = round(moe.dropped / moe.dropped_per_step) if moe.dropped_per_step else None
        total = None if steps is None or moe.assignments_per_step is None else moe.assignments_per_step * steps
        share = f" of {total:,} ({moe.dropped_fraction:.2%})" if total and moe.dropped_fraction is not None else ""
        a2a = run.m.comms.get("all-to-all")
        verb = "sends" if run.comms_sent else "has a payload of"
        moved = (f"; its step {verb} {run.comms_bytes('all-to-all') / 2**20:.2f} MiB per device in {a2a.count} "
                 f"all-to-alls" if a2a is not None and a2a.count else
                 "; no all-to-all (every device holds every expert)")
        out.append(f"{run.name}: {moe.experts} experts, top-{moe.top_k}, capacity {moe.capacity} per expert per "
                   f"sequence (factor {moe.capacity_factor:g}): dropped {moe.dropped:,.0f} token-to-expert "
                   f"assignments{share} over its steps{moved}.")
    return out


SENT_MEANS = ("Collective figures are the bytes each device sends per step on a ring of the collective's group "
              "of N devices: 2(N-1)/N of an all-reduce's buffer, (N-1)/N of an all-gather's, reduce-scatter's or "
              "all-to-all's, a collective-permute's whole buffer from each device that is a source of its "
              "pairs (the fullest device's total, where devices differ). They are computed from the compiled "
              "step's collectives and their groups, not measured on a link.")


def comms_findings(runs: list[ReportedRun]) -> list[str]:
    """What the collective figures count, which runs give only payloads (records written before bytes sent were
    kept), and which runs' counts miss iterations of loops whose trip count XLA did not record."""
    moving = [r for r in runs if r.ok and (r.comms_mib or 0) > 0]
    out = [SENT_MEANS] if moving and comms_measure(moving) != "payload" else []
    older = [r.name for r in moving if not r.comms_sent]
    if older:
        their = "its" if len(older) == 1 else "their"
        out.append(f"{', '.join(older)}: recorded before the bytes each device sends were kept, so {their} "
                   f"collective figures are payloads, the collectives' buffers per device (an all-gather's "
                   f"gathered output, a reduce-scatter's input): a reduce-scatter plus an all-gather of S bytes count "
                   f"2S where an all-reduce of S counts S, though on a ring each device sends as much for both; "
                   + ("read them as buffers, not traffic." if len(older) == len(moving) else
                      "they do not compare with the other runs' bytes sent."))
    for run in runs:
        loops = run.m.comms_unknown_trip_counts if run.ok else None
        if loops:
            out.append(f"{run.name}: {loops} loop{'s' if loops > 1 else ''} of its step ran an unknown number of "
                       f"times (XLA recorded no trip count): collectives inside {'them' if loops > 1 else 'it'} "
                       f"are counted once, so its collective figures undercount them.")
    return out


def peak_findings(runs: list[ReportedRun]) -> list[str]:
    """Where runs of one compute dtype divide MFU by different measured host peaks (runs of several sweeps, each of
    which measured its own), MFU no longer ranks them as their step times do: said, with the peaks."""
    peaks: dict[str, dict[float, list[str]]] = {}
    for run in runs:
        mfu = run.mfu
        if run.ok and mfu.mfu is not None and mfu.peak_origin and mfu.peak_flops_per_s_per_device and run.devices:
            whole = round(mfu.peak_flops_per_s_per_device * run.devices / 1e9, 1)  # the host's, in GFLOP/s
            peaks.setdefault(str(run.config.get("precision.dtype", "float32")), {}).setdefault(whole, []).append(
                run.name)
    return [f"MFU of the {dtype} runs divides by {len(found)} different host peaks, each measured by its own sweep "
            f"or run ({', '.join(f'{p:,.1f} GFLOP/s for {_names_of(names)}' for p, names in sorted(found.items()))}): "
            f"across them MFU does not rank runs as their step times do; compare their step times or throughput."
            for dtype, found in peaks.items() if len(found) > 1]


def busy_peak_findings(runs: list[ReportedRun]) -> list[str]:
    """Runs whose MFU divides by a host peak measured while other work loaded the host (their record's
    `peak_busy`): the peak may read low and their MFU high, said with the load."""
    busy: dict[str, list[str]] = {}
    for run in runs:
        if run.ok and run.mfu.mfu is not None and run.mfu.peak_busy:
            busy.setdefault(run.mfu.peak_busy, []).append(run.name)
    return [f"MFU of {_names_of(names)} divides by a host peak measured with the host at {load}: other work on the "
            f"cores reads a peak low, so {'these MFUs' if len(names) > 1 else 'its MFU'} may read high; step times "
            f"and throughput do not rest on it (measure the peak on a quiet host: --train.recalibrate-peak)."
            for load, names in busy.items()]


def _names_of(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def explain(runs: list[ReportedRun], swept: dict[str, list[Any]]) -> dict[str, list[str]]:
    """Sentences under their section heading; sections the runs give nothing to say about are left out."""
    sections = {"Speed": speed_findings(runs) + peak_findings(runs) + busy_peak_findings(runs),
                "Simulated devices": simulated_findings(runs),
                "The same computation?": equivalence_findings(runs),
                "Precision and memory": precision_findings(runs, swept) + dtype_role_finding(runs),
                "Sharding strategies": strategy_findings(runs),
                "Collectives": comms_findings(runs),
                "Profiles": trace_findings(runs),
                "Pipeline stages": pipeline_findings(runs),
                "Experts": expert_findings(runs),
                "Context parallelism": context_findings(runs),
                "The plan against the measurement": plan_findings(runs),
                "SPMD styles": spmd_findings(runs),
                "What the data allows": loss_floor_findings(runs),
                "Accuracy across seeds": seed_findings(runs, swept)}
    return {heading: sentences for heading, sentences in sections.items() if sentences}
