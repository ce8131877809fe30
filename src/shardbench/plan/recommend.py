"""Ranking the candidates and saying, in one line, which layout to use and why."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from shardbench.units import format_bytes
from shardbench.plan.candidates import Candidate
from shardbench.plan.predict import Hardware, Prediction

# Bytes in binary units, as the report gives a run's (comms/step MiB); bandwidths stay the data sheets' GB/s
MIB = 2**20


def ms(seconds: float) -> str:
    """Milliseconds to three significant figures, never in exponent form ('1,010', not '1.01e+03')."""
    value = seconds * 1e3
    return f"{value:,.0f}" if abs(value) >= 999.5 else f"{value:.3g}"


@dataclass(frozen=True)
class Row:
    """One candidate's outcome: a prediction, or why there is none (refused before compiling, or failed)."""

    candidate: Candidate
    prediction: Prediction | None = None
    problem: str = ""  # "refused: ..." or "failed to compile: ..."


def rank(rows: list[Row]) -> list[Row]:
    """Candidates that fit, fastest first; then those that do not fit, smallest first; then the rest."""
    fitting = sorted((r for r in rows if r.prediction and r.prediction.fits), key=lambda r: r.prediction.step_s)
    too_big = sorted((r for r in rows if r.prediction and not r.prediction.fits),
                     key=lambda r: r.prediction.total_bytes)
    return [*fitting, *too_big, *(r for r in rows if r.prediction is None)]


def _layout(c: Candidate) -> str:
    return f"{c.strategy} {c.mesh}"


def amounts(a: float, b: float) -> tuple[str, str]:
    """Two byte counts as `format_bytes` writes them (binary units, three figures), told apart: where different
    amounts would print alike ("39.1 MiB of 39.1 MiB"), both in whole bytes, the larger rounded up and the smaller
    down, so that a memory need never reads the same as the memory it does not fit in."""
    shown = format_bytes(a), format_bytes(b)
    if shown[0] != shown[1] or a == b:
        return shown
    first, second = (math.ceil, math.floor) if a > b else (math.floor, math.ceil)
    return f"{first(a):,} B", f"{second(b):,} B"


def _headroom(value: float) -> str:
    return ">99%" if value > 0.99 else f"{value:.0%}"


# What may vary between candidates of one layout (strategy and mesh), as their names write it.
_VARIED: tuple[tuple[str, Callable[[Candidate], object]], ...] = (
    ("remat", lambda c: c.remat), ("dtype", lambda c: c.dtype), ("accumulation", lambda c: c.grad_accum),
    ("microbatches", lambda c: c.microbatches), ("schedule", lambda c: c.schedule))


def _variants(rows: list[Row]) -> str:
    """' (its 2 candidates differ in remat)' for several candidates of one layout: the plan's tables list each of
    them, and 'the only layout' is not 'the only candidate'. '' for one candidate."""
    if len(rows) < 2:
        return ""
    varied = [label for label, get in _VARIED if len({get(r.candidate) for r in rows}) > 1]
    if not varied:
        return ""
    return f" (its {len(rows)} candidates differ in {' and '.join(varied)})"


def recommendation(ranked: list[Row], hw: Hardware, untimed: tuple[str, ...] = ()) -> str:
    """One line: the layout to use and why, against the best candidate of another layout, its links named as `hw`
    calls them (NVLink, ICI, an L4's PCIe). `untimed`: the links
    whose transfers are not timed (no bandwidth on the chip's data sheet), where the two move different bytes."""
    fitting = [r for r in ranked if r.prediction and r.prediction.fits]
    predicted = [r for r in ranked if r.prediction]
    if not fitting:
        if not predicted:
            return "no candidate could be predicted: see the reasons below"
        small = min(predicted, key=lambda r: r.prediction.total_bytes)
        need, usable = amounts(small.prediction.total_bytes, small.prediction.memory_bytes)
        return (f"nothing fits: the smallest, {small.candidate.name}, needs {need} per device of {usable} usable; "
                f"try --remat full, --param-dtype bfloat16, a smaller --batch-size or more devices")
    best = fitting[0]
    p = best.prediction
    line = f"use {best.candidate.name}: fits with {_headroom(p.headroom)} headroom"
    faster = [r for r in predicted if not r.prediction.fits and r.prediction.step_s < p.step_s]
    if faster:
        q = min(faster, key=lambda r: r.prediction.step_s)
        need, usable = amounts(q.prediction.total_bytes, q.prediction.memory_bytes)
        line += (f" ({q.candidate.name} would be {p.step_s / q.prediction.step_s:.2f}x faster but needs {need} of "
                 f"{usable})")
    other = next((r for r in fitting[1:] if _layout(r.candidate) != _layout(best.candidate)), None)
    if other is None:
        alone = len({_layout(r.candidate) for r in ranked}) == 1  # one candidate, or remat, dtype, K alone vary
        return line + (f", the only layout planned{_variants(ranked)}" if alone else
                       ", the only layout that fits" if len(predicted) > 1 else "")
    q = other.prediction
    names = {link: hw.link_name(link) for link in ("intra", "inter")}
    link = q.main_link
    why = (f", which spends {q.comm_share:.0%} of its step communicating over {names[link]}"
           if link and q.comm_share >= 0.05 else
           f" ({ms(q.step_s)} ms against {ms(p.step_s)} ms per step)")
    line = f"{line}, {q.step_s / p.step_s:.2f}x faster than {other.candidate.name}{why}"
    for link in untimed:
        mine, theirs = (r.prediction.comm_bytes.get(link, 0) / MIB for r in (best, other))
        if abs(mine - theirs) > 0.05 * max(mine, theirs, 1e-9):  # the ranking leaves the difference out
            line += (f"; not counted: {names[link]} transfers (no {names[link]} bandwidth on the chip's data "
                     f"sheet), {mine:.1f} MiB for {best.candidate.name} against {theirs:.1f} MiB")
    return line
