"""Ranking the candidates and saying, in one line, which layout to use and why."""

from __future__ import annotations

from dataclasses import dataclass

from shardbench.plan.candidates import Candidate
from shardbench.plan.predict import Prediction

GB = 1e9
LINK_NAMES = {"gpu": {"intra": "NVLink", "inter": "InfiniBand"}, "tpu": {"intra": "ICI", "inter": "DCN"},
              "cpu": {"intra": "memory copies", "inter": "memory copies"}}


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


def _headroom(value: float) -> str:
    return ">99%" if value > 0.99 else f"{value:.0%}"


def recommendation(ranked: list[Row], platform: str) -> str:
    """One line: the layout to use and why, against the best candidate of another layout."""
    fitting = [r for r in ranked if r.prediction and r.prediction.fits]
    predicted = [r for r in ranked if r.prediction]
    if not fitting:
        if not predicted:
            return "no candidate could be predicted: see the reasons below"
        small = min(predicted, key=lambda r: r.prediction.total_bytes)
        p = small.prediction
        return (f"nothing fits: the smallest, {small.candidate.name}, needs {p.total_bytes / GB:.2f} GB per device "
                f"of {p.memory_bytes / GB:.2f} GB usable; try --remat full, --param-dtype bfloat16, a smaller "
                f"--batch-size or more devices")
    best = fitting[0]
    p = best.prediction
    line = f"use {best.candidate.name}: fits with {_headroom(p.headroom)} headroom"
    faster = [r for r in predicted if not r.prediction.fits and r.prediction.step_s < p.step_s]
    if faster:
        q = min(faster, key=lambda r: r.prediction.step_s)
        line += (f" ({q.candidate.name} would be {p.step_s / q.prediction.step_s:.2f}x faster but needs "
                 f"{q.prediction.total_bytes / GB:.1f} GB of {q.prediction.memory_bytes / GB:.1f} GB)")
    other = next((r for r in fitting[1:] if _layout(r.candidate) != _layout(best.candidate)), None)
    if other is None:
        return line + (", the only layout that fits" if len(predicted) > 1 else "")
    q = other.prediction
    names = LINK_NAMES.get(platform, LINK_NAMES["gpu"])
    link = q.main_link
    why = (f", which spends {q.comm_share:.0%} of its step communicating over {names[link]}"
           if link and q.comm_share >= 0.05 else
           f" ({q.step_s * 1e3:.3g} ms against {p.step_s * 1e3:.3g} ms per step)")
    return f"{line}, {q.step_s / p.step_s:.2f}x faster than {other.candidate.name}{why}"
