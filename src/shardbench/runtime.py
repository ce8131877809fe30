"""What a training process sets before its first compilation: the XLA flags of `--train.xla-presets`, and the
persistent compilation cache with the counts its run's share of hits is measured from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardbench import compile_cache, xla_presets
from shardbench.config import Config, cache_root, cache_root_flag


@dataclass(frozen=True)
class CacheUse:
    """The persistent compilation cache this run uses, and the process's counts when the run began (its share
    of hits and requests is what it adds to them)."""

    path: Path | None
    since: tuple[int, int]


def start_process(cfg: Config) -> CacheUse:
    """Before the first compilation (the pre-flight precision probe compiles): XLA reads its flags, and JAX
    decides whether the cache is on, once per process."""
    root = cache_root(cfg)
    xla_presets.apply(cfg.train.xla_presets)  # refused where JAX's backends already run without those flags
    cache = compile_cache.use(cfg.train.compile_cache, root, cache_root_flag(cfg))
    return CacheUse(cache, compile_cache.counts())
