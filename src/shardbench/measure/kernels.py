"""A kernel table from a profiler trace: which device kernels (or, on a CPU, which XLA ops) took the time; and
`trace_time`, the train step's op time per step on each device and the part of it in collectives, which the
report's Profiles section reads (`shardbench.report.traces`).

Reads the `.xplane.pb` that `jax.profiler` writes (what `train --profile` leaves under the run's
`tensorboard/plugins/profile/<run-name>/`) with jax's own `ProfileData`, so no TensorBoard plugin is needed.
On a GPU the kernels are the events of each `/device:GPU:N` plane's stream lines; on a CPU, XLA's op events
(those with an `hlo_op` stat) on the host's threads.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

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


@dataclass(frozen=True)
class _Event:
    name: str
    ns: int
    start: int  # ns, on the trace's clock
    device: str  # a GPU plane's name, or on a CPU the op's `device_ordinal` (simulated devices share threads)
    program: tuple[str, int | None] | None  # (`hlo_module`, `program_id`) where the event names them
    execution: int | None  # `run_id`
    leaf: bool = True  # holds no other event of its thread (a while's span holds its body's ops: not a leaf)


class Timed(Protocol):
    """What `_leaves` reads of a trace's event (jax.profiler's ProfileEvent)."""

    @property
    def start_ns(self) -> float: ...

    @property
    def duration_ns(self) -> float: ...


E = TypeVar("E", bound=Timed)


def _leaves(events: list[E]) -> list[E]:
    """The events of one thread that hold no other: on a CPU a `while` (or a call) op's event spans the ops of its
    body, run on the same thread, and both would be counted. Ordered by start (the longer first where two start
    together), an event holds another exactly when the next one lies within it; an event of no length holds
    nothing and is left out (it adds no time)."""
    ordered = sorted((e for e in events if int(e.duration_ns) > 0),
                     key=lambda e: (int(e.start_ns), -int(e.duration_ns)))

    def end(e: E) -> int:
        return int(e.start_ns) + int(e.duration_ns)

    # the next event starts no earlier; it lies within `e` unless it ends later (after `e`, or overlapping it)
    return [e for e, after in zip(ordered, [*ordered[1:], None]) if after is None or end(after) > end(e)]


def _events(path: Path) -> Iterable[_Event]:
    """Every kernel in the trace: a GPU's stream kernels, or a CPU's XLA ops (those with an `hlo_op` stat), each
    marked whether it is the innermost of its thread (`_leaves`): only those are summed, each op once."""
    from jax.profiler import ProfileData

    try:
        data = ProfileData.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - the reader raises plain runtime errors on a bad file
        raise ShardbenchError(f"{path}: not a readable profiler trace ({err}); record it again with --profile")
    planes = list(data.planes)
    gpus = [p for p in planes if p.name.startswith("/device:") and "CPU" not in p.name]
    for plane in gpus or [p for p in planes if p.name == "/host:CPU"]:
        for line in plane.lines:
            if gpus and line.name.startswith(_DERIVED_LINES):
                continue
            kept = [(e, stats) for e, stats in ((e, dict(e.stats)) for e in line.events) if gpus or "hlo_op" in stats]
            # a GPU stream's kernels never nest; a CPU thread's ops do (a while's span holds its body's ops)
            leaves = {id(e) for e in ([e for e, _ in kept] if gpus else _leaves([e for e, _ in kept]))}
            for event, stats in kept:
                module, program, run = stats.get("hlo_module"), stats.get("program_id"), stats.get("run_id")
                yield _Event(event.name, int(event.duration_ns), int(event.start_ns),
                             plane.name if gpus else str(stats.get("device_ordinal", 0)),
                             None if module is None else (str(module), None if program is None else int(program)),
                             None if run is None else int(run), id(event) in leaves)


def kernel_table(path: Path, top: int = 30) -> tuple[list[Kernel], int, int]:
    """The `top` kernels by total time (name, total ns, launches, share of all kernel time), that total over
    every device, and how many devices ran kernels."""
    totals: dict[str, list[int]] = {}
    devices: set[str] = set()
    for event in (e for e in _events(path) if e.leaf):
        entry = totals.setdefault(event.name, [0, 0])
        entry[0] += event.ns
        entry[1] += 1
        devices.add(event.device)
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


# XLA's collective ops by their HLO names (`all-reduce.3`, `all-gather-start.1`, `collective-permute-done`), as a
# CPU's trace names its ops, and NCCL's kernels by theirs (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`), as a GPU's
# does. Longest first: `all-reduce-scatter` is no op, but `reduce-scatter` must not be read as `all-reduce`.
_HLO_COLLECTIVES = ("collective-broadcast", "collective-permute", "ragged-all-to-all", "reduce-scatter",
                    "all-reduce", "all-gather", "all-to-all", "send", "recv")
# A CPU's trace may name an op by the jax primitive it came from (a ring's `ppermute.28` under shard_map).
_JAX_COLLECTIVES = {"ppermute": "collective-permute", "psum_scatter": "reduce-scatter", "reduce_scatter":
                    "reduce-scatter", "psum": "all-reduce", "pmax": "all-reduce", "pmin": "all-reduce",
                    "all_gather": "all-gather", "all_to_all": "all-to-all"}
_NCCL_COLLECTIVES = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
                     "alltoall": "all-to-all", "sendrecv": "send/recv", "broadcast": "broadcast"}


def collective_of(name: str) -> str | None:
    """The collective an op or kernel is, by its name ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all',
    'ragged-all-to-all', 'collective-permute', 'collective-broadcast', 'send/recv', 'broadcast'), or None for an op
    that is not one."""
    low = name.lower()
    for op in _HLO_COLLECTIVES:
        if low == op or low.startswith((f"{op}.", f"{op}-start", f"{op}-done")):
            return "send/recv" if op in ("send", "recv") else op
    for op, kind in _JAX_COLLECTIVES.items():  # psum_scatter before psum
        if low == op or low.startswith(f"{op}."):
            return kind
    if "nccl" in low:
        squashed = low.replace("_", "").replace("-", "")
        return next((kind for key, kind in _NCCL_COLLECTIVES.items() if key in squashed), "nccl")
    return None


@dataclass(frozen=True)
class TraceTime:
    """Where a profiled run's train steps spent their time, per step on each device, as its trace holds it: the
    step's span there (from its first op to its last; a traced step usually runs slower than an untraced one), the
    time some op ran (`busy_ms`: ops that overlap, on a CPU's threads or a GPU's streams, counted once), the time
    some collective ran, in all and by kind (kinds that overlap each count), each the median over the traced steps
    of a device, then the devices' mean; and the longest ops (their time summed over the threads or streams that
    ran them, per step). Where the trace numbers no executions (`counted_steps` False), each device's window is
    one span, divided by the window's steps: it holds the gaps between steps."""

    steps: int  # train steps in the trace
    devices: int
    span_ms: float
    busy_ms: float
    collectives_ms: float
    collective_ms: dict[str, float]  # kind -> ms per step per device, the largest first
    top: tuple[tuple[str, float], ...]  # (op or kernel, summed ms per step per device), the largest first
    counted_steps: bool  # `steps` counted in the trace (the train step's executions), not the window's length
    train_only: bool = True  # False: the train step's program could not be told from the others, all counted
    kinds_overlap: bool = False  # collectives of two kinds ran at once in some step (their times add to more)

    @property
    def collective_share(self) -> float | None:
        """The part of the traced step some collective ran."""
        return self.collectives_ms / self.span_ms if self.span_ms > 0 else None


def _kinds_overlap(events: list[_Event]) -> bool:
    """Whether collectives of two kinds ran at once among `events` (one step on one device)."""
    kinds: dict[str, list[_Event]] = {}
    for e in events:
        if (kind := collective_of(e.name)) is not None:
            kinds.setdefault(kind, []).append(e)
    return sum(_union(es) for es in kinds.values()) > _union(e for es in kinds.values() for e in es)


def _union(events: Iterable[_Event]) -> int:
    """The ns during which at least one of `events` ran."""
    total, end = 0, None
    for e in sorted(events, key=lambda e: e.start):
        if end is None or e.start >= end:
            total, end = total + e.ns, e.start + e.ns
        elif e.start + e.ns > end:
            total, end = total + e.start + e.ns - end, e.start + e.ns
    return total


# The train step's program, as jit and shard_map name it (`jit_train_step`); pmap's programs are all `jit__fun`.
TRAIN_PROGRAMS = ("jit_train_step", "pmap_device_train")


def _train_events(path: Path, window_steps: int) -> tuple[list[_Event], int | None, bool]:
    """The train step's ops or kernels, how many times the step ran in the trace (None where the events do not
    say), and whether they are the train step's alone. A CPU's op events name their program (`hlo_module`,
    `program_id`) and its execution (`run_id`): the train step is the program named for it (TRAIN_PROGRAMS), or,
    where no name says (pmap), the one that ran once per step of the window, the costliest of several. The
    evaluation step's and other programs' ops are left out. Where no program is told apart (a GPU's kernels may
    name none), every event counts."""
    events = list(_events(path))
    if not events:
        raise ShardbenchError(f"{path}: the trace holds no ops; record it again with --profile")
    programs: dict[tuple[str, int | None], list[_Event]] = {}
    for e in events:
        if e.program is not None:
            programs.setdefault(e.program, []).append(e)
    named = [p for p in programs if p[0] in TRAIN_PROGRAMS]
    if not named:
        ran = [p for p, es in programs.items() if len({e.execution for e in es} - {None}) == window_steps]
        named = [max(ran, key=lambda p: sum(e.ns for e in programs[p] if e.leaf))] if ran else []
    train = [e for p in named for e in programs[p]]
    runs = {e.execution for e in train if e.execution is not None}
    return (train, len(runs) or None, True) if train else (events, None, False)


def trace_time(path: Path, window_steps: int, top: int = 3) -> TraceTime:
    """A trace's train steps by their time (see `TraceTime`); `window_steps` is the profile window's length, used
    where the trace does not count the step's executions itself."""
    events, counted, train_only = _train_events(path, window_steps)
    devices = max(len({e.device for e in events}), 1)
    steps = counted or max(window_steps, 1)
    per = 1e6 * steps * devices  # ns summed over steps and devices -> ms per step per device
    # One step on one device: its execution's ops (where the trace names no execution, the device's whole window).
    groups: dict[tuple[str, int | None], list[_Event]] = {}
    for e in events:
        groups.setdefault((e.device, e.execution), []).append(e)
    kinds = {e.name: collective_of(e.name) for e in events}
    measures: dict[str, Callable[[list[_Event]], int]] = {
        "span": lambda g: max(e.start + e.ns for e in g) - min(e.start for e in g),
        "busy": _union,
        "collectives": lambda g: _union(e for e in g if kinds[e.name]),
        **{kind: (lambda g, kind=kind: _union(e for e in g if kinds[e.name] == kind))
           for kind in {k for k in kinds.values() if k}},
    }

    def per_step_ms(measure: Callable[[list[_Event]], int]) -> float:
        """The median over a device's steps, the devices' mean, in ms (a device's window / its steps, uncounted)."""
        by_device: dict[str, list[int]] = {}
        for (device, _), g in groups.items():
            by_device.setdefault(device, []).append(measure(g))
        if counted is None:
            return sum(sum(v) for v in by_device.values()) / per
        return sum(statistics.median(v) for v in by_device.values()) / len(by_device) / 1e6

    ms = {name: per_step_ms(measure) for name, measure in measures.items()}
    by_kind = {k: ms[k] for k in measures if k not in ("span", "busy", "collectives")}
    totals: dict[str, int] = {}
    for e in events:
        if e.leaf:  # summed: a loop's span would count its body's ops again
            totals[e.name] = totals.get(e.name, 0) + e.ns
    largest = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return TraceTime(steps=steps, devices=devices, span_ms=ms["span"], busy_ms=ms["busy"],
                     collectives_ms=ms["collectives"],
                     collective_ms=dict(sorted(by_kind.items(), key=lambda item: -item[1])),
                     top=tuple((name, ns / per) for name, ns in largest), counted_steps=counted is not None,
                     train_only=train_only, kinds_overlap=any(_kinds_overlap(g) for g in groups.values()))
