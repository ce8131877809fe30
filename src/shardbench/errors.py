"""Errors that shardbench reports to users as one line, without a traceback, and their exit codes."""

from __future__ import annotations

import sys


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


def report(err: ShardbenchError) -> int:
    """Print `err` as one line on stderr and return its exit code: 2 configuration, 3 diverged, 4 data,
    5 processes (could not join, or another process failed).

    Distinct codes let a sweep tell a bad configuration from bad data without reading the message.
    """
    if isinstance(err, TrainingDiverged):
        print(f"shardbench: {err}", file=sys.stderr)
        return 3
    print(f"shardbench: error: {err}", file=sys.stderr)
    if isinstance(err, ClusterError):
        return 5
    return 4 if isinstance(err, DataError) else 2
