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

from shardbench.measure.run_record import RecordError, from_json


def spreads(root: Path) -> list[float]:
    """p90 / median - 1 of every CPU run record under `root` timed over 7 to 17 steps, read as reports read them."""
    found = []
    for path in sorted(root.rglob("summary.json")):
        try:
            m = from_json(json.loads(path.read_text()), str(path)).measurements
        except (OSError, ValueError, RecordError):
            continue
        times = None if m is None else m.step_time_s
        if m is None or times is None or m.device_kind != "cpu" or not times.median or not times.p90:
            continue
        if times.measured_steps is not None and 7 <= times.measured_steps <= 17:
            found.append(times.p90 / times.median - 1)
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
