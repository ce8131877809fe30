"""The run record: what one `shardbench train` writes as `<out>/summary.json`, as one versioned schema.

Every field is declared here once, with its unit and meaning (docs/measurements.md points here). The measuring
modules return these types (`measure.timing.compile_timed` a `CompileTimes`, `measure.comms` `Collective`s,
`measure.memory` a `Memory` and its `Breakdown`, `measure.collect` the `Measurements`), `to_json` writes them, and
every reader (the store's rows, the report, its findings and charts, the planner's measured runs) reads them
back through `from_json`, so a renamed field fails loudly in one place instead of silently in four.

Versions: 9 is this layout: version 8's, with the host's load where a measured peak was measured on a busy host
(`Mfu.peak_busy`: the peak may read low, and the MFU high); version 8 records read with it None.
Version 8 is version 7's, with the q/k/v projection's layout a run's blocks ran
(`Measurements.qkv_layout`, once `--model.qkv-layout auto` could pick seq-major); version 7 records read with it None.
Version 7 is version 6's, with what the price row's hourly price is for (`Cost.priced_per`: per
host, per device, or per chip of N JAX devices), which a report's cost note names from the record, not from
whichever table the report has at hand; version 6 records read with it None.
Version 6 is version 5's, with the FLOPs of a model of your own without `flops_per_example`
counted by XLA on its one-device forward and backward (`Flops.traced_per_step`, which MFU divides where
`mfu_uses` is "traced": the same count for every layout, where the compiled step's count x devices counted the work
every device repeats once per device); version 5 records read with it None.
Version 5 is version 4's, with the attention a run's blocks ran (`Measurements.attention`: cudnn,
fused, einsum or context, once `--model.attention auto` could pick cuDNN's); version 4 records read with it None.
Version 4 is version 3's, with the bytes each device sends (`Collective.sent_bytes`,
`Measurements.comms_total_sent_bytes`) beside each collective's payload (`Collective.bytes`), and the loops of
unknown trip count (`Measurements.comms_unknown_trip_counts`). Version 3 records (with the `cost` section: dollars
and kWh per epoch from the price table, energy measured through NVML or estimated; `shardbench.prices`) read with
those fields None; the report then compares payloads and says so. Version 2 records (the versions of shardbench, jax
and flax, the git commit when known, the host and the device kind; throughput is the global batch over the median
step) are read with `cost` None. Version 1 records
(throughput over the epochs' wall time) and records written before versions existed (no `schema_version`,
"version 0") are still read: missing fields become None, and readers derive the steady-state throughput from the
step time (`shardbench.report.content.ReportedRun.rate`). A record newer than this shardbench is refused with one line
saying which version it is.

An epoch's entry in `epochs` is a free table (its metrics are the task's); one whose train metrics cover only the
steps after a resume (its checkpoint held no sums of the epoch's earlier steps) says so with `from_step` and
`train_steps`, keys added within version 4: records written
before them leave such an epoch unmarked, and readers of any version take them as they take the metrics.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import socket
import subprocess
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench.errors import DataError

SCHEMA_VERSION = 9


class RecordError(DataError):
    """A summary.json that this shardbench cannot read: a file it cannot use, as a corrupt one (exit 4)."""


def _f(unit: str, doc: str, default: Any = None) -> Any:
    return field(default=default, metadata={"unit": unit, "doc": doc})


def _list(unit: str, doc: str) -> Any:
    return field(default_factory=list, metadata={"unit": unit, "doc": doc})


def _dict(unit: str, doc: str) -> Any:
    return field(default_factory=dict, metadata={"unit": unit, "doc": doc})


@dataclass(frozen=True)
class CompileTimes:
    lower_s: float | None = _f("s", "tracing and lowering the train step")
    compile_s: float | None = _f("s", "XLA's compilation of the train step")


@dataclass(frozen=True)
class StepTimes:
    median: float | None = _f("s", "median interval between step completions on the host")
    p90: float | None = _f("s", "90th percentile of those intervals")
    measured_steps: int | None = _f("steps", "intervals kept")
    excluded_steps: int | None = _f("steps", "intervals left out: warm-up, evaluation, checkpoints, profiler")
    warmup: int | None = _f("steps", "warm-up intervals used (lowered for a short run)")
    not_measured: str | None = _f("", "why there is no step time, when there is none")


@dataclass(frozen=True)
class PartialEpoch:
    steps: int | None = _f("steps", "steps trained in the epoch")
    of: int | None = _f("steps", "steps of a whole epoch")
    time_s: float | None = _f("s", "its wall time")


@dataclass(frozen=True)
class Throughput:
    examples_per_s: float | None = _f("examples/s", "global batch / median step time: the steady state, as MFU "
                                                    "(records written before schema 2: over the epochs' wall time)")
    examples_per_s_per_device: float | None = _f("examples/s", "the same per device")
    unit: str | None = _f("", "what throughput counts: images, tokens or examples")
    units_per_s: float | None = _f("unit/s", "throughput in that unit")
    units_per_s_per_device: float | None = _f("unit/s", "the same per device")
    wall_examples_per_s: float | None = _f("examples/s", "wall-clock: examples trained / the epochs' wall time, "
                                                         "data loading and checkpoints included; not evaluation, "
                                                         "nor the train step's compilation (before the clock "
                                                         "starts: `compile`)")


@dataclass(frozen=True)
class Flops:
    analytic_per_step: float | None = _f("FLOP", "the model's own count of a train step (None for a model of your "
                                                 "own without flops_per_example)")
    xla_per_step: float | None = _f("FLOP", "XLA's cost analysis of the compiled step x devices")
    traced_per_step: float | None = _f("FLOP", "a model of your own without flops_per_example: XLA's count of its "
                                               "forward and backward on one device, unsharded, x the examples of a "
                                               "step (the same for every layout)")
    formula: str | None = _f("", "how the analytic count is made")
    mfu_uses: str | None = _f("", "which count MFU divides: analytic, traced or xla")
    xla_note: str | None = _f("", "the cost analysis' caveat")


@dataclass(frozen=True)
class Mfu:
    mfu: float | None = _f("fraction", "FLOPs per step / median step time / (peak per device x devices)")
    peak_flops_per_s_per_device: float | None = _f("FLOP/s", "the peak divided by")
    peak_source: str | None = _f("", "where the peak comes from (data sheet, or the host's measured matmul)")
    peak_measured_at: str | None = _f("UTC", "when a measured peak was measured")
    peak_origin: str | None = _f("", "how this run got a measured peak: measured now, host cache, handed over")
    peak_busy: str | None = _f("", "a measured peak taken while other work loaded the host: its load ('load "
                                   "average 5.1 on 2 core(s)'); the peak may read low, and the MFU high")
    not_measured: str | None = _f("", "why there is no MFU, when there is none")


@dataclass(frozen=True)
class Breakdown:
    params_bytes: int | None = _f("bytes/device", "the device's shards of the parameters")
    optimizer_bytes: int | None = _f("bytes/device", "the device's shards of the optimizer state")
    model_state_bytes: int | None = _f("bytes/device", "a model of your own's other variables (BatchNorm "
                                                       "statistics, RNG streams); 0 for the built-in models")
    gradients_bytes: int | None = _f("bytes/device", "the step's gradient buffers: their own shapes, dtypes and "
                                                     "layout")
    activations_temporaries_bytes: int | None = _f("bytes/device", "compiled temporaries - gradients")
    other_bytes: int | None = _f("bytes/device", "the rest of the compiled total (batch, outputs)")


@dataclass(frozen=True)
class Memory:
    peak_bytes_in_use: int | None = _f("bytes/device", "the runtime allocator's peak, where the backend has one")
    compiled: dict[str, Any] | None = _f("bytes/device", "XLA's memory analysis: argument, output, alias, temp, "
                                                         "generated code bytes")
    total_bytes: int | None = _f("bytes/device", "arguments + outputs - aliased + temporaries")
    breakdown: Breakdown | None = _f("", "what the compiled total holds")
    per_device: list[dict[str, Any]] = _list("bytes", "every device of every process: what it holds")


@dataclass(frozen=True)
class Collective:
    count: int | None = _f("per step", "executions per step (inside a layer scan: x the trip count)")
    bytes: int | None = _f("bytes/device/step", "payload: the collective's buffer per device, summed over its "
                                                "executions (all-reduce: its buffer; all-gather: the gathered "
                                                "output; reduce-scatter: its input); not comparable across kinds")
    sent_bytes: int | None = _f("bytes/device/step", "bytes one device sends on a ring of the op's group of N: "
                                                     "all-reduce 2(N-1)/N x the payload, all-gather, reduce-scatter "
                                                     "and all-to-all (N-1)/N, collective-permute its buffer from each "
                                                     "source of its source-target pairs (others send nothing), the "
                                                     "fullest device's total (None in records written before it was "
                                                     "kept)")


@dataclass(frozen=True)
class CompileCache:
    dir: str | None = _f("", "the persistent compilation cache's directory (None = off)")
    hits: int | None = _f("programs", "this run's compilations answered from disk")
    requests: int | None = _f("programs", "this run's compilations that asked the cache")
    xla_caches: str | None = _f("", "XLA's own caches kept there (the GPU autotune cache)")


@dataclass(frozen=True)
class Measurements:
    platform: str | None = _f("", "cpu, gpu or tpu")
    device_kind: str | None = _f("", "the device's kind as JAX names it")
    devices: int | None = _f("devices", "devices in the run, every process")
    processes: int | None = _f("processes", "processes in the run")
    allocator: str | None = _f("", "the glibc allocator the process ran with, and why")
    xla_flags: str | None = _f("", "the XLA_FLAGS the process ran with: --train.xla-presets' flags and hand-set ones")
    attention: str | None = _f("", "the attention the model's blocks ran: cudnn, fused or einsum (--model.attention "
                                   "auto as this platform resolved it), or context (the sequence split over seq brings "
                                   "its own); none for a model without shardbench's attention, and in records "
                                   "written before it was kept")
    qkv_layout: str | None = _f("", "the q/k/v projection's layout the model's blocks ran: fused, split or seq-major "
                                    "(--model.qkv-layout auto as this run resolved it); none for a model without "
                                    "shardbench's attention, and in records written before it was kept")
    per_process: list[dict[str, Any]] = _list("", "each process: host, devices, its median step time")
    global_batch: int | None = _f("examples", "examples per update: the batch the optimizer steps on, which "
                                              "throughput and MFU count (--batch-size)")
    grad_accum: int | None = _f("microbatches", "microbatches per update (--train.grad-accum); 1 = the batch in one "
                                                "pass")
    microbatch: int | None = _f("examples", "examples in one forward and backward pass over all devices: global "
                                            "batch / grad_accum")
    microbatch_per_shard: int | None = _f("examples", "the same per data shard: the examples whose activations a "
                                                      "device holds at once")
    pipeline_stages: int | None = _f("stages", "pipeline stages, the stage axis of a strategy with stages (pp, "
                                               "dp+pp, fsdp+pp, pp+tp, dp+pp+tp); none without a pipeline")
    pipeline_microbatches: int | None = _f("microbatches", "microbatches that flow through the stages in each pass "
                                                           "(--parallel.microbatches)")
    pipeline_bubble: float | None = _f("fraction", "the schedule's idle fraction of each stage by its formula, GPipe's "
                                                   "(S-1)/(M+S-1): computed, not measured")
    pipeline_transfers: Collective | None = _f("", "stage-to-stage transfers: the collective-permutes whose every "
                                                   "source-target pair crosses the stage axis alone (activations "
                                                   "one stage on, their gradients one stage back), per device per "
                                                   "step; counted in comms too; none without a pipeline")
    context_transfers: Collective | None = _f("", "context parallelism's ring transfers: the collective-permutes "
                                                  "whose every source-target pair crosses the seq axis alone (ring "
                                                  "attention's key/value blocks, their gradients back), per device "
                                                  "per step; counted in comms too; none without a seq axis")
    compile: CompileTimes | None = _f("", "compile time of the train step")
    step_time_s: StepTimes | None = _f("", "step times")
    epoch_time_s: list[float] = _list("s", "wall time of each whole epoch (data included, evaluation excluded)")
    partial_epochs: list[PartialEpoch] = _list("", "epochs cut short by --steps or a resume")
    throughput: Throughput | None = _f("", "training throughput")
    flops: Flops | None = _f("", "FLOPs per step")
    mfu: Mfu | None = _f("", "model FLOPs utilisation")
    memory: Memory | None = _f("", "memory per device")
    comms: dict[str, Collective] = _dict("", "per collective kind (all-reduce, all-gather, ...)")
    comms_total_bytes: int | None = _f("bytes/device/step", "every collective's payload together")
    comms_total_sent_bytes: int | None = _f("bytes/device/step", "every collective's bytes sent together, each "
                                                                 "kind's sent_bytes (None in records written "
                                                                 "before it was kept)")
    comms_unknown_trip_counts: int | None = _f("loops", "loops of the step whose trip count XLA did not record "
                                                        "(and no bound was found): collectives inside them are "
                                                        "counted once, so comms undercounts them (None in records "
                                                        "written before it was kept)")
    compile_cache: CompileCache | None = _f("", "the persistent compilation cache")


@dataclass(frozen=True)
class MoE:
    experts: int | None = _f("experts", "experts per block (--model.num-experts)")
    top_k: int | None = _f("experts", "experts each token is routed to")
    capacity_factor: float | None = _f("", "--model.capacity-factor")
    capacity: int | None = _f("tokens", "slots per expert per sequence per block: ceil(factor x seq x k / experts)")
    assignments_per_step: int | None = _f("assignments", "token-to-expert assignments per step: batch x seq x k x "
                                                          "blocks")
    dropped: float | None = _f("assignments", "assignments dropped over capacity in all the steps of this "
                                              "invocation (their tokens' residual passed the expert unchanged)")
    dropped_per_step: float | None = _f("assignments", "dropped over the steps, per step")
    dropped_fraction: float | None = _f("fraction", "dropped / (assignments_per_step x steps)")
    aux_loss: float | None = _f("", "the last step's load-balancing loss (Switch's, summed over the blocks, mean "
                                    "over the sequences), before --model.aux-loss-coef")


@dataclass(frozen=True)
class Cost:
    device: str | None = _f("", "the price table's row: a --target chip name (h100, tpu-v5e, ...) or cpu")
    devices: int | None = _f("devices", "devices priced: chips (a TPU v2/v3 chip is two JAX devices; a GPU is one), "
                                        "or the hosts for a row priced per host")
    priced_per: str | None = _f("", "what the row's hourly price is for: per host, per device, or per chip of N JAX "
                                    "devices")
    epoch_time_s: float | None = _f("s", "steps per epoch x median step time")
    steps_per_epoch: int | None = _f("steps", "steps of a whole epoch")
    on_demand_usd: float | None = _f("USD/epoch", "epoch time x the devices priced x the row's on-demand price per "
                                                       "device-hour (hosts and host-hour for a row priced per host)")
    spot_usd: float | None = _f("USD/epoch", "the same at the spot price")
    kwh: float | None = _f("kWh/epoch", "energy of an epoch: epoch time x the measured power per GPU (NVML) x the "
                                        "run's devices, or x the table's watts x what the row prices")
    energy: str | None = _f("", "measured (NVML's energy counters over the timed steps) or estimated (the table's "
                                "watts)")
    watts_per_device: float | None = _f("W", "the power used: measured average per GPU, or the table's watts")
    measured_joules: float | None = _f("J", "NVML: energy of this process's GPUs over the timed steps")
    measured_s: float | None = _f("s", "NVML: the wall time those joules cover")
    energy_note: str | None = _f("", "why energy is estimated, when it is")
    per: str | None = _f("", "what the per-unit figures count: billion tokens, million images or million examples")
    on_demand_usd_per: float | None = _f("USD/per", "on-demand dollars per `per` (a billion tokens, ...)")
    spot_usd_per: float | None = _f("USD/per", "spot dollars per `per`")
    kwh_per: float | None = _f("kWh/per", "energy per `per`")
    prices: str | None = _f("", "the price table used: 'packaged' or the --prices file")
    price_source: str | None = _f("", "the row's source and date, and which of its figures are estimates")
    not_measured: str | None = _f("", "why there is no cost, when there is none")


@dataclass(frozen=True)
class Versions:
    shardbench: str | None = _f("", "shardbench's version")
    jax: str | None = _f("", "jax's version")
    flax: str | None = _f("", "flax's version")
    python: str | None = _f("", "Python's version")


@dataclass(frozen=True)
class RunRecord:
    schema_version: int = _f("", "this layout's version", 0)
    status: str | None = _f("", "complete")
    run_name: str | None = _f("", "the run's name (the seed's style: mesh_4_2_batch_1024)")
    steps: int | None = _f("steps", "steps trained in all")
    resumed_from: int | None = _f("steps", "the step this invocation started from")
    epochs: list[dict[str, Any]] = _list("", "per epoch: train and validation metrics, and time_s, the seconds "
                                             "from its invocation's start to the epoch's end (evaluation "
                                             "included); a resumed run's earlier epochs as its checkpoint carried "
                                             "them; an epoch a resume cut into without its sums in the checkpoint "
                                             "adds from_step and train_steps: its train metrics are means over "
                                             "those steps only")
    train_loss: float | None = _f("", "the last step's loss")
    time_s: float | None = _f("s", "this invocation's training wall time, evaluation included")
    model: str | None = _f("", "the model's kind: vit, lm or mlp (the task's kind for a model of your own)")
    spmd: str | None = _f("", "jit, shard_map or pmap")
    examples_per_s: float | None = _f("examples/s", "as measurements.throughput")
    images_per_s: float | None = _f("images/s", "for image models")
    tokens_per_s: float | None = _f("tokens/s", "for language models")
    strategy: str | None = _f("", "the strategy that ran")
    mesh: str | None = _f("", "the mesh that ran (data x model), or none")
    devices: int | None = _f("devices", "devices in the run")
    out: str | None = _f("", "the run directory")
    measurements: Measurements | None = _f("", "every measurement (above)")
    dataset: dict[str, Any] = _dict("", "the dataset's name, classes or vocabulary, normalisation, loss floor, "
                                    "examples in each split (train, val, test)")
    profile: str | None = _f("", "the profiler trace's directory, when --profile wrote one")
    test_loss: float | None = _f("", "loss on the test split")
    test_accuracy: float | None = _f("fraction", "accuracy on the test split")
    test_perplexity: float | None = _f("", "exp(test loss), language models")
    moe: MoE | None = _f("", "a mixture of experts: its routing and the assignments dropped over capacity")
    versions: Versions | None = _f("", "what it ran with")
    git_commit: str | None = _f("", "shardbench's git commit, when it runs from a checkout")
    host: str | None = _f("", "the host name of process 0")
    device_kind: str | None = _f("", "as measurements.device_kind")
    cost: Cost | None = _f("", "dollars and kWh per epoch (schema 3; None in older records)")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(kind: Any, value: Any, strict: bool, where: str) -> Any:
    """`value` (JSON) as `kind`; dataclasses recursively."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if value is None:  # a list or a table written as null is an empty one; anything else null stays None
        return [] if origin is list else {} if origin is dict else None
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value, strict, where) if len(inner) == 1 else value
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise RecordError(f"{where} should be an object, not {type(value).__name__}")
        hints = _hints(kind)
        unknown = sorted(set(value) - set(hints))
        if strict and unknown:
            raise RecordError(f"{where} has unknown field '{unknown[0]}' for record version {SCHEMA_VERSION}")
        return kind(**{k: _build(hints[k], v, strict, f"{where}.{k}") for k, v in value.items() if k in hints})
    if origin is list and args:
        if not isinstance(value, list):
            raise RecordError(f"{where} should be a list, not {type(value).__name__}")
        return [_build(args[0], v, strict, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and len(args) == 2:
        if not isinstance(value, dict):
            raise RecordError(f"{where} should be an object, not {type(value).__name__}")
        return {k: _build(args[1], v, strict, f"{where}.{k}") for k, v in value.items()}
    return value


def from_json(data: Any, source: str = "summary.json") -> RunRecord:
    """A record as written by any shardbench with a schema this one reads; one-line RecordError otherwise."""
    if not isinstance(data, dict):
        raise RecordError(f"{source} is not a run record (a JSON object)")
    version = data.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise RecordError(f"{source}.schema_version is {version!r}: a run record's version is a whole number from "
                          f"0 to {SCHEMA_VERSION}, as shardbench train writes it; the file was edited or damaged")
    if version > SCHEMA_VERSION:
        raise RecordError(f"{source} is a version-{version} run record; this shardbench reads versions 0 to "
                          f"{SCHEMA_VERSION}: upgrade shardbench to read it")
    return _build(RunRecord, {**data, "schema_version": version}, version == SCHEMA_VERSION, source)


def to_json(value: Any) -> Any:
    """A record, or any part of one (a dataclass of this module), as summary.json holds it."""
    return dataclasses.asdict(value)


def git_commit() -> str | None:
    """The commit of the checkout shardbench runs from, if it runs from one."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def provenance() -> dict[str, Any]:
    """What a record says about where and with what it ran: RunRecord's fields of that name."""
    import flax
    import jax

    try:
        ours: str | None = importlib.metadata.version("shardbench")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        ours = None
    return {"schema_version": SCHEMA_VERSION, "git_commit": git_commit(), "host": socket.gethostname(),
            "versions": Versions(shardbench=ours, jax=jax.__version__, flax=flax.__version__,
                                 python=platform.python_version())}


def field_table() -> list[tuple[str, str, str]]:
    """(path, unit, meaning) of every field, for documentation."""
    rows: list[tuple[str, str, str]] = []

    def walk(cls: type, prefix: str) -> None:
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            path = f"{prefix}{f.name}"
            rows.append((path, f.metadata.get("unit", ""), f.metadata.get("doc", "")))
            kind = hints[f.name]
            inner = [a for a in typing.get_args(kind) if dataclasses.is_dataclass(a)]
            if dataclasses.is_dataclass(kind):
                walk(kind, path + ".")
            elif inner:
                walk(inner[0], path + ("[]." if typing.get_origin(kind) is list else
                                       ".*." if typing.get_origin(kind) is dict else "."))

    walk(RunRecord, "")
    return rows
