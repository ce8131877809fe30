"""How many steps an epoch of training, or one pass of evaluation, takes: the arithmetic a configuration check
needs (a sweep's pre-flight, the planner, tune), apart from the input pipeline that makes the batches
(`shardbench.data.pipeline`, which imports grain, and grain orbax)."""

from __future__ import annotations


def steps_per_epoch(n: int, global_batch: int, repeats: int = 1) -> int:
    """Training steps per epoch: full batches only (the remainder is dropped); with `repeats` k a batch holds
    global_batch / k distinct images, and an epoch is one pass over them."""
    return n // (global_batch // repeats)


def eval_steps(n: int, global_batch: int) -> int:
    """Evaluation steps for one pass: the last, partial batch is padded, so every example counts."""
    return -(-n // global_batch)
