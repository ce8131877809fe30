"""`shardbench tune`: enumerate the layout space (`tune.space`), plan every layout (the planner, compile only),
drop what does not fit with its reason, measure the best k within `--budget-min` as a sweep (local or SLURM),
and report predicted against measured, the winner and the plan's regret (`tune.report`)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench import config as config_lib
from shardbench import outdir
from shardbench.errors import ConfigError, writable_dir
from shardbench.flags import (add_config_arguments, comma_lists, config_from_args, given_fields, parse_ints,
                              parse_names)
from shardbench.parsing import override
from shardbench.plan import plan_cmd
from shardbench.plan.candidates import PER_STAGE, USES
from shardbench.plan.target import HINT, Target, ignored_layout_notes, parse_target
from shardbench.prices import prices_from_flag
from shardbench.store import lock_runs
from shardbench.tune.select import (OBJECTIVE_NAMES, OBJECTIVES, MeasuredFigures, Planned, check_budget_floor,
                                    compile_each_s, estimate_run_s, rank, select)
from shardbench.tune.select import objective as select_objective
from shardbench.tune.space import (LAYOUT_KEYS, LIST_FLAGS, Dropped, Point, Space, enumerate_space, layout_settings,
                                   user_settings)

if TYPE_CHECKING:
    from shardbench.tune.report import Tuning

# Comma lists tune takes in a configuration flag's place (the first value stands in the Config meanwhile).
# What each measured run changes from the configuration: a few timed steps, no evaluation, no checkpoint.
MEASURE = {"train.eval": False, "train.checkpoint_every": 0}
INTERRUPTED = (130, 143)  # a sweep stopped by Ctrl-C or SIGTERM (`sweep.runner.run_sweep`)


# What --help says of those lists' defaults (each field's help says the rest): plan's, and the batch sizes.
LIST_HELP = plan_cmd.LIST_HELP | {
    "train.batch_size": "here a comma list of global batch sizes; default: the preset's (vit-seed: {default})"}


def add_parser(subparsers: Any) -> None:
    from shardbench.sweep import slurm_options

    parser = subparsers.add_parser(
        "tune", help="plan every layout, measure the best few within a time budget, and name the fastest",
        description="Enumerate every layout (each strategy of the table on each mesh, x --remat x --dtype x "
                    "--grad-accum x pipeline microbatches and schedules x --batch-size), plan each (compile only: "
                    "does it fit, predicted step), drop what does not fit with its reason, measure the plan's top "
                    "--top-k within --budget-min as a sweep, and report predicted against measured, the winner, the "
                    "regret of the plan's top choice and a ready command (and winner.toml) for the winner. "
                    "--dtype, --remat, --grad-accum and --batch-size take comma lists. The same command with "
                    "--resume finishes an interrupted tune in its --out. See docs/tune.md.")
    add_config_arguments(parser, LIST_HELP)
    group = parser.add_argument_group("tune options")
    group.add_argument("--target", default="", help=f"the hardware to plan for: {HINT} (default on a CPU host: cpu, "
                                                      f"this host with --devices simulated devices, 8 unless given)")
    group.add_argument("--candidates", default=None, metavar="S,S",
                       help=f"strategies to consider (default: every one in the table: {','.join(USES)})")
    group.add_argument("--grad-accum", dest="train.grad_accum", default=argparse.SUPPRESS, metavar="K,K",
                       help="microbatches per update to consider, a comma list (default: the configuration's, 1)")
    group.add_argument("--microbatches-per-stage", default=",".join(map(str, PER_STAGE)), metavar="K,K",
                       help="pipelines: microbatches per stage to consider (M = K x stages; default 1,4)")
    group.add_argument("--schedules", default=",".join(config_lib.PIPELINE_SCHEDULES), metavar="S,S",
                       help=f"pipelines: schedules to consider (default {','.join(config_lib.PIPELINE_SCHEDULES)})")
    group.add_argument("--objective", default="time", choices=list(OBJECTIVE_NAMES),
                       help="what to minimise: " + "; ".join(f"{o.name}: {o.what}" for o in OBJECTIVES.values())
                       + "; cost: on-demand dollars per example on the target, from the price table (--prices); "
                         "every layout uses all the target's devices, so cost ranks as time does and reports "
                         "dollars")
    group.add_argument("--top-k", type=int, default=3, metavar="K", help="layouts to measure (default 3)")
    group.add_argument("--budget-min", type=float, default=30.0, metavar="M",
                       help="minutes the measured runs may take together, by the plan's estimate (default 30)")
    group.add_argument("--measure-steps", type=int, default=10, metavar="N",
                       help="steps each measured run trains (default 10; the median step is the measurement)")
    group.add_argument("--timeout", type=float, default=1800.0, help="seconds each measured run may take")
    group.add_argument("--workers", type=int, default=0, help="compile worker processes (0 = one per core)")
    group.add_argument("--calibrate", action="append", default=[], type=Path, metavar="DIR",
                       help="fit the planner's step-time model to the runs below DIR first (repeatable)")
    slurm_options.add_arguments(parser)
    for action in parser._actions:  # a sweep's follow-up flags: a tune's sweep is followed to its end
        if action.dest in ("status", "cancel"):
            action.help = argparse.SUPPRESS
        if action.dest == "train.resume":  # tune's own meaning of train's flag
            action.help = "finish the interrupted tune in --out: give the flags it was started with"


def make_space(cfg: config_lib.Config, args: argparse.Namespace, lists: dict[str, list[str]]) -> Space:
    strategies = (parse_names("--candidates", args.candidates, list(USES)) if args.candidates is not None
                  else tuple(USES))
    return Space(
        strategies=strategies, remats=tuple(plan_cmd.remat_choices(cfg, lists)),
        # --dtype, --grad-accum and --batch-size were checked as their fields declare (`comma_lists`)
        dtypes=tuple(dict.fromkeys(lists.get("precision.dtype", [cfg.precision.dtype]))),
        accums=tuple(dict.fromkeys(int(v) for v in lists.get("train.grad_accum", [cfg.train.grad_accum]))),
        batches=tuple(dict.fromkeys(int(v) for v in lists.get("train.batch_size", [cfg.train.batch_size]))),
        per_stage=parse_ints("--microbatches-per-stage", args.microbatches_per_stage),
        schedules=parse_names("--schedules", args.schedules, config_lib.PIPELINE_SCHEDULES),
        examples=train_examples(cfg), repeats=cfg.data.repeat_augment)


def train_examples(cfg: config_lib.Config) -> int | None:
    """The distinct training examples of an epoch where the configuration says (what `shardbench train` checks
    each batch against); None for a dataset of files, read only when a run starts."""
    from shardbench.plan.plan_cmd import epoch_examples

    examples = epoch_examples(cfg)  # after the validation split, x --data.repeat-augment
    return None if examples is None else examples // cfg.data.repeat_augment


def check_options(args: argparse.Namespace) -> None:
    if args.top_k < 1:
        raise ConfigError(f"--top-k {args.top_k}: measure at least 1 layout")
    if args.measure_steps < 2:
        raise ConfigError(f"--measure-steps {args.measure_steps}: give at least 2 steps (the first compiles)")
    if args.workers < 0:
        raise ConfigError(f"--workers {args.workers}: give a number of processes, or 0 for one per core")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout:g}")
    check_budget_floor(args.budget_min)


def host_platform() -> str:
    """Where this host's runs run ('cpu', 'gpu', 'tpu'), decided without importing JAX."""
    import os

    from shardbench import malloc

    return malloc.target_platform(os.environ)


def default_target(given: str) -> str:
    """--target, or on a CPU host `cpu`; an accelerator host names its hardware (the plan needs the chip)."""
    if given:
        return given
    here = host_platform()
    if here != "cpu":
        raise ConfigError(f"--target: this host runs on {here}; name its hardware for the plan ({HINT})")
    return "cpu"


def check_measurable(target: Target) -> None:
    """The local executor measures on this host: a target of another platform is planned, not measured, here."""
    platform = "cpu" if target.chip is None else ("tpu" if target.topology else "gpu")
    here = host_platform()
    if platform != here:
        raise ConfigError(f"--target {target.spec} is {platform} hardware and this host runs on {here}: measure on it "
                          f"with --executor slurm (or run tune there), or only plan it with shardbench plan")


@dataclass(frozen=True)
class HostDevices:
    """This host's devices as a run's JAX sees them: the platform, how many, and the first one's device_kind."""

    platform: str
    count: int
    kind: str


# Lists the devices and prints [platform, count, device_kind] as JSON: what a run on this host would get.
PROBE = "import json, jax; d = jax.devices(); print(json.dumps([d[0].platform, len(d), d[0].device_kind]))"


def host_devices(timeout_s: float = 300.0) -> HostDevices:
    """This host's devices, listed by JAX in a process of its own (this one never holds an accelerator that its
    runs need); one line where JAX cannot list them."""
    import json
    import os
    import subprocess

    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # list the devices, hold no memory
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, env=env,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"tune: JAX did not list this host's devices within {timeout_s:.0f} s: check that they "
                          f"are free (nvidia-smi), or measure elsewhere with --executor slurm") from None
    if done.returncode:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        asked = os.environ.get("JAX_PLATFORMS")  # JAX's last line can be a bare AssertionError: say what it was asked
        raise ConfigError(f"tune: JAX could not list this host's devices ({why}"
                          f"{f', with JAX_PLATFORMS={asked}' if asked else ''}): fix the installation (or "
                          f"JAX_PLATFORMS), or measure elsewhere with --executor slurm")
    platform, count, kind = json.loads(done.stdout.strip().splitlines()[-1])
    return HostDevices(platform, int(count), str(kind))


def check_host(target: Target, host: HostDevices) -> None:
    """The local executor runs every layout on this host with all the target's devices: an accelerator target
    needs that many devices here, of its chip where the host's device_kind names a known one. A CPU target's
    devices are simulated by each run (any count), so only accelerator targets are checked."""
    from shardbench.hardware import chip_for_kind

    if target.chip is None:
        return
    here = chip_for_kind(host.kind)
    if target.devices > host.count:
        nodes = f", {target.nodes} nodes of {target.per_node}" if target.nodes > 1 else ""
        fits = f"--target {host.count}x{here.name}" if here is not None and host.platform == "gpu" else (
            f"a target of at most {host.count} devices")
        raise ConfigError(f"--target {target.spec} has {target.devices} devices{nodes}, and this host has "
                          f"{host.count} ({host.kind}): give {fits}, or measure on the target with --executor slurm")
    if here is not None and here.name != target.chip.name:
        instead = (f"--target {target.devices}x{here.name}" if host.platform == "gpu" else
                   f"a {here.name} --target ({here.name}:AxB)")
        raise ConfigError(f"--target {target.spec} is {target.chip.name} and this host's devices are {here.name} "
                          f"({host.kind}): give {instead}, or measure on the target with --executor slurm")


def claim_out(cfg: config_lib.Config, target: Target) -> Path:
    """--out, else runs/tune-<model>-<target>-<time>, made now (`outdir.claim`): a folder no other tune shares."""
    if cfg.train.out:
        return Path(cfg.train.out)
    model = "model" if cfg.model.factory else cfg.preset
    return outdir.claim(outdir.stamped(f"tune-{model}-{target.spec.replace(':', '-')}")).path


def nothing_fits(planned: list[Planned], dropped: list[Dropped], out: Path) -> ConfigError:
    """One line: no layout fits, with the layouts counted by why and the commonest reason of all, those dropped
    before planning (`dropped`) among them."""
    kinds: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for p in planned:
        kind = ("do not fit in memory" if p.prediction is not None else
                "were refused" if p.problem.startswith("refused") else "failed to compile")
        kinds[kind] += 1
        reasons[p.dropped] += 1
    if dropped:
        kinds["were dropped before planning"] += len(dropped)
        reasons.update(d.reason for d in dropped)
    counted = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    common = (f" (the commonest reason, {reasons.most_common(1)[0][1]} of them: {reasons.most_common(1)[0][0]})"
              if reasons else "")
    return ConfigError(f"nothing fits: of {sum(kinds.values())} layouts, {counted}{common}; every layout and its "
                       f"reason: {out / 'tune.json'}")


def plan_space(cfg: config_lib.Config, target: Target, points: list[Point], workers: int, calibrate: list[Path],
               out: Path) -> tuple[list[Planned], float]:
    """Plan every layout (one plan per batch size, each written under `out`): each as the plan saw it, and the
    compile time one candidate took on average."""
    from shardbench.plan.build import AllRefused, make_plan
    from shardbench.plan.workers import default_workers

    planned: list[Planned] = []
    wall, compiled = 0.0, 0
    batches = list(dict.fromkeys(p.batch for p in points))
    for batch in batches:
        mine = [p for p in points if p.batch == batch]
        at = override(cfg, {"train.batch_size": batch})
        try:
            plan = make_plan(at, target, [p.candidate for p in mine], workers, calibrate, progress=sys.stderr)
        except AllRefused as err:  # every candidate at this batch refused before compiling, each for its reason
            planned += [Planned(p, None, f"refused: {err.refusals[p.candidate.name]}", target) for p in mine]
            continue
        plan.write(out / ("plan" if len(batches) == 1 else f"plan-batch{batch}"))
        rows = {r.candidate: r for r in plan.rows}
        planned += [Planned(p, rows[p.candidate].prediction, rows[p.candidate].problem, target) for p in mine]
        wall += plan.compile_s
        compiled += sum(r.prediction is not None for r in plan.rows)
    return planned, compile_each_s(wall, workers or default_workers(), compiled)


def make_tune_sweep(cfg: config_lib.Config, chosen: list[Planned], devices: int,
                    steps: int) -> tuple[Any, dict[str, str]]:
    """The sweep of the chosen layouts (their varying fields name the runs) and each run's layout name."""
    from shardbench.sweep.grid import Grid, Sweep, expand

    settings = [layout_settings(cfg, p.point, devices) for p in chosen]
    varying = [k for k in LAYOUT_KEYS if len({repr(s[k]) for s in settings}) > 1 or k in ("parallel.strategy",
                                                                                        "parallel.mesh")]
    base = {**user_settings(cfg), **{k: v for k, v in settings[0].items() if k not in varying},
            **MEASURE, "train.steps": steps}
    axis = [{k: s[k] for k in varying} for s in settings]
    runs = expand([Grid([axis])], base)
    sweep = Sweep("tune", cfg.preset, base, [Grid([axis])], runs, origin="tune")
    return sweep, {r.name: p.point.name for r, p in zip(runs, chosen)}


def run_measurements(args: argparse.Namespace, sweep: Any, out: Path, resume: bool = False) -> int:
    """The sweep, on the local or the SLURM executor, into `out` (its store and run folders); with `resume`, the
    runs its store has not recorded (a store that was never created is created)."""
    from shardbench.sweep import slurm as slurm_lib
    from shardbench.sweep import slurm_options
    from shardbench.sweep.runner import Options, run_sweep
    from shardbench.sweep.sweep_cmd import open_store, plan_meta, share_peak

    executor, slurm_meta, slurm_opts = slurm_options.resolve(args, None)
    options = {"timeout": args.timeout, "profile": False, "processes": 1, "devices_per_process": 0,
               "skip_refused": False}
    checked = Options(out, args.timeout)
    if executor == "slurm":
        shapes = slurm_options.check_shapes(sweep, checked, slurm_opts)
        slurm_options.check_submittable(shapes, checked, slurm_opts)
    with open_store(out, resume and (out / "sweep.db").exists(), plan_meta(sweep, options)) as store:
        env = share_peak(sweep, out) if executor == "local" else {}
        opts = Options(out, args.timeout, env=env, way_on=False)  # `measure` says how to finish the tune
        print(f"tune: measuring {len(sweep.runs)} layout(s) -> {out}", flush=True)
        if executor == "slurm":
            store.set_meta("slurm", slurm_meta)
            return slurm_lib.run_slurm_sweep(sweep, store, opts, slurm_opts, out=lambda line: print(line, flush=True))
        return run_sweep(sweep, store, opts, out=lambda line: print(line, flush=True))


def measured_runs(out: Path, names: dict[str, str]) -> dict[str, MeasuredFigures]:
    """Each measured layout's figures (keyed by layout name) from the sweep's store."""
    from shardbench.report.content import reported
    from shardbench.store import Store

    found: dict[str, MeasuredFigures] = {}
    with Store(out / "sweep.db") as store:
        for row in store.runs():
            run = reported(row)
            if row.name in names and run.ok:
                mib = run.memory[0]
                found[names[row.name]] = MeasuredFigures(run.step_median, None if mib is None else mib * 2**20,
                                                         run.rec.cost, run.measured_steps)
    return found


def validate_batches(cfg: config_lib.Config, batches: tuple[int, ...]) -> None:
    """The configuration as `shardbench train` would check it at each batch size of the space (`cfg` holds the
    first): one line naming the batch size it refuses, before anything is planned."""
    from shardbench.tasks import validate

    for batch in batches:
        try:
            validate(override(cfg, {"train.batch_size": batch}))
        except ConfigError as err:
            said = str(err)
            if re.search(rf"--batch-size {batch}\b", said):
                raise
            raise ConfigError(f"--batch-size {batch}: {said}") from None


def prepare(args: argparse.Namespace) -> tuple[config_lib.Config, Target, Space, list[Point], list[Dropped]]:
    """Every check tune makes before compiling (each a one-line ConfigError), the budget's floor first: the
    configuration, the target, the executor, and the space with what it drops before planning."""
    from shardbench.preflight import check_dataset
    from shardbench.sweep import slurm_options
    from shardbench.tasks import validate

    check_options(args)  # a budget too small for a run is refused before anything compiles
    lists = comma_lists(args, LIST_FLAGS)
    cfg = config_from_args(args)
    validate(cfg)
    check_dataset(cfg)  # a dataset train would refuse: one line, not a space of layouts refused one by one
    if "train.batch_size" in lists:  # each batch size of the space as train would check it, not the first alone
        validate_batches(cfg, tuple(dict.fromkeys(int(v) for v in lists["train.batch_size"])))
    target = parse_target(default_target(args.target), cpu_devices=cfg.parallel.devices or 8)
    executor, _, _ = slurm_options.resolve(args, None)
    if executor == "slurm":
        slurm_options.check_available()
    else:
        check_measurable(target)
        if target.chip is not None:  # an accelerator: are its devices here? (a CPU target's are simulated)
            check_host(target, host_devices())
    space = make_space(cfg, args, lists)
    points, dropped = enumerate_space(target.devices, space)
    return cfg, target, space, points, dropped


def run(args: argparse.Namespace) -> int:
    from shardbench.sweep.sweep_cmd import check_out
    from shardbench.tune import report

    cfg, target, space, points, dropped = prepare(args)
    for note in ignored_layout_notes(given_fields(args), target, "tune"):
        print(f"shardbench: note: {note}", flush=True)
    objective = select_objective(args.objective, prices_from_flag(cfg.train.prices), target)
    if cfg.train.resume and not cfg.train.out:
        raise ConfigError("--resume needs --out: the folder of the tune to finish")
    out = claim_out(cfg, target)
    tuning = report.Tuning(cfg, target, objective, space, args.top_k, args.budget_min, args.measure_steps, out,
                           dropped=dropped)
    if cfg.train.resume:  # what it planned and chose is read back; only the runs not yet recorded are run
        resumed = report.resumed(tuning)
        with lock_runs(out, "tune"):
            return measure(args, resumed, resume=True)
    check_out(out, resume=False, command="tune")
    writable_dir(out, "--out")
    with lock_runs(out, "tune"):  # a second tune, or a sweep, in the same folder is refused while it runs
        if not points:
            report.write_json(tuning)
            raise nothing_fits([], dropped, out)
        one_peak(args, cfg, target, points, out)
        print(f"tune: planning {len(points)} layout(s) on {target.spec} ({len(dropped)} dropped before planning)",
              file=sys.stderr, flush=True)
        tuning.planned, compile_s = plan_space(cfg, target, points, args.workers, args.calibrate, out)
        ranked = rank(tuning.planned, objective)
        if not ranked:
            report.write_json(tuning)
            raise nothing_fits(tuning.planned, dropped, out)
        tuning.estimate = {p.point.name: estimate_run_s(p, args.measure_steps, compile_s) for p in ranked}
        try:
            tuning.chosen = select(ranked, args.top_k, args.budget_min * 60, lambda p: tuning.estimate[p.point.name])
        except ConfigError as err:  # the folder now holds the plan: the same command there would be refused
            raise ConfigError(f"{err}; the plan is kept in {out} (tune.json, plan/): tune again with another "
                              f"--out") from None
        finally:
            report.write_json(tuning)  # what was planned is kept, whether or not the budget holds a run
        return measure(args, tuning, resume=False)


def one_peak(args: argparse.Namespace, cfg: config_lib.Config, target: Target, points: list[Point],
             out: Path) -> None:
    """A CPU tune measured here plans and measures with one host peak: measured once into <out>/peak.json, read
    by the plan in this process and handed to the runs (`sweep_cmd.share_peak` keeps it). The plan read the host's
    cached figure and the sweep measured its own, on cores that other work may have loaded since: the predicted
    and the measured steps, and the MFU, then rested on two figures."""
    from shardbench.sweep import slurm_options
    from shardbench.sweep.sweep_cmd import peak_file

    if target.chip is None and slurm_options.resolve(args, None)[0] == "local":
        dtypes = sorted({p.candidate.dtype for p in points})
        os.environ.update(peak_file(out, dtypes, config_lib.cache_root(cfg), "tune"))


def measure(args: argparse.Namespace, tuning: Tuning, resume: bool) -> int:
    """Measure the chosen layouts as a sweep (with `resume`, those its store has not recorded), then the verdict
    (`report.finish`). Interrupted in either, it says how to finish it."""
    from shardbench.subprocs import interrupted_code, terminated_as_interrupt
    from shardbench.tune import report

    sweep, tuning.runs = make_tune_sweep(tuning.cfg, tuning.chosen, tuning.target.devices, args.measure_steps)
    report.write_json(tuning)
    started = time.perf_counter()
    with terminated_as_interrupt():  # SIGTERM (a scheduler's, kill's) stops it as Ctrl-C does, saying how to finish
        try:
            code = run_measurements(args, sweep, tuning.out, resume)
            tuning.measure_wall_s = None if resume else time.perf_counter() - started  # a resumed tune's: unknown
            if code == 0:
                tuning.measured = measured_runs(tuning.out, tuning.runs)
                code = report.finish(tuning)
        except KeyboardInterrupt as err:  # while the verdict's files were written: tune.json has no verdict yet
            code = interrupted_code(err)
    if code in INTERRUPTED:
        print(f"tune: interrupted; finish it with the same shardbench tune command and --resume (its --out is "
              f"{tuning.out})", file=sys.stderr, flush=True)
    return code


__all__ = ["add_parser", "prepare", "run"]
