"""CPU seconds of a few short shardbench commands, for two source trees side by side.

    python benchmarks/startup_cpu.py BEFORE_SRC AFTER_SRC [--repeats 5]
    python benchmarks/startup_cpu.py --bytecode SRC [--repeats 5]

`--bytecode`: one tree, its commands run without its modules' bytecode (every `__pycache__` under SRC removed
before the run, and PYTHONDONTWRITEBYTECODE=1, as some sandboxes and CI images set it) and with it
(`python -m compileall` first), taking turns.

Each command runs as `python -m shardbench ...` with PYTHONPATH set to one tree's `src` folder, the two trees
taking turns (before, after, before, ...) so that the host's pace moves both alike. It prints each command's
median user+system CPU seconds (the process and its children) for each tree, and their ratio. The commands are
small on purpose: they are what a test suite or a sweep starts many times, and where a process's start weighs.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# (label, arguments after `python -m shardbench`); {out} is a fresh folder
COMMANDS: list[tuple[str, list[str]]] = [
    ("presets", ["presets"]),
    ("train refused (bad --dtype)", ["train", "--preset", "mlp-small", "--dtype", "float8", "--out", "{out}"]),
    ("inspect vit-tiny", ["inspect", "--preset", "vit-tiny", "--devices", "8"]),
    ("train vit-tiny 4 steps", ["train", "--preset", "vit-tiny", "--steps", "4", "--batch-size", "32", "--data",
                                "synthetic", "--data.synthetic-train", "256", "--data.synthetic-test", "64",
                                "--no-train.progress", "--out", "{out}"]),
]
ENV = {"JAX_PLATFORMS": "cpu", "SHARDBENCH_MALLOC": "default",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                    "--xla_cpu_use_fusion_emitters=false"}


def set_bytecode(src: Path, present: bool) -> None:
    for cache in src.rglob("__pycache__"):
        shutil.rmtree(cache)
    if present:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True)


def cpu_seconds(src: Path, argv: list[str], bytecode: bool | None = None) -> float:
    """One run's user+system CPU seconds (its children's included), from the kernel's accounting; `bytecode`:
    with src's bytecode written first, or without any (None: as the tree is)."""
    if bytecode is not None:
        set_bytecode(src, bytecode)
    with tempfile.TemporaryDirectory() as tmp:
        args = [a.replace("{out}", str(Path(tmp) / "run")) for a in argv]
        env = {**os.environ, **ENV, "PYTHONPATH": str(src), "SHARDBENCH_CACHE": str(Path(tmp) / "cache"),
               **({"PYTHONDONTWRITEBYTECODE": "1"} if bytecode is not None else {})}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "shardbench", *args], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the first tree's src folder (with --bytecode: the tree)")
    parser.add_argument("after", type=Path, nargs="?", help="the second tree's src folder")
    parser.add_argument("--bytecode", action="store_true", help="one tree, without its bytecode, then with it")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command in each tree (default: 5)")
    args = parser.parse_args()
    if (args.after is None) != args.bytecode:
        parser.error("give two trees, or one with --bytecode")
    heads = ("without bytecode", "with bytecode") if args.bytecode else ("before", "after")
    print(f"| command | {heads[0]} (CPU s, median) | {heads[1]} (CPU s, median) | ratio | runs each |")
    print("|---|---:|---:|---:|---:|")
    for label, argv in COMMANDS:
        times: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            for name in ("before", "after"):
                if args.bytecode:
                    times[name].append(cpu_seconds(args.before.resolve(), argv, bytecode=name == "after"))
                else:
                    times[name].append(cpu_seconds(getattr(args, name).resolve(), argv))
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"| {label} | {b:.2f} | {a:.2f} | {a / b:.2f} | {args.repeats} |", flush=True)
        print(f"<!-- {label}: before {' '.join(f'{t:.2f}' for t in times['before'])}; "
              f"after {' '.join(f'{t:.2f}' for t in times['after'])} -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
