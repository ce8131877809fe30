"""Compile one candidate's train step without running it, and read off what the compiler knows: the sharded
state per device (exact), the compiled memory, every collective with its device groups, and the FLOPs.

The step is the one `shardbench train` compiles (`make_steps` on the abstract state and an abstract batch),
so a plan's figures are the run's figures, not a re-implementation of them. Runs in a worker process set up
with the target's device count (`python -m shardbench.startup shardbench.plan.compile`, see `shardbench.plan.workers`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from shardbench.config import Config, flatten
from shardbench.measure import flops as flops_lib
from shardbench.measure.collect import RunSetup, batch_sizes, traced_per_step
from shardbench.measure.comms import CollectiveOp, count_collectives, crosses_only, executed, fullest_sent
from shardbench.measure.memory import compiled_memory, gradient_buffers, per_device_bytes
from shardbench.parallel.mesh import MESH_AXES, STAGE
from shardbench.parallel.pipeline import uses_pipeline
from shardbench.parallel.rules import Layout
from shardbench.optim import build_optimizer
from shardbench.train.spmd import make_steps
from shardbench.train.state import abstract_train_state, gradient_shardings

ABSTRACT_STEPS = 1000  # the schedule's length: it changes no shape


def abstract_batch(cfg: Config, layout: Layout) -> dict[str, jax.ShapeDtypeStruct]:
    """One global batch as the input pipeline delivers it (uint8 images, int32 labels and tokens, float32
    regression pairs), laid out with the run's batch sharding."""
    b, m = cfg.train.batch_size, cfg.model
    if m.kind == "lm":
        shapes = {"tokens": ((b, m.seq_len + 1), jnp.int32)}
    elif m.kind == "mlp":
        shapes = {"inputs": ((b, m.input_dim), jnp.float32), "targets": ((b, m.num_classes), jnp.float32)}
    else:
        size = cfg.data.image_size
        shapes = {"image": ((b, size, size, 3), jnp.uint8), "label": ((b,), jnp.int32)}
    shapes["mask"] = ((b,), jnp.bool_)
    sharding = layout.batch_sharding()
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for k, (shape, dtype) in shapes.items()}


def pipeline_figures(cfg: Config, task: Any, layout: Layout) -> dict[str, Any]:
    """A pipeline's stages, microbatches, schedule and its bubble by the schedule's own formula, as the run
    record gives them (one place computes them: `shardbench.measure.collect.batch_sizes`), and the work its
    program computes over the useful work (`shardbench.parallel.pipeline.stack_work`)."""
    from shardbench.parallel.pipeline import schedule_repeats, stack_work

    sizes = batch_sizes(RunSetup(cfg, task, layout))
    stages, m = sizes["pipeline_stages"], sizes["pipeline_microbatches"]
    work = stack_work(cfg.parallel.schedule, stages, m, schedule_repeats(cfg.parallel)) if stages else None
    return {"stages": stages, "microbatches": m, "schedule": cfg.parallel.schedule, "bubble": sizes["pipeline_bubble"],
            "work": work}


_TRACED: dict[str, float | None] = {}  # per model, batch and dtype: the candidates of a plan share it


def _traced(cfg: Config, task: Any, layout: Layout, spec: Any) -> float | None:
    """A model of your own's one-device count (`traced_per_step`), once per process for every layout of one
    model: it does not depend on the layout, and it is lowered anew otherwise for each candidate."""
    key = json.dumps({k: v for k, v in flatten(cfg).items() if not k.startswith("parallel.")}, sort_keys=True,
                     default=str)
    if key not in _TRACED:
        _TRACED[key] = traced_per_step(RunSetup(cfg, task, layout, spec))
    return _TRACED[key]


def compile_candidate(cfg: Config, link_span: int, devices: list[jax.Device] | None = None) -> dict[str, Any]:
    """The compiler's figures for `cfg`'s train step (see the module docstring); `link_span` devices share a
    node (its collectives' groups decide the link each crosses). `devices`: compile for these (a TPU
    topology's) instead of the process's own."""
    from shardbench.measure.links import INTRA, link_of
    from shardbench.tasks import get_task
    from shardbench.preflight import check_runnable

    task, layout, spec = check_runnable(cfg, None if devices is None else devices[:cfg.parallel.devices])
    tx = build_optimizer(cfg.optim, ABSTRACT_STEPS)
    batch = abstract_batch(cfg, layout)
    steps = make_steps(cfg, get_task(cfg), spec, layout, tx, tuple(k for k in batch if k != "mask"))
    state = abstract_train_state(spec, layout, tx)
    start = time.perf_counter()
    compiled = steps.train.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    hlo = compiled.as_text()
    comms = count_collectives(hlo)
    kernels, traffic = executed(hlo)
    size = layout.shape.size
    staged = uses_pipeline(layout)
    # (kind, link, group size, stage-to-stage): a pipeline's transfers between stages kept apart, with their link.
    grouped: dict[tuple[str, str, int, bool], list[CollectiveOp]] = {}
    for op in comms.ops:
        group = len(op.groups[0]) if op.groups else size
        link = "intra" if link_of(op.groups, size, link_span) == INTRA else "inter"
        stage = (staged and op.kind == "collective-permute"
                 and crosses_only(op.groups, layout.shape.sizes, MESH_AXES.index(STAGE)))
        grouped.setdefault((op.kind, link, group, stage), []).append(op)
    per_example = task.train_flops_per_example(cfg)
    xla = flops_lib.xla_flops(compiled)
    accum = cfg.train.grad_accum
    if xla is not None:
        # XLA counts the microbatch loop's body once, so K microbatches are K of it (the update outside the
        # loop is then counted K times too: a few FLOPs a parameter, against 6 a parameter an example).
        xla *= accum
    params_b, opt_b = per_device_bytes(state.params), per_device_bytes(state.opt_state)
    return {
        "devices": size,
        "grad_accum": accum,  # microbatches per update: collectives, kernels and traffic count each of them
        "platform": layout.device.platform,
        "device_kind": getattr(layout.device, "device_kind", layout.device.platform),
        "compile_s": compile_s,
        "state": {"params_bytes": params_b, "optimizer_bytes": opt_b,
                  "gradients_bytes": per_device_bytes(gradient_buffers(state.params,
                                                                       gradient_shardings(spec, layout))),
                  "model_state_bytes": per_device_bytes(state.model_state)},
        "batch_bytes": per_device_bytes(batch),
        "compiled": compiled_memory(compiled),
        "flops": {"analytic_per_step": None if per_example is None else float(per_example * cfg.train.batch_size),
                  "xla_per_device": xla,
                  # a model of your own without its count: the one-device count the run's MFU divides
                  "traced_per_step": None if per_example is not None else _traced(cfg, task, layout, spec)},
        "bytes_accessed": traffic,  # per device, every loop iteration counted (measure.comms.executed)
        "kernels": kernels,
        # Per entry: executions and payload per device; bytes sent by its fullest device and by every device
        # together (a collective-permute's sources alone send: `measure.comms.fullest_sent`).
        "collectives": [{"kind": k, "link": link, "group": g, "count": sum(op.count for op in ops),
                         "bytes": sum(op.count * op.bytes_each for op in ops),
                         **dict(zip(("sent", "sent_all"), fullest_sent(ops, size))), "stage": stage}
                        for (k, link, g, stage), ops in sorted(grouped.items())],
        "pipeline": pipeline_figures(cfg, task, layout) if staged else None,
        "unknown_trip_counts": comms.unknown_trip_counts,
    }


def local_gpus(kind: str | None, count: int) -> list[jax.Device] | None:
    """This host's GPUs when they are the target's chip (`kind`, a data-sheet name) and there are at least
    `count` of them: then the GPU compiler compiles the step, its temporaries included. None otherwise (the
    CPU compiler, which the worker's simulated devices are set up for)."""
    from shardbench.hardware import chip_for_kind

    if not kind:
        return None
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        return None
    found = chip_for_kind(getattr(gpus[0], "device_kind", "")) if gpus else None
    if found is None or found.name != kind or len(gpus) < count:
        return None
    return gpus


def run_jobs(jobs: list[dict[str, Any]], out: Any) -> None:
    """Each job {name, config (flattened), link_span}: one JSON line {name, result | refused | error} on `out`
    as soon as it is done."""
    from shardbench.config import cache_root, cache_root_flag
    from shardbench.errors import ShardbenchError
    from shardbench.flags import setup_devices
    from shardbench.parsing import override
    from shardbench.plan.tpu import topology_devices
    from shardbench import compile_cache

    cfgs = [(job, override(Config(), job["config"])) for job in jobs]
    if not cfgs:
        return
    first = cfgs[0][1]
    setup_devices(first)
    compile_cache.use(first.train.compile_cache, cache_root(first), cache_root_flag(first))
    topology = jobs[0].get("topology")
    devices = (topology_devices(topology["chip"], topology["shape"]) if topology else
               local_gpus(jobs[0].get("gpu_kind"), first.parallel.devices))
    if devices is None and jax.default_backend() != "cpu":  # GPUs here, but not the target's: the CPU compiler
        devices = jax.devices("cpu")
    for job, cfg in cfgs:
        line: dict[str, Any] = {"name": job["name"]}
        try:
            line["result"] = compile_candidate(cfg, int(job["link_span"]), devices)
        except ShardbenchError as err:
            line["refused"] = str(err)
        except Exception as err:  # noqa: BLE001 - a candidate that fails to compile is a row, not the end
            first_line = (str(err).strip().splitlines() or [""])[0][:300]
            line["error"] = f"{type(err).__name__}: {first_line}"
        out.write(json.dumps(line) + "\n")
        out.flush()


def main() -> int:
    jobs = json.loads(sys.stdin.read())
    channel = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints stays out of the answer
    run_jobs(jobs, channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
