"""`shardbench launch`: one shardbench command as N processes on this host, joined through a coordinator on
loopback (jax.distributed; gloo between CPU processes). Each line a process prints comes out prefixed with
its id; when any process fails, or the whole exceeds its time limit, every process is stopped and the launch
fails with the first failing process's reason.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from shardbench import cluster
from shardbench.errors import DEBUG_ENV, ConfigError
from shardbench.subprocs import kill_group, start

LAUNCHABLE = ("train",)
JOIN_FLAGS = ("--coordinator", "--num-processes", "--process-id")  # launch's to set, each process its own
STOP_GRACE_S = 3.0
_SIM_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")
# gloo announces every connection it makes (one line per device per collective group): not the run's output.
# Only spaces and tabs after a message are taken with it, never a line break: gloo's threads write these in
# pieces that land inside other lines, and a part left without its break would glue the next process's line on.
# gloo's connection lines, whole or in the pieces its threads write them in (a line of another thread, or of
# another gloo line, can land between "[Gloo] Rank " and the rest).
_NOISE = re.compile(rb"(?:\[Gloo\] Rank )?\d+ is connected to \d+ peer ranks\.[ \t]*"
                    rb"|\[Gloo\] Rank[ \t]*(?=[\r\n]|$|\[Gloo\]|Expected number)"
                    rb"|Expected number of connected peer ranks is : \d*[ \t]*")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "launch", help="run a command as several processes on this host (jax.distributed over loopback)",
        description="Start N processes of `shardbench COMMAND ...` joined through a coordinator on a free "
                    "loopback port, each with its own simulated CPU devices; stream their output prefixed by "
                    "process id; stop all of them and fail when one fails or the time limit passes. Example: "
                    "shardbench launch --processes 2 --devices-per-process 4 -- train --preset vit-tiny "
                    "--strategy fsdp",
    )
    p.add_argument("--processes", type=int, default=2, help="processes to start (default 2)")
    p.add_argument("--devices-per-process", type=int, default=0,
                   help="simulated CPU devices in each process (0 = the command's --devices split evenly)")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds before every process is stopped and the launch fails (0 = no limit)")
    p.add_argument("--join-timeout", type=int, default=60,
                   help="seconds a process waits for the others to join or report (default 60)")
    p.add_argument("--port", type=int, default=0, help="coordinator port on 127.0.0.1 (0 = a free one)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the shardbench command each process runs, after '--' (train)")


def free_port() -> int:
    """A port nothing listens on now (the coordinator binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    index: int
    proc: subprocess.Popen[bytes]
    said: deque[str] = field(default_factory=lambda: deque(maxlen=20))  # its last stderr lines
    opening: list[str] = field(default_factory=list)  # its first stdout lines (process 0's header names the folder)
    readers: list[threading.Thread] = field(default_factory=list)

    def reason(self, code: int) -> str:
        """Why it ended: its own last 'shardbench:' line, else the signal or exit code."""
        own = [ln for ln in self.said if ln.startswith("shardbench:")
               or re.match(r"shardbench \w+: error:", ln)]  # argparse names the sub-command: "shardbench train:"
        if own:
            return re.sub(r"^shardbench( \w+)?:\s*(error:\s*)?", "", own[-1]).strip()
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        last = next((ln for ln in reversed(self.said) if ln.strip()), "")
        return f"exit {code}" + (f": {last.strip()[:200]}" if last else "")


def _failed(index: int, count: int, reason: str) -> str:
    """Which process failed, and why: where the first to end relays another's failure (every process ends with
    the one that failed, `cluster.agree`), the one that failed, not the one that said so first."""
    relayed = re.match(r"process (\d+) failed at (\w+): (.*)", reason)
    if relayed:
        by = "" if int(relayed[1]) == index else f" (process {index} ended first, saying so)"
        return f"process {relayed[1]} of {count} failed at {relayed[2]}: {relayed[3]}{by}"
    return f"process {index} of {count} failed: {reason}"


_write_lock = threading.Lock()


@dataclass
class Stopping:
    """Once a process has failed, what the others print while they are stopped is held back (its lines counted):
    a survivor of a process 0 that died prints JAX's fatal error and a stack dump of its own, about the coordinator
    it lost, not the failure. Their own one-line 'shardbench:' errors still come through."""

    failed: int | None = None
    held: int = 0
    show_all: bool = False  # --debug: nothing is held back
    # the processes, by index: one that ended in failure is seen here before its waiter reports it, so the lines a
    # survivor prints at once (gRPC's "Socket closed" from the lost coordinator) are held back too
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def holds(self, index: int, line: bytes) -> bool:
        if self.failed is None:
            self.failed = next((i for i, p in enumerate(self.procs) if p.poll() not in (None, 0)), None)
        if self.show_all or self.failed is None or self.failed == index or line.startswith(b"shardbench"):
            return False
        self.held += 1
        return True


OPENING_LINES = 20  # a process's first stdout lines kept: notes, then the header


def _keep(keep: deque[str] | list[str] | None, line: bytes) -> None:
    """`line` into `keep`: a deque keeps the last lines, a list the first OPENING_LINES."""
    if keep is not None and (not isinstance(keep, list) or len(keep) < OPENING_LINES):
        keep.append(line.decode(errors="replace").rstrip())


def _pump(source: IO[bytes], sink: IO[bytes], prefix: bytes, keep: deque[str] | list[str] | None,
          hold: Callable[[bytes], bool] | None = None) -> None:
    """Copy a child's stream to ours a line at a time, each line (or progress-bar redraw) with its prefix; a
    line `hold` takes is not written. `keep` takes every line (a deque keeps the last ones), or, a list, the first
    OPENING_LINES."""
    pending = b""
    while True:
        chunk = source.read1(65536) if hasattr(source, "read1") else source.read(65536)
        if not chunk:
            break
        pending += chunk
        parts = re.split(rb"(?<=[\r\n])", pending)
        pending = parts.pop()  # what follows the last line break: not a whole line yet
        with _write_lock:
            for whole in parts:
                part = _NOISE.sub(b"", whole)
                if (part != whole and not part.strip()) or (not part.strip(b"\r\n") and part != b"\n"):
                    continue  # a line of noise only, or a bare carriage return
                _keep(keep, part)
                if hold is not None and hold(part):
                    continue
                sink.write(prefix + part)
            sink.flush()
    if pending:
        _keep(keep, pending)
        with _write_lock:  # `hold` counts under the lock, as for whole lines
            if hold is None or not hold(pending):
                sink.write(prefix + pending + b"\n")
                sink.flush()


def child_environ(index: int, processes: int, port: int, devices: int, join_timeout: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({cluster.ENV_COORDINATOR: f"127.0.0.1:{port}", cluster.ENV_NUM_PROCESSES: str(processes),
                cluster.ENV_PROCESS_ID: str(index), cluster.ENV_JOIN_TIMEOUT: str(join_timeout),
                "PYTHONUNBUFFERED": "1"})
    if devices > 0:
        env[cluster.ENV_LOCAL_DEVICES] = str(devices)
        # An inherited device-count flag would override the per-process count. A launch of one process joins no
        # cluster, so its count is XLA's own flag.
        flags = _SIM_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
        if processes == 1:
            flags = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
        env["XLA_FLAGS"] = flags
    return env


def _check(args: argparse.Namespace) -> list[str]:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("launch needs the command to run after '--', e.g. shardbench launch --processes 2 -- "
                          "train --preset vit-tiny")
    if argv[0] not in LAUNCHABLE:
        raise ConfigError(f"launch runs {', '.join(LAUNCHABLE)} across processes, not '{argv[0]}' (a sweep takes "
                          f"--processes itself: shardbench sweep --processes N ...)")
    joining = [a.split("=")[0] for a in argv if a.split("=")[0] in JOIN_FLAGS]
    if joining:
        raise ConfigError(f"launch joins its processes itself: leave {', '.join(dict.fromkeys(joining))} out of the "
                          f"command (--processes sets how many)")
    if args.processes < 1:
        raise ConfigError(f"--processes must be at least 1, got {args.processes}")
    if args.devices_per_process < 0:
        raise ConfigError(f"--devices-per-process must be 0 or more, got {args.devices_per_process}")
    if not math.isfinite(args.timeout) or args.timeout < 0:  # inf: a crash once started
        raise ConfigError(f"--timeout must be 0 (no limit) or a finite number of seconds, got {args.timeout:g}")
    if args.join_timeout <= 0:
        raise ConfigError(f"--join-timeout must be a positive number of seconds, got {args.join_timeout}")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port {args.port} is not a port: use 1 to 65535, or 0 for a free one")
    return argv


class _Stopped(Exception):
    """SIGTERM reached the launcher: stop the processes as for Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Stopped()


def run(args: argparse.Namespace) -> int:
    argv = _check(args)
    n, port = args.processes, args.port or free_port()
    cmd = [sys.executable, "-m", "shardbench", *argv]
    children: list[Child] = []
    ended: queue.Queue[tuple[int, int]] = queue.Queue()
    stopping = Stopping(show_all=bool(getattr(args, "debug", False))
                        or os.environ.get(DEBUG_ENV, "") not in ("", "0"))
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for i in range(n):
            proc = start(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         env=child_environ(i, n, port, args.devices_per_process, args.join_timeout),
                         start_new_session=True)
            child = Child(i, proc)
            stopping.procs.append(proc)
            prefix = f"[p{i}] ".encode()
            assert proc.stdout is not None and proc.stderr is not None
            hold = functools.partial(stopping.holds, i)
            child.readers = [
                threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, prefix, child.opening, hold),
                                 daemon=True),
                threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, prefix, child.said, hold),
                                 daemon=True),
            ]
            for t in child.readers:
                t.start()
            # One waiter per process: the first to end is known exactly, not by polling order.
            threading.Thread(target=lambda c=child: ended.put((c.index, c.proc.wait())), daemon=True).start()
            children.append(child)
        return _watch(children, ended, args.timeout, stopping, argv)
    except (KeyboardInterrupt, _Stopped) as stop:
        # passed on as it came: after a Ctrl-C each process says "interrupted", not "stopped by SIGTERM"
        _stop(children, signal.SIGTERM if isinstance(stop, _Stopped) else signal.SIGINT)
        for child in children:
            for t in child.readers:
                t.join(timeout=2)  # each process's last words (its stop line) before the launch's own
        how = "stopped (SIGTERM)" if isinstance(stop, _Stopped) else "interrupted"
        print(f"shardbench: launch {how}; stopped all {len(children)} processes", file=sys.stderr)
        return 143 if isinstance(stop, _Stopped) else 130  # as a shell reports a command ended by either signal
    finally:
        signal.signal(signal.SIGTERM, previous)


def _watch(children: list[Child], ended: queue.Queue[tuple[int, int]], timeout: float, stopping: Stopping,
           argv: list[str]) -> int:
    deadline = time.monotonic() + timeout if timeout > 0 else None
    running = {c.index for c in children}
    while running:
        wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:  # a day at a time: a wait past the clock's range (--timeout 1e10) ends in an OverflowError
            index, code = ended.get(timeout=None if wait is None else min(wait, 86400.0))
        except queue.Empty:
            if wait is not None and wait > 86400.0:
                continue
            _stop(children)
            print(f"shardbench: error: no result from process(es) {', '.join(map(str, sorted(running)))} within "
                  f"the {timeout:g} s time limit: stopped all {len(children)} processes", file=sys.stderr)
            return 124
        running.discard(index)
        if code != 0:
            stopping.failed = index
            others = [c for c in children if c.index in running]
            _stop(others)
            child = children[index]
            for t in child.readers:
                t.join(timeout=2)  # its last words first
            for other in others:
                for t in other.readers:
                    t.join(timeout=2)  # what they printed while stopping, counted
            held = (f" ({stopping.held} line{'' if stopping.held == 1 else 's'} they printed meanwhile left out: "
                    f"--debug shows them)") if stopping.held else ""
            stopped = f"; stopped the other {len(others)}{held}" if others else ""
            print(f"shardbench: error: {_failed(index, len(children), child.reason(code))}{stopped}",
                  file=sys.stderr, flush=True)
            way_on = _way_on(argv, children) if code < 0 else None  # a process that ended itself said why
            if way_on:
                print(f"shardbench: {way_on}", file=sys.stderr, flush=True)
            if code < 0:  # end by the same signal, so whoever started the launch sees what a single process shows
                sys.stdout.flush()
                with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP cannot be handled anyway
                    signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            return code if code > 0 else 1
    for c in children:
        for t in c.readers:
            t.join(timeout=5)
    return 0


def _out_folder(argv: list[str]) -> str | None:
    """The --out (--train.out) the launched command names, as given; None where it names none."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("--out", "--train.out"):
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _way_on(argv: list[str], children: list[Child]) -> str | None:
    """After a process of a training was killed by a signal: how to go on, where no process said it (the killed one
    said nothing, and the others' lines can be cut short by their own stop). None where one did, or nothing can go
    on."""
    if argv[0] != "train" or any("--resume" in line for c in children for line in c.said):
        return None
    again = "the same launch" + ("" if "--resume" in argv else " with --resume")
    from shardbench.train.checkpoint import saved_steps  # orbax, imported only after a failure
    from shardbench.train.console import out_of_header

    out = _out_folder(argv)
    if out is None:  # process 0 named the folder it made at the end of its header
        out = next((o for c in children[:1] for o in map(out_of_header, c.opening) if o), None)
        if out is None:  # it was stopped before it said: there is no run to go on with
            return None
        again += f" --out {shlex.quote(out)}"
    if steps := saved_steps(Path(out) / "checkpoints"):
        return f"{again} goes on from the checkpoint of step {steps[-1]} in {out}"
    if (Path(out) / "config.json").exists():
        return f"no checkpoint to resume from in {out}; {again} starts the run from step 0"
    return None


def _stop(children: list[Child], first: signal.Signals = signal.SIGTERM) -> None:
    """Stop every process still running (`first`, then SIGKILL after a grace period), in parallel so the bound is
    one grace period, not one each."""
    threads = [threading.Thread(target=kill_group, args=(c.proc, STOP_GRACE_S, first)) for c in children
               if c.proc.poll() is None]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
