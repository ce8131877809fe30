"""The `shardbench` command: parse arguments into a Config and call one function per sub-command.

Every configuration field is a flag `--section.field` (dashes or underscores); the common ones also
have a short spelling (`--batch-size` for `--train.batch-size`). Both spellings set the same field
(see `shardbench.flags`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import typing
from collections.abc import Sequence

from shardbench import config as config_lib
from shardbench import malloc, startup, validation
from shardbench.errors import EXIT_CODES, ShardbenchError, end_process, run_reported
from shardbench.flags import add_config_arguments, config_from_args, given_fields, setup_devices
from shardbench.parsing import override
from shardbench.presets import PRESETS
from shardbench.prices import prices_from_flag

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


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (what was wrong, with the valid choices where there are any) and a
    pointer to --help, not the whole usage."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nsee '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="shardbench",
        description="Train and compare JAX models under any device mesh, sharding strategy and precision.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of a failure (also SHARDBENCH_DEBUG=1), for bug reports")
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
                              "blocks/mlp2_kernel for lm, blocks/expert2_kernel for an lm with experts, "
                              "hidden_kernel for mlp, the largest parameter of a model of your own)")
    from shardbench import launch  # the launch, sweep, report and bench commands live with their code
    from shardbench.bench import bench_cmd
    from shardbench.plan import plan_cmd
    from shardbench.report import report_cmd
    from shardbench.sweep import sweep_cmd
    from shardbench.tune import tune_cmd

    launch.add_parser(sub)

    sweep_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    plan_cmd.add_parser(sub)
    tune_cmd.add_parser(sub)
    presets = sub.add_parser("presets", help="list the named configurations",
                             description="List the named configurations and what they are for.")
    presets.add_argument("--json", action="store_true",
                         help="print every preset's full configuration as one JSON object keyed by preset name")
    return parser


def _validate_before_jax(cfg: config_lib.Config) -> None:
    """Every value against its declaration and the rules between fields, before JAX is imported: a refusal here
    takes a fraction of a second, not the seconds JAX, flax and orbax take to import. The models' own rules import
    their modules (with the collector quiet, as a program's imports are); the checks that need devices or data come
    later, in the run's pre-flight. Then, JAX's backends as this host can start them."""
    from shardbench.devices import leave_out_absent_tpu

    with startup.quiet_imports():
        validation.validate(cfg)
    leave_out_absent_tpu()


def _join_or_setup(args: argparse.Namespace, cfg: config_lib.Config) -> None:
    """Join the other processes of a multi-process run (and make sure all were given the same configuration),
    or set up this process's devices for a run of its own."""
    from shardbench import cluster as cluster_lib

    found = cluster_lib.resolve(args.coordinator, args.num_processes, args.process_id, args.join_timeout)
    if found is None:
        local = int(os.environ.get(cluster_lib.ENV_LOCAL_DEVICES) or 0)
        if local > 0:  # launch's one process of --devices-per-process devices: those, whatever --devices asks
            from shardbench.devices import simulate_devices

            simulate_devices(local)
        else:
            setup_devices(cfg)
        return
    from shardbench.tasks import validate

    validate(cfg)  # the task's checks (the model's shapes) fail here, before this process makes the others wait
    cluster_lib.join(found, cluster_lib.local_device_count(found, cfg.parallel.devices))
    # The coordinator's count of processes is the one JAX keeps: another given to a process is a mistake too.
    given = {} if found.num_processes is None else {"--num-processes": found.num_processes}
    cluster_lib.check_same(config_lib.flatten(cfg) | given)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    prices_from_flag(cfg.train.prices)  # a bad --prices table fails here, in one line, before anything compiles
    if cfg.train.xla_presets:  # XLA reads its flags once, when JAX starts: set and check them before that
        from shardbench import xla_presets

        xla_presets.check_known(xla_presets.apply(cfg.train.xla_presets))
    _validate_before_jax(cfg)
    from shardbench.subprocs import terminated_as_interrupt

    # SIGTERM (a scheduler's preemption, scancel, kill) stops the run as Ctrl-C does: the checkpoint being written
    # is finished, one line says so, exit 143. Its default ended the process silently, losing that checkpoint.
    with terminated_as_interrupt():
        _join_or_setup(args, cfg)
        with startup.quiet_imports():
            import jax

            from shardbench.train.console import summary_line
            from shardbench.train.loop import run

        summary = run(cfg, given_fields(args))
    if jax.process_index() == 0:
        print(summary_line(summary))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    _validate_before_jax(cfg)
    if cfg.parallel.devices == 0:  # nothing runs: a mesh that names its size gets that many devices
        from shardbench.parallel.mesh import mesh_size

        size = mesh_size(cfg.parallel.mesh)
        if size:
            cfg = override(cfg, {"parallel.devices": size})
    setup_devices(cfg)
    with startup.quiet_imports():
        from shardbench.inspect import inspect, unread_notes  # JAX once the devices are set up

    for note in unread_notes(cfg, given_fields(args)):
        print(f"shardbench: note: {note}", file=sys.stderr, flush=True)
    print(inspect(cfg, args.array))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    if args.json:  # one JSON document, each preset's configuration under its name, for `json.load` or jq
        print(json.dumps({name: make().to_dict() for name, make in PRESETS.items()}, indent=2, sort_keys=True))
        return 0
    for name, make in PRESETS.items():
        cfg = make()
        doc = " ".join((make.__doc__ or "").split("\n\n")[0].split())  # the first paragraph: what it is
        print(f"{name:13s} {doc}  [{preset_shape(cfg)}; batch {cfg.train.batch_size}, data {cfg.data.dataset}]")
    return 0


def preset_shape(cfg: config_lib.Config) -> str:
    """The fields that shape a preset's model, in its own kind's terms."""
    m = cfg.model
    if m.kind == "mlp":
        return f"mlp: {m.num_layers} layers of width {m.mlp_dim} on {m.input_dim} inputs, {m.num_classes} outputs"
    blocks = f"embed {m.embed_dim}, {m.num_layers} layers, {m.num_heads} heads, mlp {m.mlp_dim}"
    if m.kind == "lm":
        experts = (f", {m.num_experts} experts of mlp {m.mlp_dim}, top-{m.top_k}, capacity factor {m.capacity_factor:g}"
                   if m.num_experts else "")
        return f"lm: vocabulary {m.vocab_size}, sequence {m.seq_len}, {blocks}{experts}"
    if m.stem == "conv":
        stem = f"conv stem of {m.stem_layers} layer{'s' if m.stem_layers > 1 else ''}"
    else:
        stem = f"{'shifted ' if m.stem == 'shifted-patch' else ''}patch {m.patch_size}"
    extras = [f"{m.pool} pool"] if m.pool != "cls" else []
    extras += ["locality self-attention"] if m.lsa else []
    return f"{m.kind}: {stem}, {blocks}, {m.num_classes} classes" + "".join(f", {e}" for e in extras)


def _train_steps(args: argparse.Namespace) -> int | None:
    """The steps a `train` command will run (0: by epochs), for the allocator's choice; None for the other
    commands, which leave training to processes of their own, and for a configuration `train` will refuse by its
    fields (`validation.validate` without the models' own rules, which imports no JAX): it is refused without
    starting again."""
    if args.command != "train":
        return None
    try:
        cfg = config_from_args(args)
        validation.validate(cfg, model_rules=False)
    except ShardbenchError:
        return None
    return cfg.train.steps


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line's arguments; a flag the command does not take is refused by that command's parser,
    whose line points to its own --help ('shardbench train --help')."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = subcommand_parser(parser, args.command) or parser
        command.error(f"unrecognized arguments: {' '.join(unknown)}{_did_you_mean(command, unknown)}")
    return args


def _did_you_mean(command: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """'; did you mean --batch-size?' for a mistyped flag close to one the command takes (argparse 3.11 gives no
    suggestion), else ''."""
    flags = [s for action in command._actions for s in action.option_strings if s.startswith("--")]
    close = [match for token in unknown if token.startswith("--")
             for match in difflib.get_close_matches(token.partition("=")[0], flags, n=1, cutoff=0.8)]
    return f"; did you mean {' or '.join(dict.fromkeys(close))}?" if close else ""


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    """The parser of sub-command `name`, or None."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # run as a program (not called from Python): its imports with the collector quiet
        startup.begin_program()
    with startup.quiet_imports():
        parser = build_parser()
        args = parse(parser, argv)
        if argv is None:  # the allocator, before JAX starts its backends
            malloc.maybe_reexec(_train_steps(args))
        if args.command in ("sweep", "tune", "bench"):  # each may ask JAX for its devices from here on; train,
            from shardbench.devices import leave_out_absent_tpu  # inspect and plan after their checks

            leave_out_absent_tpu()
        if args.command in ("sweep", "tune", "bench", "report"):
            # These read the models' rules and the layouts (and with them JAX and flax) as they start, before
            # their own checks: imported here, with the collector quiet, not at their first use, where the collector
            # walked the new objects again and again (a report or a sweep's dry run took 0.5 to 1 CPU second more;
            # benchmarks/data/cli-startup/gc-1818.txt, gc-1820.txt).
            import shardbench.models  # noqa: F401
            import shardbench.parallel.rules  # noqa: F401
        from shardbench import launch
        from shardbench.bench import bench_cmd
        from shardbench.plan import plan_cmd
        from shardbench.report import report_cmd
        from shardbench.sweep import sweep_cmd
        from shardbench.tune import tune_cmd

    commands = {"train": cmd_train, "inspect": cmd_inspect, "sweep": sweep_cmd.run, "report": report_cmd.run,
                "presets": cmd_presets, "bench": bench_cmd.run, "launch": launch.run,
                "plan": plan_cmd.run, "tune": tune_cmd.run}
    code = run_reported(lambda: commands[args.command](args), args.debug)
    if argv is None and code in (EXIT_CODES["interrupted"], EXIT_CODES["stopped by SIGTERM"],
                                 EXIT_CODES["output closed"]):
        # Stopped, with every file closed and every worker ended on the way out: the process ends here. Python's
        # shutdown after a stop during the first compilation sometimes crashed (exit -11, after "interrupted")
        # in XLA's threads, which it tears down under them.
        end_process(code)
    return code


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "build_parser", "config_from_args"]
