"""Kendall's tau between two orders: how well the planner ranks what was measured (`plan --validate`, `tune`, and
the reports' chart of predicted against measured). Imports nothing of the package, so any module may use it."""

from __future__ import annotations


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
