"""Tasks: per model kind, how batches become inputs, the loss, and the work per example."""

from __future__ import annotations

from shardbench import config as config_lib
from shardbench.config import Config
from shardbench.models import check_kind
from shardbench.tasks import language, regression, vision
from shardbench.tasks.base import Rows, Task, Terms

TASKS: dict[str, Task] = {t.kind: t for t in (vision.TASK, language.TASK, regression.TASK)}


def get_task(cfg: Config) -> Task:
    check_kind(cfg.model.kind)
    return TASKS[cfg.model.kind]


def validate(cfg: Config) -> None:
    """Every check that needs neither devices nor data: the configuration's values, then the model kind's
    shapes (heads dividing the width, ...); one-line ConfigError."""
    config_lib.validate(cfg)
    get_task(cfg).check(cfg)


__all__ = ["TASKS", "Rows", "Task", "Terms", "get_task", "validate"]
