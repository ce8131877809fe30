"""The GPU suite: every GPU experiment of shardbench as one command per part, each under 9 minutes on one H100.

    python benchmarks/gpu_suite.py --part PART --out DIR [--cases NAME,...] [--budget-s 510]
    python benchmarks/gpu_suite.py --part accuracy --recipe vit-cifar|all --out DIR [--data-path TAR]
    python benchmarks/gpu_suite.py --smoke --out DIR          # every part's code path on a CPU, tiny sizes
    python benchmarks/gpu_suite.py --collect DIR --to benchmarks/results-h100.md

Parts (`--part all` runs them one after another; on a GPU give each its own command):
  bench         `shardbench bench --groups step`: shardbench, seed-style nnx, PyTorch eager and torch.compile at
                float32 b128 (TF32 on both sides) and bfloat16 b1024
  compile       cold and cached compile time and step time, one process each: vit-seed at b128/1024/4096 in
                float32 and bfloat16, a second batch size with a warm cache, lm-seed, mlp-small, --spmd shard_map
  autotune      what the GPU autotune level and its cache do to a cold compile and to a second batch size
  variants-bf16 every speed switch against the baseline at bfloat16 b1024 (one process each)
  variants-f32  the same at float32 b128
  profile       the top 30 GPU kernels of the bfloat16 b1024 step, for the baseline and the fastest variant
  plan          a small vit-seed batch x dtype sweep, then `shardbench plan --validate` on it
  accuracy      one recipe (or all) trained on the real CIFAR-10 in bfloat16: test accuracy, time, curve

Each part writes DIR/PART.json and DIR/PART.md after every case, so a part that is cut off keeps what it
finished. A case whose estimated time no longer fits the part's budget is not started: its row says "not run:
budget" with the command that runs it (`--cases`; such a run replaces those rows and keeps the others). A case
started with L seconds of the budget left may run L + GRACE_S (and at most --case-timeout-s), so a part ends within
9 minutes. Every case is a real `shardbench` process; the figures come from the run records it writes (median
step time, compile time, peak memory, losses). Without --smoke the cases run with JAX_PLATFORMS=cuda: the suite
stops in one line where JAX cannot use a GPU, and a case whose record says it ran elsewhere has failed.

Exit status: 1 when any case this run ended failed or timed out (each is named on stderr; the parts' files are
still written), or when JAX has no GPU (checked before anything is written); 130 on Ctrl-C and 143 on SIGTERM,
which stop the running case's processes too and leave the part's page marked cut off; 0 otherwise. A refusal
(exit 2 with a message the case lists as its refusal: the device cannot run that configuration) and a case not
run for the budget are not failures; an exit 2 with any other message (a wrong flag, a missing path) is.
Exit 2, in one line and before anything is written: --cases naming a case the part does not have (or with --part
all), and --collect of a folder holding no part's file.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("bench", "compile", "autotune", "variants-bf16", "variants-f32", "profile", "plan", "accuracy")
PART_LIMIT_S = 540.0  # a command of more than ~9 minutes is at risk on the reference GPU machine
BUDGET_S = 480.0  # a part starts a case only while the case's estimate fits in what is left of this
# A case started with `left` seconds of the budget may run `left + GRACE_S` (a case a little over its estimate is
# not killed): the budget, the grace and the part's own overhead (start, the GPU check, the last case's files,
# ~20 s) stay under PART_LIMIT_S.
GRACE_S = 40.0
# First losses of a variant against the baseline's, relative. On a GPU, float32 matmuls are TF32 (10-bit
# mantissa, unit roundoff 2^-11) unless --matmul-precision highest; bfloat16 has an 8-bit one (2^-8). The
# bfloat16 tolerance scaled by the ratio of the two roundoffs (1/8) gives 3.75e-3 for TF32: 4e-3. Inferred, not
# measured on a GPU: each row records its largest relative difference (`loss_rel_diff`) to recalibrate it.
LOSS_RTOL = {"float32": 4e-3, "bfloat16": 3e-2}
LOSSES_COMPARED = 5
FAILED = ("failed", "timed out")  # how a case's status starts when it makes the suite exit 1
# How `shardbench bench`'s last line (stderr) starts and says that a contender failed, when it exits 1 after
# writing all its files (bench_cmd.run); an exit 1 without it is a crash.
BENCH_SAYS, BENCH_CONTENDERS_FAILED = "shardbench bench: ", "errored or timed out"
CIFAR_CANDIDATES = ("../shared/data/cifar10-jpeg.tar.gz", "shared/data/cifar10-jpeg.tar.gz",
                    "data/cifar10-jpeg.tar.gz")


@dataclass
class Case:
    """One process of a part: a `shardbench` command line and what the budget should expect of it."""

    name: str
    argv: list[str]
    est_s: float  # on one H100, from the 2026-11-24 measurements: compile + steps + process start
    note: str = ""
    same_model: bool = True  # whether its losses must agree with those of `compare_to`
    kind: str = "train"  # train | bench | sweep | command
    # What an exit status 2 of this case may say to count as a refusal (the device cannot run this configuration);
    # an exit 2 with any other message (a wrong flag, a missing path) is a failure.
    refusals: tuple[str, ...] = ()
    # The case whose run fills the cache this one reads: run without it, this case would compile cold and measure
    # nothing of a warm cache, so --cases and a "not run: budget" command bring it along (see `selected`).
    needs: str = ""
    # The case whose first losses this one's must match (where `same_model`); None for a reference itself. Like
    # `needs`, --cases and a "not run: budget" command bring it along.
    compare_to: str | None = "baseline"


@dataclass
class Sizes:
    """What a case trains: the GPU's sizes, or tiny ones on a CPU for --smoke."""

    smoke: bool

    def preset(self, name: str) -> str:
        return {"vit-seed": "vit-tiny", "lm-seed": "lm-tiny"}.get(name, name) if self.smoke else name

    def batch(self, batch: int) -> int:
        return max(4, batch // 64) if self.smoke else batch

    def steps(self, steps: int) -> int:
        return 6 if self.smoke else steps

    def seq_len(self, tokens: int) -> int:
        return 64 if self.smoke else tokens

    def data(self) -> list[str]:
        return ["--data.synthetic-train", "512", "--data.synthetic-test", "64"] if self.smoke else []

    def model(self, preset: str) -> list[str]:
        """--smoke: vit-tiny narrowed to one block of width 32 (compiling is what a smoke case spends its time on;
        every switch the parts compare applies to it as to the full model)."""
        return [*SMOKE_VIT] if self.smoke and self.preset(preset) == "vit-tiny" else []


# --smoke's ViT: the code paths of vit-tiny's (patch stem, class token, attention, MLP) at a third of its compile.
# XLA:CPU's quickest code generation for --smoke's tiny programs: LLVM at -O0, fusions by the older emitters, and
# the module compiled in one piece (the tests' flags, tests/conftest.py).
SMOKE_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                   "--xla_cpu_parallel_codegen_split_count=1")
SMOKE_VIT = ("--model.embed-dim", "32", "--model.mlp-dim", "64", "--model.num-layers", "1", "--model.num-heads", "2")


def train_case(sizes: Sizes, name: str, preset: str, dtype: str, batch: int, *extra: str, steps: int = 40,
               est_s: float = 30.0, note: str = "", same_model: bool = True, cache: str = "off",
               refusals: tuple[str, ...] = (), needs: str = "", compare_to: str | None = "baseline") -> Case:
    argv = ["train", "--preset", sizes.preset(preset), "--dtype", dtype, "--batch-size", str(sizes.batch(batch)),
            "--steps", str(sizes.steps(steps)), "--no-train.eval", "--no-train.progress", "--train.log-every", "1",
            "--train.checkpoint-every", "0", "--train.compile-cache", cache, *sizes.data(), *sizes.model(preset),
            *extra]
    if sizes.preset(preset).startswith(("vit", "lm")) and "--data" not in extra:
        argv += ["--data", "synthetic" if sizes.preset(preset).startswith("vit") else "tokens-uniform"]
    if sizes.smoke:
        argv += ["--devices", "1", "--mesh", "none"]
    return Case(name, argv, est_s, note, same_model, refusals=refusals, needs=needs,
                compare_to=None if name == "baseline" else compare_to)


# Every speed switch the variants parts compare: (name, flags, same model as the baseline?, note).
SWITCHES: list[tuple[str, tuple[str, ...], bool, str]] = [
    ("attention einsum", ("--model.attention", "einsum"), True, "two einsums, float32 scores"),
    ("attention fused", ("--model.attention", "fused"), True,
     "jax.nn.dot_product_attention, XLA's composition (auto's choice on GPUs until 2026-11-26)"),
    ("attention cudnn", ("--model.attention", "cudnn"), True,
     "cuDNN's fused kernel on a padded sequence: what auto runs for the vit on an NVIDIA GPU in 16 bits, so at "
     "bfloat16 the baseline's twin"),
    ("attention cudnn pad 64", ("--model.attention", "cudnn", "--model.attention-pad-multiple", "64"), True,
     "cuDNN on a sequence padded to a multiple of 64"),
    ("qkv fused", ("--model.qkv-layout", "fused"), True,
     "one projection to [3,batch,seq,heads,dim], whose backward transposes [3,heads,dim,batch,seq]: auto's choice "
     "until 2026-11-27"),
    ("qkv split", ("--model.qkv-layout", "split"), True, "three projections: no [3,heads,dim,batch,seq] transpose"),
    ("qkv seq-major", ("--model.qkv-layout", "seq-major"), True,
     "one projection with a sequence-major output: what auto runs for the vit under cuDNN's attention, so at "
     "bfloat16 the baseline's twin"),
    ("pool mean", ("--model.pool", "mean"), False, "a different model: mean of 64 tokens, no class token"),
    ("adam mu bfloat16", ("--optim.mu-dtype", "bfloat16"), False, "the optimizer's first moment in bfloat16"),
    ("param bfloat16", ("--param-dtype", "bfloat16"), False, "parameters stored in bfloat16"),
    ("command buffers", ("--train.xla-presets", "command-buffers"), True, "CUDA graphs"),
    ("no command buffers", ("--train.xla-presets", "no-command-buffers"), True, "every kernel launched alone"),
    ("cudnn layernorm", ("--train.xla-presets", "cudnn-layernorm"), True, "LayerNorm by cuDNN"),
    ("cudnn gemm fusion", ("--train.xla-presets", "cudnn-gemm-fusion"), True, "GEMM fusions by cuDNN"),
    ("no triton gemm", ("--train.xla-presets", "no-triton-gemm"), True, "cuBLAS GEMMs only"),
]
# Switches that are the baseline itself at float32: there auto runs XLA's attention, and so the fused projection.
BF16_ONLY = ("qkv fused",)
# The one-line refusals (exit 2) a switch may answer with where the device or the dtype cannot run it.
CUDNN_REFUSALS = ("--model.attention cudnn needs ", "--model.attention cudnn (an NVIDIA GPU's fused attention) needs ",
                  "--model.attention cudnn takes a head dim")
XLA_REFUSALS = ("this jaxlib refuses",)


def refusals_of(flags: tuple[str, ...]) -> tuple[str, ...]:
    return ((CUDNN_REFUSALS if "cudnn" in flags else ())
            + (XLA_REFUSALS if "--train.xla-presets" in flags else ()))


# --smoke: the switches whose code paths differ (a refusal, a layout, an XLA preset); variants-f32 runs only
# the refusal, which says something else at float32, as its other code paths are variants-bf16's.
SMOKE_SWITCHES = {"variants-bf16": ("attention cudnn", "qkv split", "cudnn layernorm"),
                  "variants-f32": ("attention cudnn",)}


def cases_for(part: str, sizes: Sizes, args: argparse.Namespace, out: Path, work: Path) -> list[Case]:
    """The cases of `part`, in the order they run; `out` holds the results, `work` the runs and caches."""
    t = functools_partial(train_case, sizes)
    if part == "bench":
        argv = ["bench", "--groups", "step", "--out", str(work / "bench-raw")]
        if sizes.smoke:  # PyTorch eager where torch is installed (`make test` installs the CPU build)
            # Both of the GPU run's dtypes, at one tiny batch, in two windows: the tests check bench's own
            # records (a setting per dtype, a rate per window) on this run.
            baselines = "seed-style,pytorch-eager" if importlib.util.find_spec("torch") else "seed-style"
            argv += ["--preset", "vit-tiny", "--dtype", "float32,bfloat16", "--batch-size", "16", "--baselines",
                     baselines, "--warmup", "1", "--windows", "2", "--steps-per-window", "1", "--peak-size", "256",
                     *(f"--set=model.{flag[8:].replace('-', '_')}={value}"
                       for flag, value in zip(SMOKE_VIT[::2], SMOKE_VIT[1::2]))]
        else:  # and torch.compile's reduce-overhead mode (CUDA graphs) beside its default
            argv += ["--baselines", "seed-style,pytorch-eager,pytorch-compile,pytorch-reduce-overhead"]
        # 292 s measured for the step group with the other contenders (H100, 2026-11-24); the reduce-overhead
        # contender's compile and windows are inferred at ~40 s a setting
        return [Case("bench step group", argv, 380.0, "float32 b128 and bfloat16 b1024", kind="bench")]
    if part == "compile":
        cache = str(work / "compile-cache")
        cold = [t(f"vit-seed {d} b{b} cold", "vit-seed", d, b, est_s=45.0 if d == "float32" else 32.0)
                for d in ("float32", "bfloat16") for b in (128, 1024, 4096)]
        filling = "vit-seed bfloat16 b1024 filling a cache"
        warm = [t(filling, "vit-seed", "bfloat16", 1024, cache=cache, est_s=32.0),
                t("the same program again", "vit-seed", "bfloat16", 1024, cache=cache, est_s=12.0, needs=filling),
                t("bfloat16 b512 with that cache (a second batch size)", "vit-seed", "bfloat16", 512, cache=cache,
                  est_s=30.0, needs=filling),
                t("lm-seed float32 cold", "lm-seed", "float32", 32, est_s=35.0),
                t("mlp-small float32 cold", "mlp-small", "float32", 1024, est_s=15.0),
                t("vit-seed bfloat16 b1024 shard_map cold", "vit-seed", "bfloat16", 1024, "--spmd", "shard_map",
                  est_s=32.0)]
        return cold[:1] + warm[:3] if sizes.smoke else cold + warm
    if part == "autotune":
        cache = str(work / "autotune-cache")
        rows = [t("autotune 4 (default) cold", "vit-seed", "bfloat16", 1024, est_s=32.0)]
        rows += [t(f"autotune {level} cold", "vit-seed", "bfloat16", 1024, "--train.xla-presets",
                   f"autotune-{level}", est_s=28.0, refusals=XLA_REFUSALS) for level in (0, 2)]
        rows += [t("no triton gemm cold", "vit-seed", "bfloat16", 1024, "--train.xla-presets", "no-triton-gemm",
                   est_s=28.0, refusals=XLA_REFUSALS)]
        for level in (4, 0):
            preset = ("--train.xla-presets", f"autotune-{level}")
            rows += [t(f"autotune {level}: b1024 filling a cache", "vit-seed", "bfloat16", 1024, *preset,
                       cache=f"{cache}-{level}", est_s=32.0, refusals=XLA_REFUSALS),
                     t(f"autotune {level}: b512 from that cache", "vit-seed", "bfloat16", 512, *preset,
                       cache=f"{cache}-{level}", est_s=30.0, refusals=XLA_REFUSALS,
                       needs=f"autotune {level}: b1024 filling a cache")]
        # --smoke: one autotune preset, cold (the default level's cold compile is the compile part's)
        return rows[1:2] if sizes.smoke else rows
    if part in ("variants-bf16", "variants-f32"):
        dtype, batch = ("bfloat16", 1024) if part == "variants-bf16" else ("float32", 128)
        rows = [t("baseline", "vit-seed", dtype, batch, est_s=variant_estimate_s(dtype, ()),
                  note="as shipped (--model.attention auto)")]
        for name, flags, same, note in SWITCHES:
            if sizes.smoke and name not in SMOKE_SWITCHES[part]:
                continue
            if name in BF16_ONLY and dtype != "bfloat16":
                continue
            rows.append(t(name, "vit-seed", dtype, batch, *flags, est_s=variant_estimate_s(dtype, flags), note=note,
                          same_model=same, refusals=refusals_of(flags)))
        if part == "variants-bf16":  # the LM under XLA's composition and under cuDNN's attention (auto's choice
            # since 2026-11-27), with each q/k/v layout auto may pick; after the ViT's attention switches, before the
            # layouts and XLA presets
            lm = ("--model.seq-len", str(sizes.seq_len(LM_SEQ)))
            at = 1 + max(i for i, row in enumerate(rows) if row.name.startswith("attention"))
            rows[at:at] = [
                t(LM_FUSED, "lm-seed", dtype, LM_BATCH, *lm, "--model.attention", "fused", est_s=LM_EST_S,
                  compare_to=None, note=f"lm-seed at sequence {LM_SEQ}: XLA's composition, auto's choice for the LM "
                                        f"until 2026-11-27; the reference of the cases below"),
                t(LM_CUDNN, "lm-seed", dtype, LM_BATCH, *lm, "--model.attention", "cudnn", est_s=LM_EST_S,
                  compare_to=LM_FUSED, refusals=CUDNN_REFUSALS,
                  note="the same LM with cuDNN's causal attention: auto's choice for the LM on an NVIDIA GPU in 16 "
                       "bits"),
                t(LM_SEQ_MAJOR, "lm-seed", dtype, LM_BATCH, *lm, "--model.attention", "cudnn", "--model.qkv-layout",
                  "seq-major", est_s=LM_EST_S, compare_to=LM_FUSED, refusals=CUDNN_REFUSALS,
                  note="cuDNN's attention with the seq-major q/k/v projection: whether auto should pick it for the "
                       "LM, as it does for the vit")]
        return rows
    if part == "profile":
        best = args.variant or best_variant(out / "variants-bf16.json")
        flags = dict((name, flags) for name, flags, _, _ in SWITCHES).get(best, ()) if best else ()
        trace = ("--profile", "--train.profile-skip", "4" if sizes.smoke else "20", "--train.profile-steps",
                 "2" if sizes.smoke else "5")
        rows = [t("baseline", "vit-seed", "bfloat16", 1024, *trace, steps=40, est_s=40.0)]
        if best and best != "baseline":
            rows.append(t(best, "vit-seed", "bfloat16", 1024, *flags, *trace, steps=40, est_s=40.0,
                          note="the fastest variant of variants-bf16 whose losses agree"))
        return rows
    if part == "plan":
        batches, dtypes = ("16", "32") if sizes.smoke else ("512", "2048"), ("float32", "bfloat16")
        base = ["--preset", sizes.preset("vit-seed"), "--steps", str(sizes.steps(40)), "--no-train.eval",
                "--no-train.progress", "--train.checkpoint-every", "0", "--data", "synthetic", *sizes.data(),
                *sizes.model("vit-seed")]
        if sizes.smoke:
            base += ["--devices", "1", "--mesh", "none"]
            dtypes = ("float32",)
        sweep = ["sweep", *base, "--batch-size", ",".join(batches), "--dtype", ",".join(dtypes),
                 "--out", str(work / "plan-sweep")]
        return [Case("sweep", sweep, 45.0 * len(batches) * len(dtypes), "runs the planner never saw", kind="sweep"),
                Case("plan --validate", ["plan", "--validate", str(work / "plan-sweep")], 150.0, kind="command",
                     needs="sweep")]
    if part == "accuracy":
        return accuracy_cases(sizes, args)
    raise ValueError(part)


# The LM cases of variants-bf16: lm-seed (4 layers of width 256, 8 heads of 32) at a sequence long enough for its
# attention to weigh (lm-seed's own 64 tokens leave a 2 ms step). The estimate: lm-seed's compile on one H100 took
# 13.7 s in bfloat16 and 23.5 s in float32 (batch 32, sequence 64: benchmarks/data/h100-2026-11-24/runs/), and a
# vit-seed bfloat16 case took 18-30 s in all (2026-11-26, suite.log); 40 s leaves a margin for the longer
# sequence's steps.
LM_SEQ, LM_BATCH, LM_EST_S = 1024, 32, 40.0
LM_FUSED, LM_CUDNN, LM_SEQ_MAJOR = "lm seq 1024 fused", "lm seq 1024 cudnn", "lm seq 1024 cudnn seq-major"


# One vit-seed process of 40 steps on one H100 (2026-11-24, the reference machine's GPU records, `runs/vit-seed/sweep.db`
# wall_s): bfloat16 28.3-29.1 s (compile 16.5-20.4 s); float32 43.6-44.9 s (compile 25.7 s with the cache off,
# 30.8-36.0 s in sweeps), so 48 s covers the slowest float32 compile measured. cuDNN attention at float32 is
# refused before compiling: the process start and JAX's import only.
VARIANT_EST_S = {"bfloat16": 30.0, "float32": 48.0}
REFUSED_EARLY_EST_S = 15.0


def variant_estimate_s(dtype: str, flags: tuple[str, ...]) -> float:
    if dtype == "float32" and "cudnn" in flags:
        return REFUSED_EARLY_EST_S
    return VARIANT_EST_S[dtype]


def functools_partial(fn: Callable[..., Case], sizes: Sizes) -> Callable[..., Case]:
    return lambda *a, **k: fn(sizes, *a, **k)


def recipes() -> list[str]:
    """The CIFAR-10 recipe presets: vit-cifar and its candidates."""
    sys.path.insert(0, str(ROOT / "src"))
    from shardbench.presets import PRESETS

    return [name for name in PRESETS if name.startswith("vit-cifar")]


def accuracy_cases(sizes: Sizes, args: argparse.Namespace) -> list[Case]:
    names = recipes() if args.recipe == "all" else [args.recipe]
    unknown = [n for n in names if n not in recipes()]
    if unknown:
        raise SystemExit(f"gpu_suite: unknown --recipe '{unknown[0]}': choose from {', '.join(recipes())} or all")
    if sizes.smoke:
        # a batch of 24: a multiple of every recipe's --data.repeat-augment (vit-cifar-spt's 3)
        data = ["--data", "synthetic", *sizes.data(), "--steps", "4", "--batch-size", "24", "--devices", "1",
                "--mesh", "none", *SMOKE_VIT]
    else:
        path = args.data_path or next((p for p in CIFAR_CANDIDATES if (ROOT / p).exists()), "")
        if not path:
            raise SystemExit(f"gpu_suite: the accuracy part needs the CIFAR-10 image tar: pass --data-path "
                             f"(looked for {', '.join(CIFAR_CANDIDATES)})")
        tar = Path(path).resolve() if Path(path).exists() else ROOT / path
        data = ["--data", f"imagefolder:{os.path.relpath(tar, ROOT)}"]  # the cases run in the repository's root
    # The compilation cache off, as for the compile part's cold cases: a compile time read from a user's cache
    # would pass for a cold one, and the suite leaves nothing in ~/.cache.
    return [Case(f"recipe {name}", ["train", "--preset", name, "--dtype", "bfloat16", "--no-train.progress",
                                    "--train.checkpoint-every", "0", "--train.compile-cache", "off", *data],
                 recipe_estimate_s(name), kind="train", compare_to=None)
            for name in names]


# vit-cifar on one H100 in bfloat16 (2026-11-24): 8,700 steps of 512 images in 152 s of training. A recipe's
# estimate is the larger of two per-step figures, times its steps (repeated images included: vit-cifar-spt's batch
# of 384 is 128 distinct images x 3), plus compile, evaluation and start:
# - its training FLOPs at that measured FLOP rate (vit-cifar-spt's image costs 3.7x fewer FLOPs, vit-cifar-cct's
#   1.66x more);
# - a floor: vit-cifar's measured step less its attention, scaled by FLOPs, plus the attention scaled by
#   batch x heads x layers x tokens from vit-seed's measured attention: 1.28 ms a layer forward + backward at
#   batch 1024, 8 heads, 65 tokens in XLA's fused composition, 1.39 ms as two einsums with float32 scores (31.27
#   against 30.6 ms a step over 6 layers), which LSA (vit-cifar-spt) always uses. At these shapes the attention is
#   bound by the memory traffic of its per-head tensors, not by FLOPs, so a narrow model with many heads and
#   layers (vit-cifar-spt: 12 heads of 16, 9 layers) gains far less than its FLOPs say. Linear in the tokens, it
#   is a lower bound for a longer sequence (vit-cifar-cct: 256 tokens), whose score tensor grows as its square.
#   Inferred from the records, not measured on these presets.
RECIPE_IMAGES_PER_S = 8700 * 512 / 152
RECIPE_OVERHEAD_S = 40.0
CIFAR_TRAIN_IMAGES = 45_000  # 50,000 less the 10% held out for validation
ATTENTION_S_PER_LAYER = {"fused": 1.28e-3, "einsum": 1.39e-3}  # vit-seed bf16 b1024, 8 heads, 65 tokens
ATTENTION_WORK_MEASURED = 1024 * 8 * 65  # batch x heads x tokens


def recipe_steps(name: str) -> int:
    from shardbench.presets import get_preset

    cfg = get_preset(name)
    distinct = cfg.train.batch_size // cfg.data.repeat_augment
    return cfg.train.steps if cfg.train.steps > 0 else cfg.train.epochs * (CIFAR_TRAIN_IMAGES // distinct)


def attention_step_s(name: str) -> float:
    """A recipe's attention a step, from vit-seed's measured attention scaled by batch x heads x tokens x layers."""
    from shardbench.models.vit import num_tokens
    from shardbench.presets import get_preset

    cfg = get_preset(name)
    kind = "einsum" if cfg.model.lsa or cfg.model.attention == "einsum" else "fused"
    work = cfg.train.batch_size * cfg.model.num_heads * num_tokens(cfg.model, cfg.data.image_size)
    return cfg.model.num_layers * ATTENTION_S_PER_LAYER[kind] * work / ATTENTION_WORK_MEASURED


def flops_step_s(name: str) -> float:
    """A recipe's step at vit-cifar's measured FLOP rate."""
    from shardbench.models.vit import flops_per_example
    from shardbench.presets import get_preset

    cfg, measured = get_preset(name), get_preset("vit-cifar")
    flops = (flops_per_example(cfg.model, cfg.data.image_size)["train"]
             / flops_per_example(measured.model, measured.data.image_size)["train"])
    return cfg.train.batch_size * flops / RECIPE_IMAGES_PER_S


def recipe_estimate_s(name: str) -> float:
    """Seconds a recipe preset's full run should take on one H100 (see the comment above)."""
    sys.path.insert(0, str(ROOT / "src"))
    measured_step = 512 / RECIPE_IMAGES_PER_S
    rest = measured_step - attention_step_s("vit-cifar")  # vit-cifar's step less its attention
    floor = rest * flops_step_s(name) / measured_step + attention_step_s(name)
    return recipe_steps(name) * max(flops_step_s(name), floor) + RECIPE_OVERHEAD_S


def best_variant(path: Path) -> str | None:
    """The fastest variant of the baseline's model (by median step) whose losses agree with the baseline's, from a
    variants part: a switch of `SWITCHES` or the baseline itself, never the LM's pair (another model, faster by
    its size)."""
    if not path.exists():
        return None
    ours = {"baseline", *(name for name, *_ in SWITCHES)}
    rows = [r for r in json.loads(path.read_text())["cases"] if r.get("step_ms") and r.get("same_model")
            and r.get("losses_agree") is not False and r["name"] in ours]
    return min(rows, key=lambda r: r["step_ms"])["name"] if rows else None


# ------------------------------------------------------------------------------------------------ running
def environment(commit: str = "") -> dict[str, Any]:
    """Date, commit and device of this run of the suite (the device from nvidia-smi, else the CPU's name). The
    commit is `commit` (--commit) where given: a copy of the tree without its git history, or one inside another
    repository, whose git would name that one's commit; else git's, where git can say."""
    try:
        commit = commit or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                          capture_output=True, text=True).stdout.strip()
    except OSError:  # no git on this machine
        pass
    device = ""
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True)
        device = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    if not device:
        device = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                       if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "?"
    import importlib.metadata as md

    versions = {}
    for name in ("jax", "jaxlib", "flax", "torch"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit or None, "device": device, "versions": versions}


def child_env(smoke: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    # On a GPU, JAX must not fall back to the CPU when its CUDA plugin fails: it fails instead (see `check_gpu`).
    env["JAX_PLATFORMS"] = "cpu" if smoke else "cuda"
    if smoke:
        # One CPU device: the suite's own device count, not a caller's. XLA:CPU's quickest code generation (as
        # tests/conftest.py sets for the tests' own programs): a smoke run checks code paths, and its tiny
        # programs compile in about half the time.
        env["XLA_FLAGS"] = SMOKE_XLA_FLAGS
    return env


def run_process(argv: list[str], log: Path, timeout: float, smoke: bool) -> tuple[int | None, float, str]:
    """Run `shardbench ARGV`; returns (exit status or None on timeout, seconds, the last line of its output)."""
    t0 = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "shardbench", *argv], stdout=handle, stderr=subprocess.STDOUT,
                                env=child_env(smoke), cwd=ROOT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
        except BaseException:  # Ctrl-C or SIGTERM (`Stopped`): the case must not outlive the suite, nor share
            os.killpg(proc.pid, 9)  # the GPU with the next part's timings
            proc.wait()
            raise
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return code, time.perf_counter() - t0, lines[-1] if lines else ""


def read_run(run_dir: Path, batch: int | None) -> dict[str, Any]:
    """The figures a part reports, from a run's summary.json and metrics.jsonl."""
    summary = json.loads((run_dir / "summary.json").read_text())
    m = summary.get("measurements") or {}
    compile_ = m.get("compile") or {}
    step = (m.get("step_time_s") or {}).get("median")
    memory = m.get("memory") or {}
    losses = []
    metrics = run_dir / "tensorboard" / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if "train/loss" in row:
                losses.append(row["train/loss"])
    cache = m.get("compile_cache") or {}
    return {"compile_s": (compile_.get("lower_s") or 0) + (compile_.get("compile_s") or 0) if compile_ else None,
            "step_ms": None if step is None else 1e3 * step,
            "step_p90_ms": None if (m.get("step_time_s") or {}).get("p90") is None
            else 1e3 * m["step_time_s"]["p90"],
            "examples_per_s": None if not step or not batch else batch / step,
            "peak_mib": None if memory.get("peak_bytes_in_use") is None else memory["peak_bytes_in_use"] / 2**20,
            "compiled_mib": None if memory.get("total_bytes") is None else memory["total_bytes"] / 2**20,
            "cache_hits": f"{cache.get('hits')}/{cache.get('requests')}" if cache.get("dir") else "off",
            "losses": losses[:LOSSES_COMPARED], "test_accuracy": summary.get("test_accuracy"),
            "train_time_s": summary.get("time_s"), "device_kind": m.get("device_kind"), "platform": m.get("platform"),
            "xla_flags": m.get("xla_flags"), "attention": m.get("attention"),
            "qkv_layout": m.get("qkv_layout"), "steps": summary.get("steps")}


def _batch_of(argv: list[str]) -> int | None:
    return int(argv[argv.index("--batch-size") + 1]) if "--batch-size" in argv else None


class Part:
    """A part's results, rewritten to PART.json and PART.md after every case. A run with --cases keeps the rows of
    the cases it does not name from the folder's earlier PART.json and replaces those it runs; so too the sections
    (bench's tables, a profile's kernels, plan's output), which are keyed by the case that wrote them."""

    def __init__(self, name: str, out: Path, env: dict[str, Any], smoke: bool, keep_earlier: bool) -> None:
        self.name, self.out, self.smoke = name, out, smoke
        self.ran: set[str] = set()  # the cases this run ended (rows kept from an earlier run are not its failures)
        self.kept_note = ""
        self.record: dict[str, Any] = {"part": name, "smoke": smoke, **env, "cases": [], "notes": [],
                                       "finished": False}
        earlier = out / f"{name}.json"
        old = json.loads(earlier.read_text()) if keep_earlier and earlier.exists() else None
        if old is not None and bool(old.get("smoke")) != smoke:  # a CPU smoke row must never pass for a GPU's
            self.record["notes"].append(f"the rows of the earlier {'smoke ' if old.get('smoke') else 'GPU '}run "
                                        f"({old.get('date')}) were not kept: this run is a "
                                        f"{'smoke run' if smoke else 'GPU run'}")
            old = None
        if old is not None:
            self.record["cases"] = old.get("cases", [])
            # sections keyed by case; an earlier file's list of sections names no case, so it cannot be replaced
            sections = old.get("sections")
            self.record["sections"] = dict(sections) if isinstance(sections, dict) else {}
            # said while a row of that run is still on the page, not once this run has replaced them all
            self.kept_note = (f"rows of the cases this run did not name (--cases) are from the run of "
                              f"{old.get('date')}, commit {old.get('commit')}")

    def add(self, row: dict[str, Any]) -> None:
        self.ran.add(row["name"])
        cases = self.record["cases"]
        same = [i for i, c in enumerate(cases) if c["name"] == row["name"]]
        if same:
            cases[same[0]] = row
        else:
            cases.append(row)
        self.write()

    def section(self, case: str, text: str) -> None:
        """`text` as case `case`'s section, replacing the one it had (an earlier run's, kept with --cases)."""
        self.record.setdefault("sections", {})[case] = text

    def drop_section(self, case: str) -> None:
        """Forget case `case`'s section: it is running again, and what it writes this time is its section."""
        self.record.get("sections", {}).pop(case, None)

    def note(self, text: str) -> None:
        self.record["notes"].append(text)
        self.write()

    def failures(self) -> list[str]:
        """`part/case: status` for each case that failed or timed out. A refusal (exit 2 with one of the case's
        known refusal messages: the device cannot run that configuration, e.g. cuDNN on a CPU) and a case not run
        for the budget are answers, not failures."""
        return [f"{self.name}/{c['name']}: {c['status'][:200]}" for c in self.record["cases"]
                if c["status"].startswith(FAILED) and c["name"] in self.ran]

    def finish(self, took_s: float) -> None:
        """The part ran to its end: what is not marked so was cut off (Ctrl-C, SIGTERM, the machine's limit)."""
        self.record["finished"] = True
        self.note(f"part took {took_s:.0f} s; every command is in {self.name}.json")

    def write(self) -> None:
        notes = [n for n in self.record["notes"] if n != self.kept_note]
        if self.kept_note and any(c["name"] not in self.ran for c in self.record["cases"]):
            notes.insert(0, self.kept_note)
        self.record["notes"] = notes
        tmp = self.out / f"{self.name}.json.tmp"
        tmp.write_text(json.dumps(self.record, indent=2))
        os.replace(tmp, self.out / f"{self.name}.json")
        (self.out / f"{self.name}.md").write_text(render_part(self.record) + "\n")


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def attention_cell(case: dict[str, Any]) -> str:
    """The attention a case's run ran and, where its record keeps it (schema 8 on), its q/k/v layout."""
    attention, layout = case.get("attention"), case.get("qkv_layout")
    return "–" if not attention else f"{attention} ({layout})" if layout else attention


def render_part(record: dict[str, Any]) -> str:
    """A part's markdown: its header, one table of its cases, then its notes and any extra sections."""
    r = record
    versions = ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items())
    lines = [f"## {r['part']}" + (" (smoke run on a CPU: code paths only, no GPU figures)" if r["smoke"] else ""),
             "", f"{r['date']}, commit {r['commit']}, {r['device']}; {versions}", ""]
    if not r.get("finished", True):  # records from before the mark say nothing either way
        lines += ["**Cut off: this part did not run to its end; its rows are the cases that ended before it "
                  "stopped.**", ""]
    cases = r["cases"]
    if any("step_ms" in c for c in cases):
        lines += ["| case | status | compile s | step ms (p90) | examples/s | peak MiB | compiled MiB | cache | "
                  "attention (q/k/v) | first losses agree | note |", "|---|---|---:|---:|---:|---:|---:|---|---|---|---|"]
        for c in cases:
            agree = {True: "yes", False: "**no**", None: "–"}[c.get("losses_agree")]
            if not c.get("same_model", True):
                agree = "other model"
            lines.append(
                f"| {c['name']} | {c['status']} | {_fmt(c.get('compile_s'), '.1f')} | "
                f"{_fmt(c.get('step_ms'), '.2f')} ({_fmt(c.get('step_p90_ms'), '.2f')}) | "
                f"{_fmt(c.get('examples_per_s'), ',.0f')} | {_fmt(c.get('peak_mib'), ',.0f')} | "
                f"{_fmt(c.get('compiled_mib'), ',.0f')} | {c.get('cache_hits', '–')} | {attention_cell(c)} | "
                f"{agree} | {c.get('note', '')} |")
    else:
        lines += ["| case | status | seconds | note |", "|---|---|---:|---|"]
        lines += [f"| {c['name']} | {c['status']} | {_fmt(c.get('seconds'), '.0f')} | {c.get('note', '')} |"
                  for c in cases]
    for c in cases:
        if c.get("accuracy_line"):
            lines += ["", c["accuracy_line"]]
    lines += [""] + [f"- {n}" for n in r["notes"]]
    sections = r.get("sections", {})
    order = [c["name"] for c in cases if c["name"] in sections] + [k for k in sections if k not in
                                                                     {c["name"] for c in cases}]
    for name in order:  # in the rows' order, however often a --cases rerun replaced one
        lines += ["", sections[name]]
    return "\n".join(lines)


@dataclass
class PartRun:
    """What the cases of one part share while it runs."""

    part: str
    args: argparse.Namespace
    out: Path
    work: Path
    sizes: Sizes
    record: Part
    losses: dict[str, list[float]] = field(default_factory=dict)  # each case's first losses, as it finished

    @property
    def logs(self) -> Path:
        return self.work / f"{self.part}-logs"


class NoGPU(Exception):
    """JAX cannot reach a GPU here: the suite stops in one line before any case runs on the CPU."""


def run_part(part: str, args: argparse.Namespace, out: Path, env: dict[str, Any]) -> Part:
    sizes = Sizes(args.smoke)
    run = PartRun(part, args, out, args.work, sizes, Part(part, out, env, args.smoke, keep_earlier=bool(args.cases)))
    every = cases_for(part, sizes, args, out, args.work)
    cases = selected(every, args.cases)
    budget = budget_s(args)
    started = time.perf_counter()
    run.logs.mkdir(parents=True, exist_ok=True)
    for cache in args.work.glob(f"{part}-cache*"):  # a cache this part fills must start empty
        shutil.rmtree(cache)
    not_run: list[str] = []
    status: dict[str, str] = {}  # each case's, as it ended here: what a case reading another's output checks
    for i, case in enumerate(cases):
        left = budget - (time.perf_counter() - started)
        row: dict[str, Any] = {"name": case.name, "note": case.note, "same_model": case.same_model,
                               "command": shown("shardbench " + " ".join(case.argv), args.work)}
        forget(run, case)  # an earlier run's section and files are not this run's, whether it runs or not
        filler = status.get(case.needs, "") if case.needs else "ok"  # alone it would compile cold: see Case.needs
        if case.est_s > left:
            row["status"] = not_run_status(part, case, left, every, args)
            not_run.append(case.name)
        elif filler.startswith("not run"):
            row["status"] = (f"not run: budget: {case.needs!r}, whose output it reads, was not run; run them "
                             f"with {rerun_command(part, [case.name], every, args)}")
            not_run.append(case.name)
        elif not filler.startswith("ok"):  # failed, timed out or refused: its output is not this case's to read
            row["status"] = f"not run: {case.needs!r}, whose output it reads, ended {filler[:200]}"
        else:
            try:
                run_dir, code = run_case(run, case, row, case_timeout_s(left, args))
            except (KeyboardInterrupt, Stopped) as stop:  # the case's processes are stopped (`run_process`)
                row["status"] = f"stopped: {stop_reason(stop)} {time.perf_counter() - started:.0f} s into the part"
                run.record.add(row)
                for rest in cases[i + 1:]:
                    run.record.add({"name": rest.name, "note": rest.note, "status": f"not run: {stop_reason(stop)}"})
                raise
            finish_safely(run, case, row, run_dir, code)
        status[case.name] = row["status"]
        run.record.add(row)
    if not_run:
        run.record.note(f"not run for the budget: {', '.join(not_run)}; run them with "
                        f"{rerun_command(part, not_run, every, args)} and the same --out (the rows it runs replace "
                        f"these)")
    run.record.finish(time.perf_counter() - started)
    return run.record


class Stopped(Exception):
    """SIGTERM to the suite (a `timeout`, the machine's limit): it stops as on Ctrl-C, its case's processes too."""


def stop_reason(stop: BaseException) -> str:
    return "the suite was stopped (SIGTERM)" if isinstance(stop, Stopped) else "the suite was stopped (Ctrl-C)"


def forget(run: PartRun, case: Case) -> None:
    """Drop what an earlier run of `case` left in the results folder: its section (kept with --cases) and the
    files it publishes there. What this run of it writes, if it runs and finishes, takes their place."""
    run.record.drop_section(case.name)
    for path in published(run, case):
        path.unlink(missing_ok=True)


def published(run: PartRun, case: Case) -> list[Path]:
    """The files `case` writes into the results folder besides its row and section."""
    if case.kind == "bench":
        return [run.out / "bench-raw.json"]
    if run.part == "plan" and case.kind == "command":
        return [run.out / "plan-validation.json"]
    if run.part == "accuracy":
        return [run.out / f"accuracy-{slug(case.name)}.png"]
    return []


class UnknownCases(Exception):
    """--cases names a case the part does not have: the suite refuses in one line (exit 2) before running any."""


def selected(cases: list[Case], names: str) -> list[Case]:
    """The cases --cases names (all where it names none), in the part's order, each with the case that fills the
    cache it reads (`Case.needs`): alone it would compile cold and report a cold compile as a warm one."""
    wanted = {c.strip() for c in names.split(",") if c.strip()}
    unknown = sorted(wanted - {c.name for c in cases})
    if unknown:
        raise UnknownCases(f"--cases: {', '.join(repr(n) for n in unknown)} is not a case of this part; its cases: "
                           + ", ".join(repr(c.name) for c in cases))
    return [c for c in cases if c.name in with_needed(wanted, cases)] if wanted else cases


def with_needed(names: set[str] | list[str], cases: list[Case] | tuple[Case, ...]) -> set[str]:
    """`names` and every case they need (`Case.needs`) or compare their losses with (`Case.compare_to`), of
    `cases`, transitively."""
    known = {c.name for c in cases}
    needs = {c.name: [n for n in (c.needs, c.compare_to) if n and n in known] for c in cases}
    out, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo += needs.get(name, [])
    return out


def budget_s(args: argparse.Namespace) -> float:
    """The part's budget: --budget-s where given; else BUDGET_S on a GPU and none under --smoke (whose CPU cases
    take what they take, and the budget is a GPU's)."""
    if args.budget_s is not None:
        return args.budget_s
    return float("inf") if args.smoke else BUDGET_S


def case_timeout_s(left: float, args: argparse.Namespace) -> float:
    """A case's timeout: --case-timeout-s, and on a GPU at most what is left of the budget plus GRACE_S, so a
    case near the end of the budget that runs a little over its estimate is not killed, and the part still ends
    within PART_LIMIT_S."""
    return args.case_timeout_s if args.smoke else min(args.case_timeout_s, max(left, 0.0) + GRACE_S)


def rerun_command(part: str, names: list[str], cases: list[Case] | tuple[Case, ...] = (),
                  args: argparse.Namespace | None = None) -> str:
    """The suite's flags that run `names` of `part` with, from the part's `cases`, the cases whose losses
    theirs are compared with and those whose output one of them reads (without `cases`: a variant's with the
    baseline); with `args`, the flags of this run they also need (--smoke, the accuracy part's --recipe and
    --data-path, --commit). A rerun with --cases keeps the part's other rows."""
    needs_baseline = not cases and part.startswith("variants") and "baseline" not in names
    needed = with_needed(names, cases)
    names = [c.name for c in cases if c.name in needed and c.name not in names] + list(names)
    quoted = ",".join((["baseline"] if needs_baseline else []) + names)
    flags = [f"--part {part}"]
    if args is not None and args.smoke:
        flags.append("--smoke")
    if part == "accuracy":  # the cases are `recipe NAME`: --recipe all has them all
        flags.append("--recipe all")
        if args is not None and args.data_path:
            flags.append(f"--data-path {args.data_path}")
    flags.append(f"--cases '{quoted}'")
    if args is not None and args.commit:
        flags.append(f"--commit {args.commit}")
    return " ".join(flags)


def not_run_status(part: str, case: Case, left: float, cases: list[Case] | tuple[Case, ...] = (),
                   args: argparse.Namespace | None = None) -> str:
    return (f"not run: budget: {case.est_s:.0f} s expected, {max(left, 0):.0f} s left; run it with "
            f"{rerun_command(part, [case.name], cases, args)}")


def check_gpu(args: argparse.Namespace) -> None:
    """Once per suite, before its first case on a GPU: JAX, started as the cases start it (JAX_PLATFORMS=cuda),
    must see a GPU. Raises NoGPU, in one line, where it does not."""
    if args.smoke or getattr(args, "gpu_checked", False):
        return
    probe = "import jax; d = jax.devices()[0]; print(d.platform, '|', d.device_kind)"
    try:
        done = subprocess.run([sys.executable, "-c", probe], env=child_env(False), cwd=ROOT, capture_output=True,
                              text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        raise NoGPU("JAX (JAX_PLATFORMS=cuda) found no device within 180 s") from None
    if done.returncode != 0 or not done.stdout.startswith("gpu "):
        said = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        reason = next((line for line in reversed(said) if "cuda" in line.lower() and not line.startswith("File ")),
                      said[-1] if said else "no output")
        if not any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin")):
            reason = "no CUDA plugin for JAX is installed (pip install -U 'jax[cuda12]'); " + reason
        raise NoGPU(f"JAX cannot use a GPU here (JAX_PLATFORMS=cuda): {reason[:240]}; --smoke runs the parts' "
                    f"code paths on a CPU")
    args.gpu_checked = True


def run_case(run: PartRun, case: Case, row: dict[str, Any], timeout: float) -> tuple[Path, int | None]:
    """Run one case's process; its status from the exit status (see `exit_status`)."""
    run_dir = run.work / f"{run.part}-runs" / slug(case.name)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    if case.kind in ("bench", "sweep"):  # they write into a fixed folder: nothing of an earlier run may pass for
        shutil.rmtree(Path(case.argv[case.argv.index("--out") + 1]), ignore_errors=True)  # this one's
    argv = [*case.argv, "--out", str(run_dir)] if case.kind == "train" else case.argv
    row["command"] = shown("shardbench " + " ".join(argv), run.work)  # as run
    print(f"[{run.part}] {case.name} ...", flush=True)
    log = run.logs / f"{slug(case.name)}.log"
    code, seconds, last = run_process(argv, log, timeout, run.args.smoke)
    row["seconds"] = round(seconds, 1)
    row["status"] = shown(exit_status(code, seconds, last, case.refusals), run.work)
    if code != 0:
        row["log_tail"] = [shown(line, run.work) for line in log.read_text(errors="replace").splitlines()[-20:]]
    print(f"[{run.part}] {case.name}: {row['status']} ({seconds:.0f} s)", flush=True)
    return run_dir, code


def exit_status(code: int | None, seconds: float, last: str, refusals: tuple[str, ...]) -> str:
    """A case's status from its process: ok, a refusal (exit 2 saying one of the case's known refusals), or a
    failure (any other exit status, an exit 2 with another message, a timeout)."""
    if code is None:
        return f"{FAILED[1]} after {seconds:.0f} s"
    if code == 0:
        return "ok"
    if code == 2 and any(known in last for known in refusals):
        return "refused: " + last[-300:]
    if code == 2:
        return f"{FAILED[0]} (2, not a refusal this case can give): " + last[-300:]
    return f"{FAILED[0]} ({code}): " + last[-300:]


def finish_safely(run: PartRun, case: Case, row: dict[str, Any], run_dir: Path, code: int | None) -> None:
    """Read a finished case's results into its row; an error doing so fails this case only, and the part goes on."""
    try:
        finish(run, case, row, run_dir, code)
    except Exception as err:  # noqa: BLE001 - recorded on the row; the part's other cases still run
        row["results_error"] = shown(f"{type(err).__name__}: {err}", run.work)[:400]
        if not row["status"].startswith(FAILED):
            row["status"] = f"{FAILED[0]}: reading its results: {row['results_error']}"
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the disk: the figures are in the record


def finish(run: PartRun, case: Case, row: dict[str, Any], run_dir: Path, code: int | None) -> None:
    run.record.drop_section(case.name)  # an earlier run's (kept with --cases): this run's replaces it, or none
    if case.kind == "train" and code == 0:
        finish_train(run, case, row, run_dir)
    elif case.kind == "bench":
        finish_bench(run, case, row, code)
    elif case.kind == "sweep" and code == 0:
        problems = [device_problem(r.get("platform"), r.get("device_kind")) for r in sweep_runs(case.argv)]
        if not run.args.smoke and any(problems):
            row["status"] = next(p for p in problems if p)
    elif case.kind == "command" and run.part == "plan":
        finish_plan(run, case, code)


def finish_train(run: PartRun, case: Case, row: dict[str, Any], run_dir: Path) -> None:
    row.update(read_run(run_dir, _batch_of(case.argv)))
    problem = None if run.args.smoke else device_problem(row.get("platform"), row.get("device_kind"))
    if problem:
        row["status"] = problem
        return
    run.losses[case.name] = row["losses"]
    reference = run.losses.get(case.compare_to) if case.compare_to else None
    if reference and case.same_model and row["losses"]:
        dtype = case.argv[case.argv.index("--dtype") + 1]
        row["loss_rel_diff"] = max_rel_diff(row["losses"], reference)
        row["losses_agree"] = row["loss_rel_diff"] <= LOSS_RTOL[dtype]
    if run.part == "profile":
        row["kernels"] = kernel_section(run_dir, case.name, run.sizes)
        run.record.section(case.name, row["kernels"])
    if run.part == "accuracy":
        row["accuracy_line"] = accuracy_section(run_dir, case.name, run.out)


def max_rel_diff(losses: list[float], baseline: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(losses, baseline))


def device_problem(platform: str | None, device_kind: str | None) -> str | None:
    """A run that a GPU run of the suite must not count: its record says it ran on another platform (JAX fell
    back to the CPU, say). None where it ran on a GPU."""
    if platform == "gpu":
        return None
    return f"{FAILED[0]}: ran on {device_kind or 'an unknown device'} (platform {platform}), not a GPU"


def sweep_runs(argv: list[str]) -> list[dict[str, Any]]:
    """The measurements of every run a sweep case wrote."""
    folder = Path(argv[argv.index("--out") + 1])
    return [(json.loads(p.read_text()).get("measurements") or {}) for p in sorted(folder.rglob("summary.json"))]


def bench_raw(case: Case) -> Path:
    """The folder a bench case writes bench.json and bench.md to: its --out."""
    return Path(case.argv[case.argv.index("--out") + 1])


def bench_finished(code: int | None, last: str) -> bool:
    """Whether `shardbench bench` ended as a finished run, its files complete: exit 0, or exit 1 with its own
    line saying some contender errored or timed out (see bench_cmd.run). Any other end (a timeout, a crash, a
    refused flag) leaves files that are partial or not this run's."""
    return code == 0 or (code == 1 and last.startswith(BENCH_SAYS) and BENCH_CONTENDERS_FAILED in last)


def finish_bench(run: PartRun, case: Case, row: dict[str, Any], code: int | None) -> None:
    """bench.md as the part's section, bench.json as DIR/bench-raw.json, only from a bench that finished (see
    `bench_finished`: any other run publishes nothing, and an earlier run's DIR/bench-raw.json is removed, so no
    figures pass for this run's); the case fails where any contender errored or timed out (or, on a GPU, ran
    elsewhere)."""
    raw = bench_raw(case)
    last = next((line for line in reversed(row.get("log_tail") or []) if line.strip()), "")
    if not bench_finished(code, last):
        (run.out / "bench-raw.json").unlink(missing_ok=True)
        return
    if (raw / "bench.md").exists():
        run.record.section(case.name, demoted(shown((raw / "bench.md").read_text(), run.work)))
    if not (raw / "bench.json").exists():
        raise FileNotFoundError(f"{shown(str(raw / 'bench.json'), run.work)}: shardbench bench wrote no results")
    text = (raw / "bench.json").read_text()
    (run.out / "bench-raw.json").write_text(shown(text, run.work))
    problem = bench_problem(json.loads(text), run.args.smoke)
    if problem and not row["status"].startswith(FAILED):
        row["status"] = problem


def bench_problem(record: dict[str, Any], smoke: bool) -> str | None:
    """`failed: ...` naming each contender of a bench.json that errored or timed out (and, on a GPU, each that ran
    on another platform); None where every row has its figures."""
    bad = [f"{c['label']} ({c.get('setting') or c['group']}): {c['result']['error']}" for c in record["cases"]
           if "error" in c["result"]]
    if not smoke:
        bad += [f"{c['label']}: {device_problem(c['result']['platform'], c['result'].get('device_kind'))}"
                for c in record["cases"] if c["result"].get("platform", "gpu") != "gpu"]
    return f"{FAILED[0]}: {len(bad)} bench row(s): " + "; ".join(bad)[:600] if bad else None


def finish_plan(run: PartRun, case: Case, code: int | None) -> None:
    """plan --validate's output as the case's section; its plan-validation.json published only where it finished."""
    validation = run.work / "plan-sweep" / "plan-validation.json"
    if code == 0 and validation.exists():
        (run.out / "plan-validation.json").write_text(shown(validation.read_text(), run.work))
    tail = (run.logs / f"{slug(case.name)}.log").read_text(errors="replace").splitlines()[-25:]
    run.record.section(case.name, "```\n" + shown("\n".join(tail), run.work) + "\n```")


def demoted(markdown: str, levels: int = 2) -> str:
    """`markdown` with its headings `levels` deeper (outside code fences), to sit under a part's `##` heading."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        lines.append("#" * levels + line if line.startswith("#") and not fenced else line)
    return "\n".join(lines)


def shown(text: str, work: Path) -> str:
    """`text` without this machine's paths: --work's as `<work>`, the repository root's relative to it."""
    return text.replace(str(work), "<work>").replace(str(ROOT) + os.sep, "").replace(str(ROOT), ".")


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-").lower()


def kernel_section(run_dir: Path, name: str, sizes: Sizes) -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from shardbench.measure.kernels import find_trace, kernel_table, render, trace_time

    config = json.loads((run_dir / "config.json").read_text())
    trace, window = find_trace(run_dir), config["train"]["profile_steps"]
    kernels, total, devices = kernel_table(trace, top=30)
    # What the report's Profiles section reads from the same trace: whether this device's kernels name their
    # program and execution (so the train step's are told from the rest and its steps counted), and the collectives.
    t = trace_time(trace, window)
    counted = f"{t.steps} counted in the trace" if t.counted_steps else f"not counted: the window's {t.steps}"
    kinds = ", ".join(f"{k} {ms:.3f}" for k, ms in t.collective_ms.items()) or "none"
    read = (f"The report's reading of this trace: train steps {counted}; on each of {t.devices} device(s), a traced "
            f"step of {t.span_ms:.2f} ms, kernels running for {t.busy_ms:.2f} ms of it; collectives (ms a step): "
            f"{kinds}.")
    return f"### Kernels: {name}\n\n" + render(kernels, total, window, devices) + "\n\n" + read


def accuracy_section(run_dir: Path, name: str, out: Path) -> str:
    """The recipe's line: test accuracy, training time, step time; and its curve as PNG beside the part."""
    run = read_run(run_dir, None)
    png = out / f"accuracy-{slug(name)}.png"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy_curve.py"), str(run_dir), "--out", str(png),
                    "--label", name], env=child_env(False), check=False, capture_output=True)
    acc = run.get("test_accuracy")
    return (f"{name}: test accuracy **{_fmt(None if acc is None else 100 * acc, '.1f')}%**, training "
            f"{_fmt(run.get('train_time_s'), '.0f')} s for {run.get('steps')} steps, step "
            f"{_fmt(run.get('step_ms'), '.2f')} ms, compile {_fmt(run.get('compile_s'), '.1f')} s; curve: {png.name}")


def collect(folder: Path, to: Path | None = None) -> str:
    """Every part's markdown in `folder`, in the parts' order: the text of the results page `to` (one per kind of
    GPU, such as benchmarks/results-h100.md)."""
    parts = [folder / f"{p}.md" for p in PARTS if (folder / f"{p}.md").exists()]
    head = ("# shardbench on a GPU: the latest GPU suite results\n\nMade by `python benchmarks/gpu_suite.py "
            f"--collect DIR --to {to or 'PAGE'}` from the parts' files; each part names its date, "
            "commit and device. What was measured by hand on an H100 before the suite existed is in "
            "`benchmarks/results-h100-2026-11-24.md`.\n")
    return head + "\n" + "\n\n".join(p.read_text() for p in parts)


def _stopped(signum: int, frame: object) -> None:
    raise Stopped()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--part", default="", help=f"one of {', '.join(PARTS)}, or all")
    parser.add_argument("--out", type=Path, default=None, help="results folder (PART.md, PART.json per part): "
                                                               "small, to bring back")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "shardbench-gpu-suite",
                        help="where the runs, their logs and the compilation caches go (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="every part on a CPU at tiny sizes (default: all)")
    parser.add_argument("--cases", default="", help="comma list of case names of one --part to run, with the case "
                                                    "that fills a cache one of them reads (default: all of the part)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"seconds a part may start cases in (default: {BUDGET_S:.0f}; under --smoke none, "
                             f"unless given)")
    parser.add_argument("--case-timeout-s", type=float, default=420.0, help="seconds one case may take")
    parser.add_argument("--recipe", default="vit-cifar", help="accuracy part: a recipe preset, or all")
    parser.add_argument("--data-path", default="", help="accuracy part: the CIFAR-10 image tar")
    parser.add_argument("--variant", default="", help="profile part: the variant to profile (default: the "
                                                      "fastest of variants-bf16.json whose losses agree)")
    parser.add_argument("--commit", default="", help="the commit to record, instead of git's (a copy of the tree "
                                                     "without its .git folder, or no git on the machine)")
    parser.add_argument("--collect", type=Path, default=None, help="render a results folder's parts as one page")
    parser.add_argument("--to", type=Path, default=None, help="with --collect: write the page here")
    args = parser.parse_args(argv)
    if args.collect:
        if not any((args.collect / f"{p}.md").exists() for p in PARTS):
            # a page of no parts would replace --to's results page with an empty one
            print(f"gpu_suite: --collect {args.collect}: no part's file there (PART.md for one of {', '.join(PARTS)})"
                  f"{'' if args.collect.is_dir() else ': no such folder'}; nothing written", file=sys.stderr)
            return 2
        text = collect(args.collect, args.to)
        if args.to:
            args.to.write_text(text)
        else:
            print(text)
        return 0
    part = args.part or ("all" if args.smoke else "")
    if part not in (*PARTS, "all") or args.out is None:
        parser.error(f"give --part (one of {', '.join(PARTS)}, or all) and --out DIR")
    if args.variant and args.variant not in ("baseline", *(s[0] for s in SWITCHES)):
        parser.error(f"--variant '{args.variant}': choose from baseline, {', '.join(s[0] for s in SWITCHES)}")
    if args.cases and part == "all":
        print("gpu_suite: --cases names cases of one part: give --part PART", file=sys.stderr)
        return 2
    args.work = args.work.resolve()  # the cases run in the repository's root
    try:
        if args.cases:
            selected(cases_for(part, Sizes(args.smoke), args, args.out, args.work), args.cases)
        check_gpu(args)  # a run that is not --smoke is a GPU's: its page is never written on another device
    except UnknownCases as err:
        print(f"gpu_suite: --part {part} {err}", file=sys.stderr, flush=True)
        return 2
    except NoGPU as err:
        print(f"gpu_suite: {err}", file=sys.stderr, flush=True)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(args.commit)
    failures: list[str] = []
    previous = signal.signal(signal.SIGTERM, _stopped)  # restored below: main may run inside another program
    try:
        for name in PARTS if part == "all" else (part,):
            try:
                failures += run_part(name, args, args.out, env).failures()
            except (KeyboardInterrupt, Stopped) as stop:  # the part's file marks it cut off, names what did not run
                print(f"gpu_suite: {stop_reason(stop)} during --part {name}; {args.out / (name + '.md')} says what "
                      f"ended before it", file=sys.stderr, flush=True)
                return 143 if isinstance(stop, Stopped) else 130
            print(f"wrote {args.out / (name + '.md')}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failures:  # the figures of the other cases are written; the exit status says the run is not complete
        print(f"gpu_suite: {len(failures)} case(s) failed or timed out:", *failures, sep="\n  ", file=sys.stderr,
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
