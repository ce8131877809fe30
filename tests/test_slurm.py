"""Sweeps on a real SLURM: a one-node cluster (munged, mariadb, slurmdbd, slurmctld, slurmd on localhost, CPU-only)
started from Debian's packages in a temporary directory for this module, and sweeps submitted to it through
`shardbench sweep --executor slurm`: the same losses as the local executor, a job killed with scancel recorded
and resumed, and --status naming each run's job and state.

The cluster lives in its own directory with its own ports, munge socket and database; every daemon is a child of
this process and is stopped by its process id afterwards. Where the packages are missing or a daemon does not
come up (not root, no munge user, ...), these tests fail with the reason (`make slurm` installs them), unless
SHARDBENCH_SKIP_SLURM=1 skips them on purpose.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import as_from_a_terminal
from shardbench.errors import ConfigError
from shardbench.sweep import slurm as slurm_lib
from shardbench.sweep import slurm_jobs, slurm_options
from shardbench.sweep import sweep_cmd
from shardbench.sweep.grid import make_sweep
from shardbench.sweep.runner import Options
from shardbench.sweep.slurm_options import Shape, SlurmOptions, job_shape
from shardbench.store import JobRow, RunRow, Store

pytestmark = pytest.mark.slow  # every test here starts processes or trains for tens of seconds

# Daemons and clients this needs, and the Debian packages that hold them.
NEEDED = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm",
          "slurmdbd": "slurmdbd", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server"}
CLUSTER = "sbtest"
UP_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout_s:g} s: {_tail(log)}")


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-3:])[-400:] or "(empty log)"


class LocalSlurm:
    """A one-node SLURM cluster on localhost with accounting, its files under `root`; `env` points clients at it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.ports = {name: _free_port() for name in ("slurmctld", "slurmd", "slurmdbd", "mariadb")}
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------------------------------ start, stop
    def start(self) -> None:
        missing = [f"{cmd} ({pkg})" for cmd, pkg in NEEDED.items() if shutil.which(cmd) is None
                   and not Path("/usr/sbin", cmd).exists()]
        if missing:
            raise RuntimeError(f"not installed: {', '.join(missing)}; `make slurm` installs them as root")
        if os.geteuid() != 0:
            raise RuntimeError("starting SLURM's daemons needs root (SlurmUser=root)")
        try:
            self._munge()
            self._mariadb()
            self._write_conf()
            self._spawn("slurmdbd", ["slurmdbd", "-D"])
            _wait_port(self.ports["slurmdbd"], UP_TIMEOUT_S, self.procs[-1][1], "slurmdbd", self.root / "slurmdbd.log")
            added = subprocess.run(["sacctmgr", "-i", "add", "cluster", CLUSTER], env=self.env, capture_output=True,
                                   text=True, timeout=60)
            if added.returncode != 0 and "already exists" not in added.stdout + added.stderr:
                raise RuntimeError(f"sacctmgr add cluster failed: {(added.stderr or added.stdout).strip()[-1500:]}")
            self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
            _wait_port(self.ports["slurmctld"], UP_TIMEOUT_S, self.procs[-1][1], "slurmctld",
                       self.root / "slurmctld.log")
            self._spawn("slurmd", ["slurmd", "-D", "-N", "localhost"])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, cmd: list[str], user: str | None = None) -> subprocess.Popen[bytes]:
        if user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        out = open(self.root / f"{name}.out", "wb")
        proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        out.close()
        self.procs.append((name, proc))
        return proc

    def _munge(self) -> None:
        """munged as the munge user, on a socket and key of this cluster's own (the machine's munge is untouched)."""
        d = self.root / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        shutil.chown(d, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        self.munge_socket = d / "munge.socket"
        proc = self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                                      f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
                                      f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"],
                           user="munge")
        deadline = time.monotonic() + UP_TIMEOUT_S
        while not self.munge_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {_tail(self.root / 'munged.out')} "
                                   f"{_tail(d / 'munged.log')}")
            time.sleep(0.1)

    def _mariadb(self) -> None:
        """mariadb for slurmdbd: a data directory of its own, on a TCP port of its own, without grant tables."""
        run = self.root / "mariadb"  # the server's socket, pid and log: written as the mysql user
        data = run / "data"
        for d in (run, data):
            d.mkdir()
            shutil.chown(d, "mysql", "mysql")
        made = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=mysql",
                               "--auth-root-authentication-method=normal", "--skip-test-db"],
                              capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {(made.stderr or made.stdout).strip()[-300:]}")
        self._spawn("mariadb", ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={data}", "--user=mysql",
                                f"--socket={run / 'mysqld.sock'}", f"--pid-file={run / 'mysqld.pid'}",
                                f"--port={self.ports['mariadb']}", "--bind-address=127.0.0.1",
                                "--skip-grant-tables", "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                                f"--log-error={run / 'mariadb.log'}"])
        _wait_port(self.ports["mariadb"], UP_TIMEOUT_S, self.procs[-1][1], "mariadb", run / "mariadb.log")

    def _write_conf(self) -> None:
        r = self.root
        cpus = os.cpu_count() or 1
        with open("/proc/meminfo") as f:
            mem_mb = int(f.readline().split()[1]) // 1024
        for d in ("state", "spool"):
            (r / d).mkdir()
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        self.conf.write_text(
            f"ClusterName={CLUSTER}\nSlurmctldHost=localhost(127.0.0.1)\n"
            f"SlurmctldPort={self.ports['slurmctld']}\nSlurmdPort={self.ports['slurmd']}\n"
            f"SlurmUser=root\nSlurmdUser=root\n{auth}CredType=cred/munge\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={r / 'spool'}\n"
            f"SlurmctldPidFile={r / 'slurmctld.pid'}\nSlurmdPidFile={r / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={r / 'slurmctld.log'}\nSlurmdLogFile={r / 'slurmd.log'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nSchedulerType=sched/backfill\n"
            "ReturnToService=2\nKillWait=2\nMinJobAge=600\nSchedulerParameters=sched_interval=2\n"
            # JAX's SLURM detection puts a job's coordinator on port 61440 + job id % 4096: job ids of their own
            # keep two test clusters on one machine from sharing ports.
            f"FirstJobId={random.randrange(1000, 1_000_000)}\n"
            "JobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none\n"
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={self.ports['slurmdbd']}\nAccountingStoragePass={self.munge_socket}\n"
            f"NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost CPUs={cpus} "
            f"RealMemory={max(mem_mb - 1024, 512)} State=UNKNOWN\n"
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n"
        )
        dbd = r / "slurmdbd.conf"
        dbd.write_text(
            f"{auth}DbdHost=localhost\nDbdPort={self.ports['slurmdbd']}\nSlurmUser=root\n"
            f"PidFile={r / 'slurmdbd.pid'}\nLogFile={r / 'slurmdbd.log'}\n"
            f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={self.ports['mariadb']}\n"
            "StorageUser=root\nStorageLoc=slurm_acct_db\n"
        )
        dbd.chmod(0o600)

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {_tail(self.root / f'{name}.log')} "
                                       f"{_tail(self.root / f'{name}.out')}")
            done = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True,
                                  timeout=30)
            state = done.stdout.strip() or done.stderr.strip()
            if state in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.3)
        raise RuntimeError(f"the node did not come up within {UP_TIMEOUT_S:g} s (sinfo: {state!r}): "
                           f"{_tail(self.root / 'slurmd.log')}")

    def stop(self) -> None:
        """Cancel the jobs left on this cluster (a job's processes outlive slurmd), then stop every daemon this
        cluster started, newest first, by its process id (nothing else is touched)."""
        if any(name == "slurmd" and proc.poll() is None for name, proc in self.procs):
            try:
                subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True, timeout=30)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    left = subprocess.run(["squeue", "-h"], env=self.env, capture_output=True, text=True, timeout=30)
                    if left.returncode != 0 or not left.stdout.strip():
                        break
                    time.sleep(0.5)
            except (OSError, subprocess.SubprocessError):
                pass
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self.procs.clear()


# ----------------------------------------------------------------------------- without a cluster: pure checks
def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shardbench")
    sweep_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["sweep", *argv])


def test_time_limits_in_slurms_formats() -> None:
    assert [slurm_options.parse_time(t) for t in ("90", "1:30", "1:30:00", "2-0", "1-00:30", "0-0:0:30")] == \
        [90, 2, 90, 2880, 1470, 1]
    for bad in ("", "0", "soon", "1:2:3:4", "-5"):
        with pytest.raises(ConfigError, match="not a time limit|longer than zero"):
            slurm_options.parse_time(bad)
    assert slurm_options.parse_sbatch(["mem=64G", "--constraint=a100", "exclusive"]) == {
        "mem": "64G", "constraint": "a100", "exclusive": True}
    with pytest.raises(ConfigError, match="not an sbatch option"):
        slurm_options.parse_sbatch(["mem="])


def test_job_shapes_follow_the_runs_devices() -> None:
    opts = Options(Path("."), devices_per_process=4)
    cpu = SlurmOptions()
    assert job_shape({"parallel.devices": 4}, opts, cpu, "r") == Shape(1, 1, 0, 0)
    assert job_shape({"parallel.devices": 8}, opts, cpu, "r") == Shape(1, 2, 0, 4)
    gpus = SlurmOptions(nodes=3, gpus_per_node=8)
    assert job_shape({"parallel.devices": 16}, Options(Path(".")), gpus, "r") == Shape(2, 8, 8, 0)
    assert job_shape({"parallel.devices": 4}, Options(Path(".")), gpus, "r") == Shape(1, 4, 4, 0)
    assert job_shape({"parallel.devices": 0}, Options(Path(".")), gpus, "r") == Shape(3, 8, 8, 0)
    with pytest.raises(ConfigError, match="not a whole number of 8-GPU nodes"):
        job_shape({"parallel.devices": 12}, Options(Path(".")), gpus, "r")
    assert slurm_jobs._expand("12_[0-2,5%2]") == ["12_0", "12_1", "12_2", "12_5"]
    assert slurm_jobs._expand("12_3") == ["12_3"]


@pytest.mark.parametrize("state, kind", [("TIMEOUT", "timeout"), ("OUT_OF_MEMORY", "oom"), ("PREEMPTED", "killed"),
                                         ("NODE_FAIL", "killed"), ("CANCELLED by 0", "killed"), ("FAILED", "crash")])
def test_a_job_slurm_ended_is_recorded_with_the_sweeps_error_kinds(tmp_path: Path, state: str, kind: str) -> None:
    s = make_sweep("vit-tiny", values={"train.batch_size": "32,64"})
    row = slurm_lib.row_for(s, s.runs[0], Options(tmp_path), "7_1", slurm_jobs.JobState(state, "NodeDown", "0:9"))
    assert (row.status, row.error_kind) == ("failed", kind)
    assert f"SLURM job 7_1 {state} (NodeDown)" in (row.error or "")


def test_a_run_that_failed_inside_its_job_keeps_its_own_kind(tmp_path: Path) -> None:
    s = make_sweep("vit-tiny", values={"train.batch_size": "32,64"})
    path = slurm_lib.outcome_path(tmp_path, "9")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"job_id": "9", "returncode": 3, "stderr": ["shardbench: error: loss is nan"],
                                "started": 1.0, "wall_s": 2.0, "peak_rss_bytes": None}))
    row = slurm_lib.row_for(s, s.runs[0], Options(tmp_path), "9", slurm_jobs.JobState("COMPLETED"))
    assert (row.error_kind, row.error, row.wall_s) == ("diverged", "shardbench: error: loss is nan", 2.0)


@pytest.mark.parametrize("argv, words", [
    (["--executor", "slurm"], "sbatch, squeue, scancel not found on PATH"),
    (["--executor", "slurm", "--slurm-time", "soon"], "--slurm-time 'soon' is not a time limit"),
    (["--slurm-partition", "gpu"], "--slurm-partition is an option of --executor slurm"),
    (["--executor", "slurm", "--slurm-gpus-per-node", "8", "--devices", "12"], "not a whole number of 8-GPU nodes"),
    (["--executor", "slurm", "--slurm-nodes", "0"], "--slurm-nodes must be at least 1"),
    (["--status"], "--status needs --out"),
])
def test_bad_cluster_input_is_one_line_before_anything_is_submitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, argv: list[str],
        words: str) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM here
    out = [] if "--status" in argv else ["--out", str(tmp_path / "s")]
    code = sweep_cmd.run(parse("--preset", "vit-tiny", "--batch-size", "32,64", *argv, *out))
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s").exists()


def test_without_submitit_the_slurm_executor_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = slurm_options.importlib.util.find_spec
    monkeypatch.setattr(slurm_options.importlib.util, "find_spec", lambda name, *a: None if name == "submitit"
                        else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'shardbench\[slurm\]'"):
        slurm_options.check_available()


def test_a_dry_run_for_slurm_lists_the_runs_and_submits_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code = sweep_cmd.run(parse("--preset", "mesh-grid", "--executor", "slurm", "--slurm-partition", "gpu",
                               "--dry-run", "--out", str(tmp_path / "s")))
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and len(lines) == 10 and lines[0].startswith("9 run(s) from vit-seed")
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------------------------ fixtures
TINY = ["--data", "synthetic", "--data.synthetic-train", "256", "--data.synthetic-test", "64", "--model.patch-size",
        "8", "--model.embed-dim", "32", "--model.num-layers", "1", "--model.mlp-dim", "64", "--batch-size", "32",
        "--no-train.eval"]
# Three runs, the last of two processes (8 devices, 4 per process): 1-, 1- and 2-task jobs.
THREE = """preset = "vit-tiny"
axes = [[{"parallel.strategy" = "dp", "parallel.devices" = 4}, {"parallel.strategy" = "fsdp", "parallel.devices" = 4},
         {"parallel.strategy" = "dp", "parallel.devices" = 8}]]
"""


@pytest.fixture(scope="session")
def slurm() -> Iterator[LocalSlurm]:
    """A one-node SLURM cluster for the session, stopped (by process id) and removed afterwards."""
    from conftest import missing, skip_if_requested

    skip_if_requested("SHARDBENCH_SKIP_SLURM")
    root = Path(tempfile.mkdtemp(prefix="shardbench-slurm-"))
    root.chmod(0o755)  # the munge and mysql users work in folders below it
    cluster = LocalSlurm(root)
    problem = ""
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError, KeyError, LookupError) as err:
        shutil.rmtree(root, ignore_errors=True)
        problem = f"no SLURM cluster could be started here: {err}"
    if problem:  # outside the except: the failure is this one line, not the exception chain
        missing("SHARDBENCH_SKIP_SLURM", problem)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _env(cluster: LocalSlurm | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    return env | ({"SLURM_CONF": str(cluster.conf)} if cluster else {})


def _sweep_cmd(*argv: str) -> list[str]:
    return [sys.executable, "-m", "shardbench", "sweep", *argv]


def _sweep(cluster: LocalSlurm | None, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_sweep_cmd(*argv), env=_env(cluster), capture_output=True, text=True, timeout=timeout)


def _rows(out: Path) -> dict[str, RunRow]:
    with Store(out / "sweep.db") as store:
        return {r.name: r for r in store.runs()}


def _jobs(out: Path) -> dict[str, JobRow]:
    if not (out / "sweep.db").exists():
        return {}
    with Store(out / "sweep.db") as store:
        return store.jobs()


def _squeue(cluster: LocalSlurm) -> dict[str, str]:
    done = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], env=_env(cluster), capture_output=True, text=True,
                          timeout=30)
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


def _wait(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


# ------------------------------------------------------------------------------------------- on the cluster
def test_a_sweep_on_slurm_matches_the_local_sweep(slurm: LocalSlurm, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "three.toml").write_text(THREE)
    common = ["--sweep-file", str(tmp_path / "three.toml"), *TINY, "--steps", "3", "--devices-per-process", "4",
              "--data.cache-dir", str(tmp_path / "cache")]
    on_slurm = _sweep(slurm, *common, "--executor", "slurm", "--slurm-poll", "1", "--out", str(tmp_path / "slurm"))
    assert on_slurm.returncode == 0, on_slurm.stdout[-3000:] + on_slurm.stderr[-3000:]
    local = _sweep(None, *common, "--no-report", "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]

    there, here = _rows(tmp_path / "slurm"), _rows(tmp_path / "local")
    assert sorted(there) == sorted(here) == ["strategy_dp_devices_4", "strategy_dp_devices_8",
                                             "strategy_fsdp_devices_4"]
    for name, row in there.items():
        assert row.status == "complete", (name, row.error)
        processes = 2 if name.endswith("_8") else 1
        assert row.record["measurements"]["processes"] == here[name].record["measurements"]["processes"] == processes
        np.testing.assert_allclose(row.record["train_loss"], here[name].record["train_loss"], rtol=1e-6)
        differs = {k for k in row.config if row.config[k] != here[name].config.get(k)}
        assert differs == {"train.out"}, differs  # the same configuration, in another sweep directory
    # What a local sweep leaves, in the same places: run folders, logs, the report.
    out = tmp_path / "slurm"
    for name in there:
        assert (out / "runs" / name / "summary.json").exists() and (out / "runs" / f"{name}.log").exists()
    assert (out / "runs" / "strategy_dp_devices_8.p1.log").exists()  # the second task of the two-process job
    assert (out / "report" / "report.md").exists() or any((out / "report").glob("*.md"))
    jobs = _jobs(out)
    assert {j.state for j in jobs.values()} == {"COMPLETED"}
    assert len({j.job_id for j in jobs.values()}) == 3
    assert "[job " in on_slurm.stdout and "then sacct" in on_slurm.stdout

    status = _sweep(slurm, "--out", str(out), "--status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "3 run(s): 3 COMPLETED"
    for name, job in jobs.items():
        assert any(ln.split()[:3] == [name, job.job_id, "COMPLETED"] for ln in lines[1:]), lines

    # Without accounting, ended jobs are read from the controller's memory instead.
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setattr(slurm_jobs, "sacct_states", lambda ids: None)
    states, source = slurm_jobs.job_states([j.job_id for j in jobs.values()])
    assert source == "squeue and scontrol (no accounting)"
    assert sorted(states) == sorted(j.job_id for j in jobs.values())
    assert {st.word for st in states.values()} == {"COMPLETED"}


def test_tune_measures_its_choice_as_a_slurm_job(slurm: LocalSlurm, tmp_path: Path) -> None:
    """`shardbench tune --executor slurm`: the plan's top choice is measured as a SLURM job, and tune's verdict,
    winner and report come from that job's run record."""
    out = tmp_path / "tune"
    small_mlp = ["--preset", "mlp-small", "--model.num-layers", "3", "--model.mlp-dim", "64", "--model.input-dim",
                 "16", "--model.num-classes", "8", "--batch-size", "64", "--devices", "8"]
    done = subprocess.run([sys.executable, "-m", "shardbench", "tune", *small_mlp, "--candidates", "dp,fsdp",
                           "--remat", "none", "--top-k", "1", "--budget-min", "5", "--measure-steps", "3",
                           "--workers", "1", "--executor", "slurm", "--slurm-poll", "1", "--out", str(out)],
                          env=_env(slurm), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tuned = json.loads((out / "tune.json").read_text())
    chosen = [row for row in tuned["layouts"] if row["chosen"]]
    assert len(chosen) == 1 and chosen[0]["measured_step_s"] and tuned["result"]["winner"] == chosen[0]["name"]
    jobs = _jobs(out)
    assert [job.state for job in jobs.values()] == ["COMPLETED"] and list(jobs) == [chosen[0]["run"]]
    record = _rows(out)[chosen[0]["run"]].record
    assert record["measurements"]["step_time_s"]["median"] == pytest.approx(chosen[0]["measured_step_s"])
    assert "[job " in done.stdout and (out / "tune.md").exists() and (out / "winner.toml").exists()


def test_a_job_slurm_would_not_take_is_one_line_before_anything_is_submitted(slurm: LocalSlurm,
                                                                             tmp_path: Path) -> None:
    out = tmp_path / "s"
    for flags, words in ((["--slurm-partition", "nosuch"], "Invalid partition name specified"),
                         (["--processes", str((os.cpu_count() or 1) + 1)], "node configuration is not available")):
        done = _sweep(slurm, "--preset", "vit-tiny", *TINY, "--steps", "2", "--batch-size", "32,64", "--executor",
                      "slurm", *flags, "--out", str(out))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "SLURM would not take the job of run batch_32 (and 1 more)" in done.stderr and words in done.stderr
        assert not out.exists()
    assert _squeue(slurm) == {}


def test_a_controller_that_does_not_answer_is_named_as_such_not_as_a_refused_job(tmp_path: Path) -> None:
    """With no slurmctld at SLURM_CONF's address, sbatch cannot ask about the job at all: the one line says that
    the controller could not be reached, and where SLURM_CONF points, rather than that SLURM would not take the
    job. Nothing is submitted or written."""
    from conftest import missing, skip_if_requested

    skip_if_requested("SHARDBENCH_SKIP_SLURM")
    if shutil.which("sbatch") is None:
        missing("SHARDBENCH_SKIP_SLURM", "sbatch is not installed")
    conf = tmp_path / "slurm.conf"  # port 9 (discard): nothing answers there
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\nAuthType=auth/none\n"
                    "CredType=cred/none\nMessageTimeout=2\nNodeName=localhost CPUs=1 State=UNKNOWN\n"
                    "PartitionName=debug Nodes=localhost Default=YES State=UP\n")
    out = tmp_path / "s"
    done = subprocess.run(_sweep_cmd("--preset", "vit-tiny", *TINY, "--steps", "2", "--executor", "slurm",
                                     "--out", str(out)),
                          env=_env() | {"SLURM_CONF": str(conf)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"SLURM's controller could not be reached (SLURM_CONF={conf}): " in done.stderr, done.stderr
    assert "Unable to contact slurm controller" in done.stderr and "would not take" not in done.stderr
    assert not out.exists()


def test_a_cancelled_job_is_recorded_and_resumed_and_a_live_one_is_not_submitted_again(
        slurm: LocalSlurm, tmp_path: Path) -> None:
    out = tmp_path / "s"
    # Two runs in one array, one at a time: the first runs while the second waits its turn. 3,000 steps (about
    # 12 s on 2 busy cores, after the job's start-up) keep the first job running through the Ctrl-C and --status.
    argv = ["--preset", "vit-tiny", *TINY, "--steps", "3000", "--devices", "2", "--strategy", "dp,fsdp",
            "--data.cache-dir", str(tmp_path / "cache"), "--no-report"]
    driver = subprocess.Popen(_sweep_cmd(*argv, "--executor", "slurm", "--slurm-max-running", "1", "--slurm-poll",
                                         "1", "--out", str(out)),
                              env=_env(slurm), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=as_from_a_terminal)
    try:
        _wait("both jobs queued", lambda: len(_jobs(out)) == 2)
        first, second = (_jobs(out)[n].job_id for n in ("strategy_dp", "strategy_fsdp"))
        _wait("the first job to run", lambda: _squeue(slurm).get(first) == "RUNNING")
        # Ctrl-C while the first job runs (before anything slower: on two cores shared with the other test
        # workers a --status process can take long enough for both jobs to end first): the jobs go on.
        driver.send_signal(signal.SIGINT)
        stdout, stderr = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert f"--out {out} --status" in stderr and f"--out {out} --resume" in stderr and "--cancel" in stderr
    status = _sweep(slurm, "--out", str(out), "--status").stdout.splitlines()
    assert any(ln.split()[:3] == ["strategy_dp", first, "RUNNING"] for ln in status), status
    assert any(ln.split()[:3] == ["strategy_fsdp", second, "PENDING"] for ln in status), status
    assert "states of jobs not yet ended from squeue and sacct" in status[0]
    assert set(_squeue(slurm)) >= {first, second}

    subprocess.run(["scancel", first], env=_env(slurm), check=True, timeout=30)
    # Once the cancel has taken (squeue may say RUNNING for a moment), SLURM cleans up for a few seconds (squeue:
    # COMPLETING), and the accounting of an array's task learns of the end a moment later: the resume waits for
    # the final word before it decides what to submit again.
    _wait("the cancel to take", lambda: _squeue(slurm).get(first) != "RUNNING")
    resumed = _sweep(slurm, "--out", str(out), "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    # The cancelled job is recorded as such, then its run is submitted again; the waiting one is followed.
    killed = [ln for ln in resumed.stdout.splitlines() if "strategy_dp " in ln and "FAILED (killed)" in ln]
    assert killed and f"SLURM job {first} CANCELLED" in killed[0], resumed.stdout
    assert "1 SLURM job(s) still queued or running are followed" in resumed.stdout
    jobs, rows = _jobs(out), _rows(out)
    assert jobs["strategy_fsdp"].job_id == second and jobs["strategy_dp"].job_id not in (first, second)
    assert all(r.status == "complete" for r in rows.values()), {n: r.error for n, r in rows.items()}
    assert resumed.stdout.count("submitted 1 run(s)") == 1


def test_cancel_stops_the_jobs_and_the_driver_records_them(slurm: LocalSlurm, tmp_path: Path) -> None:
    out = tmp_path / "held"
    argv = ["--preset", "vit-tiny", *TINY, "--steps", "2", "--devices", "1", "--data.cache-dir",
            str(tmp_path / "cache"), "--no-report", "--executor", "slurm", "--slurm-poll", "1",
            "--slurm-option", "hold", "--slurm-time", "5", "--out", str(out)]
    driver = subprocess.Popen(_sweep_cmd(*argv), env=_env(slurm), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        _wait("the held job", lambda: len(_jobs(out)) == 1 and _jobs(out)["base"].state == "PENDING"
              if _jobs(out) else False)
        cancelled = _sweep(slurm, "--out", str(out), "--cancel")
        assert cancelled.returncode == 0 and "cancelled 1 job(s)" in cancelled.stdout, cancelled.stderr
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 1, stdout[-2000:] + stderr[-2000:]
    (row,) = _rows(out).values()
    assert row.status == "failed" and row.error_kind == "killed" and "CANCELLED" in (row.error or "")
    assert "1 of 1 runs failed: 1 killed" in stderr


def main() -> int:
    """Start a cluster by hand (`python tests/test_slurm.py DIR`), printing SLURM_CONF, until Ctrl-C."""
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    root = parser.parse_args().root
    root.mkdir(parents=True)
    root.chmod(0o755)
    cluster = LocalSlurm(root)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill PID` stops the daemons too
    t0 = time.perf_counter()
    cluster.start()
    print(f"up in {time.perf_counter() - t0:.1f} s: export SLURM_CONF={cluster.conf}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
