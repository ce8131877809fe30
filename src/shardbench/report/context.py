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
    """One sentence per sequence length with both modes, and where the ring overtakes the all-gather."""
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
    # The ring overtakes from the shortest length at which it is faster and stays faster at every longer one.
    overtakes = next((t for t, _, _ in pairs if all(u in faster for u, _, _ in pairs if u >= t)), None)
    if overtakes is None:
        verdict = "the all-gather's step was the faster at every length measured together"
    elif overtakes == pairs[0][0]:
        verdict = f"the ring's step was the faster at every length measured together, from {overtakes:,} tokens"
    else:
        verdict = f"the ring overtakes the all-gather from {overtakes:,} tokens on"
    alone = sorted(t for t, modes in by_length.items() if set(modes) == {"ring"})
    tail = (f" The ring alone ran at {', '.join(f'{t:,}' for t in alone)} tokens, where the all-gather's scores "
            f"(queries x every key) were not run." if alone else "")
    return [f"Context parallelism, step time (median) and compiled memory per device by sequence length: "
            f"{'; '.join(parts)}: on this machine {verdict}.{tail}"]
