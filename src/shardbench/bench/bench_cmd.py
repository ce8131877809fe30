"""`shardbench bench`: the speed benchmark. Each case runs in its own process, one after another.

Groups (all but alloc by default):
  step      shardbench's train step vs the seed-style nnx baseline and PyTorch (eager, torch.compile),
            plus the measured matmul peak that turns every throughput into a measured MFU; once per
            setting of --dtype and --batch-size (default: float32 batch 128 on a CPU; float32 batch 128
            and bfloat16 batch 1024 on a GPU or TPU, PyTorch's bfloat16 under autocast)
  batch     shardbench's throughput per device at several batch sizes (default 64,256; 256 on an accelerator)
  layers    compile time at several depths, layers in a rolled scan and fully unrolled (default 6,12,24;
            6,12 on an accelerator, where the 24-layer unrolled compile alone outlasts a 10-minute run)
  remat     --remat none | block | full: compiled temporary memory and throughput
  pipeline  the host input pipeline alone on one core, and the on-device augmentation
  alloc     shardbench's step with glibc's default allocator instead of the tuned one

Float32 fairness: JAX runs float32 matmuls on an NVIDIA GPU as TF32 unless --matmul-precision (or
--set precision.matmul_precision=) is highest, and the PyTorch baselines are given the same arithmetic
(TF32 allowed for default and high, full float32 for highest; on the CPU both sides are full float32).
Each step table says which arithmetic each side's float32 matmuls used.

On a GPU or TPU the defaults are trimmed to finish in under 10 minutes on one H100 (see
`ACCELERATOR_DEFAULTS`); the run's first lines and bench.md say what was left out, and explicit
--batches/--layers/--timeout run what they name.

Prints the tables and writes <out>/bench.json and <out>/bench.md, both rewritten after each group (a run that is
stopped keeps the groups it finished). Exit status: 1 when any case errored or timed out (named on stderr in one
line; its row says why, and the files are written), 2 for a bad flag or configuration, 6 for an --out that
cannot be written, 130 on Ctrl-C and 143 on SIGTERM (the workers stopped with it, the groups it finished kept and
the files saying it was stopped), 0 otherwise (a PyTorch baseline skipped because torch is not installed is not an
error).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from shardbench import config as config_lib
from shardbench import malloc, outdir
from shardbench.bench.matmul import jax_matmul
from shardbench.bench.tables import busy_host, render
from shardbench.errors import ConfigError, writable_dir
from shardbench.fields import list_refusal
from shardbench.parsing import override
from shardbench.presets import PRESETS, get_preset
from shardbench.subprocs import interrupted_code, start, terminated_as_interrupt

GROUPS = ("step", "batch", "layers", "remat", "pipeline", "alloc")
SCALING_WINDOWS = 3  # timed windows of the groups other than step
DEFAULT_GROUPS = GROUPS[:-1]  # the allocator comparison is opt-in: --groups alloc
BASELINES = ("seed-style", "pytorch-eager", "pytorch-compile", "pytorch-reduce-overhead")
DEFAULT_BASELINES = BASELINES[:3]  # torch.compile's reduce-overhead mode (CUDA graphs) is opt-in
CPU_DEFAULTS = {"batches": "64,256", "layers": "6,12,24", "timeout": 600.0, "compile_timeout": 600.0}
# On a GPU or TPU, what `shardbench bench` runs when --batches/--layers/--timeout are not given, sized to finish
# in under 10 minutes on one H100. Measured there with the CPU defaults (jax 0.11.2, torch 2.11): step group
# 153 s (float32 b128) + 139 s (bfloat16 b1024) = 292 s; batch group 65 s for batches 64,256 (about 33 s a
# case: worker start, a ~22 s compile, 1 warm-up step, 3 windows); layers group still compiling 24 layers
# unrolled when the run reached 550 s. With these defaults:
#   step 292 s (unchanged: the headline keeps its 3 warm-up steps and 5 windows)
#   batch 256 only (128 comes from the step group): ~33 s
#   layers 6,12, scan and unrolled, compile only: 4 x (~6 s start) + ~10 + ~22 + ~14 + ~45 s of compiling ~ 115 s,
#     each capped at `compile_timeout` (a compile past it becomes a "timed out" row; the rest still runs)
#   remat none/block/full: 3 x ~33 s ~ 100 s
#   pipeline: 5 s of host pipeline + start and the augmentation ~ 15 s
# ~ 555 s in all, under 600 s; at worst (each compile-only case hitting its 120 s cap) the layers group alone
# would take 8 min, so the cap is a guard against a hang, not part of the estimate.
ACCELERATOR_DEFAULTS = {"batches": "256", "layers": "6,12", "timeout": 600.0, "compile_timeout": 120.0}


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark the train step against baselines and the machine's matmul peak",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="vit-seed", choices=sorted(PRESETS),
                   help="model to benchmark (default: vit-seed)")
    p.add_argument("--batch-size", default=None,
                   help="batch of the step group, or a comma list paired with --dtype's (default: 128 on a CPU, "
                        "128,1024 on an accelerator)")
    p.add_argument("--dtype", default=None,
                   help=f"compute dtype of the step group and its matmul peak, or a comma list paired with "
                        f"--batch-size's, from {','.join(config_lib.DTYPES)} (default: float32 on a CPU, "
                        f"float32,bfloat16 on an accelerator)")
    p.add_argument("--groups", default=",".join(DEFAULT_GROUPS),
                   help=f"comma list of groups to run, from {','.join(GROUPS)} (default: "
                        f"{','.join(DEFAULT_GROUPS)})")
    p.add_argument("--baselines", default=",".join(DEFAULT_BASELINES),
                   help=f"baselines of the step group, from {','.join(BASELINES)} (default: "
                        f"{','.join(DEFAULT_BASELINES)}; pytorch-reduce-overhead is torch.compile with "
                        f"mode='reduce-overhead', CUDA graphs on a GPU)")
    p.add_argument("--peak-size", type=int, default=0,
                   help=f"side of the matmul-peak matrices (default 0: 4096 on CPU, 8192 on accelerators; at most "
                        f"{MAX_PEAK_SIZE:,})")
    p.add_argument("--pipeline-seconds", type=float, default=5.0, help="how long to run the host pipeline")
    p.add_argument("--batches", default=None,
                   help="batch sizes of the batch group (default: 64,256 on a CPU, 256 on an accelerator; the step "
                        "group gives --batch-size's row)")
    p.add_argument("--layers", default=None,
                   help="depths of the layers group (default: 6,12,24 on a CPU; 6,12 on an accelerator, where the "
                        "24-layer unrolled compile did not finish within a 10-minute run on an H100: pass --layers "
                        "6,12,24 to run it)")
    p.add_argument("--matmul-precision", default=None,
                   metavar="|".join(config_lib.MATMUL_PRECISIONS),
                   help="float32 matmul arithmetic of both sides (default: the preset's, 'default'): default or high "
                        "= TF32 on an NVIDIA GPU for JAX and PyTorch alike, highest = full float32; the CPU is "
                        "always full float32; the same as --set precision.matmul_precision=...")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps before the timed windows (default: 3; with 0 and windows sized by "
                        "--min-window-s, one step is still run to size them)")
    p.add_argument("--windows", type=int, default=5, help="timed windows per throughput case (median reported)")
    p.add_argument("--steps-per-window", type=int, default=0,
                   help="steps per timed window (default 0: enough steps for --min-window-s)")
    p.add_argument("--min-window-s", type=float, default=1.0,
                   help="with --steps-per-window 0, the shortest window in seconds (default: 1): untimed "
                        "windows, grown until one lasts that long, size the timed ones")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds allowed for any one answer of a worker (preparing, a window); a case past it "
                        "is stopped and becomes a 'timed out' row (default 0: 600 s, and 120 s for the "
                        "compile-only cases of the layers group on an accelerator)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="extra configuration for shardbench's step, e.g. --set model.unroll=1 (repeatable); not "
                        "precision.dtype or train.batch_size, which --dtype and --batch-size set")
    p.add_argument("--out", default="", help="output directory (default: runs/bench-<time>)")
    p.set_defaults(handler=run)


def _ints(text: str, flag: str, unique: bool = False) -> list[int]:
    """A comma list of whole numbers; each is then checked as the field it sets declares (`validate`)."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    refusal = list_refusal(flag, items, integers=True) if items else (
        f"{flag} '{text}': give one value or a comma list, e.g. 32,64,128")
    if refusal:
        raise ConfigError(refusal)
    values = [int(v) for v in items]
    if unique:
        _once(values, flag, text)
    return values


def _once(values: list[Any], flag: str, text: str) -> None:
    """Refuse a value named twice: its rows would be timed twice under one label, and the tables, which look
    cases up by label and setting, would mix them."""
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise ConfigError(f"{flag} '{text}' names {twice} twice: name each once")


# The largest matmul-peak side taken: three float32 matrices of 32,768^2 are 12 GiB, more than a laptop holds;
# a larger one failed only after every contender had run (out of memory, the peak's header '?').
MAX_PEAK_SIZE = 32768


def unlike_the_baselines(cfg: config_lib.Config) -> list[str]:
    """The options that make a train step other than the one the baselines run (seed-style nnx and PyTorch
    implement the seed's ViT with dropout, trained on crops and flips with plain cross-entropy), as flags:
    another tokenizer, pooling or attention; stochastic depth; mixing, policy augmentation or label smoothing."""
    m, d = cfg.model, cfg.data
    return [flag for flag, on in ((f"--model.stem {m.stem}", m.stem != "patch"),
                                  (f"--model.pool {m.pool}", m.pool != "cls"),
                                  ("--model.lsa", m.lsa),
                                  (f"--model.drop-path {m.drop_path:g}", m.drop_path > 0),
                                  (f"--data.mixup {d.mixup:g}", d.mixup > 0),
                                  (f"--data.cutmix {d.cutmix:g}", d.cutmix > 0),
                                  ("--data.trivial-augment", d.trivial_augment),
                                  ("--data.autoaugment", d.autoaugment),
                                  (f"--train.label-smoothing {cfg.train.label_smoothing:g}",
                                   cfg.train.label_smoothing > 0)) if on]


def _names(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    refusal = list_refusal(flag, names, choices=allowed) if names else (
        f"{flag} '{text}': give one value or a comma list of {', '.join(allowed)}")
    if refusal:
        raise ConfigError(refusal)
    _once(names, flag, text)
    return names


def _extra(pairs: list[str]) -> dict[str, str]:
    extra = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set '{pair}' is not SECTION.FIELD=VALUE, e.g. model.unroll=1")
        extra[key.strip().replace("-", "_")] = value
    return extra


def _seconds(args: argparse.Namespace) -> None:
    """Refuse a negative or non-finite --timeout, --min-window-s or --pipeline-seconds in one line: inf or nan
    would pass a plain `< 0` test and crash later (a selector timeout, a window of infinite steps), after the
    contenders were compiled. There is no "no limit": --timeout 0 is the default limit (600 s)."""
    for flag, value, zero_ok, allowed in (
            ("--timeout", args.timeout, True, "a finite number of seconds >= 0 (0: the default, 600 s; 120 s "
                                              "for compile-only cases on an accelerator; there is no unlimited)"),
            ("--min-window-s", args.min_window_s, True, "a finite number of seconds >= 0 (0: one step a window)"),
            ("--pipeline-seconds", args.pipeline_seconds, False, "a finite number of seconds > 0")):
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise ConfigError(f"{flag} {value:g}: give {allowed}")


# --set keys a group sets itself per setting, so a --set of them reaches some groups and not others (the step
# group's title would name one dtype and batch while the batch and remat groups ran another): each has a flag.
OWNED_KEYS = {"precision.dtype": "--dtype", "train.batch_size": "--batch-size (and --batches for the batch group)"}


def _refuse_owned(extra: dict[str, str]) -> None:
    for key, flag in OWNED_KEYS.items():
        if key in extra:
            raise ConfigError(f"--set {key}={extra[key]}: the step group sets {key} per setting; use {flag}")


Entry = dict[str, Any]
DEFAULT_SETTINGS = {"cpu": [("float32", 128)], "accelerator": [("float32", 128), ("bfloat16", 1024)]}


def settings(dtypes: str | None, batches: str | None, platform: str) -> list[tuple[str, int]]:
    """The step group's (dtype, batch) pairs: the two comma lists paired (a single value pairs with every
    value of the other list); where neither is given, the platform's default pairs; where one is not given, the
    default's first value for it. A list given empty is refused, not taken for the default."""
    default = DEFAULT_SETTINGS["cpu" if platform == "cpu" else "accelerator"]
    if dtypes is None and batches is None:
        return list(default)
    names = [d.strip() for d in dtypes.split(",") if d.strip()] if dtypes is not None else [default[0][0]]
    sizes = _ints(batches, "--batch-size") if batches is not None else [default[0][1]]
    refusal = list_refusal("--dtype", names, choices=config_lib.SPECS["precision.dtype"].choices) if names else (
        f"--dtype '{dtypes}': give one value or a comma list, e.g. float32,bfloat16")
    if refusal:
        raise ConfigError(refusal)
    if len(names) == 1:
        names = names * len(sizes)
    if len(sizes) == 1:
        sizes = sizes * len(names)
    if len(names) != len(sizes):
        raise ConfigError(f"--dtype '{dtypes}' and --batch-size '{batches}' pair up: give lists of the same "
                          f"length, or one value for either")
    pairs = list(zip(names, sizes))
    _once([setting_name(d, b) for d, b in pairs], "--dtype/--batch-size", f"{dtypes} / {batches}")
    return pairs


def setting_name(dtype: str, batch: int) -> str:
    return f"{dtype} b{batch}"


def plan(args: argparse.Namespace) -> list[tuple[str, list[Entry]]]:
    """Every group to run as (group, entries), checked before any process starts. Each entry is
    {label, case, kwargs, alloc}; a group's contenders are timed interleaved (see `run_pool`). `alloc` is the
    worker's allocator: "train" (as a CPU training process gets it: tuned on the CPU, glibc's default on an
    accelerator), "other" (glibc's default, as for compile-only work), or "tuned"/"default" to compare them."""
    groups = _names(args.groups, GROUPS, "--groups")
    baselines = _names(args.baselines, BASELINES, "--baselines")
    if not 0 <= args.peak_size <= MAX_PEAK_SIZE:
        raise ConfigError(f"--peak-size {args.peak_size}: give a side from 1 to {MAX_PEAK_SIZE:,} (0: the default, "
                          f"4096 on a CPU, 8192 on an accelerator)")
    for flag, value, least, what in (("--warmup", args.warmup, 0, ">= 0"), ("--windows", args.windows, 1, ">= 1"),
                                     ("--steps-per-window", args.steps_per_window, 0, ">= 0 (0: enough steps for "
                                                                                      "--min-window-s)")):
        if value < least:
            raise ConfigError(f"{flag} {value}: give a whole number {what}")
    _seconds(args)
    from shardbench.tasks import validate  # imports JAX: not at the top, which the CLI's parser loads

    if get_preset(args.preset).model.kind != "vit":
        vits = ", ".join(n for n, make in PRESETS.items() if make().model.kind == "vit")
        raise ConfigError(f"--preset {args.preset}: shardbench bench compares the ViT's train step with ViT "
                          f"baselines (seed-style nnx, PyTorch); choose one of {vits}, or compare other models "
                          f"with shardbench sweep")
    where = malloc.target_platform(os.environ)
    pairs = settings(args.dtype, args.batch_size, where)
    extra = _extra(args.set)
    _refuse_owned(extra)
    own = unlike_the_baselines(override(get_preset(args.preset), extra))
    if own and "step" in groups:
        seeds = ", ".join(n for n, make in PRESETS.items() if make().model.kind == "vit"
                          and not unlike_the_baselines(make()))
        raise ConfigError(f"--preset {args.preset}: the step group's baselines run the seed's ViT step (patch "
                          f"stem, class token, plain attention, no stochastic depth, crops and flips, plain "
                          f"cross-entropy), not this one ({', '.join(own)}): leave step out of --groups, or bench "
                          f"a preset with the seed's step ({seeds})")
    if "step" in groups and "seed-style" in baselines and where == "cpu" and any(
            d == "float16" for d, _ in pairs):
        raise ConfigError("--dtype float16: the seed-style baseline's matmuls cannot run in float16 on a CPU "
                          "(XLA's CPU dot takes bfloat16 and float32): use bfloat16, or leave seed-style out of "
                          "--baselines")
    if args.matmul_precision:
        if extra.get("precision.matmul_precision", args.matmul_precision) != args.matmul_precision:
            raise ConfigError(f"--matmul-precision {args.matmul_precision} and --set precision.matmul_precision="
                              f"{extra['precision.matmul_precision']} disagree: give one")
        extra["precision.matmul_precision"] = args.matmul_precision
    for dtype, batch in pairs:  # fail here, in one line, on a configuration that cannot run
        validate(override(get_preset(args.preset),
                                                {"precision.dtype": dtype, "train.batch_size": batch, **extra}))
    (args.dtype, args.batch_size), args.settings = pairs[0], pairs  # the other groups use the first setting
    base = {"precision.dtype": args.dtype, "train.batch_size": args.batch_size, **extra}
    args.matmul_precision = override(get_preset(args.preset), extra).precision.matmul_precision
    defaults = CPU_DEFAULTS if where == "cpu" else ACCELERATOR_DEFAULTS
    args.trimmed = trimmed(args, groups, where)
    batches = _ints(defaults["batches"] if args.batches is None else args.batches, "--batches", unique=True)
    depths = _ints(defaults["layers"] if args.layers is None else args.layers, "--layers", unique=True)
    # Each batch and depth as the run would take it, in one line now, not a case that errors (a batch of 3e9
    # allocated 8 TiB) after the others ran.
    for key, values, group, flag, field_flag in (
            ("train.batch_size", batches, "batch", "--batches", "--batch-size"),
            ("model.num_layers", depths, "layers", "--layers", "--model.num-layers")):
        for value in values if group in groups else ():
            try:
                validate(override(get_preset(args.preset), {**base, key: value}))
            except ConfigError as err:  # said of --batches' value, not of the --batch-size the user did not give
                said = str(err)
                said = f"each value{said[len(field_flag):]}" if said.startswith(f"{field_flag} ") else said
                raise ConfigError(f"{flag} {value}: {said}") from None
    compile_timeout = args.timeout or defaults["compile_timeout"]
    args.timeout = args.timeout or defaults["timeout"]

    def entry(label: str, case: str, alloc: str = "train", **kwargs: Any) -> Entry:
        return {"label": label, "case": case, "kwargs": kwargs, "alloc": alloc}

    def ours(label: str, **extra: Any) -> Entry:
        return entry(label, "shardbench", preset=args.preset, overrides={**base, **extra})

    planned: list[tuple[str, list[Entry]]] = []
    for dtype, batch in pairs if "step" in groups else []:
        here = {**base, "precision.dtype": dtype, "train.batch_size": batch}
        contenders = {
            "seed-style": entry("seed-style nnx", "seed-style", preset=args.preset, overrides=here),
            "pytorch-eager": entry("pytorch eager", "torch", preset=args.preset, overrides=here, compile=False),
            "pytorch-compile": entry("pytorch compile", "torch", preset=args.preset, overrides=here, compile=True),
            "pytorch-reduce-overhead": entry("pytorch reduce-overhead", "torch", preset=args.preset, overrides=here,
                                             compile=True, compile_mode="reduce-overhead"),
        }
        group = [entry("matmul peak", "matmul-peak", dtype=dtype, size=args.peak_size,
                       matmul_precision=args.matmul_precision),
                 entry("shardbench", "shardbench", preset=args.preset, overrides=here),
                 *(contenders[b] for b in baselines)]
        planned.append(("step", [{**e, "setting": setting_name(dtype, batch)} for e in group]))
    if "batch" in groups:
        planned.append(("batch", [ours(f"batch {b}", **{"train.batch_size": b}) for b in batches
                                  if b != args.batch_size or "step" not in groups]))
    if "layers" in groups:
        planned.append(("layers", [
            {**entry(f"{n} layer{'' if n == 1 else 's'} {how}", "compile", "other", preset=args.preset,
                     overrides={**base, "model.num_layers": n, "model.unroll": unroll}), "timeout": compile_timeout}
            for n in depths for unroll, how in ((1, "scan"), (n, "unrolled"))
        ]))
    if "remat" in groups:
        planned.append(("remat", [ours(f"remat {p}", **{"model.remat": p}) for p in config_lib.REMAT_POLICIES]))
    if "pipeline" in groups:
        planned.append(("pipeline", [entry("host pipeline", "pipeline", "other", images=50_000, batch=args.batch_size,
                                           seconds=args.pipeline_seconds, one_core=True)]))
    if "alloc" in groups:
        planned.append(("alloc", [
            {**ours("tuned allocator"), "alloc": "tuned"},
            {**ours("glibc default allocator"), "alloc": "default"},
        ]))
    return planned


def trimmed(args: argparse.Namespace, groups: list[str], where: str) -> list[str]:
    """What the accelerator defaults leave out of the CPU defaults, in words (none on a CPU, or where the
    flags were given): printed at the start of a run and noted in bench.md."""
    if where == "cpu":
        return []
    notes = []
    if "layers" in groups and args.layers is None:
        notes.append(f"layers {CPU_DEFAULTS['layers']} -> {ACCELERATOR_DEFAULTS['layers']}: the 24-layer compiles, "
                     f"whose unrolled one was still compiling when a run reached 550 s on an H100; pass --layers "
                     f"{CPU_DEFAULTS['layers']} to run them")
    if "batch" in groups and args.batches is None:
        notes.append(f"batches {CPU_DEFAULTS['batches']} -> {ACCELERATOR_DEFAULTS['batches']} (the step group "
                     f"gives its own batch's row); pass --batches {CPU_DEFAULTS['batches']} to run them")
    if "layers" in groups and not args.timeout:
        notes.append(f"each compile-only case of the layers group is stopped after "
                     f"{ACCELERATOR_DEFAULTS['compile_timeout']:.0f} s (a 'timed out' row); pass --timeout to "
                     f"change it")
    return notes


def matmul_summary(matmul_precision: str, where: str) -> str:
    """The float32 matmul arithmetic a run asks of both sides, in words, before any worker reports it."""
    jax_side = jax_matmul(matmul_precision, where)
    if where == "gpu":
        return f"float32 matmuls as {jax_side} on both sides (JAX and PyTorch on CUDA; float32 before Ampere)"
    if where == "cpu":
        return "float32 matmuls in full float32 on both sides (the CPU has nothing else)"
    return f"JAX's float32 matmuls as {jax_side}; PyTorch runs on the host CPU in full float32"


def worker_environ(alloc: str) -> dict[str, str]:
    """A worker's environment: this one, with the allocator `alloc` names (see `plan`)."""
    # Several workers may share one GPU. torch.compile's first step is timed cold, as JAX's is (the worker turns
    # JAX's persistent cache off): inductor's on-disk cache served it from an earlier run's compile.
    base = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    if alloc == "tuned":
        return malloc.tuned_environ(base, "compared with glibc's default")
    if alloc == "default":
        return malloc.default_environ(base, "compared with the tuned allocator")
    return malloc.child_environ(base, 0 if alloc == "train" else None)


class Worker:
    """A worker process and its line protocol; stderr goes to the benchmark's log."""

    def __init__(self, entry: Entry, log: IO[str], timeout: float) -> None:
        env = worker_environ(entry["alloc"])
        log.write(f"\n=== {entry['label']}: {entry['case']} {json.dumps(entry['kwargs'])}\n")
        log.flush()
        self.timeout = timeout
        # A worker dies with the bench (PR_SET_PDEATHSIG): one mid-compile or mid-window would otherwise run on
        # as an orphan, holding the CPU or the GPU, until its command ended.
        self.proc = start(
            [sys.executable, "-m", "shardbench.bench.worker", entry["case"], json.dumps(entry["kwargs"])],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
        )
        self.selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if not self.selector.select(self.timeout):
            self.proc.kill()  # a hung compile reads no "quit"
            self.close()
            return {"error": f"timed out: no answer within {self.timeout:.0f} s, stopped (see --timeout)"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return {"error": f"the worker exited ({code}) without an answer: see bench.log"}
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"error": "the worker is gone: see bench.log"}
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()
        self.selector.close()


def run_pool(entries: list[Entry], args: argparse.Namespace, log: IO[str], say: Callable[[str], None], *,
             warmup: int, windows: int) -> list[dict[str, Any]]:
    """Prepare every contender (one at a time, so compilations do not overlap), warm each up, then time
    `windows` rounds in which every contender runs one window, in an order rotated each round.
    One-shot cases just report. Returns one result per entry."""
    results: list[dict[str, Any]] = [{} for _ in entries]
    workers: dict[int, Worker] = {}
    try:
        for i, entry in enumerate(entries):
            say(f"  {entry['label']}: preparing ...")
            worker = workers[i] = Worker(entry, log, entry.get("timeout", args.timeout))  # stopped with the rest
            answer = worker.read()
            if "ready" in answer:
                results[i] = {**answer["ready"], "rates": []}
                continue
            workers.pop(i).close()
            results[i] = answer.get("result", answer)
            say(f"  {entry['label']}: {_note(results[i])}")
        spw: dict[int, int] = {}
        for i, worker in list(workers.items()):
            # Windows sized by time need one step's time after the first (whose time holds the compilation):
            # with no warm-up, one step is still run to size them.
            probe = warmup or (0 if args.steps_per_window else 1)
            answer = worker.ask(f"steps {probe}") if probe else {"seconds": None}
            if "error" in answer:
                results[i] = _failed(results[i], answer)
                worker.close()
                del workers[i]
                continue
            per_step = answer["seconds"] / probe if probe else 1.0
            sized = args.steps_per_window or _sized_window(worker, args.min_window_s, per_step)
            if isinstance(sized, dict):
                results[i] = _failed(results[i], sized)
                worker.close()
                del workers[i]
                continue
            spw[i] = sized
        for round_ in range(windows if workers else 0):
            order = list(workers)
            order = order[round_ % len(order):] + order[:round_ % len(order)] if order else order
            for i in order:
                answer = workers[i].ask(f"steps {spw[i]}")
                if "error" in answer:
                    results[i] = _failed(results[i], answer)
                    workers.pop(i).close()
                    continue
                results[i]["rates"].append(results[i]["work_per_step"] * spw[i] / answer["seconds"])
                results[i]["steps_per_window"] = spw[i]
            say(f"  round {round_ + 1}/{windows}: " + ", ".join(
                f"{entries[i]['label']} {results[i]['rates'][-1]:,.4g}" for i in order if i in workers))
        for i, worker in workers.items():
            results[i]["peak_bytes"] = worker.ask("memory").get("peak_bytes")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the workers now, not at the end of their compile or window
        for worker in workers.values():
            worker.proc.kill()
            worker.proc.wait()
        raise
    finally:
        for worker in workers.values():
            worker.close()
    return results


SIZING_TRIES = 4  # untimed windows at most, each grown from the one before, to reach --min-window-s


def _sized_window(worker: Worker, min_window_s: float, per_step: float) -> int | dict[str, Any]:
    """The steps of a window that lasts at least `min_window_s`, found as `timeit.autorange` finds its count: a
    first guess from the warm-up's time per step (`per_step`), then untimed windows, each grown by what the one
    before fell short, until one lasts long enough. The warm-up's steps can be far slower than the steady ones
    (first calls, a recompilation), which sized windows of one step. A worker's error is returned as it came."""
    steps = max(1, math.ceil(min_window_s / max(per_step, 1e-9)))
    if min_window_s <= 0:
        return steps
    for _ in range(SIZING_TRIES):
        answer = worker.ask(f"steps {steps}")
        if "error" in answer:
            return answer
        if answer["seconds"] >= min_window_s:
            break
        steps = max(steps + 1, math.ceil(steps * min_window_s / max(answer["seconds"], 1e-9)))
    return steps


def _failed(result: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """A contender that failed part-way: its error, and the windows it did time kept apart as `partial_rates`,
    so that no table takes them for a measurement (a median of 2 of 5 windows, a ratio, an MFU)."""
    kept = {k: v for k, v in result.items() if k != "rates"}
    return {**kept, **({"partial_rates": result["rates"]} if result.get("rates") else {}), **answer}


def _note(result: dict[str, Any]) -> str:
    return str(result.get("error") or result.get("skipped") or "done")


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "system": platform.platform(),
                            "cpu_count": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import jax

    info["jax"] = jax.__version__
    info["allocator"] = "step workers: " + malloc.describe(worker_environ("train"))
    with contextlib.suppress(OSError, AttributeError):  # no load average on this platform
        info["load_average"] = round(os.getloadavg()[0], 2)  # the last minute's, before any contender started
    return info


def claim_out(out: str | None) -> Path:
    """--out, else runs/bench-<time>, made now (`outdir.claim`): a folder no other bench shares."""
    return Path(out) if out else outdir.claim(outdir.stamped("bench")).path


def run(args: argparse.Namespace) -> int:
    """Run every planned group; bench.json and bench.md are rewritten after each group, so a run that is stopped
    keeps the groups it finished. Exit status 1 (after writing both files) when any contender errored or timed
    out, named on stderr in one line; 0 otherwise (a baseline skipped for a missing torch is not an error)."""
    planned = plan(args)
    where = malloc.target_platform(os.environ)
    out = claim_out(args.out)
    writable_dir(out, "--out", create=False)
    if (out / "bench.json").exists():  # an earlier bench's tables beside this one's log would read as this run's
        raise ConfigError(f"--out {out} already holds a bench (bench.json): choose another --out, or remove it")
    out.mkdir(parents=True, exist_ok=True)
    args.groups_planned = [group for group, _ in planned]
    cases: list[dict[str, Any]] = []
    started = time.perf_counter()
    print(f"matmul precision {args.matmul_precision}: {matmul_summary(args.matmul_precision, where)}", flush=True)
    for note in args.trimmed:
        print(f"trimmed on an accelerator: {note}", flush=True)
    info = machine()
    busy = busy_host(info)
    if busy:
        print(f"warning: {busy}", file=sys.stderr, flush=True)
    with (out / "bench.log").open("w") as log, terminated_as_interrupt():
        try:
            run_groups(planned, args, log, cases, out, info, started)
        except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: the workers are stopped (`run_pool`); say what ran
            how = "SIGTERM" if interrupted_code(err) == 143 else "Ctrl-C"
            write_files(out, bench_record(args, info, cases, started, stopped=how))
            print(f"shardbench bench: stopped ({how}); {out / 'bench.json'} and bench.md hold the groups that "
                  f"finished", file=sys.stderr, flush=True)
            return interrupted_code(err)
    record = bench_record(args, info, cases, started)
    text = write_files(out, record)
    print("\n" + text)
    print(f"\nshardbench bench: wrote {out / 'bench.json'} and {out / 'bench.md'} ({record['total_s']:.0f} s)")
    failed = failed_contenders(cases)
    if failed:
        print(f"shardbench bench: {len(failed)} of {len(cases)} case(s) errored or timed out: {'; '.join(failed)}"
              [:1000], file=sys.stderr, flush=True)
        return 1
    return 0


def run_groups(planned: list[tuple[str, list[Entry]]], args: argparse.Namespace, log: IO[str],
               cases: list[dict[str, Any]], out: Path, info: dict[str, Any], started: float) -> None:
    """Run each planned group in turn, adding its results to `cases` and rewriting the files after it."""
    for group, entries in planned:
        setting = entries[0].get("setting") if entries else None
        print(f"{group}{f' ({setting})' if setting else ''}: {len(entries)} case(s)", flush=True)
        t0 = time.perf_counter()
        # The headline group gets the full timing; the scaling groups compare shardbench with itself.
        full = group == "step"
        results = run_pool(entries, args, log, lambda line: print(line, flush=True),
                           warmup=args.warmup if full else min(args.warmup, 1),
                           windows=args.windows if full else min(args.windows, SCALING_WINDOWS))
        for entry, result in zip(entries, results):
            cases.append({"group": group, **{k: entry[k] for k in ("label", "case", "kwargs")},
                          "setting": entry.get("setting"), "result": result})
        write_files(out, bench_record(args, info, cases, started))
        print(f"{group}: {time.perf_counter() - t0:.0f} s", flush=True)


def bench_record(args: argparse.Namespace, info: dict[str, Any], cases: list[dict[str, Any]],
                 started: float, stopped: str = "") -> dict[str, Any]:
    """bench.json's content; `groups` are the groups planned, and `finished` says whether every one ran to its
    end (rewritten after each group, so a file read mid-run or after a stop says so), `stopped` by what."""
    ran = {c["group"] for c in cases}
    return {"machine": info, "preset": args.preset, "dtype": args.dtype, "batch_size": args.batch_size,
            "groups": args.groups_planned, "finished": not stopped and all(g in ran for g in args.groups_planned),
            "stopped": stopped or None,
            "settings": [setting_name(d, b) for d, b in args.settings],
            "matmul_precision": args.matmul_precision, "trimmed": args.trimmed,
            "timing": {"warmup": args.warmup, "windows": args.windows, "steps_per_window": args.steps_per_window,
                       "min_window_s": args.min_window_s},
            "total_s": time.perf_counter() - started, "cases": cases}


def write_files(out: Path, record: dict[str, Any]) -> str:
    """bench.json (atomically) and bench.md from `record`; returns the markdown."""
    text = render(record)
    tmp = out / "bench.json.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, out / "bench.json")
    (out / "bench.md").write_text(text + "\n")
    return text


def failed_contenders(cases: list[dict[str, Any]]) -> list[str]:
    """`label (setting): error` for each case whose result is an error (a timeout is one)."""
    return [f"{c['label']} ({c['setting'] or c['group']}): {c['result']['error']}" for c in cases
            if "error" in c["result"]]
