"""Errors that shardbench reports to users as one line, without a traceback."""

from __future__ import annotations


class ShardbenchError(Exception):
    """Base class: the message is a complete one-line explanation for the user."""


class ConfigError(ShardbenchError):
    """The requested configuration cannot run (bad value, impossible layout, ...)."""


class DataError(ShardbenchError):
    """A dataset is missing, corrupt or laid out wrongly."""


class TrainingDiverged(ShardbenchError):
    """The loss became NaN or infinite."""
