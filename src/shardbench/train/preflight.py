"""Pre-flight checks of a training run: every check that needs no compilation (configuration, mesh,
divisibility, SPMD style, profile window, dataset, resume directory, precision), made before the run directory is
written to. `check_run` returns the `CheckedRun` the loop trains; `check_runnable` is the part that needs no data
either, which a sweep (`shardbench.sweep.preflight`, the same checks in child processes) and the planner ask of
every configuration before anything runs.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import jax

from shardbench import config as config_lib
from shardbench.config import Config, TrainConfig
from shardbench.data.arrays import Dataset, ImageDataset
from shardbench.data.pipeline import steps_per_epoch
from shardbench.data.sources import check_model_kind, load_for, validate_spec
from shardbench.devices import select_devices
from shardbench.errors import ConfigError, FileFault, writable_dir
from shardbench.parallel.rules import Layout, make_layout
from shardbench.parsing import from_dict
from shardbench.precision import check_supported
from shardbench.tasks import Task, for_data, get_task, validate
from shardbench.train.spmd import check_style
from shardbench.models.spec import ModelSpec, check_outputs, describe_model
from shardbench.train.state import check_layout

@dataclass(frozen=True)
class CheckedRun:
    """A checked run: every decision made before anything is compiled or written."""

    cfg: Config
    task: Task
    out: Path
    layout: Layout
    spec: ModelSpec
    dataset: ImageDataset | Dataset
    steps_per_epoch: int
    total_steps: int


def resolve_out(cfg: Config) -> Path:
    if cfg.train.out:
        return Path(cfg.train.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.preset}-{cfg.parallel.strategy.replace('+', '_')}-{stamp}"


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


def check_runnable(cfg: Config, devices: list[jax.Device] | None = None) -> tuple[Task, Layout, ModelSpec]:
    """Every check that needs neither the data nor a compilation (what a sweep asks of each run before the
    first starts): raises ConfigError/DataError in one line. `devices`: lay the run over these (a planner's
    target devices) instead of this process's."""
    validate(cfg)
    task = get_task(cfg)
    validate_spec(cfg.data.dataset)
    check_model_kind(cfg.data.dataset, cfg.model.kind)
    if devices is None:
        devices = select_devices(cfg.parallel.devices)
    layout = make_layout(cfg.parallel.strategy, cfg.parallel.mesh, devices)
    check_style(cfg.parallel.spmd, layout)
    spec = describe_model(cfg)
    if cfg.model.factory:
        check_outputs(cfg, spec)
    check_layout(spec, layout)
    for name, size in (("--batch-size", cfg.train.batch_size), ("--train.eval-batch-size", eval_batch(cfg))):
        divisor = layout.data_size
        if size % divisor == 0:
            divisor = math.lcm(divisor, layout.process_share(size)[1])
        if size % divisor:
            raise ConfigError(
                f"{name} {size} is not divisible by the data-parallel size {divisor} ({layout.strategy.name} on "
                f"mesh {layout.shape}): use a multiple of {divisor}"
            )
    if cfg.data.mixup > 0 and (cfg.train.batch_size // layout.data_size) % 2:
        per = cfg.train.batch_size // layout.data_size
        raise ConfigError(f"--data.mixup mixes the images of pairs, which must sit on one device: --batch-size "
                          f"{cfg.train.batch_size} gives {per} per data slice ({layout.strategy.name} on mesh "
                          f"{layout.shape}); use a batch of {2 * layout.data_size * max(1, per // 2)}")
    if cfg.train.steps > 0:
        check_profile_window(cfg.train, cfg.train.steps)
    return task, layout, spec


def check_run(cfg: Config) -> CheckedRun:
    """Everything that can be checked without compiling: raises ConfigError/DataError in one line."""
    task, layout, spec = check_runnable(cfg)
    out = resolve_out(cfg)
    check_resume(cfg, out)
    check_supported(cfg.precision, layout.device)
    writable_dir(config_lib.cache_root(cfg), "--data.cache-dir")  # decoded datasets and the host's peak go there
    dataset = load_for(cfg, config_lib.cache_root(cfg))
    per_epoch = steps_per_epoch(len(dataset.train), cfg.train.batch_size, cfg.data.repeat_augment)
    if per_epoch == 0:
        raise ConfigError(
            f"--batch-size {cfg.train.batch_size} is larger than the {len(dataset.train)} training examples"
        )
    total = cfg.train.steps if cfg.train.steps > 0 else cfg.train.epochs * per_epoch
    check_profile_window(cfg.train, total)
    writable_dir(out, "--out")  # last: a run refused above leaves no folder behind
    return CheckedRun(cfg, for_data(task, dataset), out, layout, spec, dataset, per_epoch, total)


def check_profile_window(t: TrainConfig, steps_left: int) -> None:
    """--profile traces steps skip+1 .. skip+steps of this invocation: a run with fewer steps, or a window of no
    steps, would trace nothing."""
    if t.profile and t.profile_steps > 0 and steps_left < t.profile_skip + t.profile_steps:
        raise ConfigError(
            f"--profile traces steps {t.profile_skip + 1}-{t.profile_skip + t.profile_steps} (--train.profile-skip "
            f"{t.profile_skip} + --train.profile-steps {t.profile_steps}), but this run has {steps_left} step(s) "
            f"to train: lower them or train at least {t.profile_skip + t.profile_steps} steps")


def eval_batch(cfg: Config) -> int:
    return cfg.train.eval_batch_size or cfg.train.batch_size
