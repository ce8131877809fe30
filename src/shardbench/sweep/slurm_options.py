"""The SLURM executor's options and the jobs it asks for (`shardbench sweep --executor slurm`).

The --slurm-* flags say what an sbatch header would: partition, nodes, GPUs per node, time limit, account, qos
and any other sbatch option; a resumed sweep takes what it was started with for those not given again. Each run
needs a job of some shape (nodes, tasks per node, GPUs per node), worked out from its --devices before anything
is submitted, and `sbatch --test-only` asks SLURM whether it would take each shape, so a partition that does not
exist or a job larger than any node is one line, not a half-submitted sweep.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shardbench.errors import ConfigError
from shardbench.sweep.grid import Sweep, run_config
from shardbench.sweep.runner import Options, _one_line, run_processes
from shardbench.sweep.slurm_jobs import run_command

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
MAX_POLL_S = 86400.0  # --slurm-poll: a day between reads at most (time.sleep refuses about 1e10 s)


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


# The sbatch options the executor sets itself, from the plan or from a flag of its own: submitit writes
# --slurm-option's after its own, so one of these would silently replace the job planned.
_TASKS = "shardbench sets the job's tasks from the plan (one per process of the run: --processes, or one per GPU)"
_LOGS = "shardbench (submitit) sends each job's output to <out>/slurm/, where the driver and --status read it"
OWN_SBATCH = {
    "nodes": "use --slurm-nodes (on GPUs a run's --devices decides its nodes)",
    "ntasks": _TASKS, "ntasks-per-node": _TASKS, "tasks-per-node": _TASKS,
    "gpus-per-node": "use --slurm-gpus-per-node", "gpus": "use --slurm-gpus-per-node",
    "gpus-per-task": "use --slurm-gpus-per-node (each task takes the GPU of its local rank; see docs/clusters.md)",
    "time": "use --slurm-time", "partition": "use --slurm-partition", "account": "use --slurm-account",
    "qos": "use --slurm-qos",
    "array": "use --slurm-max-running (shardbench puts the runs of one job shape in one job array)",
    "job-name": "shardbench names each job after its run or the sweep",
    "output": _LOGS, "error": _LOGS, "open-mode": _LOGS,
    "signal": "submitit sets it: SLURM's signal 90 s before the time limit, at which the job ends",
}


def parse_sbatch(items: Iterable[str]) -> dict[str, Any]:
    """--slurm-option values ('mem=64G', '--constraint=a100', 'exclusive') as submitit's extra sbatch parameters.
    One of the options shardbench sets itself (OWN_SBATCH), or what sbatch would read as one (it takes any
    unambiguous beginning of an option's name: 'part' for 'partition'), is refused, naming the flag to use."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.strip().lstrip("-").partition("=")
        if not re.fullmatch(r"[A-Za-z][\w-]*", key) or (eq and not value):
            raise ConfigError(f"--slurm-option {item!r} is not an sbatch option: write it as KEY=VALUE (mem=64G) "
                              f"or a lone flag (exclusive)")
        name = key.replace("_", "-")
        mine = [name] if name in OWN_SBATCH else [o for o in OWN_SBATCH if o.startswith(name)]
        if len(mine) > 1:  # 't': --time to a reader of sbatch's short options, one of several long ones to sbatch
            raise ConfigError(f"--slurm-option {item!r} names no one sbatch option: it begins "
                              f"{', '.join('--' + o for o in mine)}, which shardbench sets itself; write an "
                              f"option's whole name (sbatch's own one-letter options are not taken)")
        own = mine[0] if mine else None
        if own is not None:
            raise ConfigError(f"--slurm-option {item!r} would replace sbatch --{own} of the job shardbench plans: "
                              f"{OWN_SBATCH[own]}")
        out[key.replace("-", "_")] = value if eq else True
    return out


def check_options(slurm: SlurmOptions) -> None:
    """Numbers in range; everything else SLURM checks when the job is submitted."""
    if slurm.nodes < 1 or slurm.gpus_per_node < 0 or slurm.max_running < 0:
        raise ConfigError(f"--slurm-nodes must be at least 1 and --slurm-gpus-per-node and --slurm-max-running 0 or "
                          f"more, got {slurm.nodes}, {slurm.gpus_per_node} and {slurm.max_running}")
    if not 0 < slurm.poll_s <= MAX_POLL_S:  # nan too: the driver sleeps this long between reads
        raise ConfigError(f"--slurm-poll must be a number of seconds above 0 and at most {MAX_POLL_S:g} (a day), got "
                          f"{slurm.poll_s:g}")
    parse_sbatch(slurm.sbatch)


def check_available() -> None:
    """submitit importable and SLURM's commands on PATH, or one line saying what is missing."""
    if importlib.util.find_spec("submitit") is None:
        raise ConfigError("--executor slurm needs submitit: pip install 'shardbench[slurm]'")
    missing = [cmd for cmd in ("sbatch", "squeue", "scancel") if shutil.which(cmd) is None]
    if missing:
        raise ConfigError(f"--executor slurm: {', '.join(missing)} not found on PATH; run the sweep on a host that "
                          f"submits SLURM jobs (a login node)")
    conf = os.environ.get("SLURM_CONF", "")
    if conf and not os.path.isfile(conf):  # sbatch would say only "ClusterName needs to be specified"
        raise ConfigError(f"--executor slurm: SLURM_CONF={conf} is no file; point it at the cluster's slurm.conf, or "
                          f"unset it for /etc/slurm/slurm.conf")


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


# What sbatch's line naming the problem says: its own errors, and getopt's for an option it does not know.
SBATCH_COMPLAINTS = ("failure", "error", "unrecognized option", "invalid option", "requires an argument",
                     "did not answer")
# What it says where no controller answered: nothing about the job, which SLURM never saw.
UNREACHABLE = ("unable to contact slurm controller", "connection refused", "socket timed out",
               "zero bytes were transmitted")


def check_submittable(shapes: dict[str, Shape], opts: Options, slurm: SlurmOptions) -> None:
    """Ask SLURM whether it would take a job of each shape (`sbatch --test-only`, which submits nothing): a
    partition that does not exist or a job larger than any node is one line now, not a half-submitted sweep."""
    by_shape: dict[Shape, list[str]] = {}
    for name, shape in shapes.items():
        by_shape.setdefault(shape, []).append(name)
    for shape, names in by_shape.items():
        done = run_command(["sbatch", "--test-only", *sbatch_args(shape, slurm, opts), "--wrap", "true"])
        if done.returncode != 0:
            said = [ln.strip() for ln in (done.stderr or done.stdout).splitlines()
                    if ln.strip() and not ln.strip().startswith('Try "sbatch --help"')]  # getopt's hint says nothing
            why = next((ln for ln in reversed(said) if any(w in ln.lower() for w in SBATCH_COMPLAINTS)),
                       said[0] if said else "")
            if done.returncode == 124 or any(w in why.lower() for w in UNREACHABLE):
                raise ConfigError(f"SLURM's controller could not be reached (SLURM_CONF="
                                  f"{os.environ.get('SLURM_CONF') or 'unset: /etc/slurm/slurm.conf'}): "
                                  f"{_one_line(why)[:300]}; start slurmctld, or point SLURM_CONF at a running "
                                  f"cluster's slurm.conf")
            raise ConfigError(f"SLURM would not take the job of run {names[0]}"
                              + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")
                              + f", {shape.nodes} node(s) x {shape.tasks_per_node} task(s): {_one_line(why)[:300]}"
                              + _what_was_asked(why, slurm))


def _what_was_asked(why: str, slurm: SlurmOptions) -> str:
    """The option behind sbatch's refusal of a partition, account or QOS, and the partitions there are (sinfo)."""
    said = why.lower()
    if "partition" in said:
        listed = run_command(["sinfo", "--noheader", "--format", "%P"]) if shutil.which("sinfo") else None
        names = sorted({p.strip().rstrip("*") for p in listed.stdout.split()} if listed and listed.returncode == 0
                       else set())
        asked = f"--slurm-partition {slurm.partition}" if slurm.partition else "no --slurm-partition (the default)"
        return f" ({asked}" + (f"; partitions here: {', '.join(names)})" if names else ")")
    for word, flag, value in (("account", "--slurm-account", slurm.account), ("qos", "--slurm-qos", slurm.qos)):
        if word in said and value:
            return f" ({flag} {value})"
    return ""


def time_limit_min(slurm: SlurmOptions, opts: Options) -> int:
    """The job's time limit: as given, else the run's own time limit and 10 minutes to start up and write."""
    return slurm.time_min or math.ceil(opts.timeout_s / 60) + 10


# submitit has SLURM signal the job 90 s before its time limit (#SBATCH --signal=USR2@90; SLURM may send it up to
# 60 s sooner), and then ends the job; the run's own limit ends this much before the job's, 30 s left to start it.
SIGNAL_MARGIN_S = 180


def run_timeout_s(slurm: SlurmOptions, opts: Options) -> float:
    """The run's own time limit inside its job: --timeout, or, where --slurm-time leaves less, the job's limit
    less SIGNAL_MARGIN_S, so that a run that reaches the job's limit is stopped by its own and recorded as a
    timeout, before submitit's signal ends the job (a job too short for the margin keeps --timeout: run_task
    records that signal as a timeout too)."""
    before_signal = time_limit_min(slurm, opts) * 60 - SIGNAL_MARGIN_S
    return min(opts.timeout_s, before_signal) if before_signal > 0 else opts.timeout_s
