"""`subprocs.start`: a child that dies with its parent, started with Ctrl-C and SIGTERM held back in the parent
only while it forks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from shardbench.subprocs import STOP_SIGNALS, start


def _mask(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith(f"{field}:")).split()[1], 16)


def test_a_started_child_takes_the_stop_signals_and_the_parent_gets_them_back() -> None:
    """The parent holds SIGINT and SIGTERM back while forking (one landing in Python's after-fork hooks was
    dropped); a child inherits the mask through exec, so it must be given them back, and so must the parent."""
    proc = start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                 stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"  # exec'd and running
        stops = sum(1 << (sig - 1) for sig in STOP_SIGNALS)
        assert _mask(proc.pid, "SigBlk") & stops == 0
        assert not STOP_SIGNALS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
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
