"""Child processes that cannot outlive their parent, and stopping a process group in bounded time."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable

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


def dies_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that ties the child's life to this process (Linux), or None where that is not possible."""
    return _die_with_parent if _PRCTL is not None else None


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the child's process group (it was started in a session of its own), then SIGKILL what is
    left after a grace period."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
