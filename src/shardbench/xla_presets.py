"""Named sets of XLA compiler options (`--train.xla-presets`), put into `XLA_FLAGS` before JAX starts its backends.

XLA reads `XLA_FLAGS` once, when the first backend starts, and ends the process on a flag it does not know. So
the presets are checked by name before anything else runs, their flags are checked against the installed
jaxlib in a short child process (`check_known`), and `apply` refuses to run once a backend is up, since the
flags would then be ignored. Whatever `XLA_FLAGS` a process ran with, presets and hand-set flags alike, goes
into its run record (`measurements.xla_flags`).

The GPU presets are the switches the GPU suite compares side by side (`benchmarks/gpu_suite.py --part
variants-bf16`); none of them is a default. On a CPU or TPU the `xla_gpu_*` flags are accepted and do nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from shardbench.errors import ConfigError
from shardbench.fields import unknown_choice


@dataclass(frozen=True)
class Preset:
    flags: tuple[str, ...]
    doc: str


PRESETS: dict[str, Preset] = {
    # CUDA graphs: XLA records runs of kernels as command buffers and launches each run at once, which cuts
    # the per-kernel launch cost that dominates small steps.
    "command-buffers": Preset(("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,"
                               "COLLECTIVES,CONDITIONAL,WHILE",
                               "--xla_gpu_graph_min_graph_size=1"),
                              "CUDA graphs for fusions, GEMMs, cuDNN calls, collectives and loops"),
    "no-command-buffers": Preset(("--xla_gpu_enable_command_buffer=",), "every kernel launched on its own"),
    "cudnn-layernorm": Preset(("--xla_gpu_enable_cudnn_layer_norm=true",), "LayerNorm as one cuDNN kernel"),
    "cudnn-gemm-fusion": Preset(("--xla_gpu_cudnn_gemm_fusion_level=2",),
                                "GEMMs fused with their neighbours by cuDNN rather than Triton"),
    "no-triton-gemm": Preset(("--xla_gpu_enable_triton_gemm=false",), "GEMMs from cuBLAS only, no Triton GEMMs"),
    # The autotuner times candidate kernels for every GEMM and fusion while compiling: level 0 skips it, 4 (XLA's
    # default) also checks the candidates' results. On one H100 (2026-11-28, benchmarks/data/h100-2026-11-28/),
    # vit-seed bfloat16 b1024 compiled in 9.7 s at level 0 against 13.9 s at 4, and stepped in 220 ms against 25.2.
    **{f"autotune-{level}": Preset((f"--xla_gpu_autotune_level={level}",), f"GPU autotune level {level}")
       for level in range(5)},
    "latency-hiding": Preset(("--xla_gpu_enable_latency_hiding_scheduler=true",),
                             "schedule collectives to overlap with compute (several GPUs)"),
}


def parse(text: str) -> list[str]:
    """The preset names of `--train.xla-presets` (a comma list), or one line naming the unknown one."""
    refusal = unknown_choice("--train.xla-presets", text, tuple(PRESETS), comma_list=True)
    if refusal:
        raise ConfigError(f"{refusal}, or pass XLA_FLAGS yourself")
    return [n.strip() for n in text.split(",") if n.strip()]


def flags(text: str) -> list[str]:
    """The XLA flags the presets named in `text` stand for, in order."""
    return [flag for name in parse(text) for flag in PRESETS[name].flags]


def merged(existing: str, extra: list[str]) -> str:
    """`existing` XLA_FLAGS with `extra` added; an extra flag replaces an existing one of the same name."""
    names = {flag.split("=", 1)[0] for flag in extra}
    kept = [f for f in existing.split() if f.split("=", 1)[0] not in names]
    return " ".join(kept + extra)


def backends_started() -> bool:
    """Whether JAX has started a backend in this process (after which XLA_FLAGS is no longer read)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return bool(getattr(xla_bridge, "_backends", None))


def apply(text: str, environ: MutableMapping[str, str] | None = None) -> str:
    """Put the presets' flags into XLA_FLAGS and return the resulting XLA_FLAGS: into this process's environment
    (before any backend starts) or, given `environ`, into a child's."""
    own = environ is None
    environ = os.environ if environ is None else environ
    extra = flags(text)
    if not extra:
        return environ.get("XLA_FLAGS", "")
    value = merged(environ.get("XLA_FLAGS", ""), extra)
    if own and value != environ.get("XLA_FLAGS", "") and backends_started():
        raise ConfigError(f"--train.xla-presets {text}: JAX already started its backends in this process, so XLA "
                          f"would ignore the flags; run it as its own process (shardbench train), or set "
                          f"XLA_FLAGS='{value}' before importing JAX")
    environ["XLA_FLAGS"] = value
    return value


_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: *(\S+)")


def check_known(value: str, environ: Mapping[str, str] | None = None, timeout: float = 120.0) -> None:
    """Start XLA once, in a child process on the CPU, with XLA_FLAGS=`value`: an installed jaxlib that does not
    know one of the flags ends that child, and this says which flag in one line instead of ending the run."""
    env = dict(os.environ if environ is None else environ, XLA_FLAGS=value, JAX_PLATFORMS="cpu")
    try:
        done = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return  # slow, not refused: the run itself will tell
    if done.returncode != 0:
        found = _UNKNOWN.search(done.stderr)
        what = found.group(1) if found else (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"XLA_FLAGS '{value}': this jaxlib refuses {what}; drop that preset or flag "
                          f"(see --train.xla-presets in 'shardbench train --help')")
