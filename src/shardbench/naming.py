"""How runs are named, in one place: the seed's style (`mesh_4_2_batch_1024`), from a configuration for a
run of its own, or from the values a sweep varies for each of its runs.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from shardbench.config import Config

# The longest run name: a run's folder is named by it, and a file name may have 255 bytes (its log adds ".log",
# a second process's ".p1.log"). A longer name keeps its first characters and ends in a hash of the whole.
MAX_NAME = 200

# How a swept field shows in a run name, as in the seed's run names (mesh_4_2_batch_1024); others use the field.
NAME_PARTS: dict[str, str] = {
    "parallel.mesh": "mesh", "parallel.strategy": "strategy", "parallel.devices": "devices",
    "train.batch_size": "batch", "precision.param_dtype": "pdtype", "precision.dtype": "dtype",
    "precision.matmul_precision": "matmul", "parallel.spmd": "spmd", "train.grad_accum": "accum",
}


def _name_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "_".join(str(v) for v in value)
    text = str(value)
    if key == "parallel.mesh" and re.fullmatch(r"\d+x\d+", text.strip().lower()):
        return text.strip().lower().replace("x", "_")
    return text or "default"


def run_name(overrides: dict[str, Any]) -> str:
    """The seed's style, from the swept values only: mesh_4_2_batch_1024, pdtype_bfloat16, lr_0.001; past
    `MAX_NAME` characters, its start and a hash of the whole name (two runs keep two names)."""
    if not overrides:
        return "base"
    parts = [f"{NAME_PARTS.get(k, k.partition('.')[2])}_{_name_value(k, v)}" for k, v in overrides.items()]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "_".join(parts)).strip("_")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[:MAX_NAME - len(digest) - 1]}_{digest}"


def config_run_name(cfg: Config, mesh: str, strategy: str, implied: str) -> str:
    """The seed's naming (mesh_4_2_batch_1024) for a run of its own, plus whatever else differs from the plain
    float32 run (dtypes, Adam's first moment's included): `mesh` as data_model or 'none', the strategy that ran, and the one its mesh implies."""
    parts = [f"mesh_{mesh}", f"batch_{cfg.train.batch_size}"]
    if strategy != implied:
        parts.append(strategy.replace("+", "_"))
    p = cfg.precision
    if p.param_dtype != "float32":
        parts.append(f"pdtype_{p.param_dtype}")
    if p.dtype != "float32":
        parts.append(f"dtype_{p.dtype}")
    if p.matmul_precision != "default":
        parts.append(f"matmul_{p.matmul_precision}")
    if cfg.optim.mu_dtype and cfg.optim.optimizer != "sgd":  # Adam's first moment in its own dtype: another
        parts.append(f"mu_{cfg.optim.mu_dtype}")  # run's memory, same name otherwise (SGD keeps no moment)
    if cfg.parallel.spmd != "jit":
        parts.append(f"spmd_{cfg.parallel.spmd}")
    if cfg.train.grad_accum > 1:
        parts.append(f"accum_{cfg.train.grad_accum}")
    if cfg.model.remat != "none":  # the same layout keeping fewer activations: another run's memory and time
        parts.append(f"remat_{cfg.model.remat}")
    if cfg.parallel.sequence_parallel:  # tp's LayerNorm and dropout regions split along the sequence
        parts.append("seqpar")
    if "pp" in strategy.split("+"):  # the pipeline's schedule and microbatches: the runs a pipeline user compares
        if cfg.parallel.schedule != "gpipe":
            parts.append(cfg.parallel.schedule)
        if cfg.parallel.microbatches:
            parts.append(f"mb_{cfg.parallel.microbatches}")
        if cfg.parallel.schedule == "circular" and cfg.parallel.repeats != 1:
            parts.append(f"repeats_{cfg.parallel.repeats}")
    if "cp" in strategy.split("+"):  # how the sequence's attention was reached, where the default is not
        if cfg.parallel.context != "all-gather":
            parts.append(cfg.parallel.context)
        if cfg.parallel.context_order != "head-tail":
            parts.append(cfg.parallel.context_order)
    return "_".join(parts)
