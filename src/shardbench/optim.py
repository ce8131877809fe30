"""The optimizer a configuration names: AdamW, Adam or SGD with momentum, warm-up and cosine decay."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from shardbench.config import OptimConfig


def global_norm(tree: Any) -> jax.Array:
    """The gradients' global L2 norm, summed in float32 whatever their dtype: in float16 the sum of squares
    overflows once the norm passes 256 (a finite gradient then read as infinite, the run stopped as diverged),
    and bfloat16 keeps 8 bits of a sum over millions of squares."""
    return optax.tree.norm(jax.tree.map(lambda g: g.astype(jnp.float32), tree))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """optax's clipping to a global norm, with the norm summed in float32 (`global_norm`): optax sums in the
    gradients' dtype, and a float16 norm past 256 came out infinite and scaled every update to zero. The scaled
    updates keep their dtype."""
    def clip(updates: Any, params: Any = None) -> Any:
        scale = jnp.minimum(1.0, max_norm / global_norm(updates))
        return jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates)
    return optax.stateless(clip)


def warmup_steps(cfg: OptimConfig, total_steps: int) -> int:
    """The warm-up's steps: --optim.warmup-steps (-1: a twentieth of the run), cut to end before the run's last
    step, where the learning rate then peaks (`warmup_note` says so)."""
    warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else max(1, total_steps // 20)
    return min(warmup, max(total_steps - 1, 0))


def warmup_note(cfg: OptimConfig, total_steps: int) -> str:
    """Why the warm-up is shorter than --optim.warmup-steps asked, or ''."""
    cut = warmup_steps(cfg, total_steps)
    if cfg.warmup_steps <= cut:
        return ""
    return (f"the warm-up of {cfg.warmup_steps} steps (--optim.warmup-steps) is past the run's {total_steps} steps: "
            f"it is cut to {cut}, so the learning rate peaks at the last step (and the decay after it never runs)")


def learning_rate(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warm-up from 0, then cosine decay to end_lr_fraction * lr (or constant)."""
    warmup = warmup_steps(cfg, total_steps)
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


class EmaState(NamedTuple):
    """An exponential moving average of the weights, kept in the optimizer state (so it is sharded like the
    parameters and checkpointed with them) and used by evaluation instead of the weights."""

    count: jax.Array
    ema: Any


def track_ema(decay: float) -> optax.GradientTransformation:
    """After the update: ema <- d ema + (1 - d) (params + updates), with d = min(decay, (1 + t) / (10 + t)) so
    that the early average does not cling to the initial weights. Updates pass through unchanged."""

    # Kept in float32 whatever the parameters' dtype: in bfloat16 a step of (1 - d) x (p - ema) rounds to
    # nothing once d is near 1, and the average would stop moving.
    def init(params: Any) -> EmaState:
        return EmaState(count=jnp.zeros([], jnp.int32), ema=jax.tree.map(lambda p: p.astype(jnp.float32), params))

    def update(updates: Any, state: EmaState, params: Any = None) -> tuple[Any, EmaState]:
        if params is None:
            raise ValueError("track_ema needs the parameters")
        t = state.count.astype(jnp.float32)
        d = jnp.minimum(decay, (1.0 + t) / (10.0 + t))
        ema = jax.tree.map(lambda e, p, u: d * e + (1.0 - d) * (p.astype(jnp.float32) + u.astype(jnp.float32)),
                           state.ema, params, updates)
        return updates, EmaState(count=state.count + 1, ema=ema)

    return optax.GradientTransformation(init, update)


def ema_params(opt_state: Any) -> Any | None:
    """The weights' moving average in `opt_state`, or None when the optimizer keeps none."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, EmaState))
             if isinstance(s, EmaState)]
    return found[0].ema if found else None


def mu_dtype(cfg: OptimConfig) -> jnp.dtype | None:
    """Adam's first-moment dtype for optax's `mu_dtype`: None (the parameters' dtype, optax's default) for '',
    else the named dtype. A bfloat16 first moment halves its bytes and traffic; the second moment stays in the
    parameters' dtype (its squares need float32's range)."""
    return jnp.dtype(cfg.mu_dtype) if cfg.mu_dtype else None


def build_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    """The optimizer `cfg` names, with gradient clipping and the weights' moving average where asked."""
    schedule = learning_rate(cfg, total_steps)
    if cfg.optimizer == "adamw":
        tx = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=_decay_mask,
                         mu_dtype=mu_dtype(cfg))
    elif cfg.optimizer == "adam":
        tx = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, mu_dtype=mu_dtype(cfg))
    else:
        # momentum 0 is plain SGD: no momentum buffer (optax keeps one of the parameters' size for momentum=0.0)
        tx = optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=False)
    if cfg.grad_clip > 0:
        tx = optax.chain(clip_by_global_norm(cfg.grad_clip), tx)
    if cfg.ema > 0:
        tx = optax.chain(tx, track_ema(cfg.ema))
    return tx
