"""`shardbench plan`: predict memory, communication and step time of every candidate layout on a target, rank
them and recommend one; or, with `--validate DIR`, predict runs that were measured and print the error."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError, writable_dir
from shardbench.flags import add_config_arguments, config_from_args
from shardbench.plan.candidates import (DEFAULT, EXPERT_PARALLEL, PER_STAGE, USES, Candidate, candidates,
                                        default_strategies)
from shardbench.plan.target import HINT, Target, parse_target

# A plan takes comma lists of these (in their short spelling or their long one, `--train.grad-accum`).
LIST_FLAGS = {"precision.dtype": "--dtype", "model.remat": "--remat", "train.grad_accum": "--grad-accum"}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan", help="predict memory, communication and step time on hardware you don't have, and recommend "
                     "a layout",
        description="Compile the train step of every candidate layout (strategy x mesh x --remat x --dtype x "
                    "--grad-accum) for the target's device count, without running a step, and predict per device: "
                    "the state, "
                    "activations and peak memory and whether it fits, every collective's bytes on the link it "
                    "crosses, and the step time (compute + exposed communication). Writes plan.json and plan.md "
                    "into --out. With --validate DIR: predict every run measured below DIR on the hardware it "
                    "ran on, and print the errors.")
    add_config_arguments(parser)
    group = parser.add_argument_group("plan options")
    group.add_argument("--target", default="", help=f"the hardware: {HINT}")
    group.add_argument("--candidates", default="", metavar="S,S",
                       help=f"strategies to consider (default: {','.join(DEFAULT)}, and for a model with experts "
                            f"{','.join(EXPERT_PARALLEL)} too; also the pipelines "
                            f"{','.join(sorted(set(USES) - set(DEFAULT) - set(EXPERT_PARALLEL)))}, each of which "
                            f"multiplies into stages x microbatches x schedules)")
    group.add_argument("--microbatches-per-stage", default=",".join(map(str, PER_STAGE)), metavar="K,K",
                       help="pipeline candidates: microbatches per stage to consider, a comma list (M = K x stages; "
                            "default 1,4), each with every --parallel.schedule, kept where M divides the examples "
                            "per data shard")
    group.add_argument("--grad-accum", dest="train.grad_accum", default=argparse.SUPPRESS, metavar="K,K",
                       help="microbatches per update to consider, a comma list (plan's spelling of "
                            "--train.grad-accum; default: its value, 1): each multiplies the candidates, kept where "
                            "K divides the layout's examples per data shard")
    group.add_argument("--workers", type=int, default=0, help="compile worker processes (0 = one per core)")
    group.add_argument("--calibrate", action="append", default=[], type=Path, metavar="DIR",
                       help="fit the step-time model to the runs measured below DIR (repeatable); GPU runs recompiled "
                            "on the CPU also fit the GPU/CPU activation ratio per dtype")
    group.add_argument("--validate", default=None, type=Path, metavar="DIR",
                       help="predict every run below DIR (a sweep or run folder) and print the errors")


def _lists(args: argparse.Namespace) -> dict[str, list[str]]:
    """The comma lists of --dtype and --remat (removed from `args`, which then holds one value of each)."""
    out: dict[str, list[str]] = {}
    for key, flag in LIST_FLAGS.items():
        given = getattr(args, key, None)
        if given is None:
            continue
        values = [v.strip() for v in str(given).split(",") if v.strip()]
        if not values:
            raise ConfigError(f"{flag} '{given}': give one value or a comma list")
        if key == "train.grad_accum" and not all(v.isdigit() and int(v) >= 1 for v in values):
            raise ConfigError(f"{flag} '{given}': give whole numbers of microbatches, 1 or more, comma separated")
        out[key] = values
        setattr(args, key, values[0])
    return out


def _choices(cfg: config_lib.Config, lists: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    dtypes = lists.get("precision.dtype", [cfg.precision.dtype])
    for d in dtypes:
        if d not in config_lib.DTYPES:
            raise ConfigError(f"--dtype {d}: choose from {', '.join(config_lib.DTYPES)}")
    if cfg.model.factory:  # a model of your own decides for itself whether it checkpoints
        return dtypes, [cfg.model.remat]
    remats = lists.get("model.remat", ["none", "block"])
    for r in remats:
        if r not in config_lib.REMAT_POLICIES:
            raise ConfigError(f"--remat {r}: choose from {', '.join(config_lib.REMAT_POLICIES)}")
    return dtypes, remats


def default_out(cfg: config_lib.Config, target: Target) -> Path:
    if cfg.train.out:
        return Path(cfg.train.out)
    model = "model" if cfg.model.factory else cfg.preset
    return Path("runs") / f"plan-{model}-{target.spec.replace(':', '-')}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare(args: argparse.Namespace) -> tuple[config_lib.Config, Target, list[Candidate]]:
    """Everything a plan checks before compiling (one-line ConfigError): the configuration, the target, libtpu
    for a TPU target, and the candidates."""
    lists = _lists(args)
    cfg = config_from_args(args)
    if not args.target:
        raise ConfigError(f"plan needs --target ({HINT}), or --validate DIR")
    from shardbench.tasks import validate

    validate(cfg)
    if cfg.parallel.spmd == "pmap":
        raise ConfigError("--spmd pmap replicates parameters and runs data parallelism only: plan with --spmd jit "
                          "or shard_map")
    target = parse_target(args.target, cpu_devices=cfg.parallel.devices or 8)
    if target.topology:
        from shardbench.plan.tpu import check_available

        check_available(target.spec)
    dtypes, remats = _choices(cfg, lists)
    accums = list(dict.fromkeys(int(k) for k in lists.get("train.grad_accum", [str(cfg.train.grad_accum)])))
    strategies = [s.strip() for s in args.candidates.split(",") if s.strip()] or default_strategies(cfg)
    given = str(args.microbatches_per_stage)
    per_stage = [v.strip() for v in given.split(",") if v.strip()]
    if not per_stage or not all(v.isdigit() and int(v) >= 1 for v in per_stage):
        raise ConfigError(f"--microbatches-per-stage '{given}': give whole numbers, 1 or more, comma separated")
    return cfg, target, candidates(target.devices, cfg.train.batch_size, strategies, remats, dtypes, accums,
                                   [int(v) for v in per_stage])


def run(args: argparse.Namespace) -> int:
    if args.workers < 0:
        raise ConfigError(f"--workers {args.workers}: give a number of processes, or 0 for one per core")
    if args.validate is not None:
        from shardbench.plan.validate import validate_dir

        return validate_dir(args.validate, args.calibrate, args.workers)
    cfg, target, cands = prepare(args)
    out = default_out(cfg, target)
    writable_dir(out, "--out", create=False)  # before the compiling, not after it
    from shardbench.plan.build import make_plan

    plan = make_plan(cfg, target, cands, args.workers, args.calibrate, progress=sys.stderr)
    paths = plan.write(out)
    print(plan.text())
    print(f"\nplan written to {paths[0]} and {paths[1]}")
    return 0 if any(r.prediction for r in plan.rows) else 1  # every candidate failed to compile


__all__ = ["add_parser", "prepare", "run"]
