"""Errors that shardbench reports to users as one line, without a traceback, and their exit codes.

Every command goes through `run_reported`: a ShardbenchError is printed as its one line; a fault of the operating
system or of a file (missing, unwritable, not a directory, a file where a folder should be, disk full, empty or
corrupt npz/tar/JSON/SQLite) is turned into one line naming the path, what is wrong and what would be right
(`describe_fault`); anything else is a bug in shardbench, said in one line with how to get the traceback. With
`shardbench --debug` (or SHARDBENCH_DEBUG=1) the full traceback is shown instead, for bug reports.

Exit statuses: 1 some runs of a sweep failed, 2 configuration, 3 diverged, 4 data, 5 processes, 6 a file or folder
the run needs, 70 an internal error (a bug), 130 interrupted (143 stopped by SIGTERM, where a command takes it as an
interrupt), 141 its output closed (a pipe whose reader ended, as `| head` does: what a shell reports for SIGPIPE).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import select
import sqlite3
import stat
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from typing import TypeVar

from shardbench.subprocs import Terminated, interrupted_code, stops_never_dropped

E = TypeVar("E", bound=BaseException)


class ShardbenchError(Exception):
    """Base class: the message is a complete one-line explanation for the user."""


class ConfigError(ShardbenchError):
    """The requested configuration cannot run (bad value, impossible layout, ...)."""


class DataError(ShardbenchError):
    """A dataset is missing, corrupt or laid out wrongly."""


class TrainingDiverged(ShardbenchError):
    """The loss became NaN or infinite."""


class ClusterError(ShardbenchError):
    """Processes could not join, or another process failed: the message says which and why."""


class FileFault(ShardbenchError):
    """A file or folder the run needs cannot be created, written or read: the message names the path."""


EXIT_CODES = {"sweep runs failed": 1, "configuration": 2, "diverged": 3, "data": 4, "processes": 5, "files": 6,
              "internal error": 70, "interrupted": 130, "output closed": 141, "stopped by SIGTERM": 143}
DEBUG_ENV = "SHARDBENCH_DEBUG"


ONE_LINE = 600  # characters: our own errors' lines fit (a refused sweep run's reason with the way out), and a
# foreign message (XLA's, a plugin's) cannot flood the terminal


def one_line(text: object) -> str:
    """The first non-blank line of `text`, stripped, at most ONE_LINE characters: a longer one keeps its start
    and its end (where a line says what would be right), and says how much it left out between them."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if len(line) <= ONE_LINE:
        return line
    head, tail = ONE_LINE * 2 // 3, ONE_LINE // 4
    return f"{line[:head]} [... {len(line) - head - tail} characters ...] {line[-tail:]}"


_end_at_once = False  # set by cluster.join: this process is one of a joined multi-process run
_AGREED = "_shardbench_agreed"


def end_at_once_on_failure() -> None:
    """From now on, a command that fails ends this process as soon as its line is printed (os._exit), skipping
    the interpreter's exit handlers: in a joined multi-process run, JAX's (distributed.shutdown) waits in a
    barrier for every other process, so a process failing alone would hang there instead of ending, and the
    others (and `shardbench launch`, which stops them when one ends) would wait with it."""
    global _end_at_once
    _end_at_once = True


def mark_agreed(err: E) -> E:
    """Mark `err` as a failure every process of the run raises together (cluster.agree, check_same): they all
    meet in JAX's shutdown barrier, so each ends normally (ending at once could take the coordinator away
    from a process still reading the last exchange)."""
    setattr(err, _AGREED, True)
    return err


def end_process(code: int) -> None:
    """End this process with `code` now, its output flushed, without Python's shutdown (atexit handlers, module
    teardown, C++ static destructors) while threads of XLA's may still run."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _finish(code: int, err: BaseException | None = None) -> int:
    """`code`, or, in a joined multi-process run that failed on its own, the end of this process with it."""
    if code != 0 and _end_at_once and not getattr(err, _AGREED, False):
        end_process(code)
    return code


def report(err: ShardbenchError) -> int:
    """Print `err` as one line on stderr and return its exit code: 2 configuration, 3 diverged, 4 data,
    5 processes (could not join, or another process failed), 6 files.

    Distinct codes let a sweep tell a bad configuration from bad data without reading the message.
    """
    if isinstance(err, TrainingDiverged):
        print(f"shardbench: {one_line(err)}", file=sys.stderr)
        return 3
    print(f"shardbench: error: {one_line(err)}", file=sys.stderr)
    if isinstance(err, ClusterError):
        return 5
    if isinstance(err, FileFault):
        return 6
    return 4 if isinstance(err, DataError) else 2


_OS_FIXES = {
    errno.ENOENT: ("does not exist", "create it, or give a path whose folder exists"),
    errno.EACCES: ("cannot be written or read (permission denied)", "choose a folder you can write to"),
    errno.EPERM: ("cannot be written (operation not permitted)", "choose a folder you can write to"),
    errno.EROFS: ("is on a read-only filesystem", "choose a writable folder"),
    errno.ENOTDIR: ("has a file where a folder is needed", "remove that file or choose another path"),
    errno.EISDIR: ("is a folder where a file is needed", "give a file's path"),
    errno.EEXIST: ("already exists as something else", "remove it or choose another path"),
    errno.ENOSPC: ("has no space left on its device", "free some space or write elsewhere"),
    errno.EDQUOT: ("is over its disk quota", "free some space or write elsewhere"),
    errno.ENAMETOOLONG: ("has a name too long for its filesystem", "choose a shorter path"),
}


def platform_fault(err: BaseException) -> ConfigError | None:
    """JAX unable to start the platforms JAX_PLATFORMS names (one this machine lacks, or a misspelt one) as one
    line naming the variable: JAX raises a RuntimeError ("Unable to initialize backend") or, for a platform it
    has no plugin for at all, an AssertionError inside its backend setup (asked again here: JAX hides its frames).
    None for any other error."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if not platforms or not isinstance(err, (RuntimeError, AssertionError)):
        return None
    if "Unable to initialize backend" not in str(err):
        try:  # JAX hides its own frames from the traceback: ask it again whether its platforms start
            import jax

            jax.devices()
        except Exception:  # noqa: BLE001 - any failure to start them is what this names
            pass
        else:
            return None
    detail = one_line(err) or "it has no such platform"
    return ConfigError(f"JAX_PLATFORMS={platforms}: JAX could not start {'them' if ',' in platforms else 'it'} "
                       f"({detail}); unset JAX_PLATFORMS, or name platforms this machine has (cpu; cuda or tpu "
                       f"where installed and present)")


def describe_fault(err: BaseException) -> ShardbenchError | None:
    """A fault of the operating system, of a file's contents or of the environment as one line (None: not such a
    fault)."""
    platform = platform_fault(err)
    if platform is not None:
        return platform
    if isinstance(err, OSError) and err.errno in _OS_FIXES:
        what, fix = _OS_FIXES[err.errno]
        path = err.filename or "a path"
        if err.filename2:
            path = f"{err.filename} -> {err.filename2}"
        return FileFault(f"{path} {what}: {fix}")
    if isinstance(err, OSError):
        return FileFault(f"{err.filename or 'a file'}: {err.strerror or one_line(err)}")
    if _NO_SPACE.search(str(err)) or (isinstance(err, sqlite3.OperationalError) and "disk is full" in str(err)):
        # orbax and XLA wrap ENOSPC in their own errors; SQLite says its disk is full: not a corrupt file
        return FileFault(f"a file could not be written: its disk has no space left ({one_line(err)}); free some "
                         f"space or write elsewhere (what was recorded before stays)")
    if isinstance(err, (EOFError, zipfile.BadZipFile, tarfile.TarError)):
        detail = one_line(err) or "no detail"
        return DataError(f"a file is empty, truncated or corrupt ({type(err).__name__}: {detail}); give a complete "
                         f"file, or run with --debug to see which")
    if isinstance(err, json.JSONDecodeError):
        return DataError(f"a JSON file is corrupt ({one_line(err)}); remove or rewrite it, or run with --debug to "
                         f"see which")
    if isinstance(err, sqlite3.DatabaseError):
        return DataError(f"a SQLite database is corrupt or not a database ({one_line(err)}); remove it or choose "
                         f"another --out")
    if _end_at_once and type(err).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and _PEER_GONE.search(str(err)):
        return ClusterError(f"another process of this run stopped while this one was exchanging data with it "
                            f"({one_line(err)}): its own line says why; finish the run with --resume")
    return None


_NO_SPACE = re.compile(r"No space left on device|\bENOSPC\b|Disk quota exceeded")

# What a collective says when a process of a joined run has gone (killed, crashed) under it: gloo's (CPU) and
# the coordination service's words.
_PEER_GONE = re.compile(r"Gloo \w+ failed|Connection (reset|closed) by peer|Socket closed|peer .*(gone|closed)",
                        re.IGNORECASE)


def writable_dir(path: os.PathLike[str] | str, flag: str, create: bool = True) -> None:
    """Check, before any work starts, that the folder `path` can hold the files a command will write: create it
    (with its parents) and write a file in it, or with `create=False` leave it uncreated and check its nearest
    existing folder instead. One line naming the flag, the path and what is wrong otherwise."""
    from pathlib import Path

    requested = folder = Path(path)
    if not create:
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise FileFault(f"{flag} {requested}: {folder} is a file where a folder is needed: remove it or choose "
                            f"another path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # a file of this call's own: two checks of one folder at once (threads of one process) never share it
        handle, probe = tempfile.mkstemp(prefix=".shardbench-write-check-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        if folder != requested:  # the folder to create it in is the one that refused
            raise FileFault(f"{flag} {requested}: it cannot be created in {folder} ({err.strerror or err}): choose a "
                            f"folder you can write to") from None
        fault = describe_fault(err)
        raise FileFault(f"{flag} {folder}: {fault if fault is not None else one_line(err)}") from None


_debug = False  # --debug was given to this process's command


def debugging() -> bool:
    """--debug was given, or SHARDBENCH_DEBUG is set: show the tracebacks that are otherwise kept to one line."""
    return _debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_reported(command: Callable[[], int], debug: bool = False) -> int:
    """Run one command; every failure becomes one line on stderr and an exit status (see EXIT_CODES)."""
    global _debug
    _debug = debug
    debug = debugging()
    try:
        with stops_never_dropped():
            return _finish(command())
    except ShardbenchError as err:
        if debug:
            raise
        return _finish(report(err), err)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM where a command takes it as one (`subprocs.Terminated`)
        said = "stopped by SIGTERM" if isinstance(err, Terminated) else "interrupted"
        way_on = str(err)  # where a command raised it again with the way on (a training's checkpoint to resume)
        print(f"shardbench: {said}{'; ' + way_on if way_on else ''}", file=sys.stderr)
        return _finish(interrupted_code(err))
    except BrokenPipeError as err:
        if debug or not _output_closed():
            return _reported_fault(err, debug)
        _quiet_output()
        with contextlib.suppress(OSError):
            print("shardbench: stopped: its output was closed (a pipe whose reader ended, as `| head` does); send "
                  "the output to a file, or through `tee`, to keep it (a training resumes with --resume)",
                  file=sys.stderr, flush=True)
        return _finish(EXIT_CODES["output closed"], err)
    except Exception as err:  # noqa: BLE001 - the one place where every other failure becomes a line
        return _reported_fault(err, debug)


def _reported_fault(err: Exception, debug: bool) -> int:
    """A failure that is neither shardbench's own nor a stop, as one line and its exit status."""
    if debug:
        raise err
    fault = describe_fault(err)
    if fault is not None:
        return _finish(report(fault), err)
    print(f"shardbench: internal error: {type(err).__name__}: {one_line(err)} (a bug in shardbench: run again "
          f"with --debug or {DEBUG_ENV}=1 for the traceback, and report it)", file=sys.stderr)
    return _finish(70, err)


def _output_closed() -> bool:
    """This process's stdout is a pipe whose reading end has closed (poll says so without writing)."""
    try:
        if not stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode):
            return False
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no stdout, or one that is not a file
        return False


def _quiet_output() -> None:
    """Point stdout at /dev/null, so that Python's flush of what it still holds at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
