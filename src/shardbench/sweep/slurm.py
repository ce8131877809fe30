"""Run a sweep's runs as SLURM jobs (`shardbench sweep --executor slurm`), submitted through submitit.

Every run is a job (runs of the same shape go in one job array, so --slurm-max-running can bound how many run at
once). A job has one task per process of its run; each task starts `shardbench train`, which recognises SLURM
by itself (jax.distributed's cluster detection) and joins the job's other tasks. Task 0 writes its outcome to
<out>/slurm/; the driver, the only writer of sweep.db, turns each finished job into the row a local sweep
would record, so the store, the run folders and the report are the same. A job SLURM ends (time limit, memory,
preemption, a node failure, scancel) is recorded with the sweep's error kinds and SLURM's words for it.

Job states come from `squeue` while jobs are queued or running, and from `sacct` once they have ended (it keeps
why); on a cluster without accounting, from `scontrol show job`, which remembers ended jobs for a few minutes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.sweep.grid import PlannedRun, Sweep, run_config, stored_sweep
from shardbench.sweep.runner import (Options, Outcome, _one_line, _read_json, classify, refused_row, run_processes,
                                     run_process, train_command)
from shardbench.sweep.store import JobRow, RunRow, Store

# SLURM's job states: those it may still leave, and how the final ones that are not a finished process map onto
# the sweep's error kinds.
LIVE_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED",
                         "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
                         "SUBMITTED"})
KILLED_KINDS = {"TIMEOUT": "timeout", "DEADLINE": "timeout", "OUT_OF_MEMORY": "oom", "CANCELLED": "killed",
                "PREEMPTED": "killed", "NODE_FAIL": "killed", "BOOT_FAIL": "killed", "REVOKED": "killed"}
OUTCOME_GRACE_S = 60.0  # a job SLURM calls finished whose outcome file has not appeared (a slow shared filesystem)
_SIM_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how the jobs run: what a user would put in an sbatch header."""

    partition: str = ""
    nodes: int = 1  # CPU jobs: every job's nodes; GPU jobs: those of runs that do not give --devices
    gpus_per_node: int = 0  # 0: CPU jobs (processes come from --processes / --devices-per-process)
    time_min: int = 0  # the job's time limit in minutes; 0: the sweep's --timeout and a margin
    account: str = ""
    qos: str = ""
    sbatch: tuple[str, ...] = ()  # more sbatch options, "key=value" or "flag"
    max_running: int = 0  # jobs of one array running at once; 0: no limit
    poll_s: float = 10.0  # how often the driver reads job states


def parse_time(text: str) -> int:
    """SLURM's time format (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes, rounded up."""
    found = _TIME.match(text.strip())
    if not found or text.strip() in ("", "0"):
        raise ConfigError(f"--slurm-time {text!r} is not a time limit: give minutes (90), HH:MM:SS (1:30:00) or "
                          f"D-HH:MM:SS (1-00:00:00), as sbatch --time takes it")
    days, a, b, c = found.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:
        h, m, s = (nums + [0, 0])[:3]
        seconds = int(days) * 86400 + h * 3600 + m * 60 + s
    elif len(nums) == 1:
        seconds = nums[0] * 60
    elif len(nums) == 2:
        seconds = nums[0] * 60 + nums[1]
    else:
        seconds = nums[0] * 3600 + nums[1] * 60 + nums[2]
    if seconds <= 0:
        raise ConfigError(f"--slurm-time {text!r} must be longer than zero")
    return math.ceil(seconds / 60)


def parse_sbatch(items: Iterable[str]) -> dict[str, Any]:
    """--slurm-option values ('mem=64G', '--constraint=a100', 'exclusive') as submitit's extra sbatch parameters."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.strip().lstrip("-").partition("=")
        if not re.fullmatch(r"[A-Za-z][\w-]*", key) or (eq and not value):
            raise ConfigError(f"--slurm-option {item!r} is not an sbatch option: write it as KEY=VALUE (mem=64G) "
                              f"or a lone flag (exclusive)")
        out[key.replace("-", "_")] = value if eq else True
    return out


def check_options(slurm: SlurmOptions) -> None:
    """Numbers in range; everything else SLURM checks when the job is submitted."""
    if slurm.nodes < 1 or slurm.gpus_per_node < 0 or slurm.max_running < 0:
        raise ConfigError(f"--slurm-nodes must be at least 1 and --slurm-gpus-per-node and --slurm-max-running 0 or "
                          f"more, got {slurm.nodes}, {slurm.gpus_per_node} and {slurm.max_running}")
    if slurm.poll_s <= 0:
        raise ConfigError(f"--slurm-poll must be a positive number of seconds, got {slurm.poll_s:g}")
    parse_sbatch(slurm.sbatch)


def check_available() -> None:
    """submitit importable and SLURM's commands on PATH, or one line saying what is missing."""
    if importlib.util.find_spec("submitit") is None:
        raise ConfigError("--executor slurm needs submitit: pip install 'shardbench[slurm]'")
    missing = [cmd for cmd in ("sbatch", "squeue", "scancel") if shutil.which(cmd) is None]
    if missing:
        raise ConfigError(f"--executor slurm: {', '.join(missing)} not found on PATH; run the sweep on a host that "
                          f"submits SLURM jobs (a login node)")


# ------------------------------------------------------------------------------------------ command line
# The flags and their defaults; a resumed sweep takes what it was started with for those not given again.
DEFAULTS: dict[str, Any] = {"slurm_partition": "", "slurm_nodes": 1, "slurm_gpus_per_node": 0, "slurm_time": "",
                            "slurm_account": "", "slurm_qos": "", "slurm_option": [], "slurm_max_running": 0,
                            "slurm_poll": 10.0}


def add_arguments(parser: Any) -> None:
    """The sweep's executor flags: where runs run, and SLURM's options (what an sbatch header would say)."""
    group = parser.add_argument_group(
        "cluster", "--executor slurm submits every run as a SLURM job (through submitit: pip install\n"
                   "'shardbench[slurm]'). Start the sweep where sbatch works, with --out on the filesystem the\n"
                   "nodes share; --status, --resume and --cancel with --out follow it. See docs/clusters.md")
    group.add_argument("--executor", choices=["local", "slurm"], default=None,
                       help="where runs run: 'local' (default) one after another on this machine; 'slurm' each as "
                            "a SLURM job")
    group.add_argument("--slurm-partition", default=None, metavar="NAME", help="sbatch --partition")
    group.add_argument("--slurm-nodes", type=int, default=None, metavar="N",
                       help="nodes per job (default 1); with GPUs, a run's --devices decides its nodes instead")
    group.add_argument("--slurm-gpus-per-node", type=int, default=None, metavar="G",
                       help="GPUs per node (sbatch --gpus-per-node); each job then runs one process per GPU "
                            "(default 0: CPU jobs)")
    group.add_argument("--slurm-time", default=None, metavar="TIME",
                       help="each job's time limit, as sbatch --time takes it (90, 1:30:00, 1-00:00:00; default "
                            "--timeout and 10 minutes)")
    group.add_argument("--slurm-account", default=None, metavar="NAME", help="sbatch --account")
    group.add_argument("--slurm-qos", default=None, metavar="NAME", help="sbatch --qos")
    group.add_argument("--slurm-option", action="append", default=None, metavar="KEY=VALUE",
                       help="any other sbatch option, repeatable: --slurm-option mem=64G --slurm-option "
                            "constraint=a100 --slurm-option exclusive")
    group.add_argument("--slurm-max-running", type=int, default=None, metavar="N",
                       help="jobs running at once of each job array (the sweep's runs of one job shape; sbatch "
                            "--array=...%%N; default no limit)")
    group.add_argument("--slurm-poll", type=float, default=None, metavar="S",
                       help="seconds between reads of the jobs' states (default 10)")
    group.add_argument("--status", action="store_true",
                       help="with --out: print each run's job id and state, and what the store recorded; change "
                            "nothing")
    group.add_argument("--cancel", action="store_true",
                       help="with --out: cancel the sweep's queued and running jobs (scancel)")


def resolve(args: Any, stored: dict[str, Any] | None) -> tuple[str, dict[str, Any], SlurmOptions]:
    """(executor, the options to store, SlurmOptions): given flags, else what a resumed sweep stored, else the
    defaults. SLURM flags without --executor slurm are a mistake, said in one line."""
    stored = stored or {}
    executor = args.executor or ("slurm" if stored else "local")
    given = [k for k in DEFAULTS if getattr(args, k, None) is not None]
    if executor != "slurm" and given:
        raise ConfigError(f"--{given[0].replace('_', '-')} is an option of --executor slurm; add --executor slurm "
                          f"or drop it")
    values = {k: getattr(args, k) if getattr(args, k, None) is not None else stored.get(k, default)
              for k, default in DEFAULTS.items()}
    slurm = SlurmOptions(partition=values["slurm_partition"], nodes=values["slurm_nodes"],
                         gpus_per_node=values["slurm_gpus_per_node"],
                         time_min=parse_time(values["slurm_time"]) if values["slurm_time"] else 0,
                         account=values["slurm_account"], qos=values["slurm_qos"],
                         sbatch=tuple(values["slurm_option"] or ()), max_running=values["slurm_max_running"],
                         poll_s=values["slurm_poll"])
    check_options(slurm)
    return executor, values, slurm


def check_no_live_jobs(out: Path) -> None:
    """A sweep with jobs still queued or running is resumed on SLURM (or cancelled), not run here beside them."""
    path = out / "sweep.db"
    if not path.exists():
        return
    with Store(path) as store:
        live = sorted(j.job_id for j in store.jobs().values() if j.state in LIVE_STATES)
    if live:
        raise ConfigError(f"--executor local: {out} has SLURM job(s) {_ranges(live)} still queued or running; "
                          f"resume it with --executor slurm, or stop them with `shardbench sweep --out {out} --cancel`")


# ------------------------------------------------------------------------------------------------ job shapes
@dataclass(frozen=True)
class Shape:
    """A run's job: nodes, tasks (processes) per node, GPUs per node, and the simulated CPU devices each process
    gets (0: its real devices)."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    local_devices: int

    @property
    def processes(self) -> int:
        return self.nodes * self.tasks_per_node


def job_shape(flat: dict[str, Any], opts: Options, slurm: SlurmOptions, name: str) -> Shape:
    """The job a run needs. On GPUs one process per GPU (JAX's SLURM detection gives each task the GPU of its
    local rank), and a run of D devices takes D / GPUs-per-node nodes; on CPUs the run's processes (see
    `run_processes`) spread over --slurm-nodes."""
    devices = int(flat.get("parallel.devices") or 0)
    g = slurm.gpus_per_node
    if g > 0:
        if devices <= 0:
            return Shape(slurm.nodes, g, g, 0)
        if devices <= g:
            return Shape(1, devices, devices, 0)
        if devices % g:
            raise ConfigError(f"run {name}: --devices {devices} is not a whole number of {g}-GPU nodes; use a "
                              f"multiple of --slurm-gpus-per-node {g}")
        return Shape(devices // g, g, g, 0)
    processes = run_processes(devices, opts)
    if processes % slurm.nodes:
        raise ConfigError(f"run {name}: {processes} process(es) do not spread evenly over --slurm-nodes "
                          f"{slurm.nodes}")
    local = 0
    if processes > 1:
        local = opts.devices_per_process or (devices // processes if devices > 0 and devices % processes == 0 else 0)
    return Shape(slurm.nodes, processes // slurm.nodes, 0, local)


def check_shapes(sweep: Sweep, opts: Options, slurm: SlurmOptions) -> dict[str, Shape]:
    """Every run's job shape, before anything is submitted (a run that fits no job stops the sweep)."""
    return {run.name: job_shape(run_config(sweep.base_preset, run), opts, slurm, run.name) for run in sweep.runs}


def sbatch_args(shape: Shape, slurm: SlurmOptions, opts: Options) -> list[str]:
    """The sbatch options of a job of `shape` (what submitit writes into the job's header, the array aside)."""
    args = [f"--nodes={shape.nodes}", f"--ntasks-per-node={shape.tasks_per_node}",
            f"--time={time_limit_min(slurm, opts)}"]
    if shape.gpus_per_node:
        args.append(f"--gpus-per-node={shape.gpus_per_node}")
    args += [f"--{flag}={value}" for flag, value in (("partition", slurm.partition), ("account", slurm.account),
                                                      ("qos", slurm.qos)) if value]
    for key, value in parse_sbatch(slurm.sbatch).items():
        args.append(f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}"))
    return args


def check_submittable(shapes: dict[str, Shape], opts: Options, slurm: SlurmOptions) -> None:
    """Ask SLURM whether it would take a job of each shape (`sbatch --test-only`, which submits nothing): a
    partition that does not exist or a job larger than any node is one line now, not a half-submitted sweep."""
    by_shape: dict[Shape, list[str]] = {}
    for name, shape in shapes.items():
        by_shape.setdefault(shape, []).append(name)
    for shape, names in by_shape.items():
        done = _run(["sbatch", "--test-only", *sbatch_args(shape, slurm, opts), "--wrap", "true"])
        if done.returncode != 0:
            said = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(said) if "failure" in ln or "error" in ln), said[-1] if said else "")
            raise ConfigError(f"SLURM would not take the job of run {names[0]}"
                              + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")
                              + f", {shape.nodes} node(s) x {shape.tasks_per_node} task(s): {_one_line(why)[:300]}")


def time_limit_min(slurm: SlurmOptions, opts: Options) -> int:
    """The job's time limit: as given, else the run's own time limit and 10 minutes to start up and write."""
    return slurm.time_min or math.ceil(opts.timeout_s / 60) + 10


# -------------------------------------------------------------------------------------------- inside a job
@dataclass(frozen=True)
class TaskSpec:
    """What each task of a run's job does: the `train` command, where its log and outcome go, and its limits."""

    name: str
    cmd: list[str]
    sweep_dir: str
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    local_devices: int = 0


def outcome_path(sweep_dir: Path, job_id: str) -> Path:
    return sweep_dir / "slurm" / f"outcome-{job_id}.json"


def _job_id(environ: Mapping[str, str]) -> str:
    array = environ.get("SLURM_ARRAY_JOB_ID")
    if array and environ.get("SLURM_ARRAY_TASK_ID") is not None:
        return f"{array}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID", "unknown")


def task_environ(spec: TaskSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The `train` process's environment: the task's own (SLURM's variables, which JAX reads to join the job's
    other tasks), the sweep's shared settings, and each process's simulated CPU devices."""
    env = {**environ, **spec.env, "PYTHONUNBUFFERED": "1"}
    if spec.local_devices > 0:
        from shardbench.cluster import ENV_LOCAL_DEVICES

        env[ENV_LOCAL_DEVICES] = str(spec.local_devices)
        env["XLA_FLAGS"] = _SIM_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()  # would override the count
    return env


def run_task(spec: TaskSpec) -> dict[str, Any]:
    """One SLURM task of a run's job: start `shardbench train` and wait for it. Task 0 logs to the run's log as a
    local sweep does (other tasks beside it, .p<rank>.log) and writes the outcome the driver records."""
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    sweep_dir = Path(spec.sweep_dir)
    run_dir = sweep_dir / "runs" / spec.name
    if rank == 0 and run_dir.exists() and not (run_dir / "summary.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)  # a requeued job (preemption) starts its run afresh
    log = sweep_dir / "runs" / (f"{spec.name}.log" if rank == 0 else f"{spec.name}.p{rank}.log")
    outcome = run_process(spec.cmd, log, spec.timeout_s, task_environ(spec, os.environ))
    result = {"job_id": _job_id(os.environ), "rank": rank, "returncode": outcome.returncode,
              "stderr": outcome.stderr[-60:], "started": outcome.started, "wall_s": outcome.wall_s,
              "peak_rss_bytes": outcome.peak_rss_bytes}
    if rank == 0:
        path = outcome_path(sweep_dir, result["job_id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)
    return result


# ------------------------------------------------------------------------------------------------ job states
@dataclass(frozen=True)
class JobState:
    """What SLURM says of one job: its state word, its reason or note, exit code and times where known."""

    state: str
    reason: str = ""
    exit_code: str = ""
    started: float | None = None
    ended: float | None = None

    @property
    def word(self) -> str:
        return self.state.split()[0] if self.state else "UNKNOWN"

    @property
    def live(self) -> bool:
        return self.word in LIVE_STATES


def _expand(job_id: str) -> list[str]:
    """'12_[0-2,5%2]' (a pending part of an array as sacct and squeue write it) -> ['12_0', '12_1', '12_2', '12_5']."""
    found = re.fullmatch(r"(\d+)_\[([\d,\-]+)(?:%\d+)?\]", job_id)
    if not found:
        return [job_id]
    out = []
    for part in found.group(2).split(","):
        lo, _, hi = part.partition("-")
        out += [f"{found.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def _clock(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def sacct_states(job_ids: list[str]) -> dict[str, JobState] | None:
    """States from SLURM's accounting (None where the cluster keeps none)."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    done = _run(["sacct", "-X", "-n", "-P", "-j", ",".join(bases), "-o", "JobID,State,Reason,ExitCode,Start,End"])
    if done.returncode != 0:
        return None
    out: dict[str, JobState] = {}
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 6:
            continue
        jid, state, reason, code, start, end = parts[:6]
        for one in _expand(jid):
            out[one] = JobState(state, "" if reason == "None" else reason, code, _clock(start), _clock(end))
    return out


def squeue_states(job_ids: list[str]) -> dict[str, JobState]:
    """States of the jobs SLURM's controller still holds: queued and running ones (squeue, always current)."""
    wanted = set(job_ids)
    out: dict[str, JobState] = {}
    done = _run(["squeue", "-h", "-r", "-o", "%i|%T|%r"])
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            for one in _expand(parts[0]):
                if one in wanted:
                    out[one] = JobState(parts[1], "" if parts[2] == "None" else parts[2])
    return out


def scontrol_states(job_ids: list[str]) -> dict[str, JobState]:
    """Without accounting: what the controller remembers of jobs that ended recently (for MinJobAge)."""
    out: dict[str, JobState] = {}
    for jid in job_ids:
        shown = _run(["scontrol", "-o", "show", "job", jid])
        fields = dict(kv.split("=", 1) for kv in shown.stdout.split() if "=" in kv)
        if shown.returncode == 0 and fields.get("JobState"):
            reason = fields.get("Reason", "")
            out[jid] = JobState(fields["JobState"], "" if reason == "None" else reason, fields.get("ExitCode", ""),
                                _clock(fields.get("StartTime", "")), _clock(fields.get("EndTime", "")))
    return out


def job_states(job_ids: list[str]) -> tuple[dict[str, JobState], str]:
    """{job id: state} and where the states came from. Queued and running jobs: squeue, which is current (the
    accounting learns of a start or an end a moment later). Jobs that left the queue: sacct, which keeps why a
    job ended; without accounting, scontrol, which remembers ended jobs for a few minutes. A job absent from
    both is left out (just submitted, or just ended and not yet accounted for)."""
    if not job_ids:
        return {}, "squeue and sacct"
    found = squeue_states(job_ids)
    rest = [j for j in job_ids if j not in found]
    if not rest:
        return found, "squeue and sacct"
    accounted = sacct_states(rest)
    if accounted is None:
        found.update({j: st for j, st in scontrol_states(rest).items() if not st.live})
        return found, "squeue and scontrol (no accounting)"
    found.update({j: st for j, st in accounted.items() if j in rest and not st.live})
    return found, "squeue and sacct"


# --------------------------------------------------------------------------------------------- recording
def _failed(sweep: Sweep, run: PlannedRun, kind: str, message: str, started: float, ended: float) -> RunRow:
    return RunRow(run.name, "failed", kind, _one_line(message), run.overrides, run_config(sweep.base_preset, run),
                  None, started, ended, max(ended - started, 0.0))


def row_for(sweep: Sweep, run: PlannedRun, opts: Options, job_id: str, state: JobState) -> RunRow:
    """The store's row for a run whose job has ended: the run's own result where its process finished, else
    what SLURM says ended it."""
    run_dir = opts.sweep_dir / "runs" / run.name
    log_path = opts.sweep_dir / "runs" / f"{run.name}.log"
    saved = _read_json(outcome_path(opts.sweep_dir, job_id))
    now = time.time()
    outcome = None
    if saved is not None:
        outcome = Outcome(saved.get("returncode"), list(saved.get("stderr") or []), float(saved.get("started") or now),
                          float(saved.get("wall_s") or 0.0), saved.get("peak_rss_bytes"))
    record = _read_json(run_dir / "summary.json") if outcome is not None and outcome.returncode == 0 else None
    if outcome is not None and record is not None:
        config_saved = _read_json(run_dir / "config.json")
        planned = run_config(sweep.base_preset, run)
        try:
            config = config_lib.flatten(config_lib.from_dict(config_saved)) if config_saved else planned
        except config_lib.ConfigError:
            config = planned
        return RunRow(run.name, "complete", None, None, run.overrides, config, record, outcome.started,
                      outcome.started + outcome.wall_s, outcome.wall_s)
    started = outcome.started if outcome else (state.started or now)
    ended = outcome.started + outcome.wall_s if outcome else (state.ended or now)
    said = f"SLURM job {job_id} {state.state}" + (f" ({state.reason})" if state.reason else "")
    if state.word in KILLED_KINDS:
        own = ""
        if outcome is not None and outcome.returncode not in (0, None):
            own = ": " + classify(outcome, log_path, opts.timeout_s)[1]
        return _failed(sweep, run, KILLED_KINDS[state.word], said + own, started, ended)
    if outcome is not None:
        kind, message = classify(outcome, log_path, opts.timeout_s)
        return _failed(sweep, run, kind, message, started, ended)
    code = f", exit {state.exit_code}" if state.exit_code else ""
    return _failed(sweep, run, "crash", f"{said}{code} without a result from its run; see {log_path} and "
                                        f"{opts.sweep_dir / 'slurm'}", started, ended)


# ------------------------------------------------------------------------------------------------ submitting
def _executor(out: Path, slurm: SlurmOptions, opts: Options, shape: Shape, name: str, count: int) -> Any:
    import submitit

    executor = submitit.SlurmExecutor(folder=out / "slurm", max_num_timeout=0)
    params: dict[str, Any] = {
        "job_name": name, "nodes": shape.nodes, "ntasks_per_node": shape.tasks_per_node,
        "time": time_limit_min(slurm, opts), "additional_parameters": parse_sbatch(slurm.sbatch),
        "stderr_to_stdout": True,
    }
    if shape.gpus_per_node:
        params["gpus_per_node"] = shape.gpus_per_node
    if slurm.partition:
        params["partition"] = slurm.partition
    if slurm.account:
        params["account"] = slurm.account
    if slurm.qos:
        params["qos"] = slurm.qos
    if count > 1:
        params["array_parallelism"] = slurm.max_running or count
    executor.update_parameters(**params)
    return executor


def submit(sweep: Sweep, runs: list[PlannedRun], opts: Options, slurm: SlurmOptions, shapes: dict[str, Shape],
           store: Store) -> dict[str, str]:
    """Submit `runs`, one job array per job shape, recording each run's job id as it is known; {name: job id}."""
    groups: dict[Shape, list[PlannedRun]] = {}
    for run in runs:
        groups.setdefault(shapes[run.name], []).append(run)
    submitted: dict[str, str] = {}
    for shape, group in groups.items():
        specs = []
        for run in group:
            leftover = opts.sweep_dir / "runs" / run.name
            if leftover.exists():  # a run of an earlier job that did not finish: its directory would refuse `train`
                shutil.rmtree(leftover)
            specs.append(TaskSpec(run.name, train_command(sweep.base_preset, run, opts, launch=False),
                                  str(opts.sweep_dir.resolve()), opts.timeout_s, dict(opts.env), shape.local_devices))
        name = f"sb-{group[0].name}" if len(group) == 1 else f"sb-{sweep.label}"
        executor = _executor(opts.sweep_dir, slurm, opts, shape, name, len(group))
        try:
            jobs = executor.map_array(run_task, specs) if len(group) > 1 else [executor.submit(run_task, specs[0])]
        except Exception as err:  # submitit raises with sbatch's own message
            first = next((ln.strip() for ln in str(err).splitlines() if "error" in ln.lower()), str(err).strip())
            earlier = (f"; the {len(submitted)} run(s) submitted before it are followed by `shardbench sweep --out "
                       f"{opts.sweep_dir} --resume`" if submitted else "")
            raise ConfigError(f"sbatch refused the jobs: {_one_line(first)[:300]}{earlier}") from None
        for run, job in zip(group, jobs):
            store.set_job(run.name, str(job.job_id), "SUBMITTED", submitted=time.time())
            submitted[run.name] = str(job.job_id)
    return submitted


# -------------------------------------------------------------------------------------------------- driving
def run_slurm_sweep(sweep: Sweep, store: Store, opts: Options, slurm: SlurmOptions,
                    out: Callable[[str], None] = print, refused: dict[str, str] | None = None) -> int:
    """Submit every run that has not completed and whose job is not queued or running, then record each job as it
    ends. Jobs an earlier driver left behind are followed, not submitted again; those that ended meanwhile are
    recorded first (and submitted again when they did not complete). Returns 0 once every run is recorded, 130 on
    Ctrl-C: the jobs go on, and the message says how to follow, resume or cancel them."""
    from shardbench.report.write import summary_table

    refused = refused or {}
    total = len(sweep.runs)
    by_name = {r.name: r for r in sweep.runs}
    shapes = check_shapes(sweep, opts, slurm)
    try:
        complete = {r.name for r in store.runs() if r.status == "complete"}
        followed = {n: j.job_id for n, j in store.jobs().items()
                    if n in by_name and n not in complete and j.state in LIVE_STATES}
        if followed:
            _follow(sweep, store, opts, slurm, followed, out, once=True)
            complete = {r.name for r in store.runs() if r.status == "complete"}
        if complete or followed:
            out(f"resuming: {len(complete)} of {total} runs complete, {len(followed)} SLURM job(s) still queued or "
                f"running are followed, not submitted again")
        for run in sweep.runs:
            if run.name in refused and run.name not in complete:
                row = refused_row(sweep, run, refused[run.name])
                store.add(row)
                out(progress_line_for(_done(store, by_name), total, row, "-"))
        todo = [r for r in sweep.runs if r.name not in complete and r.name not in followed and r.name not in refused]
        if todo:
            submitted = submit(sweep, todo, opts, slurm, shapes, store)
            followed.update(submitted)
            out(f"sweep: submitted {len(todo)} run(s) as SLURM job(s) "
                f"{_ranges(sorted(set(submitted.values()), key=_id_key))}; states from squeue while queued or running, "
                f"then sacct (scontrol without accounting)")
        _follow(sweep, store, opts, slurm, followed, out)
    except KeyboardInterrupt:
        live = [j.job_id for n, j in store.jobs().items() if n in by_name and j.state in LIVE_STATES]
        print(f"shardbench: sweep interrupted; its {len(live)} SLURM job(s) go on. Watch them with "
              f"`shardbench sweep --out {opts.sweep_dir} --status`; record them and submit what did not complete "
              f"with `shardbench sweep --out {opts.sweep_dir} --resume`; stop them with "
              f"`shardbench sweep --out {opts.sweep_dir} --cancel`", file=sys.stderr)
        return 130
    rows = {r.name: r for r in store.runs()}
    out(summary_table([rows[r.name] for r in sweep.runs if r.name in rows]))
    out(f"sweep: {opts.sweep_dir}")
    return 0


def _done(store: Store, by_name: dict[str, PlannedRun]) -> int:
    return len(store.names() & set(by_name))


def _id_key(job_id: str) -> tuple[int, int]:
    base, _, index = job_id.partition("_")
    return int(base) if base.isdigit() else 0, int(index) if index.isdigit() else -1


def _ranges(ids: list[str]) -> str:
    return ", ".join(ids) if len(ids) <= 8 else f"{', '.join(ids[:3])}, ... {ids[-1]} ({len(ids)} jobs)"


def _follow(sweep: Sweep, store: Store, opts: Options, slurm: SlurmOptions, pending: dict[str, str],
            out: Callable[[str], None], once: bool = False) -> None:
    """Read job states until every job in `pending` ({run name: job id}) has ended and its run is recorded
    (`once`: read them once, recording those that have ended). Recorded runs leave `pending`."""
    total = len(sweep.runs)
    by_name = {r.name: r for r in sweep.runs}
    unsettled: dict[str, float] = {}  # since when a job has been out of the queue without a final word
    while pending:
        states, source = job_states(list(pending.values()))
        for name, job_id in list(pending.items()):
            state = states.get(job_id)
            if state is not None and state.live:
                unsettled.pop(name, None)
                store.set_job(name, job_id, state.word, state.reason or None)
                continue
            has_outcome = outcome_path(opts.sweep_dir, job_id).exists()
            # Out of the queue, but not yet in the accounting (or, done, its outcome not yet through the shared
            # filesystem): wait a little for the full story before recording what is known.
            settled = state is not None and (state.word != "COMPLETED" or has_outcome)
            if not settled:
                if once or time.time() - unsettled.setdefault(name, time.time()) < OUTCOME_GRACE_S:
                    continue
                state = state or JobState("UNKNOWN", f"not found by {source}")
            row = row_for(sweep, by_name[name], opts, job_id, state)
            store.add(row)
            store.set_job(name, job_id, state.state or state.word, state.reason or None)
            del pending[name]
            out(progress_line_for(_done(store, by_name), total, row, job_id))
        if once:
            return
        if pending:
            time.sleep(slurm.poll_s)


def progress_line_for(i: int, total: int, row: RunRow, job_id: str) -> str:
    from shardbench.report.write import progress_line

    return f"{progress_line(i, total, row)}  [job {job_id}]"


# --------------------------------------------------------------------------------------------- status, cancel
def status_lines(store: Store, sweep: Sweep) -> list[str]:
    """One line per run: its name, job id, SLURM's state (read now for jobs not yet ended) and the store's verdict."""
    jobs = store.jobs()
    rows = {r.name: r for r in store.runs()}
    live = {n: j.job_id for n, j in jobs.items() if j.state in LIVE_STATES}
    states, source = job_states(list(live.values())) if live else ({}, "")
    width = max((len(r.name) for r in sweep.runs), default=4)
    lines = []
    counts: dict[str, int] = {}
    for run in sweep.runs:
        job: JobRow | None = jobs.get(run.name)
        row = rows.get(run.name)
        if job is None:
            state, reason, jid = (row.status.upper() if row is not None else "UNSUBMITTED"), "", "-"
        else:
            now = states.get(job.job_id) if job.name in live else None
            state = now.state if now is not None else job.state
            reason = (now.reason if now is not None else job.reason) or ""
            jid = job.job_id
        word = state.split()[0]
        counts[word] = counts.get(word, 0) + 1
        verdict = "" if row is None else (" complete" if row.status == "complete" else
                                         f" failed: {row.error_kind}: {row.error}")
        lines.append(f"{run.name.ljust(width)}  {jid:>10}  {state}" + (f" ({reason})" if reason else "")
                     + (f"  ->{verdict}" if verdict else ""))
    head = f"{len(sweep.runs)} run(s): " + ", ".join(f"{n} {w}" for w, n in counts.items())
    if source:
        head += f"; states of jobs not yet ended from {source}"
    return [head, *lines]


def cancel(store: Store, names: Iterable[str]) -> list[str]:
    """scancel every job of `names` still queued or running (as last recorded); the job ids cancelled."""
    jobs = store.jobs()
    ids = [jobs[n].job_id for n in names if n in jobs and jobs[n].state in LIVE_STATES]
    if ids:
        done = _run(["scancel", *ids])
        if done.returncode != 0:
            raise ConfigError(f"scancel failed: {(done.stderr or done.stdout).strip()[:300]}")
    return ids



def watch(args: Any) -> int:
    """`--status` and `--cancel` on the sweep in --out: read-only (status) or scancel only; neither needs the
    sweep's lock, so they work while its driver runs (the driver then records the cancelled jobs)."""
    flag = "--status" if args.status else "--cancel"
    if args.status and args.cancel:
        raise ConfigError("--status and --cancel: give one")
    if not args.out:
        raise ConfigError(f"{flag} needs --out: the directory of the sweep")
    path = Path(args.out) / "sweep.db"
    if not path.exists():
        raise ConfigError(f"{flag}: {args.out} holds no sweep (no sweep.db)")
    with Store(path) as store:
        if not store.get_meta("runs"):
            raise ConfigError(f"{flag}: {path} holds no plan")
        sweep = stored_sweep(store)
        if args.status:
            for line in status_lines(store, sweep):
                print(line)
            return 0
        if shutil.which("scancel") is None:
            raise ConfigError("--cancel: scancel not found on PATH; run it where SLURM's commands are")
        ids = cancel(store, [r.name for r in sweep.runs])
    if not ids:
        print(f"sweep: no queued or running job to cancel in {args.out}")
    else:
        print(f"sweep: cancelled {len(ids)} job(s): {_ranges(sorted(ids, key=_id_key))}; "
              f"`shardbench sweep --out {args.out} --resume` records them and submits what did not complete")
    return 0
