"""The optimizer a configuration names: AdamW, Adam or SGD with momentum, warm-up and cosine decay."""

from __future__ import annotations

from typing import Any

import jax
import optax

from shardbench.config import OptimConfig


def learning_rate(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warm-up from 0, then cosine decay to end_lr_fraction * lr (or constant)."""
    warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else max(1, total_steps // 20)
    warmup = min(warmup, max(total_steps - 1, 0))
    if cfg.schedule == "constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.lr, max(warmup, 1)), optax.constant_schedule(cfg.lr)], [warmup]
        ) if warmup else optax.constant_schedule(cfg.lr)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1), end_value=cfg.lr * cfg.end_lr_fraction,
    )


def _param_name(path: tuple[Any, ...]) -> str:
    """Last name on a pytree path, skipping the `.value` of an nnx Variable."""
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    names = [n for n in names if n != "value"]
    return names[-1] if names else ""


def _decay_mask(params: Any) -> Any:
    """Weight decay on kernels only: not on biases, norms, class token or position embedding."""
    return jax.tree_util.tree_map_with_path(lambda path, _: _param_name(path).endswith("kernel"), params)


def build_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    schedule = learning_rate(cfg, total_steps)
    if cfg.optimizer == "adamw":
        tx = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=_decay_mask)
    elif cfg.optimizer == "adam":
        tx = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2)
    else:
        tx = optax.sgd(schedule, momentum=cfg.momentum, nesterov=False)
    if cfg.grad_clip > 0:
        tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx)
    return tx
