"""What a sweep over sequence lengths says about context parallelism: at each length, the ring's step time and
memory against the all-gather's, and the shortest length from which the ring is the faster of the two on the
machine the runs ran on (the `long-context` preset). A ring run is paired with the all-gather run whose settings
are its own but for `parallel.context`; runs that differ in anything else but the sequence length (a batch size,
a mesh) are another series, said apart. The two are ranked by the Speed section's rule (`speed.verdict`), so that
the sections never contradict each other: a gap within the spread of their step times (median to p90) is a tie,
and a gap within `speed.FEW_STEPS_MARGIN` between figures from fewer than `speed.MIN_MEASURED_STEPS` timed steps is
undecided; either makes the ring neither the faster nor the slower."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from shardbench.report.speed import (
    APART, FEW_STEPS_MARGIN, MIN_MEASURED_STEPS, TIE, UNDECIDED, steps_note, verdict,
)

if TYPE_CHECKING:
    from shardbench.report.content import ReportedRun

SEQ_LEN = "model.seq_len"
CONTEXT = "parallel.context"
Pair = tuple[int, "ReportedRun", "ReportedRun"]  # (tokens, ring, all-gather)


def _mode(run: ReportedRun) -> str | None:
    """'ring' or 'all-gather' for a context-parallel run, None for any other."""
    if "cp" not in str(run.config.get("parallel.strategy") or "").split("+"):
        return None
    return str(run.config.get(CONTEXT) or "all-gather")


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**20:,.1f} MiB"


def _key(run: ReportedRun, *dropped: str) -> str:
    return json.dumps({k: v for k, v in run.settings.items() if k not in dropped}, sort_keys=True, default=str)


def _series(runs: list[ReportedRun]) -> dict[str, dict[int, dict[str, ReportedRun]]]:
    """The timed context-parallel runs by series (settings but the sequence length and the mode), then length,
    then mode; a pair is the two modes of one series at one length."""
    series: dict[str, dict[int, dict[str, ReportedRun]]] = {}
    for run in runs:
        mode = _mode(run)
        if run.ok and mode is not None and run.step_median is not None:
            lengths = series.setdefault(_key(run, SEQ_LEN, CONTEXT), {})
            lengths.setdefault(int(run.config.get(SEQ_LEN) or 0), {})[mode] = run
    return series


def _series_name(key: str, keys: list[str]) -> str:
    """What sets a series apart from the others ('' where there is one): 'train.batch_size 4'."""
    settings = [json.loads(k) for k in keys]
    mine = json.loads(key)
    varying = sorted(k for k in set().union(*settings) if len({json.dumps(s.get(k)) for s in settings}) > 1)
    return ", ".join(f"{k} {mine.get(k)}" for k in varying)


def context_findings(runs: list[ReportedRun]) -> list[str]:
    """One sentence per series with both modes at some length: each such length, and where the ring overtakes
    the all-gather (from a length on, from the shortest, or nowhere within the lengths measured)."""
    series = _series(runs)
    keys = list(series)
    sentences = []
    for key, by_length in series.items():
        pairs = [(t, modes["ring"], modes["all-gather"]) for t, modes in sorted(by_length.items())
                 if {"ring", "all-gather"} <= set(modes)]
        if pairs:
            sentences.append(_sentence(pairs, by_length, _series_name(key, keys) if len(keys) > 1 else ""))
    return sentences


def _ranked(ring: ReportedRun, gathered: ReportedRun) -> str:
    """'faster' or 'slower' (the ring's step against the all-gather's), or speed.verdict's TIE or UNDECIDED, judged
    on the slower step over the faster, as the Speed section judges them."""
    r, g = ring.step_median or 0.0, gathered.step_median or 0.0
    if not r or not g:
        return UNDECIDED
    ranked = verdict(ring, gathered, max(r, g) / min(r, g) - 1.0)
    return ranked if ranked != APART else "faster" if r < g else "slower"


def _sentence(pairs: list[Pair], by_length: dict[int, dict[str, ReportedRun]], name: str) -> str:
    parts = []
    for t, ring, gathered in pairs:
        r, g = ring.step_median or 0.0, gathered.step_median or 0.0
        parts.append(f"{t:,} tokens: ring {r * 1e3:,.1f} ms, all-gather {g * 1e3:,.1f} ms "
                     f"({_mib(ring.m.memory.total_bytes if ring.m.memory else None)} against "
                     f"{_mib(gathered.m.memory.total_bytes if gathered.m.memory else None)} per device)")
    ranked = {t: _ranked(ring, gathered) for t, ring, gathered in pairs}
    faster, open_, tied = ([t for t, said in ranked.items() if said == kind] for kind in ("faster", UNDECIDED, TIE))
    verdict_ = _crossover([t for t, _, _ in pairs], faster, open_, tied)
    steps = steps_note([r for _, ring, gathered in pairs for r in (ring, gathered)])
    timed = f" (figures {steps})" if steps else ""
    where = f" ({name})" if name else ""
    return (f"Context parallelism{where}, step time (median) and compiled memory per device by sequence length"
            f"{timed}: {'; '.join(parts)}: on this machine {verdict_}.{_alone(by_length)}")


def _tokens(lengths: list[int]) -> str:
    return ", ".join(f"{t:,}" for t in lengths)


def _undecided_note(lengths: list[int]) -> str:
    return (f"undecided at {_tokens(lengths)} tokens, where the two steps are within {100 * FEW_STEPS_MARGIN:.0f}% "
            f"of each other from fewer than {MIN_MEASURED_STEPS} timed steps")


def _tie_note(lengths: list[int]) -> str:
    return (f"tied at {_tokens(lengths)} tokens, where the two steps differ by less than the spread of their own "
            f"step times, median to p90")


def _notes(open_: list[int], tied: list[int]) -> list[str]:
    return ([_tie_note(tied)] if tied else []) + ([_undecided_note(open_)] if open_ else [])


def _crossover(lengths: list[int], faster: list[int], open_: list[int] | None = None,
               tied: list[int] | None = None) -> str:
    """Where the ring overtakes the all-gather: the shortest of the `lengths` (ascending, both modes ran) at which
    the ring's step is decidedly the faster (`faster`) and, at every longer one, the faster, tied or undecided; the
    shortest itself, or none. `open_` are the lengths where the gap is undecided and `tied` those where it is
    within the runs' spread (`speed.verdict`): they count neither way, and are said wherever they fall, as are the
    wins before a crossover."""
    open_, tied = open_ or [], tied or []
    neither = open_ + tied
    notes = _notes(open_, tied)
    if not faster and all(t in neither for t in lengths):
        return f"neither step was decidedly the faster at any length measured ({'; '.join(notes)})"
    overtakes = next((t for t in lengths if t in faster and all(u in faster or u in neither for u in lengths if u > t)),
                     None)
    if overtakes == lengths[0]:
        if not notes:
            return f"the ring's step was the faster at every length measured, from the shortest, {overtakes:,} tokens"
        return (f"the ring's step was the faster from the shortest length measured, {overtakes:,} tokens, on (it was "
                f"{'; '.join(notes)})")
    if overtakes is not None:
        slower = [t for t in lengths if t < overtakes and t not in faster and t not in neither]
        won = [t for t in faster if t < overtakes]
        said = [f"not the faster at {_tokens(slower)} tokens"] if slower else []
        said += [f"also the faster at {_tokens(won)} tokens"] if won else []
        said += notes
        return f"the ring overtakes the all-gather from {overtakes:,} tokens on (its step was {', '.join(said)})"
    span = f"{lengths[0]:,} to {lengths[-1]:,} tokens" if len(lengths) > 1 else f"{lengths[0]:,} tokens"
    verdict_ = f"the ring never overtakes the all-gather within the lengths measured ({span})"
    if faster:  # faster somewhere, but not at the longest: no crossover to speak of
        verdict_ += f": its step was the faster at {_tokens(faster)} tokens, not at {lengths[-1]:,}"
    if notes:
        verdict_ += f" ({'; '.join(notes)})"
    return verdict_


def _alone(by_length: dict[int, dict[str, ReportedRun]]) -> str:
    """The lengths the ring alone ran, and what the others would have held there: a float32 score of every query
    against every key, batch x heads x T^2 x 4 bytes a layer over all the devices (kept for the backward)."""
    alone = sorted(t for t, modes in by_length.items() if set(modes) == {"ring"})
    if not alone:
        return ""
    scores = []
    for t in alone:
        config = by_length[t]["ring"].config
        batch, heads = config.get("train.batch_size"), config.get("model.num_heads")
        if isinstance(batch, int) and isinstance(heads, int):
            scores.append(f"{batch * heads * t * t * 4 / 2**30:,.1f} GiB at {t:,}")
    held = (f": the all-gather keeps a score for every query against every key, as dp, fsdp and tp do, batch x "
            f"heads x T^2 x 4 bytes a layer over the devices ({', '.join(scores)} tokens), and was not run there"
            if scores else ", where the all-gather's scores (queries x every key) were not run")
    return f" The ring alone ran at {_tokens(alone)} tokens{held}."
