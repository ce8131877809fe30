"""`shardbench plan`: predict memory, communication and step time of every candidate layout on a target, rank
them and recommend one, with what an epoch of each would cost (dollars and kWh from the price table); or, with
`--validate DIR`, predict runs that were measured and print the error."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench import config as config_lib
from shardbench import outdir, startup, validation
from shardbench.errors import ConfigError, writable_dir
from shardbench.flags import (add_config_arguments, comma_lists, config_from_args, given_fields, parse_ints,
                              parse_names)
from shardbench.jsonfile import write_json_atomic
from shardbench.plan.candidates import (DEFAULT, EXPERT_PARALLEL, PER_STAGE, USES, Candidate, candidates,
                                        default_strategies, one_per_layout)
from shardbench.plan.target import HINT, Target, ignored_layout_notes, parse_target
from shardbench.prices import CPU, PriceTable, epoch_cost, prices_from_flag, significant

if TYPE_CHECKING:
    from shardbench.plan.build import Plan

# A plan takes comma lists of these (in their short spelling or their long one, `--train.grad-accum`).
LIST_FLAGS = {"precision.dtype": "--dtype", "model.remat": "--remat", "train.grad_accum": "--grad-accum"}


# What --help says of those lists' defaults (each field's help says the rest).
LIST_HELP = {"precision.dtype": "here a comma list; default: the preset's (vit-seed: {default})",
             "model.remat": "here a comma list; default: 'none,block' (a model of your own: its own)"}


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
    add_config_arguments(parser, LIST_HELP)
    group = parser.add_argument_group("plan options")
    group.add_argument("--target", default="", help=f"the hardware: {HINT}")
    group.add_argument("--candidates", default=None, metavar="S,S",
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
    """The comma lists of --dtype, --remat and --grad-accum, each value checked as its field declares (removed from
    `args`, which then holds one value of each)."""
    return comma_lists(args, LIST_FLAGS)


def _choices(cfg: config_lib.Config, lists: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    return list(dict.fromkeys(lists.get("precision.dtype", [cfg.precision.dtype]))), remat_choices(cfg, lists)


def remat_choices(cfg: config_lib.Config, lists: dict[str, list[str]]) -> list[str]:
    """The --remat values to plan: those given, else none and block for a built-in model. A model of your own
    checkpoints as its build decides (it is handed the configuration, --model.remat among it): its default is
    the configured value, and a list given is planned value by value as for any model (it was cut to its first)."""
    remats = lists.get("model.remat", [cfg.model.remat] if cfg.model.factory else ["none", "block"])
    return list(dict.fromkeys(remats))


def claim_out(cfg: config_lib.Config, target: Target) -> tuple[Path, outdir.Claim | None]:
    """--out, else runs/plan-<model>-<target>-<time>, made now (`outdir.claim`: a folder no other command
    shares); and the claim, None where --out was given."""
    if cfg.train.out:
        return Path(cfg.train.out), None
    model = "model" if cfg.model.factory else cfg.preset
    made = outdir.claim(outdir.stamped(f"plan-{model}-{target.spec.replace(':', '-')}"))
    return made.path, made


def prepare(args: argparse.Namespace) -> tuple[config_lib.Config, Target, list[Candidate], dict[str, str]]:
    """Everything a plan checks before compiling (one-line ConfigError): the configuration, the target, libtpu
    for a TPU target, and the candidates, one per distinct layout, with each strategy left out for laying out as
    another (on one device: `one_per_layout`)."""
    lists = _lists(args)
    cfg = config_from_args(args)
    if not args.target:
        raise ConfigError(f"plan needs --target ({HINT}), or --validate DIR")
    # What needs no model and no JAX first (the fields, the target, the lists): a refusal there takes a fraction
    # of a second. Then the models' own rules, the task's and the dataset's, which import the models and JAX.
    validation.validate(cfg, model_rules=False)
    if cfg.parallel.spmd == "pmap":
        raise ConfigError("--spmd pmap replicates parameters and runs data parallelism only: plan with --spmd jit "
                          "or shard_map")
    target = parse_target(args.target, cpu_devices=cfg.parallel.devices or 8)
    if target.topology:
        from shardbench.plan.tpu import check_available

        check_available(target.spec)
    dtypes, remats = _choices(cfg, lists)
    accums = list(dict.fromkeys(int(k) for k in lists.get("train.grad_accum", [str(cfg.train.grad_accum)])))
    strategies = (list(parse_names("--candidates", args.candidates, list(USES))) if args.candidates is not None
                  else default_strategies(cfg))
    per_stage = list(parse_ints("--microbatches-per-stage", str(args.microbatches_per_stage)))
    found = candidates(target.devices, cfg.train.batch_size, strategies, remats, dtypes, accums, per_stage)
    with startup.quiet_imports():  # the models, JAX and flax: imported with the collector quiet, as at a start
        from shardbench.preflight import check_dataset
        from shardbench.tasks import validate

    validate(cfg)
    check_dataset(cfg)  # what train refuses of the dataset, once here rather than for every candidate
    return cfg, target, *one_per_layout(found, target.devices)


# The generated datasets, whose training examples a plan knows without reading them.
GENERATED = ("synthetic", "tokens-uniform", "regression")
CIFAR10_TRAIN = 50_000


def epoch_examples(cfg: config_lib.Config) -> int | None:
    """Training examples in an epoch, where the configuration alone says (generated data, CIFAR-10), after the
    validation split and --data.repeat-augment; None for a dataset of files the plan does not read."""
    name = cfg.data.dataset.partition(":")[0]
    if cfg.data.dataset in GENERATED:
        n = cfg.data.synthetic_train
    elif name == "cifar10":
        n = CIFAR10_TRAIN
    else:
        return None
    return (n - round(n * cfg.data.val_fraction)) * cfg.data.repeat_augment


def cost_rows(plan: Plan, table: PriceTable) -> tuple[list[list[str]], list[dict[str, Any]], str]:
    """Per compiled candidate: dollars (on demand, spot) and kWh per epoch, and per billion tokens or million
    images; the plan.json entries; and the line naming the price row (or why there is none)."""
    from shardbench.data.epochs import steps_per_epoch
    from shardbench.tasks import get_task

    cfg, target = plan.cfg, plan.target
    row = target.chip.name if target.chip is not None else CPU
    price = table.lookup(row)
    if price is None:  # the row to add, not the target (--target 2x8xh100 is priced by the h100 row)
        return [], [], (f"cost: the price table ({table.origin}) has no row for {row} (--target {target.spec}): "
                        f"add [devices.{row}]")
    task = get_task(cfg)
    examples = epoch_examples(cfg)
    whole = steps_per_epoch(examples, cfg.train.batch_size) if examples else 0
    per_epoch = whole > 0  # a batch larger than the epoch's examples makes no whole step: per-unit figures only
    steps = whole or 1  # 1: the per-unit figures only
    rows: list[list[str]] = []
    entries: list[dict[str, Any]] = []
    for i, r in enumerate(plan.rows, 1):
        if r.prediction is None:
            continue
        cost = epoch_cost(price, r.prediction.step_s, steps, target.devices, hosts=target.nodes, unit=task.unit,
                          units_per_step=cfg.train.batch_size * task.units_per_example(cfg), prices=table.origin)
        # Three significant digits in plain notation, as the report's cost columns: $0.000499, never $0.0004993
        # beside $0.0005, nor 5.087e-05.
        epoch = ([f"${significant(cost.on_demand_usd, 3)}", f"${significant(cost.spot_usd, 3)}",
                  significant(cost.kwh, 3)] if per_epoch else ["-", "-", "-"])
        rows.append([str(i), r.candidate.name, *epoch, f"${significant(cost.on_demand_usd_per, 3)}",
                     f"${significant(cost.spot_usd_per, 3)}", significant(cost.kwh_per, 3)])
        shown = {k: v for k, v in dataclasses.asdict(cost).items() if v is not None}
        if not per_epoch:  # the per-unit figures hold without an epoch; the per-epoch ones would be per step
            shown = {k: shown[k] for k in ("per", "on_demand_usd_per", "spot_usd_per", "kwh_per", "price_source")}
        entries.append({"name": r.candidate.name, **shown})
    if rows:
        per = entries[0]["per"]
        rows.insert(0, ["#", "candidate", "$/epoch on-demand", "$/epoch spot", "kWh/epoch",
                        f"$/{per} on-demand", f"$/{per} spot", f"kWh/{per}"])
    epoch_note = (f"an epoch: {steps} steps of {cfg.train.batch_size}" if per_epoch else
                  f"no epoch size: {cfg.data.dataset} is not read by a plan" if examples is None else
                  f"no whole step in an epoch: --batch-size {cfg.train.batch_size} is more than its {examples} examples")
    line = (f"cost at {price.describe()}; {target.priced_on(price.per)}; {epoch_note}; energy estimated from the "
            f"table's watts ({table.origin} price table)")
    return rows, entries, line


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def write_cost(plan: Plan, table: PriceTable, paths: tuple[Path, Path]) -> list[str]:
    """The cost table as printed lines; also added to plan.json ("cost") and plan.md."""
    rows, entries, line = cost_rows(plan, table)
    write_json_atomic(paths[0], {**plan.to_dict(), "cost": {"line": line, "candidates": entries}})
    md = ["", "## Cost", "", line, ""]
    if rows:
        md += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        md += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    with paths[1].open("a") as f:
        f.write("\n".join(md) + "\n")
    return ["", "cost per epoch:", *(f"  {r}" for r in (_columns(rows) if rows else [])), f"  {line}"]


def run(args: argparse.Namespace) -> int:
    if args.workers < 0:
        raise ConfigError(f"--workers {args.workers}: give a number of processes, or 0 for one per core")
    from shardbench.devices import leave_out_absent_tpu

    if args.validate is not None:
        from shardbench.plan.validate import validate_dir

        leave_out_absent_tpu()
        return validate_dir(args.validate, args.calibrate, args.workers)
    cfg, target, cands, folded = prepare(args)
    leave_out_absent_tpu()  # the checks above start no JAX backend; the compiling below does
    for note in ignored_layout_notes(given_fields(args), target, "plan"):
        print(f"shardbench: note: {note}", flush=True)
    prices = prices_from_flag(cfg.train.prices)  # a bad table is one line before anything compiles
    out, made = claim_out(cfg, target)
    writable_dir(out, "--out", create=False)  # before the compiling, not after it
    from shardbench.plan.build import make_plan

    with outdir.released_on_error(made):
        plan = make_plan(cfg, target, cands, args.workers, args.calibrate, progress=sys.stderr, folded=folded)
    paths = plan.write(out)
    print(plan.text())
    print("\n".join(write_cost(plan, prices, paths)))
    print(f"\nplan written to {paths[0]} and {paths[1]}")
    if any(r.prediction for r in plan.rows):
        return 0
    print(f"shardbench plan: no candidate compiled for --target {target.spec}: each one's reason is above and in "
          f"{paths[1]}", file=sys.stderr, flush=True)
    return 1


__all__ = ["add_parser", "prepare", "run"]
