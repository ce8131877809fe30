"""Each test's CPU seconds beside its wall seconds: a pytest plugin, and a summary of what it wrote.

The suite on two cores is CPU-bound when its CPU seconds over two are close to its wall time; then only less
work makes it quicker. A test's CPU is its pytest worker's own plus that of the processes it started and
waited for (RUSAGE_CHILDREN): a SLURM job's processes are slurmd's children, not the test's, so they are not in it.

    SUITE_CPU_OUT=DIR PYTHONPATH=benchmarks .venv/bin/python -m pytest -q -n 2 --dist loadfile -p suite_cpu
    python benchmarks/suite_cpu.py DIR      # per file, then the 40 heaviest tests
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_rows: list[dict[str, Any]] = []


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    before, start = _cpu(), time.perf_counter()
    yield
    after = _cpu()
    _rows.append({"id": item.nodeid, "wall": time.perf_counter() - start, "self": after[0] - before[0],
                  "children": after[1] - before[1]})


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("SUITE_CPU_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(out) / f"cpu-{worker}.json").write_text(json.dumps(_rows))


def summary(folder: Path, heaviest: int = 40) -> str:
    rows = [row for path in sorted(folder.glob("cpu-*.json")) for row in json.loads(path.read_text())]
    cpu = {r["id"]: r["self"] + r["children"] for r in rows}
    wall = {r["id"]: r["wall"] for r in rows}
    files_cpu: Counter[str] = Counter()
    files_wall: Counter[str] = Counter()
    for test in cpu:
        files_cpu[test.split("::")[0]] += cpu[test]
        files_wall[test.split("::")[0]] += wall[test]
    lines = [f"{len(rows)} tests: {sum(cpu.values()):.0f} CPU s, {sum(wall.values()):.0f} wall s (summed over the "
             f"workers)", "", "| file | CPU (s) | wall (s) |", "|---|---:|---:|"]
    lines += [f"| {name} | {seconds:.1f} | {files_wall[name]:.1f} |" for name, seconds in files_cpu.most_common()]
    lines += ["", "| test | CPU (s) | wall (s) |", "|---|---:|---:|"]
    lines += [f"| {test} | {seconds:.1f} | {wall[test]:.1f} |"
              for test, seconds in Counter(cpu).most_common(heaviest)]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: suite_cpu.py DIR (the SUITE_CPU_OUT of a pytest run with -p suite_cpu)", file=sys.stderr)
        sys.exit(2)
    print(summary(Path(sys.argv[1])))
