"""A run's folder: the name it gets when `--out` names none, and whether a run may start or resume in it."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax

from shardbench import cluster
from shardbench import config as config_lib
from shardbench.config import Config
from shardbench.errors import ConfigError, FileFault
from shardbench.parsing import from_dict


def resolve_out(cfg: Config) -> Path:
    if cfg.train.out:
        return Path(cfg.train.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.preset}-{cfg.parallel.strategy.replace('+', '_')}-{stamp}"


def shared_out(cfg: Config) -> Config:
    """With several processes and no --out, every process takes the folder name process 0's clock gives."""
    if jax.process_count() == 1 or cfg.train.out:
        return cfg
    mine = str(resolve_out(cfg))
    out = cluster.exchange(mine)[0]
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=out))


def check_resume(cfg: Config, out: Path) -> None:
    """A run directory is resumed only with the configuration it was started with."""
    if out.exists() and not out.is_dir():
        raise FileFault(f"--out {out} is a file: give a folder for the run (it holds config.json, checkpoints, ...)")
    saved_path = out / "config.json"
    if cfg.train.resume:
        if not saved_path.exists():
            raise ConfigError(f"--resume: {out} holds no run to resume (no config.json); drop --resume to start one")
        try:
            saved = config_lib.flatten(from_dict(json.loads(saved_path.read_text())))
        except (json.JSONDecodeError, ConfigError) as err:
            raise ConfigError(f"--resume: {saved_path} is unreadable ({err}); start a new run with another --out")
        current = config_lib.flatten(cfg)
        diffs = [k for k in current if k not in config_lib.REPORTING_ONLY and saved.get(k) != current[k]]
        if diffs:
            k = diffs[0]
            more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
            raise ConfigError(
                f"--resume: {out} was trained with {k}={saved.get(k)!r}, not {current[k]!r}{more}; resume with "
                f"the same configuration or start a new run with another --out"
            )
    elif out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out} already holds a run: pass --resume to continue it, or choose another --out")
