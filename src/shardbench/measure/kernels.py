"""A kernel table from a profiler trace: which device kernels (or, on a CPU, which XLA ops) took the time.

Reads the `.xplane.pb` that `jax.profiler` writes (what `train --profile` leaves under the run's
`tensorboard/plugins/profile/<run-name>/`) with jax's own `ProfileData`, so no TensorBoard plugin is needed.
On a GPU the kernels are the events of each `/device:GPU:N` plane's stream lines; on a CPU, XLA's op events
(those with an `hlo_op` stat) on the host's threads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shardbench.errors import ShardbenchError

# Lines of a GPU plane that restate the streams' kernels per op or module, and would count them twice.
_DERIVED_LINES = ("XLA Ops", "XLA Modules", "Steps", "TensorFlow Ops", "Framework Ops", "Source code",
                  "Launch Stats", "XLA TraceMe")


@dataclass(frozen=True)
class Kernel:
    name: str
    total_ns: int
    count: int
    share: float  # of all kernel time in the trace


def find_trace(root: Path) -> Path:
    """The newest `.xplane.pb` below `root` (a run folder, its tensorboard folder or a trace folder)."""
    traces = sorted(Path(root).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise ShardbenchError(f"no profiler trace (*.xplane.pb) under {root}: train with --profile first")
    return traces[-1]


def _events(path: Path) -> Iterable[tuple[str, int, str]]:
    """(name, duration in ns, device) of every kernel in the trace: a GPU plane's name, or on a CPU the op's
    `device_ordinal` (simulated devices share the host's threads)."""
    from jax.profiler import ProfileData

    try:
        data = ProfileData.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - the reader raises plain runtime errors on a bad file
        raise ShardbenchError(f"{path}: not a readable profiler trace ({err}); record it again with --profile")
    planes = list(data.planes)
    devices = [p for p in planes if p.name.startswith("/device:") and "CPU" not in p.name]
    if devices:
        for plane in devices:
            for line in plane.lines:
                if line.name.startswith(_DERIVED_LINES):
                    continue
                for event in line.events:
                    yield event.name, int(event.duration_ns), plane.name
        return
    for plane in planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    yield event.name, int(event.duration_ns), str(stats.get("device_ordinal", 0))


def kernel_table(path: Path, top: int = 30) -> tuple[list[Kernel], int, int]:
    """The `top` kernels by total time (name, total ns, launches, share of all kernel time), that total over
    every device, and how many devices ran kernels."""
    totals: dict[str, list[int]] = {}
    devices: set[str] = set()
    for name, duration, device in _events(path):
        entry = totals.setdefault(name, [0, 0])
        entry[0] += duration
        entry[1] += 1
        devices.add(device)
    everything = sum(total for total, _ in totals.values())
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return [Kernel(name, total, count, total / everything if everything else 0.0)
            for name, (total, count) in ranked], everything, max(len(devices), 1)


def render(kernels: list[Kernel], total_ns: int, steps: int, devices: int = 1) -> str:
    """A markdown table: per kernel its time and launches per step on one device (the devices' mean), and its
    share. The trace's total is over every device: it is divided by them, as a step runs on each at once."""
    per = max(steps, 1) * max(devices, 1)
    on = f" on {devices} devices" if devices > 1 else ""
    each = ", each device's mean" if devices > 1 else ""
    lines = [f"kernel time in the trace: {total_ns / 1e6:.2f} ms over {steps} step(s){on}, "
             f"{total_ns / 1e6 / per:.2f} ms per step{each}", "",
             "| kernel | ms/step | launches/step | share |", "|---|---:|---:|---:|"]
    for k in kernels:
        name = k.name if len(k.name) <= 80 else k.name[:77] + "..."
        lines.append(f"| `{name}` | {k.total_ns / 1e6 / per:.3f} | {k.count / per:g} | {100 * k.share:.1f}% |")
    return "\n".join(lines)
