"""Lines a run prints: the header before training, one per epoch, and the summary at the end."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:
    from shardbench.train.loop import Plan


def epoch_line(r: dict[str, Any]) -> str:
    parts = [f"epoch {r['epoch']} (step {r['step']})", f"train loss {r.get('train_loss', float('nan')):.4f}",
             f"acc {r.get('train_accuracy', float('nan')):.3f}"]
    if "val_loss" in r:
        parts.append(f"val loss {r['val_loss']:.4f} acc {r['val_accuracy']:.3f}")
    parts.append(f"{r['time_s']:.1f}s")
    return " | ".join(parts)


def header_line(plan: "Plan") -> str:
    """The one line printed before training: what, where, on which data, for how long."""
    cfg, ds = plan.cfg, plan.dataset
    params = sum(math.prod(s.shape) for s in jax.tree.leaves(plan.spec.abstract))
    device = plan.layout.device
    mesh = "none" if plan.layout.mesh is None else str(plan.layout.shape)
    return (
        f"shardbench: {cfg.preset} ({params:,} params) | {plan.layout.strategy.name} on mesh {mesh} "
        f"({plan.layout.shape.size} {device.platform} device(s)) | {cfg.precision.param_dtype} params, "
        f"{cfg.precision.dtype} compute | data {ds.name}: {len(ds.train.labels):,} train / "
        f"{len(ds.val.labels):,} val / {len(ds.test.labels):,} test | batch {cfg.train.batch_size}, "
        f"{plan.total_steps} steps ({plan.steps_per_epoch}/epoch) | {plan.out}"
    )


def summary_line(summary: dict[str, Any]) -> str:
    """The one line printed at the end of a run."""
    m = summary.get("measurements", {})
    rate = summary.get("images_per_s")
    step = (m.get("step_time_s") or {}).get("median")
    parts = [f"done: {summary['run_name']}: {summary['steps']} steps on {summary['devices']} device(s) "
             f"({summary['strategy']}, mesh {summary['mesh']}) in {summary['time_s']:.1f}s"
             + (f", {rate:.0f} img/s" if rate else "") + (f", step {1000 * step:.1f} ms" if step else "")]
    mfu = (m.get("mfu") or {}).get("mfu")
    if mfu is not None:
        parts.append(f"MFU {100 * mfu:.1f}%")
    if summary.get("train_loss") is not None:
        parts.append(f"train loss {summary['train_loss']:.4f}")
    if summary.get("test_accuracy") is not None:
        parts.append(f"test acc {summary['test_accuracy']:.4f}")
    parts.append(f"-> {summary['out']}")
    return "; ".join(parts)
