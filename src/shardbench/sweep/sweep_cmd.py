"""The `shardbench sweep` sub-command: every `train` flag (a value with commas sweeps it), sweep presets and
files, a sweep directory holding `sweep.db`, and `--resume` to finish an interrupted sweep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from shardbench import config as config_lib
from shardbench import malloc, outdir
from shardbench.errors import ConfigError, ShardbenchError, report, writable_dir
from shardbench.flags import add_config_arguments
from shardbench.measure import peak as peak_lib
from shardbench.parsing import override
from shardbench.presets import PRESETS, get_preset
from shardbench.prices import prices_from_flag
from shardbench.store import LOCK, Store, lock_runs
from shardbench.subprocs import interrupted_code, terminated_as_interrupt
from shardbench.sweep import slurm as slurm_lib
from shardbench.sweep import slurm_options
from shardbench.sweep.grid import (SWEEP_OWNED, SWEEP_PRESETS, Sweep, inert_swept, make_sweep, run_config, same_notes,
                                   stored_sweep)
from shardbench.sweep.preflight import refusals
from shardbench.sweep.runner import Options, check_process_split, has_field, run_split, run_sweep
from shardbench.sweep.sweep_file import load_sweep_file

DESCRIPTION = """\
Run many configurations, each in its own `shardbench train` process, and keep every result in
<out>/sweep.db (SQLite; one row per run, complete or failed) with each run's directory and log under
<out>/runs/.

Every `train` flag is accepted. A value with commas sweeps the field: `--mesh none,8x1,4x2 --batch-size
128,1024` runs the 6 combinations. Fields whose single value holds commas (pairs such as --data.crop-scale
0.5,1.0, and meshes written data=4,model=2) separate alternatives with ';' instead:
--data.crop-scale '0.5,1.0;0.9,1.0'. A value with ';' is always split on ';' only.

A sweep file (TOML, or JSON by its .json suffix) holds (in TOML, every key after a [table] header belongs
to that table, so `axes` and `grid` come before [base]):
    preset = "vit-tiny"                          # the run preset every run starts from
    axes = [[{"parallel.mesh" = "8x1"}, {"parallel.mesh" = "4x2"}]]   # axes of override tables
    grid = {"train.batch_size" = [128, 1024]}    # shorthand: one axis per field
    [base]                                       # fixed overrides
    "train.steps" = 20
    "parallel.devices" = 8
Runs are the cartesian product of the axes. Command-line values override the preset's or file's: a single
value fixes the field (taking it out of every axis), a list replaces its axis.

Before the first run starts, every run is checked as `shardbench train` would check it (choices, mesh and
device count, strategy against the model, batch against the data axis). A sweep with runs that would be
refused stops there, naming them; --skip-refused records them as failed and runs the rest. --dry-run lists
the runs and marks those that would be refused, and exits as the sweep would start: 2 where runs would be
refused (0 with --skip-refused).

`shardbench sweep --out DIR --resume` finishes a sweep from the plan stored in DIR/sweep.db; arguments given
with it must match that plan. Exit status: 0 when every run completed, 1 when any failed (each is recorded
with its kind); for bad input, as train's: 2 a setting, 4 a file that is not what it should be (a sweep file,
a damaged sweep.db), 6 a path that cannot be used; 130 on Ctrl-C, 143 on SIGTERM.
"""


def add_parser(subparsers: Any) -> None:
    """Add `sweep` to the `shardbench` sub-commands."""
    # 'resolve': the sweep's own --preset, --out, --resume and --profile replace those spellings of the config
    # flags; the long forms (--train.out ...) of the fields the sweep sets for each run stay, hidden, and are refused.
    parser = subparsers.add_parser(
        "sweep", help="run a grid of configurations, each in its own process, into a SQLite store",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter, conflict_handler="resolve",
    )
    add_config_arguments(parser)
    for action in parser._actions:  # still parsed, to refuse them in one line; not offered
        if action.dest in SWEEP_OWNED:
            action.help = argparse.SUPPRESS
    group = parser.add_argument_group("sweep options")
    group.add_argument("--preset", default=None, choices=[*PRESETS, *SWEEP_PRESETS],
                       help="a run preset every run starts from, or a sweep preset: "
                            + "; ".join(f"{n}: {make().doc.rstrip('.')}" for n, make in SWEEP_PRESETS.items()))
    group.add_argument("--base", default=None, choices=list(PRESETS),
                       help="the run preset a sweep preset or sweep file starts from (e.g. vit-tiny)")
    group.add_argument("--sweep-file", type=Path, default=None, help="TOML or JSON file of axes (see above)")
    group.add_argument("--out", default="", help="sweep directory ('' = runs/sweep-<preset>-<time>)")
    group.add_argument("--resume", action="store_true",
                       help="finish the sweep in --out: skip recorded runs, re-run interrupted ones")
    group.add_argument("--retry-failed", action="store_true",
                       help="with --resume: also run again every recorded run that did not complete (a SLURM resume "
                            "always submits them again)")
    group.add_argument("--timeout", type=float, default=None,
                       help=f"seconds each run may take (default {DEFAULT_OPTIONS['timeout']:g})")
    group.add_argument("--profile", action="store_true", default=None,
                       help="profile every run; traces land in <out>/tensorboard")
    group.add_argument("--processes", type=int, default=None,
                       help="run each configuration as this many processes joined by jax.distributed (through "
                            "`shardbench launch`; default 1)")
    group.add_argument("--devices-per-process", type=int, default=None,
                       help="with --processes: simulated CPU devices in each process (0 = each run's --devices "
                            "split evenly); without it, each run takes as many processes as its --devices fill")
    group.add_argument("--skip-refused", action="store_true", default=None,
                       help="record runs whose configuration `train` would refuse as failed, and run the rest "
                            "(default: stop before the first run, naming them)")
    group.add_argument("--dry-run", action="store_true",
                       help="print the runs and their overrides, marking those that would be refused; run nothing "
                            "(exit 2 where the sweep would stop on refused runs)")
    group.add_argument("--no-report", action="store_true",
                       help="do not write <out>/report at the end (shardbench report <out> writes it later)")
    slurm_options.add_arguments(parser)


DEFAULT_OPTIONS: dict[str, Any] = {"timeout": 1800.0, "profile": False, "processes": 1, "devices_per_process": 0,
                                   "skip_refused": False}


def _fmt(overrides: dict[str, Any]) -> str:
    return " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in overrides.items())


def dry_run(sweep: Sweep, refused: dict[str, str]) -> None:
    print(f"{len(sweep.runs)} run(s) from {sweep.base_preset}" + (f"; fixed: {_fmt(sweep.base)}" if sweep.base else "")
          + (f"; {len(refused)} would be refused" if refused else ""))
    width = max((len(r.name) for r in sweep.runs), default=0)
    for run in sweep.runs:
        extra = {k: v for k, v in run.base.items() if sweep.base.get(k, object()) != v}
        print(f"{run.name.ljust(width)}  {_fmt(run.overrides)}" + (f"  [{_fmt(extra)}]" if extra else "")
              + (f"  REFUSED: {refused[run.name]}" if run.name in refused else ""))


def layout_notes(notes: dict[str, list[str]]) -> list[str]:
    """The runs' layout notes (`sweep.preflight.Checked.notes`), each once, naming the runs it is about: those
    `shardbench train` prints in each run's log, said before the sweep starts."""
    runs: dict[str, list[str]] = {}
    for name, said in notes.items():
        for note in said:
            runs.setdefault(note, []).append(name)
    return [f"run{'s' if len(names) > 1 else ''} {', '.join(names[:3])}"
            f"{f' and {len(names) - 3} more' if len(names) > 3 else ''}: {note}" for note, names in runs.items()]


def refused_error(refused: dict[str, str], total: int) -> ConfigError:
    """One line naming the refused runs and why (the first reason in full), what would be right first: a long
    reason is what the line's length limit cuts (`errors.one_line`), never the way out."""
    first = next(iter(refused))
    others = f"; and {len(refused) - 1} more: {', '.join(list(refused)[1:4])}{'...' if len(refused) > 4 else ''}"
    return ConfigError(f"{len(refused)} of {total} runs would be refused before running (fix the sweep, or pass "
                       f"--skip-refused to record them as failed and run the rest; --dry-run lists each and why): "
                       f"{first}: {refused[first]}{others if len(refused) > 1 else ''}")


def plan_meta(sweep: Sweep, options: dict[str, Any]) -> dict[str, Any]:
    """What the store remembers of the sweep (enough to resume it from `--out` alone); JSON round-tripped so
    a resumed sweep compares like for like."""
    base_cfg = override(get_preset(sweep.base_preset), sweep.base)
    meta = {
        "preset": sweep.label, "origin": sweep.origin, "base_preset": sweep.base_preset, "base": sweep.base,
        "axes": [axis for grid in sweep.grids for axis in grid.axes],
        "grids": [{"base": grid.base, "axes": grid.axes} for grid in sweep.grids],
        "base_config": config_lib.flatten(base_cfg),
        "runs": [{"name": r.name, "overrides": r.overrides, "settings": r.settings} for r in sweep.runs],
        "options": options,
    }
    return json.loads(json.dumps(meta))


def _first_difference(stored: dict[str, Any], now: dict[str, Any]) -> str | None:
    for key in dict.fromkeys([*stored, *now]):
        if stored.get(key) != now.get(key):
            return f"{key}={stored.get(key)!r} in the store, {now.get(key)!r} now"
    return None


def plan_difference(stored: dict[str, Any], meta: dict[str, Any]) -> str | None:
    """What differs between the stored plan and this invocation's, naming the field; None when they match."""
    if stored.get("base_preset") != meta["base_preset"]:
        return f"base preset {stored.get('base_preset')!r} in the store, {meta['base_preset']!r} now"
    found = _first_difference(stored.get("base_config") or {}, meta["base_config"])
    if found:
        return found
    old = {r["name"]: r["settings"] for r in stored.get("runs") or []}
    new = {r["name"]: r["settings"] for r in meta["runs"]}
    if list(old) != list(new):
        gone, added = [n for n in old if n not in new], [n for n in new if n not in old]
        parts = ([f"{_names(gone)} in the store only"] if gone else []) + ([f"{_names(added)} new"] if added else [])
        return "; ".join(parts) if parts else "the runs' order"
    for name in old:
        found = _first_difference(old[name], new[name])
        if found:
            return f"run {name}: {found}"
    return None


def _names(runs: list[str]) -> str:
    return f"run{'s' if len(runs) > 1 else ''} {', '.join(runs[:3])}" + (f" and {len(runs) - 3} more" if len(runs) > 3
                                                                         else "")


def sweep_dir(args: argparse.Namespace, sweep: Sweep) -> Path:
    """--out, else runs/sweep-<label>-<time>, made now (`outdir.claim`): a folder no other sweep shares."""
    if args.out:
        return Path(args.out)
    return outdir.claim(outdir.stamped(f"sweep-{sweep.label}")).path


def open_store(out: Path, resume: bool, meta: dict[str, Any], from_store: bool = False) -> Store:
    """A new store, or with --resume the store of the same sweep (run() has checked which exists); a plan read
    from the store itself (`from_store`) is that sweep by construction."""
    if resume and not from_store:
        check_same_plan(out, meta)
    store = Store(out / "sweep.db")
    if resume:
        return store
    for key, value in meta.items():
        store.set_meta(key, value)
    store.set_meta("created", time.time())
    return store


def check_same_plan(out: Path, meta: dict[str, Any]) -> None:
    """--resume: the store in `out` holds the sweep `meta` plans (its preset, fixed fields and runs), or this is one
    line naming the first difference."""
    with Store(out / "sweep.db") as store:
        stored = {key: store.get_meta(key) for key in ("base_preset", "base_config", "runs")}
    differs = plan_difference(stored, meta)
    if differs:
        raise ConfigError(f"--resume: {out} holds a different sweep ({differs}); resume it with "
                          f"`shardbench sweep --out {out} --resume` alone, or start a new one with another --out "
                          f"(runs to add to a sweep: sweep them into a folder beside it, and `shardbench report` the "
                          f"folder holding both)")


def resolve_options(args: argparse.Namespace, stored: dict[str, Any] | None) -> dict[str, Any]:
    """Timeout, profiling, processes and skipping refused runs: as given, else as the resumed sweep stored them,
    else the defaults."""
    return {k: getattr(args, k) if getattr(args, k) is not None else (stored or {}).get(k, default)
            for k, default in DEFAULT_OPTIONS.items()}


def replaced_options(args: argparse.Namespace, stored: dict[str, Any] | None) -> list[str]:
    """What the options given with --resume change of those the sweep stored: 'sweep: --timeout 60 replaces the
    stored 77' per option (none for a new sweep, or options given as stored)."""
    lines = []
    for key, default in DEFAULT_OPTIONS.items():
        given, before = getattr(args, key), (stored or {}).get(key, default)
        if stored is not None and given is not None and given != before:
            lines.append(f"sweep: --{key.replace('_', '-')} {given:g} replaces the stored {before:g}"
                         if isinstance(given, float) else
                         f"sweep: --{key.replace('_', '-')} {given} replaces the stored {before}")
    return lines


def failed_summary(store: Store, names: list[str]) -> str | None:
    """'2 of 9 runs failed: 1 oom, 1 config' for the sweep's runs, or None when none failed."""
    rows = [r for r in store.runs() if r.name in set(names)]
    kinds: dict[str, int] = {}
    for row in rows:
        if row.status != "complete":
            kinds[row.error_kind or "unknown"] = kinds.get(row.error_kind or "unknown", 0) + 1
    if not kinds:
        return None
    return (f"sweep: {sum(kinds.values())} of {len(names)} runs failed: "
            + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1])))


def check_out(out: Path, resume: bool, command: str = "sweep") -> None:
    """Without --resume a sweep (or tune) starts in a new or empty directory; with it, in one holding a sweep.
    The lock file a sweep or tune stopped before writing anything leaves is no content (`store.lock_runs`
    refuses a folder whose lock is still held)."""
    has_db = (out / "sweep.db").exists()
    if resume and not has_db:
        raise ConfigError(f"--resume: {out} holds no sweep to resume (no sweep.db); drop --resume to start one")
    if not resume and has_db:
        raise ConfigError(f"--out {out} already holds a sweep: pass --resume to finish it, or choose another --out")
    if not resume and out.exists() and any(p.name != LOCK for p in out.iterdir()):
        raise ConfigError(f"--out {out} is not empty: choose a new directory for the {command}")


def overhead(store: Store, started: float, wall_s: float) -> dict[str, Any]:
    """This invocation's wall time against its runs' own process times (start-up included): what the
    sweep itself costs on top of its runs (planning, the database, the report)."""
    runs = [r for r in store.runs() if (r.finished or 0.0) >= started]  # recorded by it, though a job began them before
    own = sum(r.wall_s for r in runs)
    return {"wall_s": wall_s, "runs": len(runs), "runs_wall_s": own, "ratio": wall_s / own if own else None}


def overhead_line(timing: dict[str, Any]) -> str:
    if not timing["runs"]:
        return f"sweep: {timing['wall_s']:.1f} s, no run recorded by this invocation"
    if timing["ratio"] is None:  # only runs that never started a process here (refused, or a SLURM job's ending)
        return (f"sweep: {timing['wall_s']:.1f} s, {timing['runs']} run(s) recorded, none of whose processes ran "
                f"for a measurable time")
    return (f"sweep: {timing['wall_s']:.1f} s wall for {timing['runs']} run(s) whose processes took "
            f"{timing['runs_wall_s']:.1f} s, start-up included: {timing['ratio']:.3f}x")


def share_peak(sweep: Sweep, out: Path) -> dict[str, str]:
    """On a CPU, measure the host's matmul peak once for the sweep (kept in <out>/peak.json, so a resumed sweep
    divides by the same figure); returns the environment that hands it to every run's processes."""
    configs = [run_config(sweep.base_preset, r) for r in sweep.runs]
    dtypes = sorted({c["precision.dtype"] for c in configs if c["precision.dtype"] in config_lib.DTYPES})
    return peak_file(out, dtypes, config_lib.cache_root(override(config_lib.Config(), configs[0])), "sweep")


def peak_file(out: Path, dtypes: list[str], cache: Path, who: str) -> dict[str, str]:
    """On a CPU, the host's matmul peak in each of `dtypes`, measured once into <out>/peak.json (a dtype it holds
    is kept), and the environment that hands it over (`peak.PEAK_FILE_ENV`); {} on an accelerator, whose peaks
    are its data sheet's. `who` names the command in the line that says what was measured."""
    if malloc.target_platform(os.environ) != "cpu":
        return {}
    path = out / "peak.json"
    have = set(json.loads(path.read_text())) if path.exists() else set()
    if set(dtypes) - have:
        busy = peak_lib.host_load()  # as it starts: other work on the cores, not this measurement
        measured = peak_lib.measure_into(path, dtypes, cache, busy)
        print(f"{who}: host matmul peak " + ", ".join(f"{d} {v['flops_per_s'] / 1e9:.1f} GFLOP/s"
                                                      for d, v in measured.items()) + f" -> {path}", flush=True)
        if busy:
            print(f"shardbench: note: {peak_lib.busy_note(busy)}", file=sys.stderr, flush=True)
    return {peak_lib.PEAK_FILE_ENV: str(path.resolve())}


def _plan(args: argparse.Namespace) -> tuple[Sweep, bool]:
    """The sweep to run, and whether it is the stored plan (resumed from `--out` alone)."""
    values = {k: ",".join(v) if isinstance(v, list) else v for k, v in vars(args).items() if "." in k}
    from_store = args.resume and args.preset is None and args.sweep_file is None and args.base is None and not values
    if from_store:
        if not args.out:
            raise ConfigError("--resume needs --out: the directory of the sweep to finish")
        path = Path(args.out) / "sweep.db"
        if not path.exists():
            raise ConfigError(f"--resume: {args.out} holds no sweep to resume (no sweep.db); drop --resume to start one")
        with Store(path) as store:
            if not store.get_meta("runs"):
                raise ConfigError(f"--resume: {path} holds no plan to resume; start the sweep again with another --out")
            return stored_sweep(store), True
    file = load_sweep_file(args.sweep_file) if args.sweep_file is not None else None
    # Resumed with settings alone: they apply to the stored sweep's plan, so that one differing from it is named
    # (train.steps=3 in the store, 5 now), not the run preset a plan from nothing would start at.
    stored = (_stored_plan(args) if args.resume and args.preset is None and args.sweep_file is None
              and args.base is None else None)
    sweep = make_sweep(args.preset, args.base, file, values, stored)
    if file is not None and not file.axes and len(sweep.runs) == 1:
        raise ConfigError(f"--sweep-file {args.sweep_file} defines no axes or grid, so the sweep would be one run of "
                          f"its base: add axes = [[...]] or grid = {{\"field\" = [values]}} (see shardbench sweep "
                          f"--help), or train that one run with shardbench train")
    return sweep, False


def _stored_plan(args: argparse.Namespace) -> Sweep | None:
    """The plan of the sweep being resumed, where `--out` holds one (None otherwise: check_out says why)."""
    path = Path(args.out) / "sweep.db" if args.out else None
    if path is None or not path.exists():
        return None
    with Store(path) as store:
        return stored_sweep(store) if store.get_meta("runs") else None


def _stored_meta(args: argparse.Namespace, key: str) -> Any:
    """What a sweep being resumed stored under `key` (None for a new sweep)."""
    path = Path(args.out) / "sweep.db" if args.out else None
    if not args.resume or path is None or not path.exists():
        return None
    with Store(path) as store:
        return store.get_meta(key)


def _stored_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The options (--timeout, --processes, ...) a sweep being resumed was started with, whether --resume comes
    alone or with the plan's arguments again (None for a new sweep; {} for a store that kept none)."""
    if not args.resume or not args.out or not (Path(args.out) / "sweep.db").exists():
        return None
    return _stored_meta(args, "options") or {}


def _stored_slurm(args: argparse.Namespace) -> dict[str, Any] | None:
    """The SLURM options a sweep being resumed was started with (None for a local or a new sweep)."""
    return _stored_meta(args, "slurm")


def run(args: argparse.Namespace) -> int:
    """Run the sweep `args` describe: 0 when every run completed, 1 when any failed (each is recorded); 2, 4
    or 6 for bad input (a setting, a file, a path); 130 on Ctrl-C, 143 on SIGTERM."""
    with terminated_as_interrupt():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "status", False) or getattr(args, "cancel", False):
            return slurm_lib.watch(args)
        sweep, from_store = _plan(args)
        stored_options = _stored_options(args)
        for table in {str({**r.base, **r.overrides}.get("train.prices", "")) for r in sweep.runs}:
            prices_from_flag(table)  # a bad --prices table is one line now, not a failure in every run
        options = resolve_options(args, stored_options)
        executor, slurm_meta, slurm_opts = slurm_options.resolve(args, _stored_slurm(args))
        if args.retry_failed and not args.resume:
            raise ConfigError("--retry-failed runs again the failed runs of a sweep being resumed: add --resume")
        if executor == "local" and args.resume and args.out:
            slurm_lib.check_no_live_jobs(Path(args.out))
        if options["profile"] and not has_field("train.profile_root"):
            raise ConfigError("--profile: this shardbench's train has no train.profile_root field")
        if not math.isfinite(options["timeout"]) or options["timeout"] <= 0:
            raise ConfigError(f"--timeout must be a positive, finite number of seconds, got {options['timeout']:g}")
        if options["processes"] < 1 or options["devices_per_process"] < 0:
            raise ConfigError(f"--processes must be at least 1 and --devices-per-process 0 or more, got "
                              f"{options['processes']} and {options['devices_per_process']}")
        checked = Options(Path("."), options["timeout"], options["profile"], options["processes"],
                          options["devices_per_process"])
        check_process_split(sweep, checked)
        if executor == "slurm":
            shapes = slurm_options.check_shapes(sweep, checked, slurm_opts)
            if not args.dry_run:
                slurm_options.check_available()
                slurm_options.check_submittable(shapes, checked, slurm_opts)
            processes = {name: (shape.nodes * shape.tasks_per_node, shape.local_devices)
                         for name, shape in shapes.items()}
        else:
            processes = {run.name: run_split(int(run_config(sweep.base_preset, run)["parallel.devices"]), checked)
                         for run in sweep.runs}
        checked = refusals(sweep, options["profile"], processes)
        refused = checked.refused
        for note in [*same_notes(sweep), *inert_swept(sweep, options["profile"]), *layout_notes(checked.notes)]:
            print(f"shardbench: note: {note}", file=sys.stderr, flush=True)
        if args.dry_run:  # exits as the sweep would start: 2 where it would stop on refused runs (a check for CI)
            if args.out:  # and where --out could not take it (the real run's checks, reading only)
                check_out(Path(args.out), args.resume)
                if args.resume and not from_store:
                    check_same_plan(Path(args.out), plan_meta(sweep, options))
            dry_run(sweep, refused)
            if refused and not options["skip_refused"]:
                print(f"shardbench: error: {len(refused)} of {len(sweep.runs)} runs would be refused (marked above); "
                      f"the sweep would stop before its first run: fix them, or pass --skip-refused to run the rest",
                      file=sys.stderr)
                return 2
            return 0
        if refused and not options["skip_refused"]:
            raise refused_error(refused, len(sweep.runs))
        out = sweep_dir(args, sweep)
        check_out(out, args.resume)
        writable_dir(out, "--out")
        lock = lock_runs(out, "sweep")
        started, t0 = time.time(), time.perf_counter()
        try:
            with open_store(out, args.resume, plan_meta(sweep, options), from_store) as store:
                for line in replaced_options(args, stored_options):
                    print(line, flush=True)
                store.set_meta("options", options)  # a later --resume goes on with what this one ran
                print(f"sweep: {len(sweep.runs)} runs -> {out}", flush=True)
                # A cluster's nodes are not this host: there each run measures (and caches) its own node's peak.
                env = share_peak(sweep, out) if executor == "local" else {}
                run_opts = Options(out, options["timeout"], options["profile"], options["processes"],
                                   options["devices_per_process"], env)
                if executor == "slurm":
                    store.set_meta("slurm", slurm_meta)
                    code = slurm_lib.run_slurm_sweep(sweep, store, run_opts, slurm_opts,
                                                     out=lambda line: print(line, flush=True), refused=refused)
                else:
                    code = run_sweep(sweep, store, run_opts, out=lambda line: print(line, flush=True),
                                     refused=refused, retry_failed=args.retry_failed)
                if code == 0 and not args.no_report:
                    from shardbench.report.write import write_report  # matplotlib only for a report

                    paths = write_report(out, writing=True)
                    print(f"report: {paths.markdown}\nreport: {paths.html}", flush=True)
                    for line in paths.differing:  # layouts that should agree but do not: said at the end too
                        print(f"sweep: warning: runs that differ only in layout computed different losses: {line}",
                              file=sys.stderr, flush=True)
                timing = overhead(store, started, time.perf_counter() - t0)
                store.set_meta("timing", timing)
                print(overhead_line(timing), flush=True)
                failed = failed_summary(store, [r.name for r in sweep.runs]) if code == 0 else None
                if failed:
                    print(failed, file=sys.stderr, flush=True)
                    code = 1
        finally:
            lock.close()
        return code
    except ShardbenchError as err:
        return report(err)
    except KeyboardInterrupt as err:
        print("shardbench: sweep interrupted", file=sys.stderr)
        return interrupted_code(err)
