"""Compile many candidates at once: worker processes (`python -m shardbench.plan.compile`), each set up with
the device count its candidates need, sharing the persistent compilation cache; candidates are dealt out
round-robin and each result comes back as a JSON line as soon as it is compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from shardbench import malloc
from shardbench.subprocs import dies_with_parent, kill_group

Job = dict[str, Any]  # {name, config (flattened), link_span, topology?}


def default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores)


def _environ(job: Job) -> dict[str, str]:
    env = malloc.default_environ(os.environ, "compile-only planning worker")
    if job.get("topology") is not None:
        from shardbench.plan.tpu import ENVIRON

        env.update({k: v for k, v in ENVIRON.items() if k not in env})
    if not (job.get("gpu_kind") and malloc.target_platform(env) == "gpu"):
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
    failures: list[str] = []

    def serve(share: list[Job]) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "shardbench.plan.compile"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environ(share[0]),
                                start_new_session=True, preexec_fn=dies_with_parent())
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            proc.stdin.write(json.dumps(share))
            proc.stdin.close()
            for text in proc.stdout:
                line = json.loads(text)
                with lock:
                    found[line["name"]] = line
                    if on_result is not None:
                        on_result(line)
            err = proc.stderr.read()
            proc.wait()
        finally:
            kill_group(proc, grace_s=1.0)
        if proc.returncode != 0:
            last = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            with lock:
                failures.append(last)
        for job in share:  # a worker that died leaves its remaining candidates as errors, not gaps
            with lock:
                found.setdefault(job["name"], {"name": job["name"], "error": f"the compile worker stopped: "
                                               f"{failures[-1] if failures else 'no result'}"})

    threads = [threading.Thread(target=serve, args=(share,), daemon=True) for share in shares if share]
    # Device counts run one after another (each worker group uses every core); workers within one at once.
    running: list[threading.Thread] = []
    for thread in threads:
        thread.start()
        running.append(thread)
        if len(running) >= workers:
            running.pop(0).join()
    for thread in running:
        thread.join()
    return {job["name"]: found[job["name"]] for job in jobs}
