"""What SLURM says of a sweep's jobs: their states, which of them SLURM may still leave, and how the final
ones that are not a finished process (time limit, memory, preemption, a node failure, scancel) map onto the
sweep's error kinds.

Job states come from `squeue` while jobs are queued or running, and from `sacct` once they have ended (it keeps
why); on a cluster without accounting, from `scontrol show job`, which remembers ended jobs for a few minutes.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass

# SLURM's job states: those it may still leave, and how the final ones that are not a finished process map onto
# the sweep's error kinds. SPECIAL_EXIT is a job requeued and held (a release runs it again).
LIVE_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED",
                         "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
                         "SPECIAL_EXIT", "SUBMITTED"})
# Endings SLURM may follow with a requeue of the same job id (PreemptMode=REQUEUE, a failed node or boot): final
# only once squeue no longer lists the job, since a requeued job stays in the queue, PENDING again.
REQUEUED_AFTER = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
# LOST: a job squeue, sacct and scontrol all no longer know, long after it was submitted (`lost_state`).
KILLED_KINDS = {"TIMEOUT": "timeout", "DEADLINE": "timeout", "OUT_OF_MEMORY": "oom", "CANCELLED": "killed",
                "PREEMPTED": "killed", "NODE_FAIL": "killed", "BOOT_FAIL": "killed", "REVOKED": "killed",
                "LOST": "killed"}


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


def lost_state(source: str) -> JobState:
    """A job no source knows long after its submission has ended without a record: SLURM 22.05 keeps none of a
    queued element of a job array cancelled with scancel, in squeue, sacct or scontrol alike."""
    return JobState("LOST", f"known to none of {source}: it left SLURM without a record, as a queued job "
                            f"cancelled does on some SLURM versions")


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


COMMAND_TIMEOUT_S = 120.0


def run_command(cmd: list[str], timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    """One of SLURM's commands (sbatch, squeue, sacct, scontrol, scancel), its output captured as text. One that
    does not answer within `timeout_s` (default COMMAND_TIMEOUT_S: a controller that hangs) or cannot be started
    is a failed command (exit status 124 or 127, with the reason as its stderr), as one that fails itself is."""
    timeout_s = COMMAND_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} did not answer within {timeout_s:g} s")
    except OSError as err:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]} could not be run: {err.strerror or err}")


def failure(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said, in one line: its first line of stderr (else stdout), else its exit status."""
    said = next((ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()), "")
    return f"{done.args[0]} failed ({said[:200] or f'exit {done.returncode}'})"


def sacct_states(job_ids: list[str]) -> dict[str, JobState] | None:
    """States from SLURM's accounting (None where the cluster keeps none)."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    done = run_command(["sacct", "-X", "-n", "-P", "-j", ",".join(bases), "-o",
                        "JobID,State,Reason,ExitCode,Start,End"])
    if done.returncode != 0:
        return None
    out: dict[str, JobState] = {}
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 6:
            continue
        jid, state, reason, code, start, end = parts[:6]
        for one in _expand(jid):
            out[one] = JobState(state, _reason(state, reason), code, _clock(start), _clock(end))
    return out


def _reason(state: str, reason: str) -> str:
    """sacct's reason where it tells something of the state: a queued or running job's, or why SLURM ended one
    (NODE_FAIL's NodeDown). An array element that waited keeps its last reason for waiting after it ends
    ("COMPLETED (JobArrayTaskLimit)"), which says nothing of its end: left out, as for every job that ended
    completed, failed or cancelled, whose story is the run's own or scancel's."""
    word = state.split()[0] if state else ""
    ended_by_slurm = word in KILLED_KINDS and word != "CANCELLED"
    return reason if reason != "None" and (word in LIVE_STATES or ended_by_slurm) else ""


class ReadFailed(Exception):
    """squeue could not be read (it failed, or did not answer): no job's state is known this time."""


def squeue_states(job_ids: list[str]) -> dict[str, JobState]:
    """States of the jobs SLURM's controller still holds: queued and running ones (squeue, always current).
    Raises ReadFailed when squeue fails: its silence would otherwise say that every job has left the queue."""
    wanted = set(job_ids)
    out: dict[str, JobState] = {}
    done = run_command(["squeue", "-h", "-r", "-o", "%i|%T|%r"])
    if done.returncode != 0:
        raise ReadFailed(failure(done))
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
        shown = run_command(["scontrol", "-o", "show", "job", jid])
        fields = dict(kv.split("=", 1) for kv in shown.stdout.split() if "=" in kv)
        if shown.returncode == 0 and fields.get("JobState"):
            reason = fields.get("Reason", "")
            out[jid] = JobState(fields["JobState"], "" if reason == "None" else reason, fields.get("ExitCode", ""),
                                _clock(fields.get("StartTime", "")), _clock(fields.get("EndTime", "")))
    return out


def _merge(found: dict[str, JobState], later: dict[str, JobState], rest: list[str]) -> None:
    """Add what sacct or scontrol say of the jobs in `rest`: for a job squeue did not list, any state; for one it
    calls COMPLETING, a final state replaces that, except an ending SLURM may requeue (REQUEUED_AFTER): the job
    stays COMPLETING, with that word as its reason, until squeue lists it again (requeued) or no more (ended)."""
    for j, st in later.items():
        if j not in rest:
            continue
        if j not in found:
            found[j] = st
        elif not st.live and st.word not in REQUEUED_AFTER:
            found[j] = st
        elif not st.live and not found[j].reason:
            found[j] = JobState(found[j].state, st.word)


def job_states(job_ids: list[str]) -> tuple[dict[str, JobState], str]:
    """{job id: state} and where the states came from. Queued and running jobs: squeue, which is current (the
    accounting learns of a start or an end a moment later). Jobs that left the queue: sacct, which keeps why a
    job ended; without accounting, scontrol, which remembers ended jobs for a few minutes. A job absent from
    all is left out (just submitted, or just ended and not yet accounted for). A job squeue calls COMPLETING
    has ended and is being cleaned up (after scancel, for seconds): its final state, where the accounting or the
    controller already has it, is the one given, unless SLURM may requeue the job after it (a preemption, a
    failed node): then it stays COMPLETING. Raises ReadFailed when squeue cannot be read."""
    if not job_ids:
        return {}, "squeue and sacct"
    found = squeue_states(job_ids)
    rest = [j for j in job_ids if j not in found or found[j].word == "COMPLETING"]
    if not rest:
        return found, "squeue and sacct"
    accounted = sacct_states(rest)
    if accounted is None:
        _merge(found, scontrol_states(rest), rest)
        return found, "squeue and scontrol (no accounting)"
    _merge(found, accounted, rest)
    return found, "squeue and sacct"
