"""Kendall's tau between two orders: how well the planner ranks what was measured (`plan --validate`, `tune`, and
the reports' chart of predicted against measured), and `describe_tau`, which says one group's tau with its n.
Imports nothing of the package, so any module may use it."""

from __future__ import annotations

MIN_TAU_RUNS = 3  # under three runs Kendall's tau is +-1 or undefined: it says nothing of the plan's ranking


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau-b between two lists of scores (ties count for neither side); None where it is undefined
    (every pair tied in one of the lists, e.g. a plan that predicts every run alike)."""
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = ((concordant + discordant + ties_a) * (concordant + discordant + ties_b)) ** 0.5
    return (concordant - discordant) / denominator if denominator else None


def describe_tau(predicted: list[float], measured: list[float]) -> str:
    """Kendall's tau of two orders of one group's runs with its n; under MIN_TAU_RUNS runs, that it means nothing."""
    n = len(predicted)
    if n < MIN_TAU_RUNS:
        return f"{n} run{'' if n == 1 else 's'}, too few for Kendall's tau to mean anything"
    found = kendall_tau(predicted, measured)
    if found is None:
        return f"{n} runs, no order to compare (every prediction or measurement alike)"
    return f"Kendall's tau {found:.2f} over {n} runs"
