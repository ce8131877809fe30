"""`subprocs.start`: a child that dies with its parent, started with Ctrl-C and SIGTERM held back in the parent
only while it forks, and delivered after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardbench.subprocs import STOP_SIGNALS, Terminated, start, terminated_as_interrupt


def _mask(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith(f"{field}:")).split()[1], 16)


def test_a_started_child_takes_the_stop_signals_and_the_parent_gets_its_handlers_back() -> None:
    """The parent holds SIGINT and SIGTERM back while forking (one landing in Python's after-fork hooks was
    dropped): the child blocks neither and dies of SIGTERM, and the parent's handlers are its own again."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    proc = start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                 stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"  # exec'd and running
        stops = sum(1 << (sig - 1) for sig in STOP_SIGNALS)
        assert _mask(proc.pid, "SigBlk") & stops == 0
        assert not set(STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_a_started_child_dies_with_its_parent() -> None:
    """A parent killed outright (SIGKILL: no handler runs) takes its child with it."""
    code = ("import subprocess, sys, time\n"
            "from shardbench.subprocs import start\n"
            "child = start([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n")


    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] \
            != "Z":
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.1)


_armed: list[bool] = []


def _stop_in_the_after_fork_hook() -> None:
    """A SIGTERM that lands while Python runs its after-fork hooks in the parent (registered once; it fires only
    when a test arms it, so the test process's other forks go untouched)."""
    if _armed:
        _armed.clear()
        os.kill(os.getpid(), signal.SIGTERM)


os.register_at_fork(after_in_parent=_stop_in_the_after_fork_hook)


def test_a_stop_that_lands_while_forking_stops_the_command_and_its_new_child() -> None:
    """Unheld, the SIGTERM's `Terminated` was raised inside Python's after-fork hook, printed there and dropped:
    `start` returned as if nothing had happened, and the command ran on. Held, it is raised from `start`, and the
    child it had just started, which the caller never got, is stopped with it."""
    marker = "shardbench-test-stop-while-forking"
    with terminated_as_interrupt():
        _armed.append(True)
        with pytest.raises(Terminated):
            start([sys.executable, "-c", "import time, sys; time.sleep(60)", marker])
    assert not _armed
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline")
            if _readable(p) and marker.encode() in p.read_bytes()]
    assert not left, "the child started meanwhile was left running"


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
        return True
    except OSError:
        return False
