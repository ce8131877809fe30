"""The SLURM driver's reading of job states when SLURM's commands misbehave, without a cluster: `squeue` and
`sacct` are small executables on PATH (the boundary the driver talks to), and the store is a real SQLite file.

A controller that cannot be reached makes squeue fail for minutes; its silence must not be taken for jobs that
left the queue (they would be recorded as crashed and, on --resume, submitted again over the folders the
original jobs still write to). A squeue that hangs is a failed read, not a crash of the driver.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from shardbench.store import Store
from shardbench.sweep import slurm as slurm_lib
from shardbench.sweep import slurm_jobs
from shardbench.sweep.grid import Sweep, make_sweep
from shardbench.sweep.runner import Options
from shardbench.sweep.slurm_options import SlurmOptions
from shardbench.sweep.sweep_cmd import plan_meta

JOBS = ("41_0", "41_1")
UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: Path, fails: int) -> Path:
    """squeue fails (the controller unreachable) for its first `fails` calls, then lists no job: both jobs have
    ended, each leaving the outcome file of a run whose processes could not join (exit 5). sacct says RUNNING
    while squeue fails (the accounting holds the jobs as running), FAILED once they ended. sbatch notes that it
    was called (`sbatch-called`) and refuses. Returns the folder."""
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
if [ "$n" -le {fails} ]; then state=RUNNING; code=0:0; end=Unknown; else state=FAILED; code=5:0; end=2024-01-01T00:01:00; fi
cat <<EOF
{lines}
EOF
""")
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
    write to stay. The sbatch on PATH only notes that it was called, and refuses."""
    out = tmp_path / "s"
    monkeypatch.setattr(slurm_lib, "OUTCOME_GRACE_S", 1.0)
    fake_slurm(tmp_path, monkeypatch, out, fails=30)
    sweep, store = _sweep_store(out)
    for run in sweep.runs:
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "config.json").write_text("{}")  # what the running job wrote so far
    said: list[str] = []
    with store:
        code = slurm_lib.run_slurm_sweep(sweep, store, Options(out), SlurmOptions(poll_s=0.1), out=said.append)
        kinds = [r.error_kind for r in store.runs()]
    assert code == 0 and kinds == ["processes", "processes"]
    assert not any(line.startswith("sweep: submitted") for line in said), said
    assert "resuming: 0 of 2 runs complete, 2 SLURM job(s) still queued or running are followed" in said[1], said
    assert all((out / "runs" / r.name / "config.json").exists() for r in sweep.runs)
    assert not (tmp_path / "sbatch-called").exists()


def test_a_squeue_that_does_not_answer_is_a_failed_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "squeue", "exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_jobs, "COMMAND_TIMEOUT_S", 0.5)  # 120 s in use
    with pytest.raises(slurm_jobs.ReadFailed, match=r"^squeue failed \(squeue did not answer within 0.5 s\)$"):
        slurm_jobs.job_states(["41_0"])


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
