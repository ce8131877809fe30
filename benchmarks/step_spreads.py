"""The spread of a CPU run's step times, p90 over median minus one, across the run records kept under
benchmarks/data: those timed over 7 to 17 steps (the report's rule for runs timed over fewer steps,
`shardbench.report.speed.FEW_STEPS_MARGIN`, is set against them).

    python benchmarks/step_spreads.py [benchmarks/data]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def spreads(root: Path) -> list[float]:
    found = []
    for path in sorted(root.rglob("summary.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        m = record.get("measurements") or {}
        kind = m.get("device_kind") or record.get("device_kind")
        times = m.get("step_time_s") or {}
        steps, median, p90 = times.get("measured_steps"), times.get("median"), times.get("p90")
        if kind == "cpu" and isinstance(steps, int) and 7 <= steps <= 17 and median and p90:
            found.append(p90 / median - 1)
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/data")
    s = spreads(root)
    if len(s) < 2:
        print(f"{len(s)} record(s) under {root}: too few for quartiles")
        return
    q1, median, q3 = statistics.quantiles(s, n=4, method="inclusive")
    within = sum(x <= 0.15 for x in s) / len(s)
    print(f"{len(s)} CPU records under {root} timed over 7 to 17 steps: p90/median - 1 has median {median:.1%}, "
          f"quartiles {q1:.1%} and {q3:.1%}, largest {max(s):.1%}; {within:.0%} of them at or under 15%")


if __name__ == "__main__":
    main()
