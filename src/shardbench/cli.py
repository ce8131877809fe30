"""The `shardbench` command: parse arguments into a Config and call one function per sub-command.

Every configuration field is a flag `--section.field` (dashes or underscores); the common ones also
have a short spelling (`--batch-size` for `--train.batch-size`). Both spellings set the same field.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Sequence
from typing import Any

from shardbench import config as config_lib
from shardbench import malloc
from shardbench.errors import ShardbenchError, report

SHORT_FLAGS: dict[str, str] = {
    "train.profile": "--profile",
    "data.dataset": "--data", "train.epochs": "--epochs", "train.steps": "--steps",
    "train.batch_size": "--batch-size", "parallel.mesh": "--mesh", "parallel.strategy": "--strategy",
    "parallel.devices": "--devices", "precision.param_dtype": "--param-dtype", "precision.dtype": "--dtype",
    "precision.matmul_precision": "--matmul-precision", "model.dropout": "--dropout", "optim.lr": "--lr",
    "train.seed": "--seed", "train.out": "--out", "train.resume": "--resume", "model.remat": "--remat",
    "parallel.spmd": "--spmd",
}

HELP: dict[str, str] = {
    "data.dataset": "dataset: for vit cifar10 (downloaded and md5-checked), cifar10:PATH (local tarball or "
                    "folder), imagefolder:PATH (folder or .tar/.tar.gz of <split>/<class>/<image>), synthetic; for "
                    "lm tokens-uniform or text:PATH (bytes of a local text file); for mlp regression",
    "data.image_size": "image side in pixels",
    "data.val_fraction": "fraction of train held out for validation when the dataset has no val split",
    "data.cache_dir": "where downloads and decoded images are cached ('' = $SHARDBENCH_CACHE or "
                      "~/.cache/shardbench)",
    "data.synthetic_train": "number of generated training examples (synthetic, tokens-uniform, regression)",
    "data.synthetic_test": "number of generated test examples",
    "data.augment": "random flip and resized crop on training images",
    "data.flip": "random horizontal flip (with --data.augment)",
    "data.crop_scale": "random resized crop: range of the crop's area fraction",
    "data.crop_ratio": "random resized crop: range of the crop's aspect ratio",
    "model.kind": "model: vit (Vision Transformer), lm (decoder-only Transformer language model) or mlp (deep "
                  "ReLU MLP)",
    "model.vocab_size": "lm: vocabulary size (256 for text:PATH, which is byte-level)",
    "model.seq_len": "lm: tokens the model reads per sequence",
    "model.input_dim": "mlp: input features",
    "parallel.spmd": "SPMD style: jit (automatic partitioning), shard_map (explicit per-device program with "
                     "written-out collectives) or pmap (replicated parameters, data parallelism only)",
    "model.patch_size": "patch side in pixels", "model.embed_dim": "model width",
    "model.num_layers": "Transformer blocks, or the MLP's ReLU layers", "model.num_heads": "attention heads",
    "model.mlp_dim": "hidden width of each MLP block (the MLP model's width)",
    "model.num_classes": "output classes (the MLP's outputs)",
    "model.dropout": "dropout rate after the MLP's activation and output",
    "model.unroll": "layers per scan iteration: 1 = rolled loop (compile time flat in depth), N = N layers "
                    "per iteration, 0 = auto (all layers up to 8, else 1)",
    "model.attention": "attention kernel: einsum, fused (jax.nn.dot_product_attention: cuDNN on NVIDIA GPUs) "
                       "or auto (fused on GPUs, einsum elsewhere)",
    "model.remat": "activation checkpointing per block: none, block (keep matmul outputs, recompute the "
                   "element-wise ops) or full (keep only each block's input)",
    "parallel.strategy": "how parameters and batches are split: auto (from the mesh), single, dp, fsdp, tp, "
                         "dp+tp, fsdp+tp",
    "parallel.mesh": "device mesh: N (all on the strategy's axis), AxB (data x model), data=A,model=B, "
                     "or none (one device, no mesh); '' = every device on the strategy's axis",
    "parallel.devices": "devices to use (0 = all); without accelerators, simulates N CPU devices",
    "precision.param_dtype": "parameter (and optimizer state) dtype: float32, bfloat16, float16",
    "precision.dtype": "compute dtype of activations and matmuls: float32, bfloat16, float16",
    "precision.matmul_precision": "matmul precision: default, high, highest",
    "optim.optimizer": "adamw, adam or sgd (with momentum)", "optim.lr": "peak learning rate",
    "optim.weight_decay": "decoupled weight decay on kernels (adamw)", "optim.b1": "Adam beta1",
    "optim.b2": "Adam beta2", "optim.momentum": "SGD momentum",
    "optim.warmup_steps": "linear warm-up steps (-1 = 5%% of training)",
    "optim.schedule": "cosine (decay after warm-up) or constant",
    "optim.end_lr_fraction": "final learning rate as a fraction of the peak (cosine)",
    "optim.grad_clip": "clip gradients to this global norm (0 = off)",
    "train.epochs": "epochs to train", "train.steps": "train exactly this many steps (overrides --epochs)",
    "train.batch_size": "global batch size (split over the data axis)",
    "train.eval_batch_size": "evaluation batch size (0 = --batch-size)", "train.seed": "random seed",
    "train.out": "run directory ('' = runs/<preset>-<strategy>-<time>)",
    "train.resume": "continue the run in --out from its last checkpoint",
    "train.checkpoint_every": "save a checkpoint every N steps (and at the end; 0 = only at the end)",
    "train.keep_checkpoints": "checkpoints to keep", "train.log_every": "steps between scalar logs",
    "train.eval": "validate each epoch and test at the end", "train.progress": "show a progress bar",
    "train.run_name": "name of the run in reports and profiles ('' = from the configuration, e.g. "
                      "mesh_4_2_batch_1024)",
    "train.compile_cache": "persistent compilation cache: '' = <data cache dir>/xla (~/.cache/shardbench/xla), "
                           "'off', or a directory",
    "train.timing_warmup": "first step intervals left out of the step-time statistics (lowered, with a line "
                           "saying so, when a run has too few steps)",
    "train.recalibrate_peak": "on a CPU, measure the host's matmul peak for MFU afresh (and cache it) instead of "
                              "using the cached figure",
    "train.profile": "record a jax.profiler trace of a window of steps",
    "train.profile_skip": "steps to run before the traced window",
    "train.profile_steps": "steps in the traced window",
    "train.profile_root": "TensorBoard log dir for traces ('' = <out>/tensorboard); a trace lands in "
                          "<root>/plugins/profile/<run-name>/",
}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per Config field; short flags are alternative spellings of the same argument."""
    parser.add_argument("--preset", default=argparse.SUPPRESS, choices=sorted(config_lib.PRESETS),
                        help="starting configuration (default: vit-seed); flags override its fields")
    base = config_lib.Config()
    for section in config_lib.SECTIONS:
        group = parser.add_argument_group(f"{section} options")
        section_value = getattr(base, section)
        for name, kind in config_lib.field_types(type(section_value)).items():
            key = f"{section}.{name}"
            flags = [_flag(key)] + ([f"--{key}"] if "_" in name else [])
            if key in SHORT_FLAGS:
                flags.insert(0, SHORT_FLAGS[key])
            default = getattr(section_value, name)
            help_text = f"{HELP.get(key, key)} (vit-seed: {default!r})"
            if kind is bool:
                group.add_argument(*flags, dest=key, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=help_text)
            else:
                metavar = "A,B" if typing.get_origin(kind) is tuple else getattr(kind, "__name__", "X").upper()
                group.add_argument(*flags, dest=key, default=argparse.SUPPRESS, metavar=metavar, help=help_text)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """How this process joins others (jax.distributed); `shardbench launch` sets them through the environment."""
    group = parser.add_argument_group(
        "processes", "join a run of several processes (jax.distributed). Without these flags (or SHARDBENCH_* "
                     "variables) a process runs alone, unless JAX recognises its cluster (SLURM, Cloud TPU, "
                     "Open MPI): then it joins that cluster's processes by itself")
    group.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="address of process 0's coordinator (env SHARDBENCH_COORDINATOR)")
    group.add_argument("--num-processes", type=int, default=None, metavar="N",
                       help="processes in the run (env SHARDBENCH_NUM_PROCESSES)")
    group.add_argument("--process-id", type=int, default=None, metavar="I",
                       help="this process's index, 0 to N-1 (env SHARDBENCH_PROCESS_ID)")
    group.add_argument("--join-timeout", type=int, default=None, metavar="S",
                       help="seconds to wait for every process to join or report (env SHARDBENCH_JOIN_TIMEOUT; "
                            "default 120)")


def config_from_args(args: argparse.Namespace) -> config_lib.Config:
    values: dict[str, Any] = {k: v for k, v in vars(args).items() if "." in k}
    cfg = config_lib.get_preset(getattr(args, "preset", "vit-seed"))
    return config_lib.override(cfg, values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardbench",
        description="Train and compare JAX models under any device mesh, sharding strategy and precision.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    train = sub.add_parser(
        "train", help="train a model (the Vision Transformer on CIFAR-10 by default)",
        description="Train under one configuration. Every field has a --section.field flag; the common ones a "
                    "short one. The resolved configuration is saved as <out>/config.json.",
    )
    add_config_arguments(train)
    add_cluster_arguments(train)
    inspect = sub.add_parser(
        "inspect", help="print the parameter table and how arrays are laid over the mesh (nothing is compiled)",
        description="Print every parameter's path, logical axes, shape, dtype, bytes, PartitionSpec and per-device "
                    "shape under the chosen strategy and mesh, then a picture of one array and of the batch "
                    "over the devices.",
    )
    add_config_arguments(inspect)
    inspect.add_argument("--array", default="",
                         help="parameter to picture over the mesh (default: encoder/mlp2_kernel for vit, "
                              "blocks/mlp2_kernel for lm, hidden_kernel for mlp)")
    from shardbench import launch  # the launch, sweep, report and bench commands live with their code
    from shardbench.bench import bench_cmd
    from shardbench.sweep import report_cmd, sweep_cmd

    launch.add_parser(sub)

    sweep_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    presets = sub.add_parser("presets", help="list the named configurations",
                             description="List the named configurations and what they are for.")
    presets.add_argument("--json", action="store_true", help="print each preset's full configuration as JSON")
    return parser


def setup_devices(cfg: config_lib.Config) -> None:
    """Simulate the devices a run of its own asks for (`--devices N` on a CPU)."""
    # Must run before anything asks JAX for devices.
    if cfg.parallel.devices > 0:
        from shardbench.devices import simulate_devices

        simulate_devices(cfg.parallel.devices)


def _join_or_setup(args: argparse.Namespace, cfg: config_lib.Config) -> None:
    """Join the other processes of a multi-process run (and make sure all were given the same configuration),
    or set up this process's devices for a run of its own."""
    from shardbench import cluster as cluster_lib

    found = cluster_lib.resolve(args.coordinator, args.num_processes, args.process_id, args.join_timeout)
    if found is None:
        setup_devices(cfg)
        return
    config_lib.validate(cfg)  # a bad flag fails here, before this process makes the others wait for it
    cluster_lib.join(found, cluster_lib.local_device_count(found, cfg.parallel.devices))
    cluster_lib.check_same(config_lib.flatten(cfg))


def cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    _join_or_setup(args, cfg)
    import jax

    from shardbench.train.console import summary_line
    from shardbench.train.loop import run

    summary = run(cfg)
    if jax.process_index() == 0:
        print(summary_line(summary))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if cfg.parallel.devices == 0:  # nothing runs: a mesh that names its size gets that many devices
        from shardbench.parallel.mesh import mesh_size

        size = mesh_size(cfg.parallel.mesh)
        if size:
            cfg = config_lib.override(cfg, {"parallel.devices": size})
    setup_devices(cfg)
    from shardbench.inspect import inspect

    print(inspect(cfg, args.array))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    for name, make in config_lib.PRESETS.items():
        cfg = make()
        if args.json:
            print(f"# {name}\n{cfg.to_json()}")
        else:
            doc = " ".join((make.__doc__ or "").split())
            print(f"{name:10s} {doc}  [{preset_shape(cfg)}; batch {cfg.train.batch_size}, data {cfg.data.dataset}]")
    return 0


def preset_shape(cfg: config_lib.Config) -> str:
    """The fields that shape a preset's model, in its own kind's terms."""
    m = cfg.model
    if m.kind == "mlp":
        return f"mlp: {m.num_layers} layers of width {m.mlp_dim} on {m.input_dim} inputs, {m.num_classes} outputs"
    blocks = f"embed {m.embed_dim}, {m.num_layers} layers, {m.num_heads} heads, mlp {m.mlp_dim}"
    if m.kind == "lm":
        return f"lm: vocabulary {m.vocab_size}, sequence {m.seq_len}, {blocks}"
    return f"{m.kind}: patch {m.patch_size}, {blocks}, {m.num_classes} classes"


def _train_steps(args: argparse.Namespace) -> int | None:
    """The steps a `train` command will run (0: by epochs), for the allocator's choice; None for the other
    commands, which leave training to processes of their own, and for a configuration `train` will refuse."""
    if args.command != "train":
        return None
    try:
        return config_from_args(args).train.steps
    except ShardbenchError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:  # run as a program (not called from Python): the allocator, before JAX is imported
        malloc.maybe_reexec(_train_steps(args))
    from shardbench import launch
    from shardbench.bench import bench_cmd
    from shardbench.sweep import report_cmd, sweep_cmd

    commands = {"train": cmd_train, "inspect": cmd_inspect, "sweep": sweep_cmd.run, "report": report_cmd.run,
                "presets": cmd_presets, "bench": bench_cmd.run, "launch": launch.run}
    try:
        return commands[args.command](args)
    except ShardbenchError as err:
        return report(err)
    except KeyboardInterrupt:
        print("shardbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "build_parser", "config_from_args"]
