"""The SLURM driver's reading of job states when SLURM's commands misbehave, without a cluster: `squeue` and
`sacct` are small executables on PATH (the boundary the driver talks to), and the store is a real SQLite file.

A controller that cannot be reached makes squeue fail for minutes; its silence must not be taken for jobs that
left the queue (they would be recorded as crashed and, on --resume, submitted again over the folders the
original jobs still write to). A squeue that hangs is a failed read, not a crash of the driver. A job SLURM
preempts and requeues is followed to its second attempt's end. Inside a job, a run that reaches the job's time
limit is a timeout. Flags that would crash the driver or replace the job planned are refused before anything is
submitted.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import signal
import stat
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from shardbench.errors import ConfigError
from shardbench.store import RunRow, Store
from shardbench.sweep import slurm as slurm_lib
from shardbench.sweep import runner as runner_lib
from shardbench.sweep import slurm_jobs, slurm_options, sweep_cmd
from shardbench.sweep.grid import Sweep, make_sweep
from shardbench.sweep.runner import Options, run_sweep
from shardbench.sweep.slurm_options import SlurmOptions
from shardbench.sweep.sweep_cmd import plan_meta

JOBS = ("41_0", "41_1")
UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: Path, fails: int) -> Path:
    """squeue fails (the controller unreachable) for its first `fails` calls, then lists no job: both jobs have
    ended, each leaving the outcome file of a run whose processes could not join (exit 5). sacct fails while
    squeue does (the database unreachable too: nothing says the jobs still run, so only the driver's refusal to
    take squeue's failure for an empty queue keeps them followed), and says FAILED once they ended; scontrol
    always fails. sbatch notes that it was called (`sbatch-called`) and refuses. Returns the folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "squeue-calls"
    calls.write_text("0")
    outcome = {"returncode": 5, "stderr": ["shardbench: error: process 1 could not join the run within 120 s"],
               "started": 1.0, "wall_s": 2.0}
    writes = "".join(
        f"  echo '{json.dumps({**outcome, 'job_id': job})}' > {slurm_lib.outcome_path(out, job)}\n" for job in JOBS)
    _script(bin_dir / "squeue", f"""n=$(cat {calls}); echo $((n + 1)) > {calls}
if [ "$n" -lt {fails} ]; then echo '{UNREACHABLE}' >&2; exit 1; fi
if [ "$n" -eq {fails} ]; then
  mkdir -p {out / 'slurm'}
{writes}fi
""")
    lines = "\n".join(f"{job}|$state|None|$code|2024-01-01T00:00:00|$end" for job in JOBS)
    _script(bin_dir / "sacct", f"""n=$(cat {calls})
if [ "$n" -le {fails} ]; then echo 'sacct: error: Problem talking to the database: Connection refused' >&2; exit 1; fi
state=FAILED; code=5:0; end=2024-01-01T00:01:00
cat <<EOF
{lines}
EOF
""")
    _script(bin_dir / "scontrol", f"echo '{UNREACHABLE}' >&2; exit 1\n")
    _script(bin_dir / "sbatch", f"touch {tmp_path / 'sbatch-called'}; echo 'sbatch: error: not in this test' >&2; exit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def _sweep_store(out: Path) -> tuple[Sweep, Store]:
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8,16"})
    store = Store(out / "sweep.db")
    for key, value in plan_meta(sweep, {}).items():
        store.set_meta(key, value)
    for run, job in zip(sweep.runs, JOBS):
        store.set_job(run.name, job, "RUNNING")
    return sweep, store


def test_a_failing_squeue_leaves_running_jobs_unrecorded_until_it_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue fails for 3 s, three times the grace a job out of the queue gets: no job is recorded meanwhile, and
    once squeue answers each is recorded from its outcome, exit 5 as the `processes` kind (which the store keeps)."""
    out = tmp_path / "s"
    monkeypatch.setattr(slurm_lib, "OUTCOME_GRACE_S", 1.0)  # 60 s in use; shortened to keep the test short
    fake_slurm(tmp_path, monkeypatch, out, fails=30)
    sweep, store = _sweep_store(out)
    said: list[str] = []
    with store:
        slurm_lib._follow(sweep, store, Options(out), SlurmOptions(poll_s=0.1), dict(zip(
            (r.name for r in sweep.runs), JOBS)), said.append)
        rows = {r.name: r for r in store.runs()}
        jobs = store.jobs()
    assert [(r.status, r.error_kind, r.error) for r in rows.values()] == [
        ("failed", "processes", "shardbench: error: process 1 could not join the run within 120 s")] * 2
    assert {j.state for j in jobs.values()} == {"FAILED"}
    warnings = [line for line in said if "warning" in line]
    assert warnings == [(f"sweep: warning: squeue failed ({UNREACHABLE}); the jobs' states are unknown until it "
                         f"answers, trying again every 0.1 s")]
    assert "sweep: squeue answers again" in said


def test_a_resume_while_squeue_fails_submits_nothing_again_and_keeps_the_run_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs of an earlier driver are followed, not recorded as crashed and submitted again: the folders they
    write to stay. squeue never answers; the user stops the driver (Ctrl-C) after twice the grace a job out of
    the queue gets. The sbatch on PATH only notes that it was called, and refuses."""
    out = tmp_path / "s"
    monkeypatch.setattr(slurm_lib, "OUTCOME_GRACE_S", 0.5)  # 60 s in use
    fake_slurm(tmp_path, monkeypatch, out, fails=1000)
    sweep, store = _sweep_store(out)
    for run in sweep.runs:
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "config.json").write_text("{}")  # what the running job wrote so far
    began = time.monotonic()

    def sleep(seconds: float) -> None:  # the driver's waits between reads; Ctrl-C after 1 s
        if time.monotonic() - began > 1.0:
            raise KeyboardInterrupt
        time.sleep(seconds)

    monkeypatch.setattr(slurm_lib, "time", SimpleNamespace(time=time.time, sleep=sleep))
    said: list[str] = []
    with store:
        code = slurm_lib.run_slurm_sweep(sweep, store, Options(out), SlurmOptions(poll_s=0.1), out=said.append)
        rows = store.runs()
        jobs = store.jobs()
    assert code == 130 and rows == [], said
    assert {(j.job_id, j.state) for j in jobs.values()} == {(JOBS[0], "RUNNING"), (JOBS[1], "RUNNING")}
    assert all((out / "runs" / r.name / "config.json").exists() for r in sweep.runs)
    assert not (tmp_path / "sbatch-called").exists(), said


def test_a_squeue_that_does_not_answer_is_a_failed_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "squeue", "exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_jobs, "COMMAND_TIMEOUT_S", 0.5)  # 120 s in use
    with pytest.raises(slurm_jobs.ReadFailed, match=r"^squeue failed \(squeue did not answer within 0.5 s\)$"):
        slurm_jobs.job_states(["41_0"])


def test_an_ended_jobs_last_reason_for_waiting_is_not_its_story(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sacct keeps an array element's last reason for waiting after it ends: --status showed
    "COMPLETED (JobArrayTaskLimit)". A reason is kept where it says why SLURM ended the job, or why it waits."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "sacct", "echo '7_0|COMPLETED|JobArrayTaskLimit|0:0|2024-01-01T00:00:00|2024-01-01T00:05:00'\n"
                               "echo '7_1|CANCELLED by 0|JobArrayTaskLimit|0:0|2024-01-01T00:00:00|None'\n"
                               "echo '7_2|NODE_FAIL|NodeDown|0:9|2024-01-01T00:00:00|2024-01-01T00:05:00'\n"
                               "echo '7_3|PENDING|JobArrayTaskLimit|0:0|None|None'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    states = slurm_jobs.sacct_states(["7_0", "7_1", "7_2", "7_3"])
    assert {j: (s.word, s.reason) for j, s in states.items()} == {
        "7_0": ("COMPLETED", ""), "7_1": ("CANCELLED", ""), "7_2": ("NODE_FAIL", "NodeDown"),
        "7_3": ("PENDING", "JobArrayTaskLimit")}


def test_sacct_running_counts_for_a_job_squeue_does_not_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sacct's live states are taken where squeue is silent on a job, never over squeue's own word."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "squeue", "echo '41_1|COMPLETING|None'\n")
    _script(bin_dir / "sacct", "echo '41_0|RUNNING|None|0:0|2024-01-01T00:00:00|Unknown'\n"
                               "echo '41_1|RUNNING|None|0:0|2024-01-01T00:00:00|Unknown'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    states, source = slurm_jobs.job_states(list(JOBS))
    assert {j: s.state for j, s in states.items()} == {"41_0": "RUNNING", "41_1": "COMPLETING"}
    assert source == "squeue and sacct"


def test_status_while_squeue_fails_shows_the_recorded_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "s"
    fake_slurm(tmp_path, monkeypatch, out, fails=1000)
    sweep, store = _sweep_store(out)
    with store:
        lines = slurm_lib.status_lines(store, sweep)
    assert lines[0] == (f"2 run(s): 2 RUNNING; states of jobs not yet ended from the store, as last recorded: "
                        f"squeue failed ({UNREACHABLE})")
    assert [line.split()[1:3] for line in lines[1:]] == [["41_0", "RUNNING"], ["41_1", "RUNNING"]]


# ------------------------------------------------------------------------------------ preemption and requeue
# What squeue and sacct say at each read of a job SLURM preempts (or whose node fails) and requeues under the same
# id: squeue's line (None: not listed) and sacct's state. The last read: the second attempt has ended, leaving its
# outcome and its run's summary.
REQUEUES = {
    "preempted": [("COMPLETING", "PREEMPTED"), ("PENDING", "PREEMPTED"), ("RUNNING", "RUNNING"),
                  (None, "COMPLETED")],
    "node failed, one read out of the queue": [(None, "NODE_FAIL"), ("PENDING", "PENDING"), ("RUNNING", "RUNNING"),
                                              (None, "COMPLETED")],
}


def fake_requeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: Path, run: str,
                 reads: list[tuple[str | None, str]]) -> None:
    """squeue and sacct answer `reads` in turn (the last one from then on); sbatch notes that it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "squeue-calls"
    calls.write_text("0")
    outcome = json.dumps({"job_id": "41_0", "returncode": 0, "stderr": [], "started": 1.0, "wall_s": 2.0})
    last = len(reads) - 1
    squeue = "".join(f"  {i}) echo '41_0|{word}|None' ;;\n" for i, (word, _) in enumerate(reads) if word)
    _script(bin_dir / "squeue", f"""n=$(cat {calls}); echo $((n + 1)) > {calls}
if [ "$n" -ge {last} ]; then n={last}; fi
if [ "$n" -eq {last} ]; then
  mkdir -p {out / 'slurm'} {out / 'runs' / run}
  echo '{outcome}' > {slurm_lib.outcome_path(out, '41_0')}
  echo '{{"steps": 4}}' > {out / 'runs' / run / 'summary.json'}
fi
case $n in
{squeue}esac
""")
    sacct = "".join(f"  {i}) state={word} ;;\n" for i, (_, word) in enumerate(reads))
    _script(bin_dir / "sacct", f"""n=$(($(cat {calls}) - 1)); if [ "$n" -gt {last} ]; then n={last}; fi
case $n in
{sacct}esac
echo "41_0|$state|None|0:0|2024-01-01T00:00:00|2024-01-01T00:05:00"
""")
    _script(bin_dir / "sbatch", f"touch {tmp_path / 'sbatch-called'}; echo 'sbatch: error: not in this test' >&2; exit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("case", list(REQUEUES))
def test_a_requeued_job_is_followed_to_its_end_not_recorded_as_killed_and_submitted_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """A resume whose first read falls while SLURM ends the preempted job (or, its node failed, no longer lists
    it for a moment) follows the job, requeued, to its second attempt's end: one complete row, nothing submitted."""
    out = tmp_path / "s"
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8"})
    (run,) = sweep.runs
    fake_requeue(tmp_path, monkeypatch, out, run.name, REQUEUES[case])
    said: list[str] = []
    with Store(out / "sweep.db") as store:
        for key, value in plan_meta(sweep, {}).items():
            store.set_meta(key, value)
        store.set_job(run.name, "41_0", "RUNNING")  # as the first driver last saw it
        code = slurm_lib.run_slurm_sweep(sweep, store, Options(out), SlurmOptions(poll_s=0.05), out=said.append)
        rows = [(r.name, r.status) for r in store.runs()]
        job = store.jobs()[run.name]
    assert code == 0 and rows == [(run.name, "complete")], said
    assert (job.job_id, job.state) == ("41_0", "COMPLETED")
    assert not (tmp_path / "sbatch-called").exists(), said
    assert [line for line in said if "[job 41_0]" in line] == [line for line in said if line.startswith("[1/1]")]
    assert len([line for line in said if line.startswith("[1/1]")]) == 1, said


@pytest.mark.parametrize("squeue, sacct, state", [
    ("COMPLETING", "PREEMPTED", "COMPLETING"), ("COMPLETING", "NODE_FAIL", "COMPLETING"),
    ("COMPLETING", "CANCELLED by 0", "CANCELLED by 0"), ("SPECIAL_EXIT", "SPECIAL_EXIT", "SPECIAL_EXIT")])
def test_a_job_squeue_lists_stays_live_while_slurm_may_requeue_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squeue: str, sacct: str, state: str) -> None:
    """COMPLETING after a preemption or a node failure is not the end where SLURM requeues; after scancel it is."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "squeue", f"echo '41_0|{squeue}|None'\n")
    _script(bin_dir / "sacct", f"echo '41_0|{sacct}|None|0:0|2024-01-01T00:00:00|2024-01-01T00:01:00'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    found = slurm_jobs.job_states(["41_0"])[0]["41_0"]
    assert (found.state, found.live) == (state, state != "CANCELLED by 0")


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the run is `sh` or `sleep`, not JAX
def test_a_requeued_jobs_task_starts_without_its_first_attempts_outcome(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt, preempted, left 'killed by SIGTERM' (-15); the second's run must not be read as that
    (while it runs, or if it dies without writing its own). The run checks that the file is gone as it starts."""
    monkeypatch.setenv("SLURM_JOB_ID", "88")
    monkeypatch.setenv("SLURM_PROCID", "0")
    path = slurm_lib.outcome_path(tmp_path, "88")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"job_id": "88", "returncode": -15, "stderr": [], "started": 1.0, "wall_s": 2.0}))
    result = slurm_lib.run_task(slurm_lib.TaskSpec("base", ["sh", "-c", f"test ! -e {path}"], str(tmp_path), 60.0))
    assert result["returncode"] == 0
    assert json.loads(path.read_text())["returncode"] == 0


def test_a_preempted_job_slurm_does_not_requeue_is_recorded_as_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PreemptMode=CANCEL: squeue lists the job COMPLETING, then no more; at the second read without it, killed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "squeue-calls"
    calls.write_text("0")
    _script(bin_dir / "squeue", f"n=$(cat {calls}); echo $((n + 1)) > {calls}; "
                                f"if [ \"$n\" -eq 0 ]; then echo '41_0|COMPLETING|None'; fi\n")
    _script(bin_dir / "sacct", "echo '41_0|PREEMPTED|None|0:15|2024-01-01T00:00:00|2024-01-01T00:05:00'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "s"
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8"})
    (run,) = sweep.runs
    with Store(out / "sweep.db") as store:
        slurm_lib._follow(sweep, store, Options(out), SlurmOptions(poll_s=0.05), {run.name: "41_0"}, lambda _: None)
        rows = [(r.status, r.error_kind, r.error) for r in store.runs()]
    assert rows == [("failed", "killed", "SLURM job 41_0 PREEMPTED")]
    assert calls.read_text().strip() == "3"  # COMPLETING, out of the queue, out of the queue again: recorded


# ------------------------------------------------------------------------------------------ the time limit
def test_the_runs_own_time_limit_ends_before_the_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--slurm-time 30 with --timeout 1800: the run stops itself 180 s before the job's limit, ahead of the
    signal submitit has SLURM send 90 s before it (up to 60 s sooner). The submitted task carries that limit."""
    pytest.importorskip("submitit")
    opts = Options(tmp_path / "s", timeout_s=1800.0)
    assert slurm_options.run_timeout_s(SlurmOptions(time_min=30), opts) == 30 * 60 - 180
    assert slurm_options.run_timeout_s(SlurmOptions(time_min=60), opts) == 1800  # --timeout comes first
    assert slurm_options.run_timeout_s(SlurmOptions(), opts) == 1800  # the job's limit is --timeout + 10 min
    assert slurm_options.run_timeout_s(SlurmOptions(time_min=2), opts) == 1800  # too short: run_task's catch
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "sbatch", "echo 'Submitted batch job 43'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8"})
    slurm = SlurmOptions(time_min=30)
    with Store(opts.sweep_dir / "sweep.db") as store:
        assert slurm_lib.submit(sweep, sweep.runs, opts, slurm, slurm_options.check_shapes(sweep, opts, slurm),
                                store) == {sweep.runs[0].name: "43"}
    with open(opts.sweep_dir / "slurm" / "43_submitted.pkl", "rb") as f:
        (spec,) = pickle.load(f).args
    assert (spec.timeout_s, spec.time_limit_min) == (1620, 30)
    slurm_lib.outcome_path(opts.sweep_dir, "43").write_text(json.dumps(
        {"job_id": "43", "returncode": None, "stderr": [], "started": 1.0, "wall_s": 1620.0, "timeout_s": 1620.0}))
    row = slurm_lib.row_for(sweep, sweep.runs[0], opts, "43", slurm_jobs.JobState("COMPLETED", "", "0:0"))
    assert (row.error_kind, row.error) == ("timeout", "no result within the 1620 s time limit: stopped (the job's "
                                                      "time limit less 180 s, which comes before --timeout 1800)")


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the run is `sh` or `sleep`, not JAX
def test_a_run_submitit_stops_at_slurms_signal_is_a_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit's own handler of USR2 (SLURM's signal 90 s before the job's limit) raises in run_task's wait: the
    run is stopped, its outcome says timeout, and the exception goes on to submitit, which ends the job FAILED."""
    pytest.importorskip("submitit")
    from submitit.core import job_environment, utils

    class Env:  # rank 0 of the job, as SlurmJobEnvironment would say
        global_rank = 0

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_PROCID", "0")
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8"})
    (run,) = sweep.runs
    spec = slurm_lib.TaskSpec(run.name, ["sleep", "30"], str(tmp_path), 1800.0, time_limit_min=5)
    delayed = utils.DelayedSubmission(slurm_lib.run_task, spec)
    delayed.set_timeout(5, 0)  # --time=5, max_num_timeout=0, as _executor submits it
    handler = job_environment.SignalHandler(Env(), None, delayed)  # type: ignore[arg-type]
    before = signal.signal(signal.SIGUSR2, handler.checkpoint_and_try_requeue)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR2))
    try:
        timer.start()
        with pytest.raises(utils.UncompletedJobError):
            slurm_lib.run_task(spec)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR2, before)
    saved = json.loads(slurm_lib.outcome_path(tmp_path, "77").read_text())
    assert saved["returncode"] is None and saved["wall_s"] < 10
    row = slurm_lib.row_for(sweep, run, Options(tmp_path), "77", slurm_jobs.JobState("FAILED", "", "1:0"))
    assert (row.status, row.error_kind, row.error) == (
        "failed", "timeout", "no result within the job's 5-minute SLURM time limit: stopped at SLURM's signal, 90 s "
                             "before it")


# ------------------------------------------------------------------------------------------------- bad input
def _sweep_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shardbench")
    sweep_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["sweep", "--preset", "mlp-small", "--batch-size", "8,16", *argv])


def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch that takes every job (--test-only too), noting each call in the file returned; squeue lists none,
    sacct and scontrol know none (a sweep that submits is over in a second: its jobs are recorded as crashed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch-calls"
    _script(bin_dir / "sbatch", f"""echo "$@" >> {calls}
case "$*" in *--test-only*) echo 'sbatch: Job 50 to start at 2024-01-01T00:00:00' >&2 ;; *) echo 'Submitted batch job 50' ;; esac
""")
    _script(bin_dir / "squeue", "true\n")
    _script(bin_dir / "scancel", "true\n")
    _script(bin_dir / "sacct", "exit 1\n")
    _script(bin_dir / "scontrol", "exit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_lib, "OUTCOME_GRACE_S", 0.5)
    return calls


@pytest.mark.parametrize("flag, value", [("--slurm-poll", "nan"), ("--slurm-poll", "inf"), ("--slurm-poll", "1e10"),
                                         ("--timeout", "nan"), ("--timeout", "inf")])
def test_a_poll_or_timeout_that_is_no_number_of_seconds_is_refused_before_anything_is_submitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str,
        value: str) -> None:
    """Accepted, they crashed the driver after its jobs were submitted (time.sleep(nan)) or in the job's time
    limit (ceil(inf / 60)), the bad value stored in the sweep's meta."""
    pytest.importorskip("submitit")
    calls = fake_sbatch(tmp_path, monkeypatch)
    out = tmp_path / "s"
    code = sweep_cmd.run(_sweep_args("--executor", "slurm", flag, value, "--no-report", "--out", str(out)))
    err = capsys.readouterr().err
    assert code == 2 and f"{flag} must be" in err and len(err.strip().splitlines()) == 1, err
    assert not calls.exists() and not out.exists()


@pytest.mark.parametrize("item, own, flag", [
    ("nodes=3", "nodes", "--slurm-nodes"), ("--ntasks-per-node=4", "ntasks-per-node", "from the plan"),
    ("ntasks_per_node=4", "ntasks-per-node", "from the plan"), ("ntasks=8", "ntasks", "from the plan"),
    ("tasks-per-node=2", "tasks-per-node", "from the plan"), ("gpus-per-node=4", "gpus-per-node",
                                                              "--slurm-gpus-per-node"),
    ("gpus=8", "gpus", "--slurm-gpus-per-node"), ("time=10", "time", "--slurm-time"),
    ("part=gpu", "partition", "--slurm-partition"), ("account=a", "account", "--slurm-account"),
    ("qos=high", "qos", "--slurm-qos"), ("array=0-9", "array", "--slurm-max-running"),
    ("job-name=x", "job-name", "names each job"), ("output=/tmp/x", "output", "<out>/slurm/"),
    ("error=/tmp/x", "error", "<out>/slurm/"), ("open-mode=truncate", "open-mode", "<out>/slurm/"),
    ("signal=USR1@60", "signal", "submitit sets it")])
def test_an_sbatch_option_the_executor_sets_itself_is_refused(item: str, own: str, flag: str) -> None:
    """submitit writes --slurm-option's after its own settings: 'nodes=3' made every job 3 nodes, whatever the
    plan, and sbatch --test-only checked the overridden job."""
    with pytest.raises(ConfigError, match=rf"^--slurm-option '{item}' would replace sbatch --{own} of the job "
                                          rf"shardbench plans: .*{re.escape(flag)}"):
        slurm_options.check_options(SlurmOptions(sbatch=("mem=64G", item)))
    assert slurm_options.parse_sbatch(["mem=64G", "exclusive", "constraint=a100", "wckey=proj", "time-min=30",
                                       "gres=gpu:1", "hold"]) == {
        "mem": "64G", "exclusive": True, "constraint": "a100", "wckey": "proj", "time_min": "30", "gres": "gpu:1",
        "hold": True}


def test_a_job_that_ends_as_a_resumes_first_pass_ends_keeps_its_own_grace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume's first pass ends at the grace (0.3 s here, on a clock that moves a tenth of a second at every
    reading): a job squeue listed COMPLETING until then (SLURM cleaning up), which the accounting now calls
    COMPLETED while its outcome file has not come through the shared filesystem yet, stays followed for its own
    grace; recorded then without its outcome, it would count as failed and be submitted again."""
    out = tmp_path / "s"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "squeue-calls"
    calls.write_text("0")
    _script(bin_dir / "squeue", f"""n=$(cat {calls}); echo $((n + 1)) > {calls}
if [ "$n" -lt 2 ]; then echo '{JOBS[0]}|COMPLETING|None'; fi
""")
    _script(bin_dir / "sacct", f"""if [ "$(cat {calls})" -ge 3 ]; then
  echo '{JOBS[0]}|COMPLETED|None|0:0|2024-01-01T00:00:00|2024-01-01T00:05:00'; fi
""")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_lib, "OUTCOME_GRACE_S", 0.3)
    clock = iter(time.time() + 0.1 * i for i in range(10**6))
    monkeypatch.setattr(slurm_lib, "time", SimpleNamespace(time=lambda: next(clock), sleep=lambda seconds: None))
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8,16"})
    pending = {sweep.runs[0].name: JOBS[0]}
    with Store(out / "sweep.db") as store:
        slurm_lib._follow(sweep, store, Options(out), SlurmOptions(poll_s=0.05), pending, lambda _: None, once=True)
        assert store.runs() == [] and pending == {sweep.runs[0].name: JOBS[0]}
    assert int(calls.read_text()) == 3  # it ended at the third read, the pass's last


def test_an_sbatch_option_that_begins_several_of_the_executors_is_refused_naming_them_all() -> None:
    """'t=3' was refused as sbatch --tasks-per-node (the first of shardbench's own options it begins), though a
    reader of sbatch's short options means --time by it."""
    with pytest.raises(ConfigError) as err:
        slurm_options.check_options(SlurmOptions(sbatch=("t=3",)))
    assert str(err.value) == (
        "--slurm-option 't=3' names no one sbatch option: it begins --tasks-per-node, --time, which shardbench sets "
        "itself; write an option's whole name (sbatch's own one-letter options are not taken)")


def test_a_sweep_with_an_sbatch_option_the_executor_sets_is_refused_before_anything_is_submitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("submitit")
    calls = fake_sbatch(tmp_path, monkeypatch)
    out = tmp_path / "s"
    code = sweep_cmd.run(_sweep_args("--executor", "slurm", "--slurm-option", "ntasks-per-node=4", "--no-report",
                                     "--out", str(out)))
    err = capsys.readouterr().err
    assert code == 2 and "--slurm-option 'ntasks-per-node=4' would replace" in err, err
    assert len(err.strip().splitlines()) == 1 and not calls.exists() and not out.exists()


def test_cancel_and_a_local_resume_read_slurms_states_not_the_stores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No driver ran since the store recorded both jobs RUNNING: 41_0 has since been cancelled, 41_1 runs. --cancel
    scancels 41_1 alone (it said both, and again at every call); a local resume is refused naming 41_1 only, and
    allowed once SLURM holds neither; it then runs again the run whose job did not complete, as a SLURM resume
    would (it called it recorded), and leaves the completed one."""
    out = tmp_path / "s"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    queue = tmp_path / "queue"
    queue.write_text("41_1|RUNNING|None\n")
    _script(bin_dir / "squeue", f"cat {queue}\n")
    _script(bin_dir / "sacct", "echo '41_0|CANCELLED by 0|None|0:0|2024-01-01T00:00:00|2024-01-01T00:05:00'\n")
    _script(bin_dir / "scancel", f'echo "$@" >> {tmp_path / "scancelled"}\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sweep, store = _sweep_store(out)
    with store:
        assert slurm_lib.cancel(store, [r.name for r in sweep.runs]) == ["41_1"]
    assert (tmp_path / "scancelled").read_text().split() == ["41_1"]
    with pytest.raises(ConfigError, match=r"has SLURM job\(s\) 41_1 still queued or running"):
        slurm_lib.check_no_live_jobs(out)
    queue.write_text("")  # 41_1 ended too
    _script(bin_dir / "sacct", "echo '41_0|CANCELLED by 0|None|0:0|2024-01-01T00:00:00|2024-01-01T00:05:00'\n"
                               "echo '41_1|COMPLETED|None|0:0|2024-01-01T00:00:00|2024-01-01T00:05:00'\n")
    slurm_lib.check_no_live_jobs(out)  # nothing live: a local resume may run
    first, second = sweep.runs
    with Store(out / "sweep.db") as store:
        store.add(RunRow(first.name, "failed", "killed", "cancelled", first.overrides, {}, None, 1.0, 2.0,
                                   1.0))
        store.add(RunRow(second.name, "complete", None, None, second.overrides, {}, {}, 1.0, 2.0, 1.0))
        said: list[str] = []


        # Every run to do is refused here, so nothing trains: the row shows which runs the resume took up.
        run_sweep(sweep, store, Options(out), said.append, refused={r.name: "(this test)" for r in sweep.runs})
        rows = {r.name: r for r in store.runs()}
    assert said[0] == "resuming: 1 of 2 runs already recorded"
    assert rows[first.name].error == "refused before running: (this test)"  # taken up again
    assert rows[second.name].status == "complete"
    # The run recorded here has no SLURM job any more: --status credited the job that did not complete with it.
    with Store(out / "sweep.db") as store:
        assert set(store.jobs()) == {second.name}
        assert "LOCAL (failed)" in slurm_lib.status_lines(store, sweep)[1]


def test_a_job_slurm_keeps_no_record_of_has_ended_and_is_submitted_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURM 22.05 keeps no trace of a queued element of a job array cancelled with scancel: squeue, sacct and
    scontrol all answer without it. Such a job, submitted an hour ago, was counted live by --status, --cancel and
    a local resume (refused forever), and a SLURM resume waited out two graces, recorded it as a crash and did not
    submit it again. It has ended: --status says LOST, --cancel scancels nothing, a local resume may run, and a
    SLURM resume records it as killed and submits it again (the sbatch here notes that it was called, and refuses).
    A job submitted a moment ago that squeue does not list yet is still live."""
    out = tmp_path / "s"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("squeue", "sacct", "scontrol"):
        _script(bin_dir / command, "true\n")  # known to none
    _script(bin_dir / "scancel", f'echo "$@" >> {tmp_path / "scancelled"}\n')
    _script(bin_dir / "sbatch", f"touch {tmp_path / 'sbatch-called'}; echo 'sbatch: error: not in this test' >&2; "
                                f"exit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_lib, "OUTCOME_GRACE_S", 0.3)  # 60 s in use
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8,16"})
    first, second = sweep.runs
    with Store(out / "sweep.db") as store:
        for key, value in plan_meta(sweep, {}).items():
            store.set_meta(key, value)
        store.set_job(first.name, JOBS[0], "PENDING", "JobArrayTaskLimit", submitted=time.time() - 3600)
        store.add(RunRow(second.name, "complete", None, None, second.overrides, {}, {}, 1.0, 2.0, 1.0))
        lines = slurm_lib.status_lines(store, sweep)
        assert lines[1].split()[1:3] == [JOBS[0], "LOST"], lines
        assert slurm_lib.cancel(store, [first.name]) == []
    assert not (tmp_path / "scancelled").exists()
    slurm_lib.check_no_live_jobs(out)  # nothing live: a local resume may run
    with Store(out / "sweep.db") as store:
        store.set_job(first.name, JOBS[0], "PENDING", submitted=time.time())  # just submitted: not listed yet
    with pytest.raises(ConfigError, match=r"has SLURM job\(s\) 41_0 still queued or running"):
        slurm_lib.check_no_live_jobs(out)
    # The driver's clock: a tenth of a second at every reading, no sleeping. A resume's first pass ends at the grace
    # (0.3 s); it had read the clock apart from the job's own wait, and returned one reading before that wait
    # ended, leaving the job followed rather than recorded and submitted again.
    clock = iter(time.time() + 0.1 * i for i in range(10**6))
    monkeypatch.setattr(slurm_lib, "time", SimpleNamespace(time=lambda: next(clock), sleep=lambda seconds: None))
    said: list[str] = []
    with Store(out / "sweep.db") as store:
        store.set_job(first.name, JOBS[0], "PENDING", submitted=time.time() - 3600)
        with pytest.raises(ConfigError, match="sbatch refused the jobs"):
            slurm_lib.run_slurm_sweep(sweep, store, Options(out), SlurmOptions(poll_s=0.05), out=said.append)
        row = {r.name: r for r in store.runs()}[first.name]
    assert (row.status, row.error_kind) == ("failed", "killed") and f"SLURM job {JOBS[0]} LOST" in row.error, row
    # said as what the resume found, not as progress: it printed "[1/2]", then counted the run again when its
    # new job ended
    assert said[0].startswith(f"resuming: SLURM job {JOBS[0]} of {first.name} ended: FAILED (killed): "), said
    assert not any(line.startswith("[") for line in said), said
    assert (tmp_path / "sbatch-called").exists()  # submitted again, by the same resume


def test_sbatchs_refusal_of_an_option_names_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch's getopt names an option it does not know, then adds its "Try sbatch --help" hint: the refusal
    quotes the first line, not the hint."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "sbatch", "echo \"sbatch: unrecognized option '--foo=bar'\" >&2\n"
                                "echo 'Try \"sbatch --help\" for more information' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ConfigError, match=r"1 task\(s\): sbatch: unrecognized option '--foo=bar'$"):
        slurm_options.check_submittable({"run": slurm_options.Shape(1, 1, 0, 0)}, Options(tmp_path),
                                        SlurmOptions(sbatch=("comment=x",)))


def test_sbatchs_refusal_of_a_partition_names_the_option_and_the_partitions_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'Invalid partition name specified' named neither --slurm-partition nor what would be right: sinfo lists the
    partitions (the default one starred)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "sbatch", "echo 'sbatch: error: Batch job submission failed: Invalid partition name "
                                "specified' >&2\nexit 1\n")
    _script(bin_dir / "sinfo", "printf 'debug*\\ngpu\\ndebug*\\n'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ConfigError) as err:
        slurm_options.check_submittable({"run": slurm_options.Shape(1, 1, 0, 0)}, Options(tmp_path),
                                        SlurmOptions(partition="gpux"))
    assert str(err.value).endswith(": sbatch: error: Batch job submission failed: Invalid partition name specified "
                                   "(--slurm-partition gpux; partitions here: debug, gpu)"), str(err.value)


def test_a_slurm_conf_that_is_no_file_is_said_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch, read without its configuration, said "ClusterName needs to be specified", which the sweep reported
    as a job SLURM would not take."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("sbatch", "squeue", "scancel"):
        _script(bin_dir / command, "true\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nonexistent.conf"))
    with pytest.raises(ConfigError, match=rf"SLURM_CONF={re.escape(str(tmp_path))}/nonexistent.conf is no file"):
        slurm_options.check_available()
    (tmp_path / "nonexistent.conf").write_text("ClusterName=here\n")
    slurm_options.check_available()


def test_status_names_a_run_that_ran_here_apart_from_slurms_states(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local sweep resumed on SLURM: its first run ran here, with no job. --status counted it as COMPLETE beside
    SLURM's COMPLETED, two words for one state; it is LOCAL."""
    out = tmp_path / "s"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "squeue", "true\n")
    _script(bin_dir / "sacct", "echo '41_1|COMPLETED|None|0:0|2024-01-01T00:00:00|2024-01-01T00:05:00'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    lines, _ = _status_of_two_runs_the_first_local(out, job="41_1")
    assert lines[0].startswith("2 run(s): 1 LOCAL, 1 COMPLETED"), lines[0]
    assert "LOCAL (complete)" in lines[1]


def test_the_progress_line_counts_a_run_recorded_while_another_job_waits_for_its_outcome(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs followed to their end: 41_1 FAILED (the accounting says so at once, its end long ago), 41_0 known to
    none until the grace is over (then LOST). Each run counts once, in the order they are recorded: [1/2], then
    [2/2]. 41_1 was counted [0/2]: the wait of 41_0 had taken the place of the driver's own start."""
    out = tmp_path / "s"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "squeue", "true\n")
    _script(bin_dir / "sacct", f"echo '{JOBS[1]}|FAILED|None|1:0|2024-01-01T00:00:00|2024-01-01T00:05:00'\n")
    _script(bin_dir / "scontrol", "true\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_lib, "OUTCOME_GRACE_S", 0.3)
    clock = iter(time.time() + 0.1 * i for i in range(10**6))
    monkeypatch.setattr(slurm_lib, "time", SimpleNamespace(time=lambda: next(clock), sleep=lambda seconds: None))
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8,16"})
    first, second = sweep.runs
    said: list[str] = []
    with Store(out / "sweep.db") as store:
        slurm_lib._follow(sweep, store, Options(out), SlurmOptions(poll_s=0.05),
                          {first.name: JOBS[0], second.name: JOBS[1]}, said.append)
        assert {r.name: r.status for r in store.runs()} == {first.name: "failed", second.name: "failed"}
    assert [line.split("  ")[0] for line in said] == [f"[1/2] {second.name}", f"[2/2] {first.name}"], said


def test_a_resubmitted_run_counts_once_and_a_run_recorded_now_counts_in_the_overhead(tmp_path: Path) -> None:
    """A resume submits again a run an earlier attempt recorded as failed: the progress line counts it when its new
    job ends, not before (it printed [3/3] twice); and the overhead line counts the runs this driver recorded,
    though their jobs started before it ("no run was recorded" after recording two)."""
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8,16"})
    first, second = sweep.runs
    by_name = {r.name: r for r in sweep.runs}
    with Store(tmp_path / "sweep.db") as store:
        store.add(RunRow(first.name, "complete", None, None, first.overrides, {}, {}, 1.0, 2.0, 1.0))
        store.add(RunRow(second.name, "failed", "killed", "x", second.overrides, {}, None, 1.0, 2.0, 1.0))
        assert slurm_lib._done(store, by_name, since=10.0) == 1  # the failed one is being submitted again
        store.add(RunRow(second.name, "complete", None, None, second.overrides, {}, {}, 5.0, 20.0, 15.0))
        assert slurm_lib._done(store, by_name, since=10.0) == 2
        timing = sweep_cmd.overhead(store, started=10.0, wall_s=30.0)
    assert timing["runs"] == 1 and timing["runs_wall_s"] == 15.0  # begun at 5 by an earlier driver's job
    # A run recorded with no process time (a job SLURM cancelled before it started) is a run recorded all the same
    line = sweep_cmd.overhead_line({"wall_s": 30.0, "runs": 1, "runs_wall_s": 0.0, "ratio": None})
    assert line == "sweep: 30.0 s, 1 run(s) recorded, none of whose processes ran for a measurable time"


def test_a_timeout_names_the_limit_its_task_ran_under_not_todays_timeout(tmp_path: Path) -> None:
    """A job submitted with --timeout 25 (its own limit 35 minutes) timed out; the driver that records it was
    resumed with --timeout 1800. The run stopped at its 25 s: not at "the job's time limit less 180 s" (what
    comparing 25 s with today's 1800 said). A task stopped by its job's limit says so."""
    log = tmp_path / "run.log"
    log.write_text("")
    stopped = runner_lib.Outcome(None, [], 1.0, 25.0)
    resumed = Options(tmp_path, timeout_s=1800.0)
    kind, said = slurm_lib._own_ending(stopped, {"timeout_s": 25.0, "job_limit_s": 35 * 60.0}, log, resumed)
    assert kind == "timeout" and said == "no result within the 25 s time limit: stopped", said
    kind, said = slurm_lib._own_ending(stopped, {"timeout_s": 35 * 60.0 - 180, "job_limit_s": 35 * 60.0}, log,
                                       resumed)
    assert said.endswith("(the job's 35-minute time limit less 180 s, which came before the run's --timeout)")


def test_a_local_sweeps_unrecorded_run_is_not_called_unsubmitted(tmp_path: Path) -> None:
    """`--status` of a local sweep stopped during its second run called that run UNSUBMITTED, SLURM's word for a
    job never sent; a sweep with no jobs says it was not recorded (UNRECORDED)."""
    lines, second = _status_of_two_runs_the_first_local(tmp_path)
    assert lines[0].startswith("2 run(s): 1 LOCAL, 1 UNRECORDED"), lines[0]
    assert any(line.split()[:3] == [second, "-", "UNRECORDED"] for line in lines[1:]), lines


def _status_of_two_runs_the_first_local(out: Path, job: str | None = None) -> tuple[list[str], str]:
    """`--status` lines of a two-run sweep whose first run was recorded here, with no job, and whose second has
    SLURM job `job` running (None: none); and the second run's name."""
    sweep = make_sweep("mlp-small", values={"train.batch_size": "8,16"})
    first, second = sweep.runs
    with Store(out / "sweep.db") as store:
        for key, value in plan_meta(sweep, {}).items():
            store.set_meta(key, value)
        store.add(RunRow(first.name, "complete", None, None, first.overrides, {}, {}, 1.0, 2.0, 1.0))
        if job is not None:
            store.set_job(second.name, job, "RUNNING")
        return slurm_lib.status_lines(store, sweep), second.name
