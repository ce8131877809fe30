"""Lines a run prints: the header before training, one per epoch, and the summary at the end."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import jax

from shardbench.measure.timing import MIN_MEASURED_STEPS
from shardbench.optim import warmup_note

if TYPE_CHECKING:
    from shardbench.preflight import CheckedRun


# The run's folder in its header line: after the steps' count, up to the next " | " (a note) or the line's end.
_HEADER_OUT = re.compile(r"^shardbench: .*? \d+ steps \(\d+/epoch\) \| (.+?)(?= \| |$)")


def out_of_header(line: str) -> str | None:
    """The run folder a header line (`header_line`) names; None for any other line. A launch given no --out reads
    the folder process 0 chose from its output."""
    match = _HEADER_OUT.match(line.rstrip("\r\n"))
    return match[1] if match else None


def epoch_line(r: dict[str, Any]) -> str:
    parts = [f"epoch {r['epoch']} (step {r['step']})", f"train loss {r.get('train_loss', float('nan')):.4f}"
             + (f" acc {r['train_accuracy']:.3f}" if "train_accuracy" in r else "")]
    if "val_loss" in r:
        parts.append(f"val loss {r['val_loss']:.4f}" + (f" acc {r['val_accuracy']:.3f}" if "val_accuracy" in r else "")
                     + (f" ppl {r['val_perplexity']:.2f}" if "val_perplexity" in r else ""))
    parts.append(f"{r['time_s']:.1f}s")
    return " | ".join(parts)


def header_line(checked: "CheckedRun") -> str:
    """The one line printed before training: what, where, on which data, for how long."""
    cfg, ds = checked.cfg, checked.dataset
    params = sum(math.prod(s.shape) for s in jax.tree.leaves(checked.spec.abstract))
    device = checked.layout.device
    mesh = "none" if checked.layout.mesh is None else str(checked.layout.shape)
    where = f"{checked.layout.shape.size} {device.platform} device(s)"
    if jax.process_count() > 1:
        where += f" in {jax.process_count()} processes"
    model = f"{cfg.model.factory}, task {cfg.model.task}" if cfg.model.factory else cfg.model.kind
    notes = "".join(f" | {note}" for note in checked.spec.axis_notes())
    if (checked.spec.has_statistics and not checked.spec.axis_names and cfg.parallel.spmd != "jit"
            and checked.layout.shape.data > 1):
        per = cfg.train.batch_size // checked.layout.shape.data
        notes += (f" | BatchNorm statistics per shard: no layer names an axis (axis_name=), so under "
                  f"{cfg.parallel.spmd} each device normalises its {per} examples with their own statistics "
                  f"(running averages are averaged over devices); name one, e.g. axis_name='batch', for "
                  f"global statistics")
    cut = warmup_note(cfg.optim, checked.total_steps)
    if cut:
        notes += f" | {cut}"
    if checked.task.train_flops_per_example(cfg) is None:
        notes += (" | FLOPs from XLA's count of the model's forward and backward on one device (no "
                  "flops_per_example in the model's file): a loop body counts once, so layers under a scan are "
                  "undercounted")
    return (
        f"shardbench: {cfg.preset if not cfg.model.factory else 'model'} ({model}, {params:,} params) | "
        f"{checked.layout.strategy.name}{' with sequence parallelism' if checked.layout.sequence_parallel else ''} "
        f"on mesh {mesh}, {cfg.parallel.spmd} "
        f"({where}) | {cfg.precision.param_dtype} params, "
        f"{cfg.precision.dtype} compute | data {ds.name}: {len(ds.train):,} train / "
        f"{len(ds.val):,} val / {len(ds.test):,} test | batch {cfg.train.batch_size}{_microbatches(checked)}, "
        f"{checked.total_steps} steps ({checked.steps_per_epoch}/epoch) | {checked.out}{notes}"
    )


def _microbatches(checked: CheckedRun) -> str:
    """How an update's batch is computed when it is accumulated: K microbatches of B/K (per data shard)."""
    k, batch = checked.cfg.train.grad_accum, checked.cfg.train.batch_size
    if k == 1:
        return ""
    return f" in {k} microbatches of {batch // k} ({batch // k // checked.layout.data_size} per data shard)"


def summary_line(summary: dict[str, Any]) -> str:
    """The one line printed at the end of a run."""
    m = summary.get("measurements", {})
    throughput = m.get("throughput") or {}
    rate, unit = throughput.get("units_per_s"), throughput.get("unit", "examples")
    timing = m.get("step_time_s") or {}
    step = timing.get("median")
    # A resumed run's time and step statistics are this invocation's: the line says how many steps they cover.
    resumed = summary.get("resumed_from")
    here = f" ({summary['steps'] - resumed} after resuming from step {resumed})" if resumed else ""
    few = timing.get("measured_steps")
    parts = [f"done: {summary['run_name']}: {summary['steps']} steps{here} on {summary['devices']} device(s) "
             f"({summary['strategy']}, mesh {summary['mesh']}, {summary.get('spmd', 'jit')}) in "
             f"{summary['time_s']:.1f}s" + (f", {rate:,.0f} {unit}/s" if rate else "")
             + (f", step {1000 * step:.1f} ms" + (f" (over {few} step(s))" if few and few < MIN_MEASURED_STEPS else "") if step else
                f", step time {timing['not_measured']}" if timing.get("not_measured") else "")]
    mfu = m.get("mfu") or {}
    if mfu.get("mfu") is not None:
        parts.append(f"MFU {100 * mfu['mfu']:.1f}%")
    elif mfu.get("not_measured") and step:
        parts.append(f"MFU not measured: {mfu['not_measured']}")
    if summary.get("train_loss") is not None:
        parts.append(f"last step's train loss {summary['train_loss']:.4f}")
    if summary.get("test_accuracy") is not None:
        parts.append(f"test acc {summary['test_accuracy']:.4f}")
    if summary.get("test_perplexity") is not None:
        parts.append(f"test perplexity {summary['test_perplexity']:.2f}")
    floor = (summary.get("dataset") or {}).get("loss_floor")
    if floor is not None and summary.get("test_loss") is not None:
        parts.append(f"test loss {summary['test_loss']:.4f} (best possible {floor:.4g})")
    if summary.get("profile"):
        parts.append(f"trace {summary['profile']}")
    parts.append(f"-> {summary['out']}")
    return "; ".join(parts)
