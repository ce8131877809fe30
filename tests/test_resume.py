"""Checkpoints: a run killed mid-way and resumed ends with exactly the parameters of an uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import QUICK_COMPILE_FLAGS

pytestmark = pytest.mark.slow  # every test here starts processes or trains for tens of seconds

# 178 images: 18 held out for validation, 160 train, 5 steps of 32 an epoch: 12 steps end epochs at 5 and 10 and
# cut the third short.
MICRO = ["--preset", "vit-tiny", "--data", "synthetic", "--data.synthetic-train", "178", "--data.synthetic-test",
         "128", "--model.patch-size", "8", "--model.embed-dim", "32", "--model.num-layers", "2",
         "--model.mlp-dim", "64", "--dropout", "0.1", "--batch-size", "32", "--steps", "12",
         "--train.checkpoint-every", "4", "--train.log-every", "1", "--no-train.progress", "--no-train.eval",
         "--devices", "8", "--strategy", "fsdp"]


def _train(out: Path, cache: Path, *extra: str, kill_at: int | None = None,
           signal_name: str = "KILL") -> subprocess.CompletedProcess:
    # Its own devices, and the quick compilation of this process (tests/conftest.py): every run here compiles alike.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "JAX_PLATFORMS": "cpu", "XLA_FLAGS": QUICK_COMPILE_FLAGS}
    if kill_at is not None:
        env["SHARDBENCH_FAULT_KILL_AT_STEP"] = str(kill_at)
        env["SHARDBENCH_FAULT_KILL_SIGNAL"] = signal_name
    cmd = [sys.executable, "-m", "shardbench", "train", *MICRO, "--out", str(out),
           "--data.cache-dir", str(cache), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _final_params(out: Path) -> dict:
    steps = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    restored = ocp.StandardCheckpointer().restore((out / "checkpoints" / str(steps[-1]) / "default").absolute())
    return {"step": steps[-1], "params": restored["params"]}


def test_resume_after_a_kill_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    whole = _train(tmp_path / "whole", tmp_path / "cache")
    assert whole.returncode == 0, whole.stderr

    killed = _train(tmp_path / "killed", tmp_path / "cache", kill_at=10)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (tmp_path / "killed" / "summary.json").exists()  # an interrupted run never looks complete
    # Saves are asynchronous and one waits for the previous: step 4's is final by the time step 8's starts;
    # step 8's may have been cut short by the kill at step 10, in which case orbax never finalised it.
    kept = sorted(int(p.name) for p in (tmp_path / "killed" / "checkpoints").iterdir() if p.name.isdigit())
    assert kept in ([4], [4, 8]), kept

    again = _train(tmp_path / "killed", tmp_path / "cache")
    assert again.returncode == 2 and "already holds a run: pass --resume" in again.stderr
    other = _train(tmp_path / "killed", tmp_path / "cache", "--resume", "--lr", "0.5")
    assert other.returncode == 2
    assert "was trained with optim.lr=0.001, not 0.5" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1

    # A checkpoint the kill left half-written (orbax's N.orbax-checkpoint-tmp, made here for step 12 whatever the
    # kill cut short): said in shardbench's words, not orbax's raw "WARNING:absl:... not finalized" as it replaces it.
    shutil.copytree(tmp_path / "killed" / "checkpoints" / "4", tmp_path / "killed" / "checkpoints" /
                    "12.orbax-checkpoint-tmp")
    resumed = _train(tmp_path / "killed", tmp_path / "cache", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    said = [line for line in resumed.stdout.splitlines() if "half-written" in line]
    assert len(said) == 1 and said[0].startswith("shardbench: --resume: the checkpoint") and "12 " in said[0], said
    assert "not finalized" not in resumed.stderr and "WARNING:absl" not in resumed.stderr, resumed.stderr[-2000:]
    assert not (tmp_path / "killed" / "checkpoints" / "12.orbax-checkpoint-tmp").exists()
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["resumed_from"] == kept[-1]  # the newest the kill left finished
    assert f"shardbench: --resume: resuming from step {summary['resumed_from']} of 12" in resumed.stdout
    _check_the_resumed_epochs(tmp_path / "whole", summary)

    # Resuming a run that has finished trains nothing and keeps its record.
    before = (tmp_path / "killed" / "summary.json").read_text()
    again = _train(tmp_path / "killed", tmp_path / "cache", "--resume")
    assert again.returncode == 0 and "nothing to resume" in again.stdout
    assert (tmp_path / "killed" / "summary.json").read_text() == before

    # A run that trained every step but whose record is unreadable (or was never written: stopped after its
    # final checkpoint) trains its last steps again from the checkpoint before, to time them; it was written as
    # a complete record of no steps, no epochs and no step time.
    (tmp_path / "killed" / "summary.json").write_text(before[: len(before) // 2])
    again = _train(tmp_path / "killed", tmp_path / "cache", "--resume")
    assert again.returncode == 0, again.stderr
    assert ("is unreadable; training its last steps again from the last checkpoint before step 12 that restores "
            "(step 8 or earlier)") in again.stdout
    redone = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert redone["resumed_from"] == 8 and redone["measurements"]["step_time_s"]["median"] > 0
    _check_the_resumed_epochs(tmp_path / "whole", redone)

    # Its logs hold each step once, as the uninterrupted run's do: what was logged past the checkpoint before the
    # kill (twice resumed: from step 4 or 8, then 8) is dropped from metrics.jsonl, and TensorBoard, told where
    # the run restarted, shows the new rows only.
    assert _logged_losses(tmp_path / "killed") == _logged_losses(tmp_path / "whole")
    assert _tensorboard_losses(tmp_path / "killed") == _tensorboard_losses(tmp_path / "whole")

    a, b = _final_params(tmp_path / "whole"), _final_params(tmp_path / "killed")
    assert a["step"] == b["step"] == 12
    flat_a = dict(_flatten(a["params"]))
    flat_b = dict(_flatten(b["params"]))
    assert flat_a.keys() == flat_b.keys()
    for key in flat_a:
        np.testing.assert_array_equal(np.asarray(flat_a[key]), np.asarray(flat_b[key]), err_msg=key)


def test_sigterm_stops_the_run_as_ctrl_c_does_and_it_resumes_to_the_same_result(tmp_path: Path) -> None:
    """SIGTERM, as a scheduler preempts a job or scancel ends one: the run stops in one line, exit 143, with the
    checkpoint it had begun (step 8's, begun two steps before) written whole. Its default ended the process
    silently (exit -15), the save in flight left unfinished."""
    whole = _train(tmp_path / "whole", tmp_path / "cache")
    assert whole.returncode == 0, whole.stderr
    stopped = _train(tmp_path / "stopped", tmp_path / "cache", kill_at=10, signal_name="TERM")
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    # the one line says the way on: this folder's last checkpoint, step 8
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"shardbench: stopped by SIGTERM; the same command with --resume --out {tmp_path / 'stopped'} goes on from "
        f"the checkpoint of step 8")
    assert not (tmp_path / "stopped" / "summary.json").exists()
    assert sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir()) == ["4", "8"]
    resumed = _train(tmp_path / "stopped", tmp_path / "cache", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((tmp_path / "stopped" / "summary.json").read_text())["resumed_from"] == 8
    # its time and step statistics are this invocation's, and the last line says how many steps they cover
    done = resumed.stdout.strip().splitlines()[-1]
    assert done.startswith("done: ") and ": 12 steps (4 after resuming from step 8) on 8 device(s)" in done, done
    assert ": 12 steps on 8 device(s)" in whole.stdout.strip().splitlines()[-1]
    a, b = _final_params(tmp_path / "whole"), _final_params(tmp_path / "stopped")
    for key, value in dict(_flatten(a["params"])).items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(dict(_flatten(b["params"]))[key]), err_msg=key)
    # With checkpoints off, the line says there is no checkpoint to resume from, and how to start again: with
    # --resume, as the folder holds the run's records (it said "the same command", which then refused: "already
    # holds a run: pass --resume").
    bare = _train(tmp_path / "bare", tmp_path / "cache", "--train.checkpoint-every", "0", kill_at=3,
                  signal_name="TERM")
    assert bare.returncode == 143 and bare.stderr.strip().splitlines()[-1] == (
        f"shardbench: stopped by SIGTERM; no checkpoint to resume from: --train.checkpoint-every 0 writes one only "
        f"at the end; the same command with --resume --out {tmp_path / 'bare'} starts it from step 0"
    ), bare.stderr[-2000:]
    assert "already holds a run: pass --resume" in _train(tmp_path / "bare", tmp_path / "cache").stderr
    again = _train(tmp_path / "bare", tmp_path / "cache", "--train.checkpoint-every", "0", "--resume")
    assert again.returncode == 0 and json.loads((tmp_path / "bare" / "summary.json").read_text())["resumed_from"] == 0


def _logged_losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


def _tensorboard_losses(run: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))  # every event file of the folder, in order, as TensorBoard
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


def _check_the_resumed_epochs(whole: Path, resumed: dict) -> None:
    """Every epoch is in the resumed record: those finished before the resume as its checkpoint carried them, and
    the one the resume cut into with the running sums its checkpoint carried. Each epoch's train metrics are the
    means over all its steps, as the uninterrupted run's are, counted from that run's log of every step
    (--train.log-every 1), and neither record marks an epoch as covering part of it."""
    uncut = json.loads((whole / "summary.json").read_text())["epochs"]
    assert [e["step"] for e in resumed["epochs"]] == [e["step"] for e in uncut] == [5, 10, 12]
    logged = [json.loads(line) for line in (whole / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in logged if "train/loss" in r}
    for first, epoch, plain in zip((1, 6, 11), resumed["epochs"], uncut):
        assert not {"from_step", "train_steps"} & (epoch.keys() | plain.keys())
        for name in ("loss", "accuracy", "grad_norm"):
            everything = [by_step[step][f"train/{name}"] for step in range(first, plain["step"] + 1)]
            mean = sum(everything) / len(everything)
            assert plain[f"train_{name}"] == pytest.approx(mean, rel=1e-12), name
            assert epoch[f"train_{name}"] == pytest.approx(mean, rel=1e-12), (name, epoch["step"])


def _flatten(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    items: list[tuple[str, object]] = []
    for k, v in tree.items():
        items += _flatten(v, f"{prefix}{k}/") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return items


def test_resume_before_the_first_checkpoint_says_it_starts_over(tmp_path: Path) -> None:
    """Killed at step 2, before the first checkpoint (step 4): --resume says there is none and trains from 0."""
    killed = _train(tmp_path / "run", tmp_path / "cache", kill_at=2)
    assert killed.returncode == -signal.SIGKILL
    resumed = _train(tmp_path / "run", tmp_path / "cache", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "holds no finished checkpoint (the run stopped before its first); training from step 0" in resumed.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["resumed_from"] == 0


OWN = '''
from flax import nnx

WIDTH = 48


class Net(nnx.Module):
    def __init__(self, cfg, rngs):
        self.a = nnx.Linear(cfg.model.input_dim, WIDTH, rngs=rngs)
        self.b = nnx.Linear(WIDTH, cfg.model.num_classes, rngs=rngs)

    def __call__(self, x):
        return self.b(nnx.relu(self.a(x)))


def build(cfg, rngs):
    return Net(cfg, rngs)
'''


def _train_own(model: Path, out: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "shardbench", "train", "--model", f"{model}:build", "--task", "regress", "--data",
           "regression", "--data.synthetic-train", "256", "--data.synthetic-test", "64", "--model.input-dim", "16",
           "--batch-size", "32", "--steps", "2", "--train.checkpoint-every", "1", "--no-train.eval",
           "--no-train.progress", "--devices", "1", "--mesh", "none", "--out", str(out), "--data.cache-dir",
           str(cache), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("edit", "says"), [
    ("WIDTH = 64", "was trained with params/a/bias of shape (48,);"),
    ("WIDTH = 48  # the same shapes, other code", "changed since"),
], ids=["shape-changed", "code-changed"])
def test_resume_after_editing_the_models_file_is_refused_in_one_line(tmp_path: Path, edit: str, says: str) -> None:
    """A model of your own is resumed only from the file it was trained with: a width changed (the checkpoints
    no longer fit) or code changed with the same shapes stops with one line and exit 2, the checkpoints kept."""
    model, out, cache = tmp_path / "mine.py", tmp_path / "run", tmp_path / "cache"
    model.write_text(OWN)
    assert _train_own(model, out, cache).returncode == 0
    (out / "summary.json").unlink()  # as if it had stopped after its last checkpoint
    before = _tree(out)
    model.write_text(OWN.replace("WIDTH = 48", edit))
    resumed = _train_own(model, out, cache, "--resume")
    lines = resumed.stderr.strip().splitlines()
    assert resumed.returncode == 2 and len(lines) == 1, resumed.stderr
    assert lines[0].startswith("shardbench: error: --resume: ") and says in lines[0], lines[0]
    assert "damaged" not in lines[0] and "Traceback" not in resumed.stdout + resumed.stderr
    assert _tree(out) == before


def test_a_checkpoint_of_other_shapes_is_a_changed_model_not_damage(tmp_path: Path) -> None:
    """A run whose model.json is missing (a run from before it was written) falls back on the checkpoint's own
    shapes: one line naming the array, not the damaged-checkpoint advice, and no orbax traceback."""
    model, out, cache = tmp_path / "mine.py", tmp_path / "run", tmp_path / "cache"
    model.write_text(OWN)
    assert _train_own(model, out, cache).returncode == 0
    (out / "summary.json").unlink()
    (out / "model.json").unlink()
    model.write_text(OWN.replace("WIDTH = 48", "WIDTH = 64"))
    resumed = _train_own(model, out, cache, "--resume")
    errors = [line for line in resumed.stderr.splitlines() if "error" in line]
    assert resumed.returncode == 2, resumed.stderr
    assert len(resumed.stderr.strip().splitlines()) == 1 and "Traceback" not in resumed.stderr, resumed.stderr
    assert len(errors) == 1 and "of shape (48,), the model now (64,)" in errors[0], errors
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["1", "2"]


def test_a_checkpoint_carries_its_epoch_sums_and_older_ones_restore_without(tmp_path: Path) -> None:
    """`save` with sums restores them beside the state; a checkpoint written as shardbench wrote them before the
    sums (one unnamed orbax item) restores its state with no sums, so its resumed epoch is marked as part."""
    import jax.numpy as jnp

    from shardbench.train.checkpoint import Checkpoints
    from shardbench.train.state import TrainState

    state = TrainState(jnp.array(3), {"w": jnp.arange(4.0)}, {})
    old = ocp.CheckpointManager((tmp_path / "c").absolute(), options=ocp.CheckpointManagerOptions(create=True))
    old.save(2, args=ocp.args.StandardSave(TrainState(jnp.array(2), state.params, {})))
    old.wait_until_finished()
    old.close()
    checkpoints = Checkpoints(tmp_path / "c", keep=3)
    checkpoints.save(state, {"sums": {"loss": 4.5}, "count": 3})
    checkpoints.wait()
    restored = checkpoints.restore_good(state, 3)
    assert restored.step == 3 and restored.meter == {"sums": {"loss": 4.5}, "count": 3}
    np.testing.assert_array_equal(restored.state.params["w"], np.arange(4.0))
    older = checkpoints.restore(state, 2)
    assert older.meter is None and int(older.state.step) == 2
    checkpoints.close()


def test_a_checkpoint_holds_the_sums_it_was_given_though_they_change_while_it_writes(tmp_path: Path) -> None:
    """The write finishes in the background while training goes on and the epoch's meter takes the next steps'
    metrics: the checkpoint holds the sums of its own step, not a later one's (a resumed epoch counted a step
    twice when it did)."""
    import jax.numpy as jnp

    from shardbench.train.checkpoint import Checkpoints
    from shardbench.train.hooks import EpochMeter, Metrics
    from shardbench.train.state import TrainState

    meter = EpochMeter()
    for loss in (1.0, 2.0, 3.0):
        meter.add({"loss": loss})
    metrics = Metrics(lambda step: None, lambda: "", meter)
    metrics.epochs.append({"step": 1, "train_loss": 0.5})
    checkpoints = Checkpoints(tmp_path / "c", keep=3)
    state = TrainState(jnp.array(8), {"w": jnp.arange(4.0)}, {})
    checkpoints.save(state, metrics.carried())
    meter.add({"loss": 4.0})  # the steps after the checkpoint, as the loop goes on at once
    metrics.epochs.append({"step": 9, "train_loss": 9.0})
    checkpoints.wait()
    restored = checkpoints.restore_good(state, 8)
    assert restored.meter == {"sums": {"loss": 6.0}, "count": 3, "epochs": [{"step": 1, "train_loss": 0.5}]}
    checkpoints.close()


def test_a_partly_damaged_checkpoint_leaves_no_orbax_traceback_behind(tmp_path: Path) -> None:
    """orbax reads a checkpoint's arrays concurrently and gives up at the first damaged one: the reads still in
    flight then ended in its closed event loop, and Python printed each ("Event loop is closed", the damaged
    array again) under the line naming the damage, while training went on from the checkpoint before."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SHARDBENCH_DEBUG")} | {
        "JAX_PLATFORMS": "cpu", "XLA_FLAGS": QUICK_COMPILE_FLAGS}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "shardbench", "train", "--preset", "mlp-small", "--model.num-layers", "4",
           "--steps", "6", "--train.checkpoint-every", "2", "--train.keep-checkpoints", "3", "--devices", "1",
           "--mesh", "none", "--no-train.progress", "--no-train.eval", "--out", str(out),
           "--data.cache-dir", str(tmp_path / "cache")]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    (out / "summary.json").unlink()
    # 64 KiB of zeros a quarter into step 4's largest file: one array of many no longer reads
    biggest = max((p for p in (out / "checkpoints" / "4").rglob("d/*")), key=lambda p: p.stat().st_size)
    with biggest.open("r+b") as f:
        f.seek(biggest.stat().st_size // 4)
        f.write(bytes(65536))
    resumed = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "the checkpoint of step 4" in resumed.stderr and "resuming from step 2" in resumed.stderr
    assert "Traceback" not in resumed.stderr and "Exception ignored" not in resumed.stderr, resumed.stderr
