"""`subprocs.start`: a child that dies with its parent, started with Ctrl-C and SIGTERM held back in the parent
only while it forks, and delivered after."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardbench.subprocs import (STOP_SIGNALS, Terminated, start, stops_held,
                                  terminated_as_interrupt)


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


@contextlib.contextmanager
def ctrl_c_as_from_a_terminal() -> Iterator[None]:
    """SIGINT raising KeyboardInterrupt in this process while the block runs, as in a command started from a
    terminal, so that a child started in it takes Ctrl-C. A suite started in the background by a shell (`&`) runs
    with SIGINT ignored, and a child keeps an ignored stop signal ignored (`start`)."""
    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, was)


def test_a_stop_signal_the_parent_ignores_stays_ignored_in_the_child() -> None:
    """A command started with SIGINT ignored (a shell's `&`, nohup) starts its children so: a Ctrl-C sent to the
    group stops neither. The handler held while forking was reset to the default by exec, and a bench's worker
    died of the SIGINT its bench ignored."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)"
    was = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=30)
    finally:
        signal.signal(signal.SIGINT, was)
    assert out.strip() == "True"
    with ctrl_c_as_from_a_terminal():  # not ignored here: not in the child (the suite may run with it ignored)
        proc = start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.communicate(timeout=30)[0].strip() == "False"


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


@pytest.mark.slow
def test_a_stopped_command_ends_without_pythons_shutdown(tmp_path: Path) -> None:
    """After a Ctrl-C, its files closed and its workers ended on the way out, the command ends at once. Python's
    shutdown (atexit handlers, module teardown, C++ destructors) tore XLA's threads down under them: a stop during
    the first compilation sometimes crashed after "interrupted" (exit -11). An atexit handler, registered by a
    sitecustomize, shows whether the shutdown ran; a command that ends by itself still runs it."""
    site, marker = tmp_path / "site", tmp_path / "shut-down"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').close())\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    assert subprocess.run([sys.executable, "-m", "shardbench", "presets"], env=env, capture_output=True,
                          timeout=120).returncode == 0
    assert marker.exists()  # the handler runs where Python shuts down
    marker.unlink()
    with ctrl_c_as_from_a_terminal():
        proc = start([sys.executable, "-m", "shardbench", "train", "--preset", "mlp-small", "--steps", "500",
                      "--devices", "1", "--mesh", "none", "--no-train.progress", "--out", str(tmp_path / "run"),
                      "--data.cache-dir", str(tmp_path / "cache")],
                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("shardbench: mlp-small")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    # Stopped before its first step, the line says the way on: start over, or --resume once its folder holds its
    # records (written just after the first line, so either, by when the stop lands)
    out = tmp_path / "run"
    assert proc.returncode == 130 and err.strip().splitlines()[-1] in (
        "shardbench: interrupted; no step was trained: the same command starts the run over",
        f"shardbench: interrupted; no step was trained: the same command with --resume --out {out} starts it from "
        f"step 0"), err
    assert not marker.exists()


# A command whose stop is raised in a garbage-collection callback, run as a program: prints the exit status
# run_reported gave it and whether the callback fired.
DROPPED_STOP = """
import gc, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as from a terminal (see the test)
from shardbench.errors import run_reported
from shardbench.subprocs import Terminated, terminated_as_interrupt

stop = {"KeyboardInterrupt": KeyboardInterrupt, "Terminated": Terminated}[sys.argv[1]]
fired = []

def collecting(phase, info):
    if not fired:
        fired.append(phase)
        raise stop()

def command():
    gc.callbacks.append(collecting)
    try:
        gc.collect()  # Python prints the stop as an ignored exception here
    finally:
        gc.callbacks.remove(collecting)
    deadline = time.monotonic() + 60  # where the stop delivered again lands, a moment later
    while time.monotonic() < deadline:
        time.sleep(0.005)
    return 0

with terminated_as_interrupt():
    code = run_reported(command)
print(code, bool(fired))
"""


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_a_stop_raised_where_python_drops_it_stops_the_command(stop: type[KeyboardInterrupt]) -> None:
    """A Ctrl-C landing in a garbage-collection callback (JAX's `_xla_gc_callback`) was printed as an ignored
    exception and dropped: a train stopped 4 s in trained to the end. A stop raised there now stops the command.
    In a process of its own that takes Ctrl-C as a terminal's process does: a suite started in the background
    (bash's `&`) ignores SIGINT, which every process it starts inherits, and a SIGINT delivered again never
    raised (three full runs, never alone in a terminal)."""
    done = subprocess.run([sys.executable, "-c", DROPPED_STOP, stop.__name__], capture_output=True, text=True,
                          timeout=120, check=False)
    # The shell's codes for a stop: 128 + SIGINT (2) for Ctrl-C, 128 + SIGTERM (15) for a terminate.
    code = {"KeyboardInterrupt": "130", "Terminated": "143"}[stop.__name__]
    assert done.stdout.split() == [code, "True"], done.stdout + done.stderr


def test_a_stop_held_while_a_block_runs_is_raised_as_it_ends() -> None:
    """`stops_held` (a checkpoint's start): a SIGTERM landing inside the block lets it finish, then stops the
    command; without one the block ends plainly and the handlers are the caller's again."""
    finished = []
    with terminated_as_interrupt():
        before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        with pytest.raises(Terminated):
            with stops_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # where an unheld SIGTERM would already have raised
                finished.append("the block's end")
        assert finished == ["the block's end"]
        with stops_held():
            finished.append("again")
        assert finished[-1] == "again" and {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
