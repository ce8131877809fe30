"""What a sweep over sequence lengths says about context parallelism: at each length, the ring's step time and
memory against the all-gather's, and the shortest length from which the ring is the faster of the two on the
machine the runs ran on (the `long-context` preset)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardbench.report.content import ReportedRun


def _mode(run: ReportedRun) -> str | None:
    """'ring' or 'all-gather' for a context-parallel run, None for any other."""
    if "cp" not in str(run.config.get("parallel.strategy") or "").split("+"):
        return None
    return str(run.config.get("parallel.context") or "all-gather")


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**20:,.1f} MiB"


def context_findings(runs: list[ReportedRun]) -> list[str]:
    """One sentence: each sequence length with both modes, and where the ring overtakes the all-gather (from a
    length on, from the shortest, or nowhere within the lengths measured)."""
    by_length: dict[int, dict[str, ReportedRun]] = {}
    for run in runs:
        mode = _mode(run)
        if run.ok and mode is not None and run.step_median is not None:
            by_length.setdefault(int(run.config.get("model.seq_len") or 0), {})[mode] = run
    pairs = [(t, modes["ring"], modes["all-gather"]) for t, modes in sorted(by_length.items())
             if {"ring", "all-gather"} <= set(modes)]
    if not pairs:
        return []
    parts = []
    for t, ring, gathered in pairs:
        r, g = ring.step_median or 0.0, gathered.step_median or 0.0
        parts.append(f"{t:,} tokens: ring {r * 1e3:,.1f} ms, all-gather {g * 1e3:,.1f} ms "
                     f"({_mib(ring.m.memory.total_bytes if ring.m.memory else None)} against "
                     f"{_mib(gathered.m.memory.total_bytes if gathered.m.memory else None)} per device)")
    faster = [t for t, ring, gathered in pairs if (ring.step_median or 0) < (gathered.step_median or 0)]
    verdict = _crossover([t for t, _, _ in pairs], faster)
    sentence = (f"Context parallelism, step time (median) and compiled memory per device by sequence length: "
                f"{'; '.join(parts)}: on this machine {verdict}.{_alone(by_length)}")
    return [sentence]


def _tokens(lengths: list[int]) -> str:
    return ", ".join(f"{t:,}" for t in lengths)


def _crossover(lengths: list[int], faster: list[int]) -> str:
    """Where the ring overtakes the all-gather: the shortest of the `lengths` (ascending, both modes ran) from which
    the ring's step is the faster (`faster`) at it and at every longer one; the shortest itself, or none."""
    overtakes = next((t for t in lengths if all(u in faster for u in lengths if u >= t)), None)
    if overtakes == lengths[0]:
        return f"the ring's step was the faster at every length measured, from the shortest, {overtakes:,} tokens"
    if overtakes is not None:
        return (f"the ring overtakes the all-gather from {overtakes:,} tokens on (its step was not the faster at "
                f"{_tokens([t for t in lengths if t < overtakes and t not in faster])} tokens)")
    span = f"{lengths[0]:,} to {lengths[-1]:,} tokens" if len(lengths) > 1 else f"{lengths[0]:,} tokens"
    verdict = f"the ring never overtakes the all-gather within the lengths measured ({span})"
    if faster:  # faster somewhere, but not at the longest: no crossover to speak of
        verdict += f": its step was the faster at {_tokens(faster)} tokens, not at {lengths[-1]:,}"
    return verdict


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
