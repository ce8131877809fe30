"""Run a sweep: each run in a fresh `shardbench train` process with a time limit, each result into the store
the moment its process ends, one progress line per run and a table at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shardbench import config as config_lib
from shardbench.parsing import from_dict
from shardbench.report.terminal import progress_line, summary_table
from shardbench.store import RunRow, Store
from shardbench.subprocs import Terminated, interrupted_code, kill_group, start
from shardbench.sweep.grid import PlannedRun, Sweep, field_kind, run_config
from shardbench.sweep.memory import (
    PeakMemory,
    host_memory_bytes,
    memory_cgroup,
    memory_limit_bytes,
    oom_kills,
)

# `shardbench train` exit codes (cli.main): 2 bad configuration, 3 diverged, 4 missing or corrupt data, 5 the
# processes of a multi-process run could not join or one of them failed (`shardbench launch` passes them on).
EXIT_KINDS = {2: "config", 3: "diverged", 4: "data", 5: "processes"}
OOM_FRACTION = 0.75  # a SIGKILL after the run grew past this share of the host's memory is taken as an OOM kill
OOM_WORDS = re.compile(r"RESOURCE_EXHAUSTED|out of memory|MemoryError", re.IGNORECASE)


@dataclass(frozen=True)
class Options:
    """How to run: where, the per-run time limit, whether to profile, and in how many processes (runs inherit
    the environment)."""

    sweep_dir: Path
    timeout_s: float = 1800.0
    profile: bool = False
    processes: int = 1
    devices_per_process: int = 0
    env: dict[str, str] = field(default_factory=dict)  # added to each run's environment (the shared peak)
    way_on: bool = True  # a stop says how to continue: False where the caller says it (tune: its own --resume)


def has_field(key: str) -> bool:
    try:
        field_kind(key)
        return True
    except config_lib.ConfigError:
        return False


def _arg(key: str, value: Any) -> list[str]:
    flag = f"--{key.replace('_', '-')}"
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag[2:]}"]
    if isinstance(value, (tuple, list)):
        value = ",".join(str(v) for v in value)
    # '--flag=value' keeps a value such as '-1' from being read as a flag.
    return [f"{flag}={value}"]


def run_processes(devices: int, opts: Options) -> int:
    """How many processes a run of `devices` devices takes: --processes when given, else, with
    --devices-per-process, as many as its devices fill (a sweep over --devices then mixes 1- and
    several-process runs; `check_process_split` refuses counts that do not divide before the sweep starts)."""
    if opts.processes > 1 or opts.devices_per_process <= 0 or devices <= opts.devices_per_process:
        return opts.processes
    return max(devices // opts.devices_per_process, 1)


def run_split(devices: int, opts: Options) -> tuple[int, int]:
    """A run's processes on this host and the devices each gets (0: its devices split evenly among them)."""
    processes = run_processes(devices, opts)
    return processes, opts.devices_per_process if processes > 1 else 0


def check_process_split(sweep: Sweep, opts: Options) -> None:
    """Runs given processes by --devices-per-process alone must fill whole processes, or one line naming one."""
    if opts.processes > 1 or opts.devices_per_process <= 0:
        return
    for run in sweep.runs:
        devices = int(run_config(sweep.base_preset, run)["parallel.devices"])
        if devices > opts.devices_per_process and devices % opts.devices_per_process:
            raise config_lib.ConfigError(
                f"run {run.name}: --devices {devices} does not fill whole processes of --devices-per-process "
                f"{opts.devices_per_process}; use a multiple of it")


def train_command(base_preset: str, run: PlannedRun, opts: Options, launch: bool = True) -> list[str]:
    """The command that runs `run`: `shardbench train`, through `shardbench launch` for several processes on
    this host unless `launch` is False (a cluster starts the processes itself)."""
    cmd = [sys.executable, "-m", "shardbench"]
    processes = run_processes(int(run_config(base_preset, run)["parallel.devices"]), opts)
    if processes > 1 and launch:
        cmd += ["launch", "--processes", str(processes), "--devices-per-process", str(opts.devices_per_process),
                "--"]
    cmd += ["train", "--preset", base_preset]
    for key, value in run.settings.items():
        cmd += _arg(key, value)
    cmd += ["--out", str(opts.sweep_dir / "runs" / run.name)]
    if has_field("train.run_name"):  # older trainers name runs themselves
        cmd += ["--train.run-name", run.name]
    cmd += ["--no-train.progress"]
    if opts.profile:
        cmd += ["--train.profile", "--train.profile-root", str(opts.sweep_dir / "tensorboard")]
    return cmd


def _tee(source: IO[bytes], log: IO[bytes], lines: list[str]) -> None:
    """Copy the child's stderr into the log, keeping its lines: the error message comes from stderr. A log that
    can no longer be written (its disk full) is left behind, the lines still kept (and the pipe still read, so the
    child never blocks on it)."""
    writable = True
    for raw in iter(source.readline, b""):
        if writable:
            try:
                log.write(raw)
            except OSError as err:
                writable = False
                lines.append(f"shardbench: the run's log could not be written further ({err.strerror or err})")
        lines.append(raw.decode(errors="replace").rstrip())
        del lines[:-200]


@dataclass(frozen=True)
class Outcome:
    returncode: int | None  # None: stopped at the time limit
    stderr: list[str]
    started: float
    wall_s: float
    peak_rss_bytes: int | None = None  # the run's processes' resident memory at its largest, sampled (Linux only)
    oom_kills: int | None = None  # processes the out-of-memory killer took in this cgroup while the run ran


def run_process(cmd: list[str], log_path: Path, timeout_s: float, env: dict[str, str] | None = None) -> Outcome:
    """One run's process, alone in its session so that a time limit or Ctrl-C can stop all of it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started, t0 = time.time(), time.perf_counter()
    lines: list[str] = []
    with open(log_path, "wb", buffering=0) as log:
        proc = start(cmd, stdout=log, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                     env={**os.environ, **(env or {})}, start_new_session=True)
        assert proc.stderr is not None
        reader = threading.Thread(target=_tee, args=(proc.stderr, log, lines), daemon=True)
        reader.start()
        memory = PeakMemory(proc.pid)
        cgroup = memory_cgroup()
        kills_before = oom_kills(cgroup)
        code: int | None
        try:  # the limit counts from the process's start, not from when the sampling above was set up
            code = proc.wait(timeout=max(0.0, timeout_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            code = None
        except BaseException:  # Ctrl-C: the run dies with the sweep; its directory is cleared on --resume
            kill_group(proc)
            raise
        finally:
            peak = memory.stop()
        reader.join(timeout=10)
        proc.stderr.close()
    kills_after = oom_kills(cgroup)
    kills = None if kills_before is None or kills_after is None else kills_after - kills_before
    return Outcome(code, lines, started, time.perf_counter() - t0, peak, kills)


def _log_lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            return [ln.rstrip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return []


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def _oom_kill(outcome: Outcome, name: str, oom_line: str | None) -> str | None:
    """Why a SIGKILLed run was most likely the out-of-memory killer's, in one line; None when nothing says so:
    its log's own words, the cgroup's count of OOM kills grown while it ran, or its processes' memory near the
    limit (the host's, or the cgroup's where tighter)."""
    if oom_line:
        return _one_line(f"killed by {name}: {oom_line}")
    if outcome.oom_kills:
        return (f"killed by {name}: the kernel's out-of-memory killer took {outcome.oom_kills} process(es) of "
                f"this cgroup while the run ran")
    limit, peak = memory_limit_bytes(), outcome.peak_rss_bytes
    if peak and limit and peak > OOM_FRACTION * limit:
        where = "the host's" if limit == host_memory_bytes() else "its cgroup's limit of"
        return (f"killed by {name} with {peak / 2**30:.1f} GiB resident of {where} {limit / 2**30:.1f} GiB: most "
                f"likely the kernel's out-of-memory killer")
    return None


def classify(outcome: Outcome, log_path: Path, timeout_s: float) -> tuple[str, str]:
    """(error_kind, one-line message) of a run that did not complete."""
    log = _log_lines(log_path)
    said = [ln for ln in outcome.stderr if ln.startswith("shardbench:")]
    last = next((ln for ln in reversed(outcome.stderr) if ln.strip()), None) or next(
        (ln for ln in reversed(log) if ln.strip()), "")
    message = said[-1] if said else last
    oom = next((ln for ln in reversed(log) if OOM_WORDS.search(ln)), None)
    code = outcome.returncode
    if code is None:
        return "timeout", f"no result within the {timeout_s:g} s time limit: stopped"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGKILL:
            found = _oom_kill(outcome, name, oom)
            if found:
                return "oom", found
        # A launch of several processes ends by its failed process's signal, having named which one.
        launched = next((ln for ln in reversed(said) if f"failed: killed by {name}" in ln), None)
        return "killed", _one_line(launched.removeprefix("shardbench: error: ")) if launched else f"killed by {name}"
    if code in EXIT_KINDS:
        return EXIT_KINDS[code], _one_line(message)
    if code in (130, 143):  # a run that took Ctrl-C or SIGTERM as an interrupt ("shardbench: stopped by SIGTERM")
        return "killed", _one_line(message) if message else f"exit {code}: interrupted"
    if oom:
        return "oom", _one_line(oom)
    if code == 0:
        return "crash", "exited 0 without writing summary.json"
    return "crash", _one_line(f"exit {code}: {message}" if message else f"exit {code}")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def execute(sweep: Sweep, run: PlannedRun, opts: Options) -> RunRow:
    """Run one configuration to the end (or its time limit) and describe what happened."""
    run_dir = opts.sweep_dir / "runs" / run.name
    log_path = opts.sweep_dir / "runs" / f"{run.name}.log"
    outcome = run_process(train_command(sweep.base_preset, run, opts), log_path, opts.timeout_s, opts.env)
    finished = outcome.started + outcome.wall_s
    planned = run_config(sweep.base_preset, run)
    # A run stopped at its time limit after writing its record (written last, after its checkpoints, and whole or
    # not at all) did its work: only its exit came after, or its record came in the grace before SIGKILL. Its
    # folder says complete; so does the row.
    record = _read_json(run_dir / "summary.json") if outcome.returncode in (0, None) else None
    if record is not None:
        saved = _read_json(run_dir / "config.json")
        try:
            config = config_lib.flatten(from_dict(saved)) if saved else planned
        except config_lib.ConfigError:
            config = planned
        return RunRow(run.name, "complete", None, None, run.overrides, config, record, outcome.started, finished,
                      outcome.wall_s)
    kind, message = classify(outcome, log_path, opts.timeout_s)
    return RunRow(run.name, "failed", kind, message, run.overrides, planned, None, outcome.started, finished,
                  outcome.wall_s)


def refused_row(sweep: Sweep, run: PlannedRun, why: str) -> RunRow:
    """A run the sweep's check refused: recorded as failed without starting a process."""
    now = time.time()
    return RunRow(run.name, "failed", "config", _one_line(f"refused before running: {why}"), run.overrides,
                  run_config(sweep.base_preset, run), None, now, now, 0.0)


def run_sweep(sweep: Sweep, store: Store, opts: Options, out: Callable[[str], None] = print,
              refused: dict[str, str] | None = None, retry_failed: bool | None = None) -> int:
    """Run every run not yet in the store (recording `refused` ones as failed without running them), and every run
    that ran as a SLURM job and did not complete, as a SLURM resume submits it again, or (`retry_failed`) every
    run that did not complete (None: the caller offers no such choice, and the resume line does not name it);
    returns 0 when each is recorded, 130 on Ctrl-C."""
    jobs = store.jobs()
    planned = {p.name for p in sweep.runs}
    rows = [r for r in store.runs() if r.name in planned]
    done = {r.name for r in rows if r.status == "complete" or (r.name not in jobs and not retry_failed)}
    todo = [r for r in sweep.runs if r.name not in done]
    if done:
        left = sum(r.status != "complete" for r in rows if r.name in done)
        out(f"resuming: {len(sweep.runs) - len(todo)} of {len(sweep.runs)} runs already recorded"
            + (f" ({left} of them did not complete: --retry-failed runs them again)"
               if left and retry_failed is not None else "") + ("; nothing left to run" if not todo else ""))
    total = len(sweep.runs)
    try:
        for i, run in enumerate(todo, start=total - len(todo) + 1):
            leftover = opts.sweep_dir / "runs" / run.name
            if leftover.exists():  # an interrupted run of an earlier sweep: its directory would refuse `train`
                shutil.rmtree(leftover)
            row = refused_row(sweep, run, refused[run.name]) if run.name in (refused or {}) else execute(
                sweep, run, opts)
            store.add(row)
            if run.name in jobs:  # its SLURM job's state would be read as this run's (`--status`)
                store.drop_job(run.name)
            out(progress_line(i, total, row))
    except KeyboardInterrupt as err:
        print(f"shardbench: sweep {'stopped by SIGTERM' if isinstance(err, Terminated) else 'interrupted'}; "
              f"{len(store.names())} of {total} runs are recorded in {store.path}"
              + (f": continue with --resume --out {opts.sweep_dir}" if opts.way_on else ""), file=sys.stderr)
        return interrupted_code(err)
    rows = {r.name: r for r in store.runs()}
    out(summary_table([rows[r.name] for r in sweep.runs if r.name in rows]))
    out(f"sweep: {opts.sweep_dir}")
    return 0
