"""Several processes on jax.distributed: 2 processes x 4 CPU devices compute what 1 process x 8 devices does,
a failing or hanging process stops the launch as a whole, and a killed run resumes to the uninterrupted result.

Every multi-process run here is real: `shardbench launch` starts two `shardbench train` processes that join
through a coordinator on loopback and run their collectives through gloo.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import QUICK_COMPILE_FLAGS, as_from_a_terminal
from shardbench import cluster
from shardbench.cli import build_parser, config_from_args
from shardbench.errors import ConfigError
from shardbench.launch import _way_on, free_port
from shardbench.train.loop import run

pytestmark = pytest.mark.slow  # every test here starts processes or trains for tens of seconds

MICRO = ["--preset", "vit-tiny", "--data", "synthetic", "--data.synthetic-train", "512", "--data.synthetic-test",
         "128", "--model.patch-size", "8", "--model.embed-dim", "32", "--model.num-layers", "2",
         "--model.mlp-dim", "64", "--batch-size", "32", "--steps", "6", "--train.checkpoint-every", "2",
         "--train.log-every", "1", "--no-train.progress"]
# tp over a 1x8 mesh puts the model axis across the two processes: both then load the whole batch.
STRATEGIES = {"dp": ["--strategy", "dp"], "fsdp": ["--strategy", "fsdp"],
              "tp": ["--strategy", "tp", "--mesh", "1x8", "--model.num-heads", "8"]}


def _env() -> dict[str, str]:
    # The launcher gives each process its own device count; the test process's 8-device flag must not leak. The
    # quick compilation of this process (tests/conftest.py): the processes compile in less time, and alike with
    # the one-process runs they are compared with.
    return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "JAX_PLATFORMS": "cpu", "XLA_FLAGS": QUICK_COMPILE_FLAGS}


def _launch(out: Path, cache: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 0,
            argv: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "shardbench", "launch", "--processes", "2", "--devices-per-process", "4",
           "--join-timeout", "60", "--timeout", str(timeout), "--", "train",
           *(MICRO if argv is None else argv), "--out", str(out), "--data.cache-dir", str(cache), *extra]
    return subprocess.run(cmd, env=_env() | (env or {}), capture_output=True, text=True, timeout=600)


def _single(out: Path, cache: Path, *extra: str) -> dict[str, Any]:
    """The same command line in this process: one process, its 8 simulated devices."""
    args = build_parser().parse_args(["train", *MICRO, "--out", str(out), "--data.cache-dir", str(cache), *extra])
    return run(config_from_args(args))


def _losses(out: Path) -> dict[int, float]:
    """train/loss at every step, read back from the run's TensorBoard file."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    files = sorted((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1, files  # one writer: process 0
    acc = accumulator.EventAccumulator(str(files[0]))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("train/loss")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each strategy once as 2 processes x 4 devices and once as 1 process x 8 devices, sharing a cache."""
    root = tmp_path_factory.mktemp("processes")
    out: dict[str, Any] = {"root": root, "cache": root / "cache"}
    for name, flags in STRATEGIES.items():
        launched = _launch(root / f"{name}-2x4", out["cache"], *flags)
        assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
        out[name] = {"proc": launched, "two": root / f"{name}-2x4",
                     "one": _single(root / f"{name}-1x8", out["cache"], *flags)}
    return out


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_processes_train_exactly_like_one(runs: dict[str, Any], strategy: str) -> None:
    r = runs[strategy]
    two = json.loads((r["two"] / "summary.json").read_text())
    one = r["one"]
    assert two["measurements"]["processes"] == 2 and one["measurements"]["processes"] == 1
    # Same global batches in the same order, same program: the same loss at every step.
    a, b = _losses(r["two"]), _losses(Path(one["out"]))
    assert sorted(a) == sorted(b) == list(range(1, 7))
    np.testing.assert_allclose([a[s] for s in sorted(a)], [b[s] for s in sorted(b)], rtol=2e-5)
    np.testing.assert_allclose(two["test_loss"], one["test_loss"], rtol=2e-5)
    assert two["test_accuracy"] == one["test_accuracy"]  # 128 test images, counted the same way
    assert two["epochs"][0]["val_accuracy"] == one["epochs"][0]["val_accuracy"]

    # One record holds every device of both processes, each holding what it holds in the 1-process run.
    per_device = two["measurements"]["memory"]["per_device"]
    assert sorted(d["process"] for d in per_device) == [0] * 4 + [1] * 4
    assert len({d["device"] for d in per_device}) == 8
    held = {d["params_bytes"] for d in per_device}
    assert held == {d["params_bytes"] for d in one["measurements"]["memory"]["per_device"]}
    total = one["measurements"]["memory"]["breakdown"]["params_bytes"]
    assert len(held) == 1 and held.pop() == total
    assert [p["process"] for p in two["measurements"]["per_process"]] == [0, 1]

    # Process 0 alone talks: its epoch line and summary; process 1 only joins in.
    stdout = r["proc"].stdout
    assert "[p0] epoch 1" in stdout and "[p0] done:" in stdout
    assert "[p1] epoch" not in stdout and "[p1] done:" not in stdout


def test_fsdp_shards_parameters_over_both_processes(runs: dict[str, Any]) -> None:
    dp = json.loads((runs["dp"]["two"] / "summary.json").read_text())["measurements"]["memory"]
    fsdp = json.loads((runs["fsdp"]["two"] / "summary.json").read_text())["measurements"]["memory"]
    dp_bytes = sum(d["params_bytes"] for d in dp["per_device"])
    fsdp_bytes = sum(d["params_bytes"] for d in fsdp["per_device"])
    assert dp_bytes == 8 * dp["breakdown"]["params_bytes"]  # replicated on all 8 devices
    # Sharded: the 8 devices together hold one copy, up to the few small arrays nothing divides.
    assert fsdp_bytes < dp_bytes / 4
    assert fsdp_bytes >= dp["breakdown"]["params_bytes"]


def test_killed_process_stops_the_launch_and_the_run_resumes_to_the_same_result(runs: dict[str, Any]) -> None:
    out, cache = runs["root"] / "killed", runs["cache"]
    killed = _launch(out, cache, *STRATEGIES["dp"],
                     env={"SHARDBENCH_FAULT_KILL_AT_STEP": "5", "SHARDBENCH_FAULT_KILL_PROCESS": "1"})
    assert killed.returncode == -9  # the launch ends by its process's signal, as that process would alone
    assert "process 1 of 2 failed: killed by SIGKILL; stopped the other 1" in killed.stderr
    # Process 0, if it speaks before it is stopped, says its peer stopped: not "a bug in shardbench".
    assert "internal error" not in killed.stderr, killed.stderr[-3000:]
    assert not (out / "summary.json").exists()
    assert not _running(str(out))  # process 0 was stopped too, not left waiting in a collective
    # The way on is said: by process 0 as it is stopped, else by the launch (the killed process says nothing, and
    # the other's line can be cut off by its own end), naming the step the resume then starts from.
    assert "--resume" in killed.stderr, killed.stderr[-3000:]
    way_on = _way_on(["train", *STRATEGIES["dp"], "--out", str(out)], [])
    assert way_on is not None
    said_step = int(re.fullmatch(r"the same launch with --resume goes on from the checkpoint of step (\d+) in (.+)",
                                 way_on)[1])
    again = _way_on(["train", "--out", str(out), "--resume"], []) or ""  # a launch that was itself a resume
    assert again.startswith("the same launch goes on from the checkpoint of step")
    assert _way_on(["train", "--out", str(out)], [_Said(["shardbench: stopped by SIGTERM; the same command with "
                                                        f"--resume --out {out} goes on from ..."])]) is None
    # Given no --out, the folder is the one process 0's header named (this launch's own line, read as printed).
    opening = [line.removeprefix("[p0] ") for line in killed.stdout.splitlines() if line.startswith("[p0] ")]
    assert _way_on(["train", *STRATEGIES["dp"]], [_Said([], opening=opening[:20])]) == (
        f"the same launch with --resume --out {out} goes on from the checkpoint of step {said_step} in {out}")
    assert _way_on(["train", *STRATEGIES["dp"]], [_Said([], opening=["[ 1/10] epoch 1"])]) is None  # before it

    resumed = _launch(out, cache, *STRATEGIES["dp"], "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == said_step and said_step in (2, 4)
    whole = json.loads((runs["dp"]["two"] / "summary.json").read_text())
    np.testing.assert_allclose(summary["train_loss"], whole["train_loss"], rtol=1e-6)
    np.testing.assert_allclose(summary["test_loss"], whole["test_loss"], rtol=1e-6)
    assert summary["test_accuracy"] == whole["test_accuracy"]


def test_the_way_on_quotes_a_folder_the_shell_would_split(tmp_path: Path) -> None:
    out = tmp_path / "my runs" / "x"
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    header = f"shardbench: vit-tiny (vit, 1 params) | batch 8, 4 steps (2/epoch) | {out} | a note"
    assert _way_on(["train"], [_Said([], opening=[header])]) == (
        f"no checkpoint to resume from in {out}; the same launch with --resume --out '{out}' starts the run from "
        f"step 0")


class _Said:
    """What the launch keeps of a process: its last stderr lines and its first stdout lines."""

    def __init__(self, said: list[str], opening: list[str] | None = None) -> None:
        self.said, self.opening = deque(said), opening or []


def test_when_process_0_dies_the_survivor_does_not_bury_the_reason(tmp_path: Path) -> None:
    """Process 0 holds the coordinator: when it is killed, process 1's JAX aborts with a fatal error and a stack
    dump about the coordinator it lost, while the launcher stops it. The launch says which process failed and
    why, in one line, and what the survivor printed meanwhile is left out (counted)."""
    killed = _launch(tmp_path / "run", tmp_path / "cache", *STRATEGIES["dp"], "--steps", "40",
                     env={"SHARDBENCH_FAULT_KILL_AT_STEP": "3", "SHARDBENCH_FAULT_KILL_PROCESS": "0"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "process 0 of 2 failed: killed by SIGKILL; stopped the other 1" in killed.stderr
    assert "stack trace" not in killed.stderr and "@     0x" not in killed.stderr, killed.stderr[-3000:]
    assert not _running(str(tmp_path / "run"))


def test_what_others_print_while_they_are_stopped_is_held_back_and_counted() -> None:
    import io

    from shardbench.launch import OPENING_LINES, Stopping, _pump

    stopping, out = Stopping(), io.BytesIO()
    _pump(io.BytesIO(b"epoch 1\n"), out, b"[p1] ", None, lambda line: stopping.holds(1, line))
    stopping.failed = 0
    said: deque[str] = deque()
    _pump(io.BytesIO(b"F client.h:80] Terminating process\n*** Check failure stack trace: ***\n"
                     b"    @  0x7f SendToLog()\nshardbench: error: another process of this run stopped\n"), out,
          b"[p1] ", said,
          lambda line: stopping.holds(1, line))
    _pump(io.BytesIO(b"its last words\n"), out, b"[p0] ", None, lambda line: stopping.holds(0, line))
    assert out.getvalue().decode().splitlines() == [
        "[p1] epoch 1", "[p1] shardbench: error: another process of this run stopped", "[p0] its last words"]
    assert stopping.held == 3 and len(said) == 4  # kept for the reason all the same
    first: list[str] = []  # a process's first stdout lines, where process 0's header names the run's folder
    _pump(io.BytesIO(b"".join(b"line %d\n" % i for i in range(29)) + b"line 29"), io.BytesIO(), b"[p0] ", first)
    assert first == [f"line {i}" for i in range(OPENING_LINES)]
    assert not Stopping(failed=0, show_all=True).holds(1, b"anything\n")  # --debug
    # A process that ended in failure holds back what the others print from then on, before its waiter has told
    # the launch: process 1's gRPC lines about the coordinator it lost came through.
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    killed.wait()
    early = Stopping(procs=[killed, subprocess.Popen([sys.executable, "-c", "pass"])])
    assert early.holds(1, b':UNKNOWN:Error received from peer  {grpc_message:"Socket closed"}\n')
    assert early.failed == 0 and not early.holds(0, b"its last words\n")
    early.procs[1].wait()


def test_a_sweep_runs_each_configuration_as_two_processes(runs: dict[str, Any]) -> None:
    from shardbench.store import Store

    out = runs["root"] / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "shardbench", "sweep", *MICRO, "--data.cache-dir", str(runs["cache"]),
         "--no-train.eval", "--strategy", "dp,fsdp", "--processes", "2", "--devices-per-process", "4",
         "--no-report", "--out", str(out)], env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with Store(out / "sweep.db") as store:
        records = {r.name: r for r in store.runs()}
    assert sorted(records) == ["strategy_dp", "strategy_fsdp"], records
    for name, row in records.items():
        assert row.status == "complete", (name, row.error)
        assert row.record["measurements"]["processes"] == 2
        assert len(row.record["measurements"]["memory"]["per_device"]) == 8
    # The same configurations as the launches above: the same losses.
    for name in ("dp", "fsdp"):
        whole = json.loads((runs[name]["two"] / "summary.json").read_text())
        np.testing.assert_allclose(records[f"strategy_{name}"].record["train_loss"], whole["train_loss"], rtol=1e-6)


def _running(marker: str) -> list[int]:
    """Processes whose command line mentions `marker` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_hanging_launch_is_stopped_at_its_time_limit(tmp_path: Path) -> None:
    t0 = time.monotonic()
    hung = _launch(tmp_path / "run", tmp_path / "cache", *STRATEGIES["dp"], "--steps", "100000", timeout=4)
    assert hung.returncode == 124
    assert "within the 4 s time limit: stopped all 2 processes" in hung.stderr
    assert time.monotonic() - t0 < 60
    # Its processes end on the SIGTERM: JAX's preemption service took it and they ran on until SIGKILL.
    assert "SIGTERM caught" not in hung.stderr, hung.stderr
    assert not _running(str(tmp_path / "run"))


@pytest.mark.parametrize(("sig", "code", "launch_says", "process_says"), [
    ("SIGTERM", 143, "launch stopped (SIGTERM)", "stopped by SIGTERM"),
    ("SIGINT", 130, "launch interrupted", "interrupted")])
def test_one_launched_process_has_its_devices_and_a_stop_is_passed_on_as_it_came(
        tmp_path: Path, sig: str, code: int, launch_says: str, process_says: str) -> None:
    """`--processes 1 --devices-per-process 4` is one process of 4 devices (it ran on 1: one process joins no
    cluster, and the count went with the cluster); SIGTERM to the launcher stops it as a shell reports (143), and
    a user's Ctrl-C (SIGINT) as 130, its process saying "interrupted", not "stopped by SIGTERM"."""
    cmd = [sys.executable, "-m", "shardbench", "launch", "--processes", "1", "--devices-per-process", "4", "--",
           "train", *MICRO, "--steps", "100000", "--out", str(tmp_path / "run"), "--data.cache-dir",
           str(tmp_path / "cache")]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)  # the suite may run with SIGINT ignored
    try:
        assert proc.stdout is not None
        header = proc.stdout.readline()
        assert header.startswith("[p0] shardbench:") and "(4 cpu device(s))" in header, header
        proc.send_signal(getattr(subprocess.signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code and f"{launch_says}; stopped all 1 processes" in err, err
    said = [line for line in err.splitlines() if line.startswith("[p0] shardbench:")]
    assert said and said[-1].startswith(f"[p0] shardbench: {process_says}"), err
    assert not (tmp_path / "run" / "summary.json").exists() and not _running(str(tmp_path / "run"))


def test_one_launched_process_refuses_more_devices_than_it_was_given(tmp_path: Path) -> None:
    """--devices 8 in a launch of one process of 4 devices trained on 8: --devices set the simulated count over
    the launcher's."""
    done = subprocess.run([sys.executable, "-m", "shardbench", "launch", "--processes", "1", "--devices-per-process",
                           "4", "--", "train", *MICRO, "--devices", "8", "--out", str(tmp_path / "run")],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--devices 8: only 4 cpu device(s) are available" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_glued_gloo_announcements_leave_every_line_whole() -> None:
    """gloo's threads write their connection lines in pieces that land inside other lines: each piece is taken
    out, keeping the line break after it, so the next line (of any process) starts a line of its own. The pieces
    of one split line ("[Gloo] Rank " before another line, "0 is connected to 7 peer ranks." after it) were
    printed."""
    import io

    from shardbench.launch import _pump

    out = io.BytesIO()
    source = io.BytesIO(b"[Gloo] Rank [Gloo] Rank 1 is connected to 7 peer ranks.\n2 is connected to 7 peer "
                        b"ranks. epoch 1 (step 2) | train loss 3.19\n[Gloo] Rank 3 is connected to 7 peer ranks.\n"
                        b"[Gloo] Rank Expected number of connected peer ranks is : 7\n0 is connected to 7 peer "
                        b"ranks.\ndone\n")
    _pump(source, out, b"[p1] ", None)
    assert out.getvalue().decode().splitlines(keepends=True) == [
        "[p1] epoch 1 (step 2) | train loss 3.19\n", "[p1] done\n"]


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "shardbench", "launch", "--processes", "2",
                               "--devices-per-process", "1", "--port", str(port), "--join-timeout", "20", "--",
                               "train", *MICRO, "--out", str(tmp_path / "run")], env=_env(), capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 5, done.stderr
    assert f"(is port {port} in use? launch --port 0 picks a free one)" in done.stderr, done.stderr


def test_a_run_of_several_processes_names_what_to_change_for_its_devices(monkeypatch) -> None:
    import jax

    from shardbench.devices import select_devices

    monkeypatch.setattr(jax, "process_count", lambda: 2)  # this process's 8 devices, counted as two processes'
    with pytest.raises(ConfigError, match="pass --devices 8 \\(or 0\\), or start more processes, or more devices"):
        select_devices(16)
    with pytest.raises(ConfigError, match="pass --devices 8 \\(or 0\\), or start fewer processes"):
        select_devices(4)


# Process 1 alone fails with an exception that is not one of shardbench's own (a file's permission, a bug), at the
# stage SHARDBENCH_TEST_FAULT names: `checking` is inside cluster.agree (the configuration and data checked by
# every process), `building` after it (the step built, where process 0 goes on into the first collective).
# It writes the time it failed into SHARDBENCH_TEST_FAULT_MARK.
FAULT_SITE = """
import os
import time
_stage = os.environ.get("SHARDBENCH_TEST_FAULT")


def _mark():
    with open(os.environ["SHARDBENCH_TEST_FAULT_MARK"], "w") as f:
        f.write(repr(time.time()))


if _stage and os.environ.get("SHARDBENCH_PROCESS_ID") == "1":
    if _stage == "checking":
        import shardbench.preflight as _module

        def check_run(*args, **kwargs):
            _mark()
            raise PermissionError(13, "Permission denied", "/data/train.npz")

        _module.check_run = check_run
    else:
        import shardbench.train.spmd as _module

        def make_steps(*args, **kwargs):
            _mark()
            raise RuntimeError("injected fault in process 1")

        _module.make_steps = make_steps
"""


def test_a_failure_one_process_relays_is_said_as_the_failing_processs() -> None:
    """Every process ends with the one that failed (cluster.agree): where another ended first, the launch named
    it as the one that failed ("process 0 of 2 failed: process 1 failed at checking: ...")."""
    from shardbench.launch import _failed

    assert _failed(0, 2, "process 1 failed at checking: bad file") == (
        "process 1 of 2 failed at checking: bad file (process 0 ended first, saying so)")
    assert _failed(1, 2, "process 1 failed at checking: bad file") == "process 1 of 2 failed at checking: bad file"
    assert _failed(1, 2, "killed by SIGKILL") == "process 1 of 2 failed: killed by SIGKILL"


@pytest.mark.parametrize("stage, code, said", [
    # the launch's line names process 1, whichever process ended first with its message
    ("checking", 6, r"^shardbench: error: process 1 of 2 failed( at checking)?: /data/train\.npz cannot be written "
                    r"or read \(permission denied\)"),
    ("building", 70, r"^shardbench: error: process 1 of 2 failed: internal error: RuntimeError: injected fault in "
                     r"process 1"),
])
def test_one_process_failing_with_any_exception_ends_the_run_at_once(tmp_path: Path, stage: str, code: int,
                                                                     said: str) -> None:
    """Both end within seconds of the fault: in `checking` every process stops with process 1's message (it used
    to wait the hour cluster.SLOW_STAGE_TIMEOUT_S allows, here the launch's 150 s); in `building` process 1 ends at
    once rather than waiting in JAX's shutdown barrier, so the launch sees it and stops process 0 (which used to
    fail on its own, 30 s later, when gloo gave up waiting for process 1)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAULT_SITE)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    out, mark = tmp_path / "run", tmp_path / "fault-time"
    failed = _launch(out, tmp_path / "cache", *STRATEGIES["dp"], timeout=150,
                     env={"PYTHONPATH": path, "SHARDBENCH_TEST_FAULT": stage, "SHARDBENCH_TEST_FAULT_MARK": str(mark)})
    ended = time.time()
    assert failed.returncode == code, failed.stdout[-2000:] + failed.stderr[-3000:]
    assert re.search(said, failed.stderr, re.M), failed.stderr[-3000:]
    assert ended - float(mark.read_text()) < 20
    assert "[p0] shardbench: internal error" not in failed.stderr
    assert not _running(str(out))
    assert not (out / "summary.json").exists()


def test_pmap_across_processes_is_refused_before_the_run_folder(tmp_path: Path) -> None:
    """pmap's program mapped over both processes' devices and its metrics were fetched as one process's arrays:
    the launch failed after the first step (internal error, exit 70) and left a run folder with config.json. It
    is refused by every process's checks, before anything compiles or is written."""
    out = tmp_path / "run"
    done = _launch(out, tmp_path / "cache", "--strategy", "dp", "--spmd", "pmap", timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("shardbench:")]
    assert len(lines) == 1 and ("--spmd pmap runs in one process, but this run has 2 processes: across processes "
                                "use --spmd jit or shard_map") in lines[0], done.stderr[-3000:]
    assert "internal error" not in done.stderr
    assert not (out / "config.json").exists() and not out.exists()


def test_unreachable_coordinator_fails_in_bounded_time_with_one_line(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    cmd = [sys.executable, "-m", "shardbench", "train", *MICRO, "--out", str(tmp_path / "run"),
           "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "1", "--join-timeout", "3"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 5
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("shardbench:")]
    assert len(lines) == 1 and f"process 1 could not join the run within 3 s: nothing answered at " \
                                 f"127.0.0.1:{port}" in lines[0]
    assert not (tmp_path / "run").exists()


def test_processes_with_different_configurations_all_stop(tmp_path: Path) -> None:
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "shardbench", "train", *MICRO, "--batch-size", batch, "--out", str(tmp_path / "run"),
         "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)],
        env=_env() | {cluster.ENV_LOCAL_DEVICES: "4"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, batch in enumerate(("32", "64"))]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 2
        assert "process 0 has train.batch_size=32 but process 1 has 64" in err
    assert not (tmp_path / "run").exists()


def test_processes_given_different_process_counts_all_stop(tmp_path: Path) -> None:
    """JAX keeps the coordinator's count: process 1 told of 3 processes where process 0 said 2 trained as one of
    2, and the mistake went unseen."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "shardbench", "train", *MICRO, "--out", str(tmp_path / "run"),
         "--coordinator", f"127.0.0.1:{port}", "--num-processes", count, "--process-id", str(i),
         "--join-timeout", "60"],
        env=_env() | {cluster.ENV_LOCAL_DEVICES: "4"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, count in enumerate(("2", "3"))]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 2, err
        assert "process 0 has --num-processes=2 but process 1 has 3" in err
    assert not (tmp_path / "run").exists()


def test_processes_with_unequal_devices_all_refuse_before_the_run_folder(tmp_path: Path) -> None:
    """Process 0 with 4 devices, process 1 with 2: process 0 failed with an internal error (a reshape of 6 devices
    into 2x4) after writing the run folder, and process 1 waited out its join timeout without its reason."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "shardbench", "train", *MICRO, "--batch-size", "48", "--out", str(tmp_path / "run"),
         "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i),
         "--join-timeout", "60"],
        env=_env() | {cluster.ENV_LOCAL_DEVICES: local}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, local in enumerate(("4", "2"))]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 2, err
        last = err.strip().splitlines()[-1]  # its own, or process 0's as it ("process 0 failed at checking: ...")
        assert last.startswith("shardbench: error: ") and last.endswith(
            "the 2 processes have unequal devices (4, 2): a mesh over them needs the same count in each; give "
            "every process the same (SHARDBENCH_LOCAL_DEVICES, or launch's --devices-per-process)"), err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------- joining flags, without a network
def test_cluster_resolution_from_flags_and_environment() -> None:
    env = {cluster.ENV_COORDINATOR: "10.0.0.1:1234", cluster.ENV_NUM_PROCESSES: "4", cluster.ENV_PROCESS_ID: "3"}
    c = cluster.resolve(environ=env)
    assert c is not None and (c.coordinator, c.num_processes, c.process_id) == ("10.0.0.1:1234", 4, 3)
    c = cluster.resolve("h:1", 2, 0, environ=env)  # flags win over the environment
    assert c is not None and (c.coordinator, c.num_processes, c.process_id) == ("h:1", 2, 0)
    assert cluster.resolve("h:1", 1, 0, environ={}) is None  # one process: nothing to join
    for args, words in ((("h:1", 2, None), "missing: --process-id"), (("h", 2, 0), "is not HOST:PORT"),
                        (("h:1", 2, 2), "--process-id 2 is out of range for 2 processes"),
                        (("h:1", 0, 0), "--num-processes must be at least 1")):
        with pytest.raises(ConfigError, match=words):
            cluster.resolve(*args, environ={})
    with pytest.raises(ConfigError, match="SHARDBENCH_NUM_PROCESSES must be an integer"):
        cluster.resolve(environ={cluster.ENV_COORDINATOR: "h:1", cluster.ENV_NUM_PROCESSES: "two"})


def test_local_devices_split_the_run_evenly() -> None:
    c = cluster.Cluster("h:1", 2, 0)
    assert cluster.local_device_count(c, 8) == 4
    assert cluster.local_device_count(cluster.Cluster("h:1", 2, 0, local_devices=3), 8) == 3
    with pytest.raises(ConfigError, match="--devices 7 does not split evenly over 2 processes"):
        cluster.local_device_count(c, 7)


@pytest.mark.parametrize("argv, words", [
    (["--", "sweep", "--preset", "strategies"], "launch runs train across processes, not 'sweep'"),
    (["--processes", "0", "--", "train"], "--processes must be at least 1"),
    ([], "launch needs the command to run after '--'"),
    (["--join-timeout", "0", "--", "train"], "--join-timeout must be a positive number of seconds, got 0"),
    (["--", "train", "--num-processes", "3", "--process-id=0"], "launch joins its processes itself: leave "
                                                                 "--num-processes, --process-id out of the command"),
    (["--timeout", "-1", "--", "train"], "--timeout must be 0 (no limit) or a finite number of seconds, got -1"),
])
def test_launch_rejects_bad_input_in_one_line(argv: list[str], words: str) -> None:
    done = subprocess.run([sys.executable, "-m", "shardbench", "launch", *argv], env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and words in done.stderr
