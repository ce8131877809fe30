"""Pre-flight checks of a training run: every check that needs no compilation (configuration, mesh,
divisibility, SPMD style, whether the parameters alone fit one device, profile window, dataset, resume directory,
precision), made before the run directory is made (`shardbench.train.build` makes it once the whole train state is
known to fit). `check_run` returns the `CheckedRun` the loop trains;
`check_runnable` is the part that needs no data either, which a sweep (`shardbench.sweep.preflight`, the same
checks in child processes) and the planner ask of every configuration before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax

from shardbench import config as config_lib
from shardbench.capacity import check_fits
from shardbench.config import Config
from shardbench.data.arrays import Dataset, ImageDataset, fingerprint
from shardbench.data.epochs import steps_per_epoch
from shardbench.data.sources import check_known_shape, check_model_kind, load_for, validate_spec
from shardbench.devices import select_devices
from shardbench.errors import ConfigError, DataError, FileFault, writable_dir
from shardbench.models.spec import ModelSpec, check_outputs, describe_model
from shardbench.parallel.checks import (
    check_accumulation, check_batch, check_context, check_experts, check_layout, check_pipeline, check_style,
)
from shardbench.parallel.rules import Layout, make_layout
from shardbench.precision import check_supported
from shardbench.rundir import check_resume, check_same_data, resolve_out
from shardbench.tasks import Task, check_own_functions, for_data, get_task, validate
from shardbench.validation import check_profile_window


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
    cache_root: Path  # decoded datasets, compiled programs and the host's peak
    data_fingerprint: str  # what every split holds (`data.arrays.fingerprint`): --resume finds the same data


def check_dataset(cfg: Config) -> None:
    """The dataset's name, its PATH's existence, and whether it feeds this kind of model, reading no data (what a
    plan or tune asks before planning)."""
    validate_spec(cfg.data.dataset)
    check_model_kind(cfg.data.dataset, cfg.model.kind, cfg.model.task if cfg.model.factory else "")
    check_known_shape(cfg.data.dataset, cfg.data.image_size)


def check_runnable(cfg: Config, devices: list[jax.Device] | None = None) -> tuple[Task, Layout, ModelSpec]:
    """Every check that needs neither the data nor a compilation (what a sweep asks of each run before the
    first starts, and `shardbench inspect` of its layout): raises ConfigError/DataError in one line. `devices`: lay
    the run over these (a planner's target devices) instead of this process's."""
    validate(cfg)
    task = get_task(cfg)
    check_dataset(cfg)
    spec = describe_model(cfg)
    if cfg.model.factory:  # the model's outputs, then its file's loss and FLOPs on them: one line, no run folder
        check_own_functions(cfg, task, check_outputs(cfg, spec))
    layout = check_parallel(cfg, spec, devices)
    if cfg.train.steps > 0:
        check_profile_window(cfg.train, cfg.train.steps)
    return task, layout, spec


def check_parallel(cfg: Config, spec: ModelSpec, devices: list[jax.Device] | None = None) -> Layout:
    """The layout's checks: the mesh against the strategy and the devices, the SPMD style, pipeline, experts and
    context against the model, every split dim's divisibility, and the batch (and its accumulated and mixed parts)
    against the data axis. `devices`: as `check_runnable`'s."""
    if devices is None:
        devices = select_devices(cfg.parallel.devices)
    layout = make_layout(cfg.parallel.strategy, cfg.parallel.mesh, devices, cfg.parallel.sequence_parallel)
    # A mixture of experts runs under jit alone: said before the style's own refusals, whose advice (another
    # strategy, shard_map) it would refuse in turn.
    check_experts(spec, layout, cfg.parallel.spmd, cfg.model.kind)
    check_style(cfg.parallel.spmd, layout)
    # Before the layout's divisibility: a stack that does not split into stages is said in the pipeline's words.
    # (The built-in models' dropout flags: a model of your own draws its own, and passes none into its stack.)
    random_layers = () if spec.custom else tuple(
        flag for flag, rate in (("--model.dropout", cfg.model.dropout), ("--model.drop-path", cfg.model.drop_path))
        if rate > 0)
    stack = ("your model's stack of layers" if spec.custom else
             "--model.num-layers" + (": the mlp stacks num_layers - 1" if cfg.model.kind == "mlp" else ""))
    check_pipeline(cfg.parallel.microbatches, cfg.train.batch_size, cfg.train.grad_accum, spec, layout,
                   random_layers, cfg.parallel.schedule, cfg.parallel.repeats, stack)
    check_context(cfg, layout)
    check_layout(spec, layout)
    check_batch("--batch-size", cfg.train.batch_size, layout)
    check_batch("--train.eval-batch-size", cfg.train.eval_batch, layout)
    check_accumulation(cfg.train.grad_accum, cfg.train.batch_size, spec, layout)
    if cfg.data.mixup > 0 and (cfg.train.batch_size // layout.data_size) % 2:
        per = cfg.train.batch_size // layout.data_size
        raise ConfigError(f"--data.mixup mixes the images of pairs, which must sit on one device: --batch-size "
                          f"{cfg.train.batch_size} gives {per} per data slice ({layout.strategy.name} on mesh "
                          f"{layout.shape}); use a batch of {2 * layout.data_size * max(1, per // 2)}")
    return layout


def check_batch_fits_data(cfg: Config, rows: int, name: str) -> int:
    """The steps of an epoch of `rows` training examples (of the dataset `name`); one line where there are none,
    or fewer than one batch. A sweep asks it of every run whose dataset's size its configuration gives."""
    if rows == 0:  # not "a batch larger than 0 examples": the data is what to mend
        raise DataError(f"{name}'s training split holds no examples (after --data.val-fraction "
                        f"{cfg.data.val_fraction} is held out where no validation split is given): give it rows")
    per_epoch = steps_per_epoch(rows, cfg.train.batch_size, cfg.data.repeat_augment)
    if per_epoch == 0:
        # A text file's examples are its windows of --model.seq-len + 1 bytes: the sequence sets how many it holds.
        windows = (f" ({name} cut into windows of --model.seq-len {cfg.model.seq_len} + 1 tokens: a shorter "
                   f"sequence makes more)" if cfg.data.dataset.startswith("text:") else "")
        raise ConfigError(f"--batch-size {cfg.train.batch_size} is larger than the {rows} training "
                          f"examples{windows}")
    return per_epoch


def check_run(cfg: Config) -> CheckedRun:
    """Everything that can be checked without compiling: raises ConfigError/DataError in one line."""
    task, layout, spec = check_runnable(cfg)
    check_fits(cfg, spec, layout)  # before the precision probe compiles anything
    check_supported(cfg.precision, layout.device)
    out = resolve_out(cfg)
    check_resume(cfg, out, spec, layout)
    cache = config_lib.cache_root(cfg)
    writable_dir(cache, config_lib.cache_root_flag(cfg))  # decoded datasets and the host's peak go there
    dataset = load_for(cfg, cache)
    data_fingerprint = fingerprint(dataset)
    if cfg.train.resume:
        check_same_data(out, dataset.name, data_fingerprint)
    task = for_data(task, dataset)
    per_epoch = check_batch_fits_data(cfg, len(dataset.train), dataset.name)
    if cfg.train.eval and len(dataset.test) == 0:  # the run ended complete, with no test score and no word
        raise DataError(f"{dataset.name}'s test split holds no examples, so the run would have no test score: give "
                        f"it rows, or train without evaluation (--no-train.eval)")
    total = cfg.train.steps if cfg.train.steps > 0 else cfg.train.epochs * per_epoch
    check_profile_window(cfg.train, total)
    writable_dir(out, "--out", create=False)  # written once the train state is known to fit (`train.build`)
    # the logs a resumed run appends to: a file or a folder in their place failed only once training had begun
    if (logs := out / "tensorboard").exists():
        if not logs.is_dir():
            raise FileFault(f"--out {out}: {logs} is a file where the run's TensorBoard logs (a folder) go: remove "
                            f"it, or start a new run with another --out")
        writable_dir(logs, "the run's TensorBoard logs")
    if (metrics := logs / "metrics.jsonl").is_dir():
        raise FileFault(f"--out {out}: {metrics} is a folder where the run's log of metrics (a file) goes: remove "
                        f"it, or start a new run with another --out")
    if cfg.train.checkpoint_every > 0:  # a resumed run's checkpoints: written to mid-run, after steps it could lose
        writable_dir(out / "checkpoints", "--out", create=False)
    if cfg.train.profile and cfg.train.profile_root:  # the trace is filed there after its window, mid-run
        writable_dir(Path(cfg.train.profile_root) / "plugins" / "profile", "--train.profile-root", create=False)
    return CheckedRun(cfg, task, out, layout, spec, dataset, per_epoch, total, cache, data_fingerprint)
