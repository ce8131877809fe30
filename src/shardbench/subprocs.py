"""Child processes that cannot outlive their parent, and stopping a process group in bounded time."""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

KILL_GRACE_S = 5.0


def _find_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: Ctrl-C and time limits still end a child; only a SIGKILLed parent leaves it running


# Looked up here, not in the child: between fork and exec the child should do as little as possible.
_PRCTL = _find_prctl()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: a parent killed outright must not leave its child running as an orphan."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


# The signals that stop a command (Ctrl-C, SIGTERM), held back while `start` forks a child.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, **kwargs)` for a child that cannot outlive this process (Linux). A Ctrl-C or SIGTERM
    that arrives while it forks is held back and delivered after: raised inside Python's own after-fork hooks
    (logging's lock release), its KeyboardInterrupt or `Terminated` was printed there and dropped, and the command
    went on as if never stopped (seen: a bench that ran on after its SIGTERM). Delivered after, it stops the
    command, and the child just started, which the caller never gets, is stopped first. (Signal handlers belong to
    the main thread: a child started from another thread is started plainly, as a stop cannot land in its hooks.)"""
    if threading.current_thread() is not threading.main_thread():
        return subprocess.Popen(argv, preexec_fn=_die_with_parent, **kwargs)
    proc: subprocess.Popen[Any] | None = None
    try:
        with stops_held() as ignored:
            # A stop signal this process ignores (started in the background by a shell, or under nohup) stays
            # ignored in the child, as it would through a plain fork: exec resets the holding handler to the default.
            def in_child() -> None:
                _die_with_parent()
                for sig in ignored:
                    signal.signal(sig, signal.SIG_IGN)

            proc = subprocess.Popen(argv, preexec_fn=in_child, **kwargs)
    except BaseException:  # a stop held meanwhile, raised as the block ended: the child it started is stopped first
        if proc is not None:
            proc.kill()
            proc.wait()
        raise
    return proc


@contextlib.contextmanager
def stops_held() -> Iterator[tuple[int, ...]]:
    """Meanwhile a Ctrl-C or SIGTERM is held back, and delivered (raised) as the block ends, so that it cannot land
    in the middle of what the block does (a fork's after-hooks, a checkpoint's start); gives the stop signals this
    process ignores. Only the main thread holds them: elsewhere the block runs plainly."""
    if threading.current_thread() is not threading.main_thread():
        yield ()
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield tuple(sig for sig, handler in previous.items() if handler == signal.SIG_IGN)
    finally:
        _restore(previous, held)


def _restore(previous: dict[int, Any], held: list[int]) -> None:
    """Put the stop signals' handlers back, then deliver the first one held: its handler raises (KeyboardInterrupt,
    `Terminated`); where it had none of Python's, the signal is sent again."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if not held:
        return
    handler = previous[held[0]]
    if callable(handler):
        handler(held[0], None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), held[0])


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S,
               first: signal.Signals = signal.SIGTERM) -> None:
    """`first` (SIGTERM; SIGINT to pass on a user's Ctrl-C) to the child's process group (it was started in a
    session of its own), then SIGKILL what is left after a grace period."""
    for sig, wait in ((first, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Terminated(KeyboardInterrupt):
    """SIGTERM reached a command (a sweep, tune, bench): stopped as Ctrl-C stops it (what it finished kept, the
    way on said), exit 143."""


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """Meanwhile SIGTERM (a scheduler's or `kill`'s) stops the command as Ctrl-C does (its default ended the
    process silently: a sweep without the line that says how to resume, a bench with its workers running on).
    Only the main thread can."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


REDELIVER_S = 0.05  # a dropped stop is delivered again this long after Python dropped it


@contextlib.contextmanager
def stops_never_dropped() -> Iterator[None]:
    """Meanwhile a Ctrl-C or SIGTERM whose exception Python cannot raise is delivered again, where it can. Raised
    inside a garbage-collection callback (JAX's `_xla_gc_callback`) or a destructor, Python printed it as an ignored
    exception and dropped it, and the command went on as if never stopped (seen: a Ctrl-C 4 s into a train, which
    trained to the end)."""
    before = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # From another thread, a moment later: delivered at once, it would be raised in this hook (or while
            # the thread starts), and dropped again.
            sig = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
            again = threading.Timer(REDELIVER_S, _thread.interrupt_main, args=(sig,))
            again.daemon = True
            again.start()
            return
        before(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:  # one set meanwhile around it (the checkpoints' filter) stays, and it inside
            sys.unraisablehook = before


def interrupted_code(err: KeyboardInterrupt) -> int:
    return 143 if isinstance(err, Terminated) else 130
