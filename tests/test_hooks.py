"""The loop's hooks and its clock: hooks run in the order of their declared phase, and a step in which a
checkpoint or an epoch's end with evaluation ran is left out of the step times by the loop; an epoch's end
without evaluation is as light as logging, and its steps stay timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.measure.timing import StepTimer
from shardbench.train import hooks
from shardbench.train.loop import run


def test_hooks_due_after_a_step_run_in_the_order_of_their_phase() -> None:
    ran: list[str] = []
    state = hooks.LoopState(total=8, per_epoch=4, metrics=hooks.Metrics(lambda step: None, lambda: ""), state=None,
                            done=4)
    schedule = [  # declared out of order on purpose: the phase, not the list, decides
        hooks.Every(lambda r: ran.append("epoch"), hooks.Phase.EPOCH_END, epoch_end=True),
        hooks.Every(lambda r: ran.append("checkpoint"), hooks.Phase.CHECKPOINT, steps=2),
        hooks.Every(lambda r: ran.append("log"), hooks.Phase.LOG, steps=1),
        hooks.Every(lambda r: ran.append("never"), hooks.Phase.CHECKPOINT, steps=3),
    ]
    phases = [every.phase for every in hooks.run_due(schedule, state)]
    assert ran == ["log", "epoch", "checkpoint"]
    assert phases == [hooks.Phase.LOG, hooks.Phase.EPOCH_END, hooks.Phase.CHECKPOINT]


def test_steps_with_a_checkpoint_or_an_epoch_end_are_not_timed_as_training_steps(
        micro, monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 steps of 4 per epoch (130 training examples after the validation split): checkpoints after steps 3, 6 and 9 (the last step's is written after the loop),
    # epoch ends (evaluation) after 4, 8 and 12. Step k's interval ends when its results arrive; a hook that ran
    # after step k lands in step k + 1's, so steps 4, 7, 10 (checkpoints) and 5, 9 (epoch ends) are left out,
    # besides the warm-up's 2 and 3. Logging every step is part of training and stays timed.
    cfg = micro(**{"train.steps": 12, "data.synthetic_train": 144, "train.checkpoint_every": 3, "train.eval": True,
                   "train.timing_warmup": 2, "train.log_every": 1})
    # Which steps the run's timer left out, seen as it decides (its own `completed`, unchanged, watched).
    excluded: list[int] = []
    completed = StepTimer.completed

    def watched(timer: StepTimer, step: int) -> None:
        before = timer.excluded
        completed(timer, step)
        if timer.excluded > before:
            excluded.append(step)

    monkeypatch.setattr(StepTimer, "completed", watched)
    summary = run(cfg)
    assert [e["step"] for e in summary["epochs"]] == [4, 8, 12]
    times = json.loads((Path(cfg.train.out) / "summary.json").read_text())["measurements"]["step_time_s"]
    left_out = {4, 7, 10} | {5, 9}
    assert sorted(excluded) == sorted({2, 3} | left_out)
    assert times["excluded_steps"] == 2 + len(left_out)
    assert times["measured_steps"] == 11 - 2 - len(left_out)


def test_an_epoch_end_without_evaluation_leaves_its_steps_timed(micro) -> None:
    """One step per epoch and no evaluation: every step ends an epoch, whose hook only records its time and writes
    a line, as logging does. The steps stay timed (all 6 but the warm-up's 2), not every one left out."""
    cfg = micro(**{"train.steps": 6, "data.synthetic_train": 40, "train.batch_size": 32, "train.eval": False,
                   "train.timing_warmup": 2, "train.checkpoint_every": 0})
    summary = run(cfg)
    assert [e["step"] for e in summary["epochs"]] == [1, 2, 3, 4, 5, 6]
    times = summary["measurements"]["step_time_s"]
    assert times["excluded_steps"] == 2 and times["measured_steps"] == 5 - 2


def test_an_epoch_a_resume_cut_into_says_its_train_metrics_cover_only_the_steps_trained_since() -> None:
    """Resumed from step 6 of 7 per epoch: epoch 1's train means are over step 7 alone (the killed process took the
    sums of steps 1-6 with it), and its record and line say so, not pass it off as the epoch's; epoch 2, trained
    whole here, is unmarked, and so is an epoch --steps cuts short at its end (trained from its first step)."""
    from shardbench.train.events import ScalarWriter

    lines: list[str] = []
    bar = type("Bar", (), {"write": staticmethod(lines.append)})()
    end = hooks.EpochEnd(None, ScalarWriter(Path("."), enabled=False), bar, show=True)
    run = hooks.LoopState(total=16, per_epoch=7, metrics=hooks.Metrics(lambda step: None, lambda: ""), state=None,
                          start=6)
    schedule = [hooks.Every(end, hooks.Phase.EPOCH_END, epoch_end=True)]
    for step in range(7, 17):
        run.done = step
        run.metrics.push(step, {"loss": float(step), "grad_norm": 1.0})
        hooks.run_due(schedule, run)
    first, second, cut = run.metrics.epochs
    assert (first["step"], first["train_loss"], first["from_step"], first["train_steps"]) == (7, 7.0, 7, 1)
    assert lines[0].endswith("| train metrics over step 7 only (resumed from step 6)"), lines[0]
    assert second["step"] == 14 and second["train_loss"] == sum(range(8, 15)) / 7
    assert cut["step"] == 16 and cut["train_loss"] == 15.5
    assert not {"from_step", "train_steps"} & (second.keys() | cut.keys())
    assert "train metrics over" not in lines[1] + lines[2]
    assert hooks.part_note({"from_step": 4, "step": 7}) == " | train metrics over steps 4-7 only (resumed from step 3)"


def test_a_checkpoints_epoch_sums_make_a_resumed_epochs_means_whole() -> None:
    """Steps 1-6 of 7 trained by a process that stopped, its checkpoint of step 6 carrying the epoch's sums: the
    resumed epoch's train loss is the mean over steps 1-7, unmarked. Sums that are not exactly steps 1-6 of the
    checkpoint's epoch (another count, a checkpoint at an epoch's end, none saved) are not taken."""
    from shardbench.train.events import ScalarWriter

    before = hooks.EpochMeter()
    for step in range(1, 7):
        before.add({"loss": float(step), "grad_norm": 1.0})
    saved = before.saved()
    lines: list[str] = []
    bar = type("Bar", (), {"write": staticmethod(lines.append)})()
    end = hooks.EpochEnd(None, ScalarWriter(Path("."), enabled=False), bar, show=True)
    meter = hooks.EpochMeter.resumed(saved, 6, per_epoch=7)
    run = hooks.LoopState(total=7, per_epoch=7, metrics=hooks.Metrics(lambda step: None, lambda: "", meter),
                          state=None, start=6)
    run.done = 7
    run.metrics.push(7, {"loss": 7.0, "grad_norm": 1.0})
    hooks.run_due([hooks.Every(end, hooks.Phase.EPOCH_END, epoch_end=True)], run)
    [epoch] = run.metrics.epochs
    assert epoch["train_loss"] == sum(range(1, 8)) / 7 and epoch["train_grad_norm"] == 1.0
    assert "from_step" not in epoch and "train metrics over" not in lines[0]
    for wrong in ({"sums": saved["sums"], "count": 5}, None):
        assert hooks.EpochMeter.resumed(wrong, 6, per_epoch=7).count == 0
    assert hooks.EpochMeter.resumed({"sums": {"loss": 28.0}, "count": 7}, 7, per_epoch=7).count == 0
    assert hooks.EpochMeter.resumed({"sums": {"loss": 8.0}, "count": 1}, 8, per_epoch=7).sums == {"loss": 8.0}


def test_logging_a_step_does_not_wait_for_it(tmp_path: Path) -> None:
    """Log due after every step: the step it logs stays in flight (nothing waits for its results) and its scalars
    are written when they arrive, at the next step's dispatch, with that step's number and loss, not the next's.
    A hook of a later phase (a checkpoint) still runs on a settled step, after that step's log line."""
    from shardbench.train.events import ScalarWriter

    arrived: list[int] = []
    bar = type("Bar", (), {"set_postfix": staticmethod(lambda *a, **k: None)})()
    writer = ScalarWriter(tmp_path)
    run = hooks.LoopState(total=4, per_epoch=4, metrics=hooks.Metrics(arrived.append, lambda: ""), state=None)

    def lines() -> list[dict[str, float]]:
        return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    seen_by_checkpoint: list[list[int]] = []
    schedule = [hooks.Every(hooks.Log(writer, bar, 8, "images"), hooks.Phase.LOG, steps=1),
                hooks.Every(lambda r: seen_by_checkpoint.append([line["step"] for line in lines()]),
                            hooks.Phase.CHECKPOINT, steps=3)]
    for step in (1, 2):
        run.done = step
        run.metrics.push(step, {"loss": 10.0 * step, "grad_norm": 1.0})
        hooks.run_due(schedule, run)
        assert arrived == list(range(1, step)), "logging waited for the step it logs"
        assert [line["step"] for line in lines()] == list(range(1, step))
    run.done = 3
    run.metrics.push(3, {"loss": 30.0, "grad_norm": 1.0})
    hooks.run_due(schedule, run)  # the checkpoint settles step 3: its log line comes first
    assert arrived == [1, 2, 3] and seen_by_checkpoint == [[1, 2, 3]]
    assert [(line["step"], line["train/loss"]) for line in lines()] == [(1, 10.0), (2, 20.0), (3, 30.0)]
    writer.close()


def _interrupted_after(cfg, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Train `cfg` in this process and stop it with Ctrl-C as the loop fetches the batch of step `steps` + 1."""
    import dataclasses
    from collections.abc import Iterator

    import pytest

    from shardbench.train.build import build_run
    from shardbench.train.loop import train

    built = build_run(cfg)

    def interrupted(batches: Iterator[object]) -> Iterator[object]:
        for _ in range(steps):
            yield next(batches)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(dataclasses.replace(built, batches=interrupted(built.batches)))


def test_a_run_stopped_by_an_error_keeps_the_line_of_the_step_it_logged_last(micro) -> None:
    """An interrupt while the loop fetches step 4's batch: step 3 was logged and still in flight (logging does not
    wait for it), and its line is written before the interrupt goes on up, as it was when logging waited."""
    cfg = micro(**{"train.steps": 6, "train.log_every": 1})
    _interrupted_after(cfg, 3)
    lines = (Path(cfg.train.out) / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_an_epoch_the_run_ends_inside_says_how_many_of_its_steps_it_trained(micro, capsys) -> None:
    """--steps 20 at 16 steps an epoch: epoch 2's line ("epoch 2 (step 20)") averaged 4 steps and read as a whole
    epoch; its note says 4 of its 16. A whole epoch, and the run's last step at an epoch's end, say nothing."""
    from shardbench.train.hooks import LoopState, cut_note

    def at(done: int, total: int) -> str:
        return cut_note(LoopState(total=total, per_epoch=16, metrics=None, state=None, done=done))

    assert at(20, 20) == " | 4 of its 16 steps: the run ends inside this epoch"
    assert at(16, 20) == at(32, 32) == at(16, 16) == ""
    run(micro(**{"train.steps": 18}))  # 460 training examples (512 less validation) in batches of 32: 14 an epoch
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert [line.split(" |")[0] for line in lines] == ["epoch 1 (step 14)", "epoch 2 (step 18)"]
    assert lines[1].endswith(" | 4 of its 14 steps: the run ends inside this epoch") and "of its" not in lines[0]


def test_a_resume_from_a_checkpoint_at_an_epochs_end_keeps_that_epoch_in_the_record(micro) -> None:
    """Checkpoints every 4 steps at 4 steps an epoch: the checkpoint of step 4 comes at epoch 1's end. Stopped
    after step 6 and resumed from step 4, the record held epochs [2, 3]: epoch 1 had ended before the resume,
    but its checkpoint was written before its record was made, so it carried none. The resumed record holds
    every epoch, as the uninterrupted run's does."""
    import pytest

    from shardbench.parsing import override

    # 144 synthetic images, 16 held out for validation: 128 train, 4 steps of 32 an epoch.
    settings = {"train.steps": 12, "data.synthetic_train": 144, "train.checkpoint_every": 4, "train.eval": True}
    whole = run(micro(**settings, **{"train.out": micro().train.out + "-whole"}))
    cfg = micro(**settings)
    _interrupted_after(cfg, 6)
    resumed = run(override(cfg, {"train.resume": True}))
    assert resumed["resumed_from"] == 4
    assert [e["step"] for e in resumed["epochs"]] == [e["step"] for e in whole["epochs"]] == [4, 8, 12]
    for mine, theirs in zip(resumed["epochs"], whole["epochs"]):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-6)
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-6)
