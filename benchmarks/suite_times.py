"""Each test file's seconds in two pytest runs, from their JUnit XML (`pytest --junitxml FILE`): a file's seconds
are its tests' setup, call and teardown summed, so the two workers' share of a file is read the same way in both
runs. The slowest files first, and the runs' sums at the end.

    python benchmarks/suite_times.py benchmarks/data/test-suite-cpu/before.xml \\
        benchmarks/data/test-suite-cpu/after.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def file_seconds(path: str) -> Counter[str]:
    """Seconds per test file (`tests/test_x.py`) in one run's JUnit XML."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(path).iter("testcase"):
        seconds["tests/" + case.get("classname", "").split(".")[-1] + ".py"] += float(case.get("time", 0))
    return seconds


def table(before: Counter[str], after: Counter[str]) -> str:
    rows = ["| file | before (s) | after (s) | after / before |", "|---|---:|---:|---:|"]
    for name, was in before.most_common():
        now = after.get(name, 0.0)
        rows.append(f"| {name} | {was:.1f} | {now:.1f} | {now / was:.2f} |" if was else f"| {name} | 0 | {now:.1f} | |")
    for name in sorted(set(after) - set(before)):
        rows.append(f"| {name} | | {after[name]:.1f} | |")
    total_before, total_after = sum(before.values()), sum(after.values())
    rows.append(f"| all files | {total_before:.1f} | {total_after:.1f} | {total_after / total_before:.2f} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: suite_times.py BEFORE.xml AFTER.xml", file=sys.stderr)
        return 2
    print(table(file_seconds(argv[0]), file_seconds(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
