"""JAX's persistent compilation cache: a run whose programs were compiled before loads them from disk.

A sweep repeats programs across runs and across invocations (a resumed sweep, the same grid
tomorrow), so every `shardbench train` points JAX at one cache directory before its first
compilation. JAX decides once per process whether the cache is on, at the first compilation, so
`enable` must run before anything is jitted. Hits are counted from JAX's own monitoring events.
On a GPU, XLA's per-fusion autotune cache is kept in the same directory where the installed jax can.
"""

from __future__ import annotations

import threading
from pathlib import Path

import jax

from shardbench.errors import writable_dir

OFF = "off"
# With the persistent cache on, XLA's per-fusion GPU autotune results go under it too (jax >= 0.4.36), so a
# later run of another mesh or batch of the same model skips autotuning the fusions it shares.
XLA_CACHES_OPTION = "jax_persistent_cache_enable_xla_caches"
AUTOTUNE_CACHE = "xla_gpu_per_fusion_autotune_cache_dir"
_HIT = "/jax/compilation_cache/cache_hits"
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"


class CacheCounter:
    """Counts compilations that asked the cache and those it answered, from this process's start."""

    def __init__(self) -> None:
        self.hits = 0
        self.requests = 0
        self._lock = threading.Lock()

    def __call__(self, event: str, **_: object) -> None:
        if event in (_HIT, _REQUEST):
            with self._lock:
                if event == _HIT:
                    self.hits += 1
                else:
                    self.requests += 1


COUNTER = CacheCounter()
jax.monitoring.register_event_listener(COUNTER)


def resolve(setting: str, cache_root: Path) -> Path | None:
    """The directory a `train.compile_cache` setting names: '' = <cache root>/xla, 'off' = none."""
    if setting.strip().lower() == OFF:
        return None
    return Path(setting).expanduser() if setting else cache_root / "xla"


def use(setting: str, cache_root: Path, root_flag: str) -> Path | None:
    """Resolve a `train.compile_cache` setting and `enable` it. A folder that cannot be used is named by the flag it
    came from: --train.compile-cache where that was given, else the cache root's (`root_flag`: --data.cache-dir or
    $SHARDBENCH_CACHE, `config.cache_root_flag`), which the default <cache root>/xla is made in."""
    path = resolve(setting, cache_root)
    if path is None or setting:
        enable(path)
    else:
        writable_dir(cache_root, root_flag)
        enable(path, f"{root_flag} {cache_root}: its compilation cache")
    return path


def enable(path: Path | None, flag: str = "--train.compile-cache") -> None:
    """Use `path` as the persistent cache (every program, however fast it compiled); None turns it off. `flag`
    names the folder in the one line that says it cannot be used."""
    if path is None:
        if jax.config.jax_compilation_cache_dir is not None:
            _reset()
        jax.config.update("jax_enable_compilation_cache", False)
        return
    writable_dir(path, flag)
    if jax.config.jax_compilation_cache_dir not in (None, str(path)):
        _reset()  # this process already opened another cache directory (several runs in one process)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if hasattr(jax.config, XLA_CACHES_OPTION):  # XLA's GPU autotune results too, where this jax can keep them
        jax.config.update(XLA_CACHES_OPTION, AUTOTUNE_CACHE)


def _reset() -> None:
    try:
        from jax._src import compilation_cache  # no public way to reopen the cache elsewhere

        compilation_cache.reset_cache()
    except (ImportError, AttributeError):
        pass


def counts() -> tuple[int, int]:
    """(hits, requests) so far in this process: take one before a run and pass it to `stats`."""
    return COUNTER.hits, COUNTER.requests


def shift(since: tuple[int, int], before: tuple[int, int], after: tuple[int, int]) -> tuple[int, int]:
    """`since` moved past the compilations between `before` and `after`, so that they are not counted."""
    return since[0] + after[0] - before[0], since[1] + after[1] - before[1]


def stats(path: Path | None, since: tuple[int, int] = (0, 0)) -> dict[str, object]:
    """The cache's directory and the hits and requests since `since` (one run's share of the process)."""
    xla = getattr(jax.config, XLA_CACHES_OPTION, None) if path is not None else None
    return {"dir": None if path is None else str(path), "hits": COUNTER.hits - since[0],
            "requests": COUNTER.requests - since[1], "xla_caches": xla}
