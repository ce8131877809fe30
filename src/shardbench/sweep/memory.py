"""How much memory a run's processes held, and what limited them (Linux; None elsewhere): the resident memory of
the run's whole process tree (a multi-process run's workers are children of its launch process), the memory
limit of the cgroup it runs in, and the cgroup's count of out-of-memory kills. A process the kernel's
out-of-memory killer takes leaves no message of its own; these are what tell it from another SIGKILL.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2^63


def proc_kib(path: Path | str, key: str) -> int | None:
    """Bytes of a 'key: N kB' line of a /proc file (Linux); None where there is no such file or line."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_memory_bytes() -> int | None:
    return proc_kib(PROC / "meminfo", "MemTotal:")


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """Every living descendant of `pid` (children of each of its threads, recursively), from /proc."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for children in (proc / str(parent) / "task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except (OSError, ValueError):
                continue
            found += [k for k in kids if k not in found]
            todo += kids
    return found


def tree_rss_bytes(pid: int, proc: Path = PROC) -> int | None:
    """Resident memory now of `pid` and all its descendants; None when `pid` is gone."""
    own = proc_kib(proc / str(pid) / "status", "VmRSS:")
    if own is None:
        return None
    return own + sum(proc_kib(proc / str(k) / "status", "VmRSS:") or 0 for k in descendants(pid, proc))


class PeakMemory:
    """Samples the resident memory of a process and its descendants until it ends: the largest of the process's
    own high-water mark (VmHWM) and the sum over its tree at any sample."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.pid, self.every_s, self.peak = pid, every_s, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            values = [v for v in (proc_kib(PROC / str(self.pid) / "status", "VmHWM:"), tree_rss_bytes(self.pid))
                      if v is not None]
            if values:
                self.peak = max(self.peak or 0, *values)
            self._stop.wait(self.every_s)

    def stop(self) -> int | None:
        self._stop.set()
        self._thread.join(timeout=2)
        return self.peak


# ------------------------------------------------------------------------------------------------- cgroups
@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup a process is in: its folder and its ancestors' (nearest first), and its version."""

    folders: tuple[Path, ...]
    version: int  # 1 or 2

    @property
    def limit_file(self) -> str:
        return "memory.max" if self.version == 2 else "memory.limit_in_bytes"

    @property
    def events_file(self) -> str:
        return "memory.events" if self.version == 2 else "memory.oom_control"


def memory_cgroup(pid: int | str = "self", proc: Path = PROC, root: Path = CGROUP_ROOT) -> MemoryCgroup | None:
    """The memory cgroup of `pid` from /proc/PID/cgroup: v1's `N:memory:/path` (under root/memory) or v2's
    `0::/path` (under root, where it is the unified hierarchy). A path not mounted here (a cgroup namespace) falls
    back to the hierarchy's root, which is then the process's own cgroup."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            return _cgroup(root / "memory", path, 1)
    for line in lines:
        if line.startswith("0::") and (root / "cgroup.controllers").exists():
            return _cgroup(root, line[3:], 2)
    return None


def _cgroup(base: Path, path: str, version: int) -> MemoryCgroup | None:
    folder = base / path.strip().lstrip("/")
    if not folder.is_dir():
        folder = base
    if not folder.is_dir():
        return None
    chain = [folder, *[p for p in folder.parents if p.is_relative_to(base)]]
    return MemoryCgroup(tuple(chain), version)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def cgroup_limit_bytes(cgroup: MemoryCgroup | None) -> int | None:
    """The tightest memory limit of the cgroup and its ancestors; None where none is set."""
    if cgroup is None:
        return None
    limits = [v for v in (_read_int(f / cgroup.limit_file) for f in cgroup.folders) if v is not None and v < NO_LIMIT]
    return min(limits, default=None)


def oom_kills(cgroup: MemoryCgroup | None) -> int | None:
    """How many processes the out-of-memory killer has taken in the cgroup (its 'oom_kill N' line); None where
    the kernel does not say."""
    if cgroup is None:
        return None
    try:
        for line in (cgroup.folders[0] / cgroup.events_file).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def memory_limit_bytes() -> int | None:
    """What this process's children may hold at most: the host's memory or, tighter, its cgroup's limit."""
    limits = [v for v in (host_memory_bytes(), cgroup_limit_bytes(memory_cgroup())) if v]
    return min(limits, default=None)
