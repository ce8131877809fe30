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
finished. A case whose estimated time no longer fits the part's budget is skipped and listed with the
command that runs it (`--cases`). Every case is a real `shardbench` process with its own timeout; the
figures come from the run records it writes (median step time, compile time, peak memory, losses).

Exit status: 1 when any case of a part failed or timed out (each is named on stderr; the parts' files are still
written), 0 otherwise. A refusal (the device cannot run that configuration) and a case skipped for the budget are
not failures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("bench", "compile", "autotune", "variants-bf16", "variants-f32", "profile", "plan", "accuracy")
BUDGET_S = 510.0  # a part's cases start only while they fit here: under 9 minutes with the part's own overhead
LOSS_RTOL = {"float32": 2e-3, "bfloat16": 3e-2}  # first losses of a variant against the baseline's
LOSSES_COMPARED = 5
FAILED = ("failed", "timed out")  # how a case's status starts when it makes the suite exit 1
CIFAR_CANDIDATES = ("../shared/data/cifar10-jpeg.tar.gz", "shared/data/cifar10-jpeg.tar.gz",
                    "data/cifar10-jpeg.tar.gz")


@dataclass
class Case:
    """One process of a part: a `shardbench` command line and what the budget should expect of it."""

    name: str
    argv: list[str]
    est_s: float  # on one H100, from the 2026-11-24 measurements: compile + steps + process start
    note: str = ""
    same_model: bool = True  # whether its losses must agree with the baseline's
    kind: str = "train"  # train | bench | sweep | command


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

    def data(self) -> list[str]:
        return ["--data.synthetic-train", "512", "--data.synthetic-test", "64"] if self.smoke else []

    def model(self, preset: str) -> list[str]:
        """--smoke: vit-tiny narrowed to one block of width 32 (compiling is what a smoke case spends its time on;
        every switch the parts compare applies to it as to the full model)."""
        return [*SMOKE_VIT] if self.smoke and self.preset(preset) == "vit-tiny" else []


# --smoke's ViT: the code paths of vit-tiny's (patch stem, class token, attention, MLP) at a third of its compile.
SMOKE_VIT = ("--model.embed-dim", "32", "--model.mlp-dim", "64", "--model.num-layers", "1", "--model.num-heads", "2")


def train_case(sizes: Sizes, name: str, preset: str, dtype: str, batch: int, *extra: str, steps: int = 40,
               est_s: float = 30.0, note: str = "", same_model: bool = True, cache: str = "off") -> Case:
    argv = ["train", "--preset", sizes.preset(preset), "--dtype", dtype, "--batch-size", str(sizes.batch(batch)),
            "--steps", str(sizes.steps(steps)), "--no-train.eval", "--no-train.progress", "--train.log-every", "1",
            "--train.checkpoint-every", "0", "--train.compile-cache", cache, *sizes.data(), *sizes.model(preset),
            *extra]
    if sizes.preset(preset).startswith(("vit", "lm")) and "--data" not in extra:
        argv += ["--data", "synthetic" if sizes.preset(preset).startswith("vit") else "tokens-uniform"]
    if sizes.smoke:
        argv += ["--devices", "1", "--mesh", "none"]
    return Case(name, argv, est_s, note, same_model)


# Every speed switch the variants parts compare: (name, flags, same model as the baseline?, note).
SWITCHES: list[tuple[str, tuple[str, ...], bool, str]] = [
    ("attention einsum", ("--model.attention", "einsum"), True, "two einsums, float32 scores"),
    ("attention fused", ("--model.attention", "fused"), True, "jax.nn.dot_product_attention, XLA's composition"),
    ("attention cudnn", ("--model.attention", "cudnn"), True, "cuDNN's fused kernel on a padded sequence"),
    ("attention cudnn pad 64", ("--model.attention", "cudnn", "--model.attention-pad-multiple", "64"), True,
     "cuDNN on a sequence padded to a multiple of 64"),
    ("qkv split", ("--model.qkv-layout", "split"), True, "three projections: no [3,heads,dim,batch,seq] transpose"),
    ("qkv seq-major", ("--model.qkv-layout", "seq-major"), True, "one projection with a sequence-major output"),
    ("pool mean", ("--model.pool", "mean"), False, "a different model: mean of 64 tokens, no class token"),
    ("adam mu bfloat16", ("--optim.mu-dtype", "bfloat16"), False, "the optimizer's first moment in bfloat16"),
    ("param bfloat16", ("--param-dtype", "bfloat16"), False, "parameters stored in bfloat16"),
    ("command buffers", ("--train.xla-presets", "command-buffers"), True, "CUDA graphs"),
    ("no command buffers", ("--train.xla-presets", "no-command-buffers"), True, "every kernel launched alone"),
    ("cudnn layernorm", ("--train.xla-presets", "cudnn-layernorm"), True, "LayerNorm by cuDNN"),
    ("cudnn gemm fusion", ("--train.xla-presets", "cudnn-gemm-fusion"), True, "GEMM fusions by cuDNN"),
    ("no triton gemm", ("--train.xla-presets", "no-triton-gemm"), True, "cuBLAS GEMMs only"),
]
# --smoke: the switches whose code paths differ (a refusal, a layout, an XLA preset); variants-f32 runs only
# the refusal, which says something else at float32, as its other code paths are variants-bf16's.
SMOKE_SWITCHES = {"variants-bf16": ("attention cudnn", "qkv split", "cudnn layernorm"),
                  "variants-f32": ("attention cudnn",)}


def cases_for(part: str, sizes: Sizes, args: argparse.Namespace, out: Path, work: Path) -> list[Case]:
    """The cases of `part`, in the order they run; `out` holds the results, `work` the runs and caches."""
    t = functools_partial(train_case, sizes)
    if part == "bench":
        argv = ["bench", "--groups", "step", "--out", str(work / "bench-raw")]
        if sizes.smoke:
            argv += ["--preset", "vit-tiny", "--dtype", "float32", "--batch-size", "16", "--baselines", "seed-style",
                     "--warmup", "1", "--windows", "1", "--steps-per-window", "2", "--peak-size", "256",
                     *(f"--set=model.{flag[8:].replace('-', '_')}={value}"
                       for flag, value in zip(SMOKE_VIT[::2], SMOKE_VIT[1::2]))]
        return [Case("bench step group", argv, 330.0, "float32 b128 and bfloat16 b1024", kind="bench")]
    if part == "compile":
        cache = str(work / "compile-cache")
        cold = [t(f"vit-seed {d} b{b} cold", "vit-seed", d, b, est_s=45.0 if d == "float32" else 32.0)
                for d in ("float32", "bfloat16") for b in (128, 1024, 4096)]
        warm = [t("vit-seed bfloat16 b1024 filling a cache", "vit-seed", "bfloat16", 1024, cache=cache, est_s=32.0),
                t("the same program again", "vit-seed", "bfloat16", 1024, cache=cache, est_s=12.0),
                t("bfloat16 b512 with that cache (a second batch size)", "vit-seed", "bfloat16", 512, cache=cache,
                  est_s=30.0),
                t("lm-seed float32 cold", "lm-seed", "float32", 32, est_s=35.0),
                t("mlp-small float32 cold", "mlp-small", "float32", 1024, est_s=15.0),
                t("vit-seed bfloat16 b1024 shard_map cold", "vit-seed", "bfloat16", 1024, "--spmd", "shard_map",
                  est_s=32.0)]
        return cold[:1] + warm[:3] if sizes.smoke else cold + warm
    if part == "autotune":
        cache = str(work / "autotune-cache")
        rows = [t("autotune 4 (default) cold", "vit-seed", "bfloat16", 1024, est_s=32.0)]
        rows += [t(f"autotune {level} cold", "vit-seed", "bfloat16", 1024, "--train.xla-presets",
                   f"autotune-{level}", est_s=28.0) for level in (0, 2)]
        rows += [t("no triton gemm cold", "vit-seed", "bfloat16", 1024, "--train.xla-presets", "no-triton-gemm",
                   est_s=28.0)]
        for level in (4, 0):
            preset = ("--train.xla-presets", f"autotune-{level}")
            rows += [t(f"autotune {level}: b1024 filling a cache", "vit-seed", "bfloat16", 1024, *preset,
                       cache=f"{cache}-{level}", est_s=32.0),
                     t(f"autotune {level}: b512 from that cache", "vit-seed", "bfloat16", 512, *preset,
                       cache=f"{cache}-{level}", est_s=30.0)]
        return rows[:2] if sizes.smoke else rows
    if part in ("variants-bf16", "variants-f32"):
        dtype, batch = ("bfloat16", 1024) if part == "variants-bf16" else ("float32", 128)
        est = 30.0 if dtype == "bfloat16" else 40.0
        rows = [t("baseline", "vit-seed", dtype, batch, est_s=est, note="as shipped")]
        for name, flags, same, note in SWITCHES:
            if sizes.smoke and name not in SMOKE_SWITCHES[part]:
                continue
            rows.append(t(name, "vit-seed", dtype, batch, *flags, est_s=est, note=note, same_model=same))
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
                Case("plan --validate", ["plan", "--validate", str(work / "plan-sweep")], 150.0, kind="command")]
    if part == "accuracy":
        return accuracy_cases(sizes, args)
    raise ValueError(part)


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
        data = ["--data", "synthetic", *sizes.data(), "--steps", "4", "--batch-size", "16", "--devices", "1",
                "--mesh", "none", *SMOKE_VIT]
    else:
        path = args.data_path or next((p for p in CIFAR_CANDIDATES if (ROOT / p).exists()), "")
        if not path:
            raise SystemExit(f"gpu_suite: the accuracy part needs the CIFAR-10 image tar: pass --data-path "
                             f"(looked for {', '.join(CIFAR_CANDIDATES)})")
        data = ["--data", f"imagefolder:{Path(path).resolve() if Path(path).exists() else ROOT / path}"]
    return [Case(f"recipe {name}", ["train", "--preset", name, "--dtype", "bfloat16", "--no-train.progress",
                                    "--train.checkpoint-every", "0", *data], recipe_estimate_s(name), kind="train")
            for name in names]


# vit-cifar on one H100 in bfloat16 (2026-11-24): 8,700 steps of 512 images in 152 s of training. A candidate's
# estimate is its training FLOPs at that measured FLOP rate (the candidates' models differ: vit-cifar-spt's image
# costs 3.7x fewer FLOPs, vit-cifar-cct's 1.66x more); a narrower model reaches a lower MFU, so a smaller model's
# estimate is optimistic. Compile, evaluation and start are added.
RECIPE_IMAGES_PER_S = 8700 * 512 / 152
RECIPE_OVERHEAD_S = 40.0
CIFAR_TRAIN_IMAGES = 45_000  # 50,000 less the 10% held out for validation


def recipe_estimate_s(name: str) -> float:
    """Seconds a recipe preset's full run should take on one H100: its training FLOPs at vit-cifar's measured
    FLOP rate, plus the overhead."""
    sys.path.insert(0, str(ROOT / "src"))
    from shardbench.models.vit import flops_per_example
    from shardbench.presets import get_preset

    cfg, measured = get_preset(name), get_preset("vit-cifar")
    distinct = cfg.train.batch_size // cfg.data.repeat_augment
    steps = cfg.train.steps if cfg.train.steps > 0 else cfg.train.epochs * (CIFAR_TRAIN_IMAGES // distinct)
    flops = (flops_per_example(cfg.model, cfg.data.image_size)["train"]
             / flops_per_example(measured.model, measured.data.image_size)["train"])
    return steps * cfg.train.batch_size * flops / RECIPE_IMAGES_PER_S + RECIPE_OVERHEAD_S


def best_variant(path: Path) -> str | None:
    """The fastest variant (by median step) whose losses agree with the baseline's, from a variants part."""
    if not path.exists():
        return None
    rows = [r for r in json.loads(path.read_text())["cases"] if r.get("step_ms") and r.get("same_model")
            and r.get("losses_agree") is not False]
    return min(rows, key=lambda r: r["step_ms"])["name"] if rows else None


# ------------------------------------------------------------------------------------------------ running
def environment() -> dict[str, Any]:
    """Date, commit and device of this run of the suite (the device from nvidia-smi, else the CPU's name)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
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
            "commit": commit, "device": device, "versions": versions}


def child_env(smoke: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
        # One CPU device: the suite's own device count, not a caller's. LLVM at -O0 (as tests/conftest.py sets
        # for the tests' own programs): a smoke run checks code paths, and its tiny programs compile in a third
        # less time.
        env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
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
            "train_time_s": summary.get("time_s"), "device_kind": m.get("device_kind"),
            "xla_flags": m.get("xla_flags"), "steps": summary.get("steps")}


def _batch_of(argv: list[str]) -> int | None:
    return int(argv[argv.index("--batch-size") + 1]) if "--batch-size" in argv else None


class Part:
    """A part's results, rewritten to PART.json and PART.md after every case."""

    def __init__(self, name: str, out: Path, env: dict[str, Any], smoke: bool) -> None:
        self.name, self.out, self.smoke = name, out, smoke
        self.record: dict[str, Any] = {"part": name, "smoke": smoke, **env, "cases": [], "notes": []}

    def add(self, row: dict[str, Any]) -> None:
        self.record["cases"].append(row)
        self.write()

    def note(self, text: str) -> None:
        self.record["notes"].append(text)
        self.write()

    def failures(self) -> list[str]:
        """`part/case: status` for each case that failed or timed out. A refusal (exit 2: the device cannot run
        that configuration, e.g. cuDNN on a CPU) and a case skipped for the budget are answers, not failures."""
        return [f"{self.name}/{c['name']}: {c['status'][:200]}" for c in self.record["cases"]
                if c["status"].startswith(FAILED)]

    def write(self) -> None:
        tmp = self.out / f"{self.name}.json.tmp"
        tmp.write_text(json.dumps(self.record, indent=2))
        os.replace(tmp, self.out / f"{self.name}.json")
        (self.out / f"{self.name}.md").write_text(render_part(self.record) + "\n")


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def render_part(record: dict[str, Any]) -> str:
    """A part's markdown: its header, one table of its cases, then its notes and any extra sections."""
    r = record
    versions = ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items())
    lines = [f"## {r['part']}" + (" (smoke run on a CPU: code paths only, no GPU figures)" if r["smoke"] else ""),
             "", f"{r['date']}, commit {r['commit']}, {r['device']}; {versions}", ""]
    cases = r["cases"]
    if any("step_ms" in c for c in cases):
        lines += ["| case | status | compile s | step ms (p90) | examples/s | peak MiB | compiled MiB | cache | "
                  "first losses agree | note |", "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
        for c in cases:
            agree = {True: "yes", False: "**no**", None: "–"}[c.get("losses_agree")]
            if not c.get("same_model", True):
                agree = "other model"
            lines.append(
                f"| {c['name']} | {c['status']} | {_fmt(c.get('compile_s'), '.1f')} | "
                f"{_fmt(c.get('step_ms'), '.2f')} ({_fmt(c.get('step_p90_ms'), '.2f')}) | "
                f"{_fmt(c.get('examples_per_s'), ',.0f')} | {_fmt(c.get('peak_mib'), ',.0f')} | "
                f"{_fmt(c.get('compiled_mib'), ',.0f')} | {c.get('cache_hits', '–')} | {agree} | "
                f"{c.get('note', '')} |")
    else:
        lines += ["| case | status | seconds | note |", "|---|---|---:|---|"]
        lines += [f"| {c['name']} | {c['status']} | {_fmt(c.get('seconds'), '.0f')} | {c.get('note', '')} |"
                  for c in cases]
    for c in cases:
        if c.get("accuracy_line"):
            lines += ["", c["accuracy_line"]]
    lines += [""] + [f"- {n}" for n in r["notes"]]
    for section in r.get("sections", []):
        lines += ["", section]
    return "\n".join(lines)


def run_part(part: str, args: argparse.Namespace, out: Path, env: dict[str, Any]) -> Part:
    sizes = Sizes(args.smoke)
    record = Part(part, out, env, args.smoke)
    work = args.work
    cases = cases_for(part, sizes, args, out, work)
    if args.cases:
        wanted = {c.strip() for c in args.cases.split(",")}
        cases = [c for c in cases if c.name in wanted]
    budget = float("inf") if args.smoke else args.budget_s
    started = time.perf_counter()
    logs = work / f"{part}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for cache in work.glob(f"{part}-cache*"):  # a cache this part fills must start empty
        shutil.rmtree(cache)
    baseline: list[float] | None = None
    for case in cases:
        left = budget - (time.perf_counter() - started)
        row: dict[str, Any] = {"name": case.name, "note": case.note, "same_model": case.same_model,
                               "command": "shardbench " + " ".join(case.argv)}
        if case.est_s > left:
            alone = (f"--recipe {case.name.removeprefix('recipe ')}" if part == "accuracy"
                     else f"--cases '{case.name}'")
            row["status"] = (f"skipped: {case.est_s:.0f} s expected, {max(left, 0):.0f} s left; run it with "
                             f"--part {part} {alone}")
            record.add(row)
            continue
        run_dir = work / f"{part}-runs" / slug(case.name)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        argv = [*case.argv, "--out", str(run_dir)] if case.kind == "train" else case.argv
        print(f"[{part}] {case.name} ...", flush=True)
        code, seconds, last = run_process(argv, logs / f"{slug(case.name)}.log",
                                          min(left, args.case_timeout_s) if not args.smoke else 600, args.smoke)
        row["seconds"] = round(seconds, 1)
        if code is None:
            row["status"] = f"{FAILED[1]} after {seconds:.0f} s"
        elif code != 0:
            row["status"] = ("refused: " if code == 2 else f"{FAILED[0]} ({code}): ") + last[-300:]
        else:
            row["status"] = "ok"
        if code != 0:
            row["log_tail"] = (logs / f"{slug(case.name)}.log").read_text(errors="replace").splitlines()[-20:]
        if case.kind == "train" and code == 0:
            row.update(read_run(run_dir, _batch_of(case.argv)))
            if case.name == "baseline":
                baseline = row["losses"]
            elif baseline and case.same_model and row["losses"]:
                dtype = case.argv[case.argv.index("--dtype") + 1]
                row["losses_agree"] = all(abs(a - b) <= LOSS_RTOL[dtype] * abs(b)
                                          for a, b in zip(row["losses"], baseline))
            if part == "profile":
                row["kernels"] = kernel_section(run_dir, case.name, sizes)
            if part == "accuracy":
                row["accuracy_line"] = accuracy_section(run_dir, case.name, out)
        if case.kind == "bench" and code == 0:
            raw = work / "bench-raw" / "bench.md"
            if (work / "bench-raw" / "bench.json").exists():
                shutil.copy(work / "bench-raw" / "bench.json", out / "bench-raw.json")
            record.record.setdefault("sections", []).append(raw.read_text() if raw.exists() else "")
        if case.kind == "command" and part == "plan":
            validation = work / "plan-sweep" / "plan-validation.json"
            if validation.exists():
                shutil.copy(validation, out / "plan-validation.json")
            tail = (logs / f"{slug(case.name)}.log").read_text(errors="replace").splitlines()[-25:]
            record.record.setdefault("sections", []).append("```\n" + "\n".join(tail) + "\n```")
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the disk: the figures are in the record
        print(f"[{part}] {case.name}: {row['status']} ({seconds:.0f} s)", flush=True)
        record.add(row)
        if row.get("kernels"):
            record.record.setdefault("sections", []).append(row["kernels"])
            record.write()
    record.note(f"part took {time.perf_counter() - started:.0f} s; every command is in {part}.json")
    return record


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-").lower()


def kernel_section(run_dir: Path, name: str, sizes: Sizes) -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from shardbench.measure.kernels import find_trace, kernel_table, render

    config = json.loads((run_dir / "config.json").read_text())
    kernels, total = kernel_table(find_trace(run_dir), top=30)
    return f"### Kernels: {name}\n\n" + render(kernels, total, config["train"]["profile_steps"])


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


def collect(folder: Path) -> str:
    """Every part's markdown in `folder`, in the parts' order: the text of benchmarks/results-h100.md."""
    parts = [folder / f"{p}.md" for p in PARTS if (folder / f"{p}.md").exists()]
    head = ("# shardbench on a GPU: the latest GPU suite results\n\nMade by `python benchmarks/gpu_suite.py "
            "--collect DIR --to benchmarks/results-h100.md` from the parts' files; each part names its date, "
            "commit and device.\n")
    return head + "\n" + "\n\n".join(p.read_text() for p in parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--part", default="", help=f"one of {', '.join(PARTS)}, or all")
    parser.add_argument("--out", type=Path, default=None, help="results folder (PART.md, PART.json per part): "
                                                               "small, to bring back")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "shardbench-gpu-suite",
                        help="where the runs, their logs and the compilation caches go (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="every part on a CPU at tiny sizes (default: all)")
    parser.add_argument("--cases", default="", help="comma list of case names to run (default: all of the part)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds a part may start cases in")
    parser.add_argument("--case-timeout-s", type=float, default=420.0, help="seconds one case may take")
    parser.add_argument("--recipe", default="vit-cifar", help="accuracy part: a recipe preset, or all")
    parser.add_argument("--data-path", default="", help="accuracy part: the CIFAR-10 image tar")
    parser.add_argument("--variant", default="", help="profile part: the variant to profile (default: the "
                                                      "fastest of variants-bf16.json whose losses agree)")
    parser.add_argument("--collect", type=Path, default=None, help="render a results folder's parts as one page")
    parser.add_argument("--to", type=Path, default=None, help="with --collect: write the page here")
    args = parser.parse_args(argv)
    if args.collect:
        text = collect(args.collect)
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
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    failures: list[str] = []
    for name in PARTS if part == "all" else (part,):
        failures += run_part(name, args, args.out, env).failures()
        print(f"wrote {args.out / (name + '.md')}", flush=True)
    if failures:  # the figures of the other cases are written; the exit status says the run is not complete
        print(f"gpu_suite: {len(failures)} case(s) failed or timed out:", *failures, sep="\n  ", file=sys.stderr,
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
