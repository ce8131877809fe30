"""Compile many candidates at once: worker processes (`python -m shardbench.startup shardbench.plan.compile`),
each set up with the device count its candidates need, sharing the persistent compilation cache; candidates are
dealt out round-robin and each result comes back as a JSON line as soon as it is compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from shardbench import malloc
from shardbench.subprocs import kill_group, start

COMPILE_WORKER = "shardbench.plan.compile"  # what a worker runs: `python -m shardbench.startup COMPILE_WORKER`

Job = dict[str, Any]  # {name, config (flattened), link_span, topology?}


def default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores)


def compiler_platform(job: Job, environ: dict[str, str] | os._Environ[str]) -> str:
    """The platform whose compiler a worker for `job` uses: "tpu" for a TPU slice (libtpu describes it beside
    the CPU backend), "gpu" for a GPU target or GPU record (`gpu_kind`) where JAX would run on GPUs here (the
    same probe that picks the allocator, `shardbench.malloc.target_platform`), else "cpu". A GPU worker still
    falls back to the CPU compiler when this host's GPUs are not the target's chip, or too few
    (`shardbench.plan.compile.local_gpus`): each prediction names the compiler that really compiled it."""
    if job.get("topology") is not None:
        return "tpu"
    if job.get("gpu_kind") and malloc.target_platform(environ) == "gpu":
        return "gpu"
    return "cpu"


def _environ(job: Job) -> dict[str, str]:
    env = malloc.default_environ(os.environ, "compile-only planning worker")
    platform = compiler_platform(job, env)
    if platform == "tpu":
        from shardbench.plan.tpu import ENVIRON

        env.update({k: v for k, v in ENVIRON.items() if k not in env})
    if platform == "gpu":
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # workers share the GPUs: no pool each
    else:
        # The CPU backend (a TPU slice is described by libtpu beside it): the sharded state and the
        # collectives are exact whatever compiles them.
        env["JAX_PLATFORMS"] = "cpu"
    return env


def compile_all(jobs: list[Job], workers: int, on_result: Callable[[dict[str, Any]], None] | None = None
                ) -> dict[str, dict[str, Any]]:
    """{job name: its line (result, refused or error)} for every job; `on_result` sees each as it comes."""
    by_devices: dict[int, list[Job]] = {}
    for job in jobs:
        by_devices.setdefault(int(job["config"]["parallel.devices"]), []).append(job)
    shares: list[list[Job]] = []
    for group in by_devices.values():  # one process serves one device count
        n = max(1, min(workers, len(group)))
        shares.extend([group[i::n] for i in range(n)])
    found: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def serve(share: list[Job]) -> None:
        last = "no result"
        try:
            # The child's stderr goes to a file: a pipe nobody reads until the end could fill and stall it.
            with tempfile.TemporaryFile(mode="w+") as log:
                proc = start([sys.executable, "-m", "shardbench.startup", COMPILE_WORKER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=log, text=True, env=_environ(share[0]),
                             start_new_session=True)
                try:
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(json.dumps(share))
                    proc.stdin.close()
                    for text in proc.stdout:
                        try:
                            line = json.loads(text)
                        except ValueError:
                            continue  # not ours: something a library wrote to the same descriptor
                        if not isinstance(line, dict) or "name" not in line:
                            continue
                        with lock:
                            found[line["name"]] = line
                            if on_result is not None:
                                on_result(line)
                    proc.wait()
                finally:
                    kill_group(proc, grace_s=1.0)
                log.seek(0)
                if proc.returncode != 0:
                    last = (log.read().strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        except (OSError, subprocess.SubprocessError) as err:
            last = f"{type(err).__name__}: {err}"
        finally:
            for job in share:  # a worker that died leaves its remaining candidates as errors, not gaps
                with lock:
                    found.setdefault(job["name"], {"name": job["name"],
                                                   "error": f"the compile worker stopped: {last}"})

    threads = [threading.Thread(target=serve, args=(share,), daemon=True) for share in shares if share]
    # At most `workers` worker processes at once, whatever device counts they serve.
    running: list[threading.Thread] = []
    for thread in threads:
        thread.start()
        running.append(thread)
        if len(running) >= workers:
            running.pop(0).join()
    for thread in running:
        thread.join()
    return {job["name"]: found[job["name"]] for job in jobs}
