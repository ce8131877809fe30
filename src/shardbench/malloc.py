"""glibc allocator settings that keep XLA's CPU buffers off the page-fault path, for the processes they pay in.

XLA's CPU runtime takes every step's temporaries from `malloc` on its worker threads. With glibc's
defaults, blocks that large come from fresh `mmap`s (or from per-thread arenas that hand memory back
with `madvise`), so each step touches its whole working set as new 4 KiB pages: measured on a 2-core
EPYC, a `vit-seed` step at batch 128 took 595,000 page faults and 1.7 s of kernel time out of 6.5 s.
One arena, no `mmap` for large blocks and no trimming make freed blocks come back to the next step as
they are: 0 faults, 0.02 s of kernel time. The cost is that the process keeps its peak heap until it
exits, which a training process does anyway.

The one arena also makes XLA's compiler, which runs on many threads, queue on malloc. Measured:
- on an H100, vit-seed's train step compiled in 79.7 s instead of 15.0 s (bfloat16, batch 1024) and in
  137-142 s instead of 21.6 s (float32, batch 128), for the same images/s: never on an accelerator;
- on 2 CPU cores (Xeon), the same step compiled in 6.3-6.9 s instead of 3.8-4.8 s and vit-tiny's in
  4.4-4.8 s instead of 2.8-3.0 s, while each step ran 12% faster (36.7 vs 32.6 images/s; 1.37x on the
  EPYC). Setting the arena limit with mallopt(3) after compiling keeps the compile time but loses the
  step gain (33.4 images/s), because XLA's threads already hold their arenas by then.
So a process gets the tuned allocator only when JAX will run on the CPU (`target_platform`, decided
before JAX is imported) and it is a training process long enough to repay the slower compilation (at
least `MIN_STEPS` steps, or trained by epochs; break-even was about 8 steps of vit-seed). Everything else
(sweep and launch drivers, inspect, reports, short runs, compile-only benchmark cases) keeps glibc's default.

glibc reads `GLIBC_TUNABLES` only when a process starts, so `shardbench train` re-executes itself once
with the variable set (`maybe_reexec`), before JAX is imported. `SHARDBENCH_MALLOC=default` turns it off
everywhere, `SHARDBENCH_MALLOC=tuned` forces it on (to measure it); a user's own tunables win.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import sys
from collections.abc import Callable, Mapping

TUNABLES: dict[str, str] = {
    "glibc.malloc.arena_max": "1",  # every thread allocates from the main (brk) heap
    "glibc.malloc.mmap_max": "0",  # large blocks come from that heap too, not from fresh mmaps
    "glibc.malloc.trim_threshold": str(1 << 40),  # and freed memory stays there for the next step
}
OPT_OUT = "SHARDBENCH_MALLOC"  # "default" (never tuned) or "tuned" (wherever glibc can)
MIN_STEPS = 20  # a CPU training run shorter than this does not repay the slower compilation
_MARKER = "SHARDBENCH_MALLOC_TUNED"
_CHOICE = "SHARDBENCH_MALLOC_CHOICE"  # why this process has the allocator it has, for its record

# An accelerator JAX will pick by itself: (platform, the modules that bring its plugin, its device files).
ACCELERATORS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("gpu", ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"),
     ("/dev/nvidiactl", "/dev/nvidia[0-9]*")),
    ("gpu", ("jax_rocm7_plugin", "jax_rocm60_plugin", "jax_plugins.xla_rocm7", "jax_plugins.xla_rocm60"),
     ("/dev/kfd",)),
    ("tpu", ("libtpu",), ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")),
)
_PLATFORM_NAMES = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}


def _module_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def target_platform(environ: Mapping[str, str], *, installed: Callable[[str], bool] = _module_installed,
                    present: Callable[[str], bool] = lambda pattern: bool(glob.glob(pattern))) -> str:
    """'cpu', 'gpu' or 'tpu' (or another name JAX_PLATFORMS gives): where JAX will run this process,
    decided without importing JAX. JAX_PLATFORMS (its first entry) is what JAX obeys; without it, JAX
    takes an accelerator whose plugin is installed and whose device files exist, else the CPU."""
    requested = (environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or "").split(",")[0].strip()
    if requested:
        return _PLATFORM_NAMES.get(requested.lower(), requested.lower())
    for name, modules, devices in ACCELERATORS:
        if any(installed(m) for m in modules) and any(present(d) for d in devices):
            return name
    return "cpu"


def _glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def choice(environ: Mapping[str, str], train_steps: int | None) -> tuple[bool, str]:
    """(tune?, why) for a process that will train `train_steps` steps (0: by epochs; None: not a training
    process, or one whose steps are not known)."""
    asked = environ.get(OPT_OUT, "").lower()
    if asked == "default":
        return False, f"{OPT_OUT}=default"
    if not _glibc():
        return False, "not glibc"
    if asked == "tuned":
        return True, f"{OPT_OUT}=tuned"
    where = target_platform(environ)
    if where != "cpu":
        return False, f"JAX runs on {where}, where the single arena slows XLA's compiler"
    if train_steps is None:
        return False, "not a training process"
    if 0 < train_steps < MIN_STEPS:
        return False, f"{train_steps} steps do not repay its slower compilation (under {MIN_STEPS})"
    return True, "CPU training"


def applies(environ: Mapping[str, str], train_steps: int | None = 0) -> bool:
    return choice(environ, train_steps)[0]


def tuned_environ(environ: Mapping[str, str], why: str = "") -> dict[str, str]:
    """`environ` with our tunables added to GLIBC_TUNABLES; tunables the user set already win."""
    env = dict(environ)
    if why:
        env[_CHOICE] = why
    given = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    names = {t.split("=", 1)[0] for t in given}
    added = [f"{k}={v}" for k, v in TUNABLES.items() if k not in names]
    env["GLIBC_TUNABLES"] = ":".join(given + added)
    env[_MARKER] = "1"
    return env


def default_environ(environ: Mapping[str, str], why: str) -> dict[str, str]:
    """`environ` for a child that runs with glibc's default allocator (and does not re-execute itself)."""
    env = {k: v for k, v in environ.items() if k not in (_MARKER, "GLIBC_TUNABLES")}
    env[_CHOICE] = why
    env[OPT_OUT] = "default"
    return env


def child_environ(environ: Mapping[str, str], train_steps: int | None) -> dict[str, str]:
    """The environment for a child process that does not choose for itself (a benchmark worker): tuned or
    default by `choice`, with the reason it will report."""
    tune, why = choice(environ, train_steps)
    return tuned_environ(environ, why) if tune else default_environ(environ, why)


def describe(environ: Mapping[str, str]) -> str:
    """What this process runs with, for records: 'tuned (why; tunables)' or 'default (why)'."""
    why = environ.get(_CHOICE, "")
    if environ.get(_MARKER) and environ.get("GLIBC_TUNABLES"):
        return f"tuned ({why or 'inherited'}; {environ['GLIBC_TUNABLES']})"
    return f"default ({why or choice(environ, None)[1]})"


def maybe_reexec(train_steps: int | None) -> None:
    """Re-run this very command line once with the tuned allocator where `choice` says so; returns when the
    process already has it, or should not. Call before importing JAX: nothing is lost by replacing the
    process."""
    if os.environ.get(_MARKER):
        return
    tune, why = choice(os.environ, train_steps)
    os.environ[_CHOICE] = why
    if not tune:
        return
    argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *argv[1:]], tuned_environ(os.environ))
    except OSError:
        os.environ[_CHOICE] = "could not re-execute"
        return  # cannot re-exec (unusual interpreter setup): run with the default allocator
