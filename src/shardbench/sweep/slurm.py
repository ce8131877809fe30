"""Run a sweep's runs as SLURM jobs (`shardbench sweep --executor slurm`), submitted through submitit.

Every run is a job (runs of the same shape go in one job array, so --slurm-max-running can bound how many run at
once). A job has one task per process of its run; each task starts `shardbench train`, which recognises SLURM
by itself (jax.distributed's cluster detection) and joins the job's other tasks. Task 0 writes its outcome to
<out>/slurm/; the driver, the only writer of sweep.db, turns each finished job into the row a local sweep
would record, so the store, the run folders and the report are the same. A job SLURM ends (time limit, memory,
preemption, a node failure, scancel) is recorded with the sweep's error kinds and SLURM's words for it.

The --slurm-* options and each run's job shape are in `slurm_options`; the jobs' states, as squeue, sacct or
scontrol tell them, in `slurm_jobs`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.parsing import from_dict
from shardbench.report.terminal import progress_line, status_text, summary_table
from shardbench.store import JobRow, RunRow, Store
from shardbench.sweep.grid import PlannedRun, Sweep, run_config, stored_sweep
from shardbench.sweep.runner import (Options, Outcome, _one_line, _read_json, classify, refused_row, run_process,
                                     train_command)
from shardbench.sweep.slurm_jobs import (KILLED_KINDS, LIVE_STATES, REQUEUED_AFTER, JobState, ReadFailed, job_states,
                                         lost_state, run_command)
from shardbench.sweep.slurm_options import (SIGNAL_MARGIN_S, Shape, SlurmOptions, check_shapes, parse_sbatch,
                                            run_timeout_s, time_limit_min)

OUTCOME_GRACE_S = 60.0  # a job SLURM calls finished whose outcome file has not appeared (a slow shared filesystem)
_SIM_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")


# -------------------------------------------------------------------------------------------- inside a job
@dataclass(frozen=True)
class TaskSpec:
    """What each task of a run's job does: the `train` command, where its log and outcome go, and its limits."""

    name: str
    cmd: list[str]
    sweep_dir: str
    timeout_s: float  # the run's own: --timeout, or less to end before the job's (run_timeout_s)
    env: dict[str, str] = field(default_factory=dict)
    local_devices: int = 0
    time_limit_min: int = 0  # the job's, SLURM's


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


def _signal_stops() -> tuple[type[BaseException], ...]:
    """What submitit raises in the job's main thread at SLURM's signal before the time limit (USR2, 90 s ahead;
    with max_num_timeout=0 it requeues no job on it): none outside submitit."""
    try:
        from submitit.core.utils import UncompletedJobError
    except ImportError:
        return ()
    return (UncompletedJobError,)


def run_task(spec: TaskSpec) -> dict[str, Any]:
    """One SLURM task of a run's job: start `shardbench train` and wait for it. Task 0 logs to the run's log as a
    local sweep does (other tasks beside it, .p<rank>.log) and writes the outcome the driver records; a run that
    submitit stops at SLURM's signal before the job's time limit is a timeout (its outcome says so), and the
    exception goes on to submitit, which ends the job."""
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    sweep_dir = Path(spec.sweep_dir)
    run_dir = sweep_dir / "runs" / spec.name
    if rank == 0:  # a requeued job (preemption, a failed node) starts its run afresh, and without the outcome
        # its first attempt left (killed by SIGTERM), which the driver would otherwise read as this attempt's
        outcome_path(sweep_dir, _job_id(os.environ)).unlink(missing_ok=True)
        if run_dir.exists() and not (run_dir / "summary.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
    log = sweep_dir / "runs" / (f"{spec.name}.log" if rank == 0 else f"{spec.name}.p{rank}.log")
    stops, started = _signal_stops(), time.time()
    try:
        outcome = run_process(spec.cmd, log, spec.timeout_s, task_environ(spec, os.environ))
    except stops:  # run_process has stopped the run
        limit = f"{spec.time_limit_min}-minute " if spec.time_limit_min else ""
        stopped = f"no result within the job's {limit}SLURM time limit: stopped at SLURM's signal, 90 s before it"
        _write_outcome(sweep_dir, rank, {**_result(Outcome(None, [], started, time.time() - started), rank, spec),
                                         "stopped": stopped})
        raise
    result = _result(outcome, rank, spec)
    _write_outcome(sweep_dir, rank, result)
    return result


def _result(outcome: Outcome, rank: int, spec: TaskSpec) -> dict[str, Any]:
    return {"job_id": _job_id(os.environ), "rank": rank, "returncode": outcome.returncode,
            "stderr": outcome.stderr[-60:], "started": outcome.started, "wall_s": outcome.wall_s,
            "peak_rss_bytes": outcome.peak_rss_bytes, "oom_kills": outcome.oom_kills, "timeout_s": spec.timeout_s,
            "job_limit_s": 60.0 * spec.time_limit_min}


def _write_outcome(sweep_dir: Path, rank: int, result: dict[str, Any]) -> None:
    """Task 0's outcome, for the driver (written whole: the driver may read it at any moment)."""
    if rank == 0:
        path = outcome_path(sweep_dir, result["job_id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)


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
                          float(saved.get("wall_s") or 0.0), saved.get("peak_rss_bytes"), saved.get("oom_kills"))
    record = _read_json(run_dir / "summary.json") if outcome is not None and outcome.returncode == 0 else None
    if outcome is not None and record is not None:
        config_saved = _read_json(run_dir / "config.json")
        planned = run_config(sweep.base_preset, run)
        try:
            config = config_lib.flatten(from_dict(config_saved)) if config_saved else planned
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
        kind, message = _own_ending(outcome, saved or {}, log_path, opts)
        return _failed(sweep, run, kind, message, started, ended)
    code = f", exit {state.exit_code}" if state.exit_code else ""
    return _failed(sweep, run, "crash", f"{said}{code} without a result from its run; see {log_path} and "
                                        f"{opts.sweep_dir / 'slurm'}", started, ended)


def _own_ending(outcome: Outcome, saved: dict[str, Any], log_path: Path, opts: Options) -> tuple[str, str]:
    """(error kind, message) of a run that ended inside its job without a result. A run stopped at a time limit
    ran under its task's own (--timeout, or less to end before the job's: the message says which), or was
    stopped at SLURM's signal before the job's limit: a timeout either way."""
    if outcome.returncode is None and saved.get("stopped"):
        return "timeout", _one_line(str(saved["stopped"]))
    limit = float(saved.get("timeout_s") or opts.timeout_s)
    kind, message = classify(outcome, log_path, limit)
    # Which limit the task ran under, from what it saved: its job's (less the margin) or --timeout as submitted,
    # which a resume may since have changed. An outcome from before job_limit_s was saved: against today's.
    job_s = saved.get("job_limit_s")
    by_job = (bool(job_s) and math.isclose(limit, float(job_s) - SIGNAL_MARGIN_S) if "job_limit_s" in saved
              else limit < opts.timeout_s)
    if outcome.returncode is None and by_job:
        message += (f" (the job's {float(job_s) / 60:g}-minute time limit less {SIGNAL_MARGIN_S} s, which came "
                    f"before the run's --timeout)" if job_s else
                    f" (the job's time limit less {SIGNAL_MARGIN_S} s, which comes before --timeout "
                    f"{opts.timeout_s:g})")
    return kind, message


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
                                  str(opts.sweep_dir.resolve()), run_timeout_s(slurm, opts), dict(opts.env),
                                  shape.local_devices, time_limit_min(slurm, opts)))
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
    refused = refused or {}
    total = len(sweep.runs)
    by_name = {r.name: r for r in sweep.runs}
    shapes = check_shapes(sweep, opts, slurm)
    since = time.time()  # the progress counts the runs complete before and those recorded from now on
    try:
        recorded = store.names() & set(by_name)
        complete = {r.name for r in store.runs() if r.status == "complete"}
        followed = {n: j.job_id for n, j in store.jobs().items()
                    if n in by_name and n not in complete and j.state in LIVE_STATES}
        if followed:
            _follow(sweep, store, opts, slurm, followed, out, once=True, since=since)
            complete = {r.name for r in store.runs() if r.status == "complete"}
        if recorded or followed:
            out(f"resuming: {len(complete)} of {total} runs complete, {len(followed)} SLURM job(s) still queued or "
                f"running are followed, not submitted again")
        for run in sweep.runs:
            if run.name in refused and run.name not in complete:
                row = refused_row(sweep, run, refused[run.name])
                store.add(row)
                out(progress_line_for(_done(store, by_name, since), total, row, "-"))
        todo = [r for r in sweep.runs if r.name not in complete and r.name not in followed and r.name not in refused]
        if todo:
            submitted = submit(sweep, todo, opts, slurm, shapes, store)
            followed.update(submitted)
            out(f"sweep: submitted {len(todo)} run(s) as SLURM job(s) "
                f"{_ranges(sorted(set(submitted.values()), key=_id_key))}; states from squeue while queued or running, "
                f"then sacct (scontrol without accounting)")
        _follow(sweep, store, opts, slurm, followed, out, since=since)
    except KeyboardInterrupt:
        live = [j.job_id for n, j in store.jobs().items() if n in by_name and j.state in LIVE_STATES]
        resume = (f"record them and submit what did not complete with `shardbench sweep --out {opts.sweep_dir} "
                  f"--resume`; " if opts.way_on else "")  # else the caller says how (tune: its own --resume)
        print(f"shardbench: sweep interrupted; its {len(live)} SLURM job(s) go on. Watch them with "
              f"`shardbench sweep --out {opts.sweep_dir} --status`; {resume}stop them with "
              f"`shardbench sweep --out {opts.sweep_dir} --cancel`", file=sys.stderr)
        return 130
    rows = {r.name: r for r in store.runs()}
    out(summary_table([rows[r.name] for r in sweep.runs if r.name in rows]))
    out(f"sweep: {opts.sweep_dir}")
    return 0


def _done(store: Store, by_name: dict[str, PlannedRun], since: float = 0.0) -> int:
    """How many of the runs are done for the progress line: complete, or recorded since `since` (an earlier
    attempt's failure, submitted again, is not done until its new job ends)."""
    return sum(r.name in by_name and (r.status == "complete" or (r.finished or 0.0) >= since) for r in store.runs())


def _id_key(job_id: str) -> tuple[int, int]:
    base, _, index = job_id.partition("_")
    return int(base) if base.isdigit() else 0, int(index) if index.isdigit() else -1


def _ranges(ids: list[str]) -> str:
    return ", ".join(ids) if len(ids) <= 8 else f"{', '.join(ids[:3])}, ... {ids[-1]} ({len(ids)} jobs)"


def _follow(sweep: Sweep, store: Store, opts: Options, slurm: SlurmOptions, pending: dict[str, str],
            out: Callable[[str], None], once: bool = False, since: float = 0.0) -> None:
    """Read job states until every job in `pending` ({run name: job id}) has ended and its run is recorded
    (`once`: only until none is ending, recording those that have ended, so that a resume knows which runs to
    submit again: a job SLURM is cleaning up after scancel, or one out of the queue whose final word has not yet
    come, is waited for up to OUTCOME_GRACE_S). A job preempted or on a failed node is recorded once squeue has
    not listed it at two reads in a row: SLURM may requeue it, and a requeued job is listed again (PENDING), to
    be followed, not recorded as killed and submitted a second time. Recorded runs leave `pending`."""
    total = len(sweep.runs)
    by_name = {r.name: r for r in sweep.runs}
    unsettled: dict[str, float] = {}  # since when a job has been ending without a final word
    out_of_queue: set[str] = set()  # runs whose job squeue did not list at the last read, ended as REQUEUED_AFTER
    started = time.time()
    first_read: float | None = None  # the clock at the first read squeue answered
    failing = False  # squeue could not be read at the last poll
    while pending:
        try:
            states, source = job_states(list(pending.values()))
        except ReadFailed as err:  # nothing is known of any job this time: none is taken to have ended
            if not failing:
                out(f"sweep: warning: {err}; the jobs' states are unknown until it answers, trying again every "
                    f"{slurm.poll_s:g} s")
            failing = True
            if once:
                return
            time.sleep(slurm.poll_s)
            continue
        if failing:
            out("sweep: squeue answers again")
            failing = False
        ending, now = False, time.time()
        first_read = now if first_read is None else first_read
        for name, job_id in list(pending.items()):
            state = states.get(job_id)
            if state is not None and state.live:
                if state.word != "COMPLETING":
                    unsettled.pop(name, None)
                else:
                    ending = True
                out_of_queue.discard(name)
                store.set_job(name, job_id, state.word, state.reason or None)
                continue
            if state is not None and state.word in REQUEUED_AFTER and name not in out_of_queue:
                out_of_queue.add(name)  # a requeue shows at the next read, PENDING again
                ending = True
                continue
            has_outcome = outcome_path(opts.sweep_dir, job_id).exists()
            # Out of the queue, but not yet in the accounting (or, done, its outcome not yet through the shared
            # filesystem): wait a little for the full story before recording what is known.
            settled = state is not None and (state.word != "COMPLETED" or has_outcome)
            if not settled:
                # `once` ends at the grace: a job unsettled since the first read has waited it out and is recorded
                # then, not left followed unrecorded; one that ended since keeps its own grace (its outcome coming)
                ending_since = unsettled.setdefault(name, now)
                waited_out = once and ending_since == first_read and now - started >= OUTCOME_GRACE_S
                if now - ending_since < OUTCOME_GRACE_S and not waited_out:
                    ending = True
                    continue
                state = state or lost_state(source)
            row = row_for(sweep, by_name[name], opts, job_id, state)
            store.add(row)
            store.set_job(name, job_id, state.state or state.word, state.reason or None)
            del pending[name]
            if once and row.status != "complete":  # a resume's first pass: the run is not done, it is submitted
                # again (or refused) next, and counted when that ends
                out(f"resuming: SLURM job {job_id} of {row.name} ended: {status_text(row)}: {row.error}")
            else:
                out(progress_line_for(_done(store, by_name, since), total, row, job_id))
        if once and (not ending or now - started >= OUTCOME_GRACE_S):
            return
        if pending:
            time.sleep(slurm.poll_s)


def progress_line_for(i: int, total: int, row: RunRow, job_id: str) -> str:
    return f"{progress_line(i, total, row)}  [job {job_id}]"


# --------------------------------------------------------------------------------------------- status, cancel
def status_lines(store: Store, sweep: Sweep) -> list[str]:
    """One line per run: its name, job id, SLURM's state (read now for jobs not yet ended) and the store's verdict."""
    jobs = store.jobs()
    rows = {r.name: r for r in store.runs()}
    live = {n: j.job_id for n, j in jobs.items() if j.state in LIVE_STATES}
    read = True
    try:
        states, source = job_states(list(live.values())) if live else ({}, "")
    except ReadFailed as err:
        states, source, read = {}, f"the store, as last recorded: {err}", False
    width = max((len(r.name) for r in sweep.runs), default=4)
    lines = []
    counts: dict[str, int] = {}
    for run in sweep.runs:
        job: JobRow | None = jobs.get(run.name)
        row = rows.get(run.name)
        if job is None:
            # a run recorded without a job ran here (a local sweep resumed on SLURM): not SLURM's COMPLETED; one
            # not recorded is unsubmitted where the sweep has jobs, else a local run that never ended (stopped)
            state = (f"LOCAL ({row.status})" if row is not None else "UNSUBMITTED" if jobs else "UNRECORDED")
            reason, jid = "", "-"
        else:
            now = states.get(job.job_id) if job.name in live else None
            if job.name in live and now is None and read and _lost(job):
                now = lost_state(source)
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


def _lost(job: JobRow) -> bool:
    """Whether a job no source knows now was submitted long enough ago to have ended without a record
    (`lost_state`), rather than to be too new for squeue."""
    return time.time() - job.submitted >= OUTCOME_GRACE_S


def still_live(recorded: dict[str, JobRow]) -> dict[str, str]:
    """Of the jobs {run: job} the store last recorded as queued or running, those SLURM still holds ({run: job id}):
    only a driver writes states to the store, so a job cancelled or ended since is still recorded live there. A
    job no source knows counts as live while it may be too new for squeue, and as ended after (`_lost`); where
    squeue cannot be read, every recorded one counts as live."""
    if not recorded:
        return {}
    try:
        states, _ = job_states([j.job_id for j in recorded.values()])
    except ReadFailed:
        return {n: j.job_id for n, j in recorded.items()}
    return {n: j.job_id for n, j in recorded.items()
            if (states[j.job_id].word in LIVE_STATES if j.job_id in states else not _lost(j))}


def cancel(store: Store, names: Iterable[str]) -> list[str]:
    """scancel every job of `names` still queued or running, as SLURM says now; the job ids cancelled."""
    jobs = store.jobs()
    ids = list(still_live({n: jobs[n] for n in names if n in jobs and jobs[n].state in LIVE_STATES}).values())
    if ids:
        done = run_command(["scancel", *ids])
        if done.returncode != 0:
            raise ConfigError(f"scancel failed: {(done.stderr or done.stdout).strip()[:300]}")
    return ids


def check_no_live_jobs(out: Path) -> None:
    """A sweep with jobs still queued or running is resumed on SLURM (or cancelled), not run here beside them."""
    path = out / "sweep.db"
    if not path.exists():
        return
    with Store(path) as store:
        recorded = {n: j for n, j in store.jobs().items() if j.state in LIVE_STATES}
    live = sorted(still_live(recorded).values())
    if live:
        raise ConfigError(f"--executor local: {out} has SLURM job(s) {_ranges(live)} still queued or running; "
                          f"resume it with --executor slurm, or stop them with `shardbench sweep --out {out} --cancel`")


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
