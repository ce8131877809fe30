"""Evaluation of a train state on a whole split: each example exactly once, the last batch padded and masked."""

from __future__ import annotations

import math
from typing import Any

import jax

from shardbench.config import Config
from shardbench.data.arrays import Split
from shardbench.data.epochs import eval_steps
from shardbench.data.pipeline import make_batches
from shardbench.parallel.rules import Layout
from shardbench.tasks import Task
from shardbench.train.hooks import scalar
from shardbench.train.step import Steps


def evaluate(steps: Steps, state: Any, arrays: Split, cfg: Config, task: Task, layout: Layout) -> dict[str, float]:
    """Loss (and accuracy, perplexity where they apply) over every example of a split exactly once
    (the last batch is padded and masked); the mean is over targets (tokens for a language model)."""
    if len(arrays) == 0:
        return {}
    batch = cfg.train.eval_batch
    totals: dict[str, float] = {}
    part, parts = layout.process_share(batch)
    batches = make_batches(arrays, global_batch=batch, seed=cfg.train.seed, shuffle=False,
                           num_steps=eval_steps(len(arrays), batch), process_index=part, process_count=parts)
    for host_batch in batches:
        for k, v in jax.device_get(steps.evaluate(state, steps.place(host_batch))).items():
            totals[k] = totals.get(k, 0.0) + scalar(v)
    out = {"loss": totals["loss_sum"] / totals["count"], "count": int(totals["count"])}
    if "correct" in totals:
        out["accuracy"] = totals["correct"] / totals["count"]
    if task.perplexity:
        out["perplexity"] = math.exp(min(out["loss"], 700.0))
    return out
