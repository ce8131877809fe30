"""The host's matmul peak on the CPU: measured once, then shared, so every run's MFU divides by the same number.

A CPU has no data-sheet peak, so a short matmul measures it. Measured afresh in every process, it varied from
160 to 308 GFLOP/s on one 2-core machine, and MFU then ranked runs against their step times. So:
- a lone `shardbench train` reads the host's cached figure for its compute dtype (`<cache>/peaks.json`, keyed
  by host name, CPU model, usable cores and dtype), measuring and caching it only when there is none or
  `--train.recalibrate-peak` asks;
- a sweep measures once before its first run and hands the figure to every run through
  `SHARDBENCH_PEAK_FILE` (a JSON file of {dtype: peak}, kept as `<sweep>/peak.json` for a resume);
- the processes of one run (`shardbench launch`, a cluster) all use process 0's figure, exchanged when
  they have joined (`shardbench.train.build.shared_host_peak`).
The record says which figure was used, where it came from and when it was measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardbench.jsonfile import read_json_dict, write_json_atomic

PEAK_FILE_ENV = "SHARDBENCH_PEAK_FILE"
CACHE_NAME = "peaks.json"


@dataclass(frozen=True)
class HostPeak:
    """The whole host's matmul FLOP/s in one dtype, and its provenance."""

    dtype: str
    flops_per_s: float
    measured_at: str  # UTC, ISO 8601
    host: str  # host name, CPU model, usable cores
    origin: str = ""  # how this process got it: measured now, the host cache, or handed over by a sweep/launch
    busy: str = ""  # measured while other work loaded the host ('load average 5.1 on 2 core(s)'): it may read low

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def host_key() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{socket.gethostname()} | {cpu} | {cores} cores"


def measure(dtype: str, size: int = 1536, repeats: int = 5) -> HostPeak:
    """Whole-host matmul FLOP/s on JAX's CPU backend: the best of a few timed size^3 matmuls in `dtype`."""
    import jax
    import jax.numpy as jnp

    device = jax.devices("cpu")[0]
    a = jax.device_put(jnp.ones((size, size), dtype), device)
    b = jax.device_put(jnp.ones((size, size), dtype), device)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        mm(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return HostPeak(dtype, 2.0 * size**3 / best, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), host_key(),
                    "measured now")


def _from(entry: Any, origin: str) -> HostPeak | None:
    """A stored figure, or None where the entry is not one (an edited or damaged file: measured again rather
    than every run of a sweep failing on it)."""
    try:
        peak = HostPeak(str(entry["dtype"]), float(entry["flops_per_s"]), str(entry["measured_at"]),
                        str(entry["host"]), origin, str(entry.get("busy") or ""))
    except (TypeError, KeyError, ValueError):
        return None
    return peak if math.isfinite(peak.flops_per_s) and peak.flops_per_s > 0 else None


def host_peak(dtype: str, cache_dir: Path, recalibrate: bool = False) -> HostPeak:
    """The figure this process uses: handed over by a sweep or launch, else the host cache, else measured
    (and cached, unless other work loaded the host: then it carries the load, `host_load`). `recalibrate`
    measures afresh and replaces the cached figure."""
    handed = os.environ.get(PEAK_FILE_ENV)
    if handed and not recalibrate:
        handed_peak = _from(read_json_dict(Path(handed)).get(dtype), f"handed over in {handed}")
        if handed_peak is not None:
            return handed_peak
    cache = cache_dir / CACHE_NAME
    key = f"{host_key()} | {dtype}"
    entries = read_json_dict(cache)
    cached = _from(entries.get(key), f"host cache {cache}") if not recalibrate else None
    if cached is not None:
        return cached
    busy = host_load()
    peak = measure(dtype)
    if busy:
        return dataclasses.replace(peak, busy=busy)
    entries[key] = {k: v for k, v in peak.to_dict().items() if k not in ("origin", "busy")}
    write_json_atomic(cache, entries)
    return peak


def host_load() -> str | None:
    """'load average 5.1 on 2 core(s)' where the host's last minute's load average is above half its usable
    cores: other work on them slows a matmul, so a peak measured now reads low and every MFU divided by it high.
    None on a quiet host, or where the OS keeps none."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"load average {load:.1f} on {cores} core(s)" if load > cores / 2 else None


def busy_note(load: str) -> str:
    """The line for a peak measured at `load` (`host_load`)."""
    return (f"the host was at {load} as its matmul peak was measured: other work on the cores reads the peak low "
            f"and MFU high, so it is not kept as the host's cached figure, and the runs' records and report say so; "
            f"measure on a quiet host (a lone run: --train.recalibrate-peak)")


def measure_into(path: Path, dtypes: list[str], cache_dir: Path, busy: str | None = None
                 ) -> dict[str, dict[str, Any]]:
    """Measure each dtype's peak afresh in a clean CPU process, write them to `path` (for SHARDBENCH_PEAK_FILE)
    and, on a quiet host, into the host cache; on a busy one (`busy`: `host_load`'s words) each figure written
    to `path` carries them, so the runs dividing by it say so. Returns what was written."""
    keep = busy is None
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop(PEAK_FILE_ENV, None)
    done = subprocess.run([sys.executable, "-m", "shardbench.measure.peak", str(cache_dir),
                           *([] if keep else ["--no-cache"]), *sorted(set(dtypes))],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"measuring the host's matmul peak failed: {done.stderr.strip().splitlines()[-1:]}")
    data = {dtype: {**entry, **({"busy": busy} if busy else {})} for dtype, entry in json.loads(done.stdout).items()}
    write_json_atomic(path, data)
    return data


def measure_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """The host's memory bandwidth in bytes/s: the best of a few copies of a `megabytes` array (each byte read
    once and written once), what a collective between simulated devices does."""
    import numpy as np

    src = np.ones(megabytes * 2**20 // 8, np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * src.nbytes / best


def host_bandwidth(cache_dir: Path) -> tuple[float, str]:
    """(this host's memory bandwidth in bytes/s, where the figure comes from), cached beside the peaks."""
    cache = cache_dir / CACHE_NAME
    key = f"{host_key()} | memory bandwidth"
    entries = read_json_dict(cache)
    if key not in entries:
        entries[key] = {"bytes_per_s": measure_bandwidth(),
                        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_json_atomic(cache, entries)
    entry = entries[key]
    return float(entry["bytes_per_s"]), f"host memory copy {entry['bytes_per_s'] / 1e9:.1f} GB/s measured " \
                                        f"{entry['measured_at']}"


def main(argv: list[str]) -> int:
    """`python -m shardbench.measure.peak CACHE_DIR [--no-cache] DTYPE...`: measure, print {dtype: peak} as JSON,
    and keep each as the host's cached figure, unless --no-cache (a busy host's, `host_load`: read low, it would
    stand for every later lone run's MFU on the host)."""
    cache_dir, dtypes = Path(argv[0]), [d for d in argv[1:] if d != "--no-cache"]
    measured = {d: measure(d) for d in dtypes}
    if "--no-cache" not in argv[1:]:
        cache = cache_dir / CACHE_NAME
        entries = read_json_dict(cache)
        for dtype, peak in measured.items():
            entries[f"{host_key()} | {dtype}"] = {k: v for k, v in peak.to_dict().items()
                                                  if k not in ("origin", "busy")}
        write_json_atomic(cache, entries)
    print(json.dumps({d: {k: v for k, v in p.to_dict().items() if k not in ("origin", "busy")}
                      for d, p in measured.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
