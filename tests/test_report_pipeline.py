"""The report on pipeline stages (`shardbench.report.pipeline`): the measured bubble against a one-stage run at
the same microbatch size, by hand-counted step times; the stage-to-stage transfers; and the memory each layout
holds, per schedule and microbatch count. Hand-made records in a real store, written by the real report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardbench.report.write import write_report
from shardbench.store import Store
from test_report import markdown_table, record, row

MIB = 2**20


def _run(name: str, strategy: str, devices: int, step_ms: float, breakdown: tuple[float, float, float, float],
         stages: int | None = None, microbatches: int = 0, per_shard: int = 64,
         transfers: tuple[int, float] = (0, 0.0), sent: float | None = None, mesh: str = "") -> Any:
    """A run of `mlp` at batch 64 (one data shard where it pipelines): `stages` and `microbatches` as the record
    of a pipeline writes them, with GPipe's formula. `transfers`: the permutes' executions and payload (MiB);
    `sent`: the MiB the fullest device sends in them (None: a record written before bytes sent were kept)."""
    mesh = mesh or (f"stage={stages}" if stages else str(devices))
    staged = bool(stages and stages > 1)
    rec = record(name, strategy, mesh, devices, breakdown=breakdown, total=sum(breakdown) + 1.0,
                 comms={"collective-permute": (transfers[0], transfers[1])} if staged else {},
                 sent={"collective-permute": sent} if staged and sent is not None else None,
                 epochs=[1.0], step_ms=step_ms, img_s=64 / step_ms * 1e3, mfu=None, acc=0.1)
    m = rec["measurements"]
    m.update(global_batch=64, grad_accum=1, microbatch=64, microbatch_per_shard=per_shard)
    if stages:
        m.update(pipeline_stages=stages, pipeline_microbatches=microbatches,
                 pipeline_bubble=(stages - 1) / (microbatches + stages - 1),
                 pipeline_transfers={"count": transfers[0], "bytes": int(transfers[1] * MIB)}
                 | ({} if sent is None else {"sent_bytes": int(sent * MIB)}))
    overrides = {"parallel.strategy": strategy, "parallel.devices": devices, "parallel.mesh": mesh,
                 "model.kind": "mlp", "train.batch_size": 64}
    if stages:
        overrides |= {"parallel.microbatches": microbatches, "parallel.schedule": "gpipe"}
    return row(name, overrides, rec)


def _write(tmp_path: Path, sent: float | None = 0.75) -> str:
    """The sweep's report. Its pipelines' permutes have a payload of 1 MiB per device, of which the fullest device
    sends `sent` MiB (the others send less: a permute is sent by its source devices alone); None: records written
    before bytes sent were kept."""
    rows = [
        _run("dp", "dp", 8, 100.0, (8.0, 16.0, 8.0, 10.0)),
        # 4 stages: a quarter of the stacked parameters each (here all of them, for round numbers).
        _run("pp_m8", "pp", 4, 500.0, (2.0, 4.0, 2.0, 6.0), stages=4, microbatches=8, transfers=(33, 1.0),
             sent=sent),
        _run("pp_m16", "pp", 4, 450.0, (2.0, 4.0, 2.0, 4.0), stages=4, microbatches=16, transfers=(57, 1.0),
             sent=sent),
        _run("pp_m32", "pp", 4, 400.0, (2.0, 4.0, 2.0, 3.0), stages=4, microbatches=32, transfers=(105, 1.0),
             sent=sent),
        # The one-stage references: 8 rows per microbatch (64 / 8) and 4 (64 / 16); none for M = 32 (2 rows).
        _run("one_m8", "pp", 1, 1000.0, (8.0, 16.0, 8.0, 12.0), stages=1, microbatches=8),
        _run("one_m16", "pp", 1, 1200.0, (8.0, 16.0, 8.0, 9.0), stages=1, microbatches=16),
    ]
    with Store(tmp_path / "sweep" / "sweep.db") as store:
        for r in rows:
            store.add(r)
    return write_report(tmp_path / "sweep").markdown.read_text()


def test_the_measured_bubble_is_one_minus_the_split_one_stage_time_over_the_step(tmp_path: Path) -> None:
    """By hand: M = 8 on 4 stages, one-stage run 1000 ms for the same 8 microbatches: ideal 1000 / 4 = 250 ms,
    measured 1 - 250 / 500 = 50.0%, formula 3 / 11 = 27.3%. M = 16: ideal 1200 / 4 = 300 ms, 1 - 300 / 450 =
    33.3%, formula 3 / 19 = 15.8%. M = 32 has no one-stage run at its microbatch size: no measured figure."""
    text = _write(tmp_path)
    table = {r["run"]: r for r in markdown_table(text.split("## Runs")[1].split("\n\n")[1])}
    assert (table["pp_m8"]["bubble % formula"], table["pp_m8"]["bubble % measured"]) == ("27.3", "50.0")
    assert (table["pp_m16"]["bubble % formula"], table["pp_m16"]["bubble % measured"]) == ("15.8", "33.3")
    assert (table["pp_m32"]["bubble % measured"], table["dp"]["bubble % formula"]) == ("–", "–")
    assert table["one_m8"]["bubble % measured"] == "–"
    assert ("mlp pp on 4 stages, gpipe, M=8: bubble by the schedule's formula 27.3%, measured 50.0% (step 500.0 ms "
            "against the ideal 250.0 ms: the one-stage run's 1,000.0 ms x 8/8 microbatches / 4 stages, one_m8)") in text
    assert "M=16: bubble by the schedule's formula 15.8%, measured 33.3%" in text
    # Simulated devices: the stages share the host's cores, so the figure is not the bubble; the time ratio
    # (500 / 1000) beside the program's work ((8 + 3) / 8).
    assert "it took 0.50x the one-stage step for the same microbatches, where its program computes 1.38x" in text
    assert "share its cores, so the stages cannot all compute at the same time" in text
    assert ("No one-stage run of the same model at the same microbatch size, splitting each layer alike, to measure "
            "the bubble of pp_m32") in text


def test_the_stage_transfers_are_what_the_fullest_device_sends(tmp_path: Path) -> None:
    """The stage-to-stage column and sentence give the bytes the fullest device sends (0.75 MiB), as the record's
    sent_bytes and the comms total do, not the permutes' payload (1 MiB on every device); a record written before
    bytes sent were kept gives its payload, marked as one."""
    text = _write(tmp_path / "sent")
    table = {r["run"]: r for r in markdown_table(text.split("## Runs")[1].split("\n\n")[1])}
    assert table["pp_m8"]["stage-to-stage MiB/step"] == "0.75" and table["dp"]["stage-to-stage MiB/step"] == "–"
    assert ("mlp pp on 4 stages, gpipe, M=8: 33 stage-to-stage transfers per step, 0.75 MiB per device, of 0.75 MiB "
            "in all its collectives.") in text
    old = _write(tmp_path / "payload", sent=None)
    table = {r["run"]: r for r in markdown_table(old.split("## Runs")[1].split("\n\n")[1])}
    assert table["pp_m8"]["stage-to-stage MiB/step"] == "1.00 (payload)"
    assert ("mlp pp on 4 stages, gpipe, M=8: 33 stage-to-stage transfers per step, 1.00 MiB per device, of 1.00 MiB "
            "in all its collectives (payloads: the record has no bytes sent).") in old


def test_the_stage_transfers_and_each_layouts_memory_are_named(tmp_path: Path) -> None:
    text = _write(tmp_path)
    assert "mlp pp on 4 stages, gpipe, M=8: 33 stage-to-stage transfers per step, 0.75 MiB per device, of 0.75 MiB" \
        in text
    # Parameters + optimizer state against dp's 24 MiB: 6 MiB is 1/4.0; the one-stage references are left out.
    assert ("mlp, MiB per device: parameters + optimizer state dp 24.0; pp gpipe M=8 6.0 (1/4.0 of dp's); pp gpipe "
            "M=16 6.0 (1/4.0 of dp's); pp gpipe M=32 6.0 (1/4.0 of dp's). Activations and temporaries (the compiled "
            "program's, less the gradients): dp 10.0; pp gpipe M=8 6.0; pp gpipe M=16 4.0; pp gpipe M=32 3.0.") in text
    assert ("mlp gpipe (pp_m8 against pp_m32): activations and temporaries 6.0 MiB at M=8 and 3.0 MiB at M=32, "
            "with all else the same") in text
    # The strategies' sentence counts the 4-stage runs alone: the one-stage runs are references, not a layout.
    assert "PP splits the stacked layers into stages over the stage axis and replicates the rest: 6.0 MiB" in text
    # Microbatch counts and schedules are layouts: the runs are one computation to the equivalence check.
    assert "dp, pp_m8, pp_m16, pp_m32, one_m8, one_m16 are the same computation" in text


def test_microbatch_counts_are_compared_only_between_runs_that_differ_in_them_alone(tmp_path: Path) -> None:
    """A run of M=2 that accumulates 2 microbatches of its own pipelines microbatches of M=4's size: it was set
    against M=4 "with the batch fixed (each microbatch smaller as M grows)", which its microbatch was not."""
    accumulating = _run("pp_m2_accum2", "pp", 4, 500.0, (2.0, 4.0, 2.0, 9.0), stages=4, microbatches=2)
    accumulating.overrides["train.grad_accum"] = 2
    accumulating.config["train.grad_accum"] = 2
    rows = [_run("pp_m4", "pp", 4, 450.0, (2.0, 4.0, 2.0, 5.0), stages=4, microbatches=4),
            _run("pp_m8", "pp", 4, 400.0, (2.0, 4.0, 2.0, 4.0), stages=4, microbatches=8), accumulating]
    with Store(tmp_path / "sweep" / "sweep.db") as store:
        for r in rows:
            store.add(r)
    text = write_report(tmp_path / "sweep").markdown.read_text()
    assert ("mlp gpipe (pp_m4 against pp_m8): activations and temporaries 5.0 MiB at M=4 and 4.0 MiB at M=8, with "
            "all else the same") in text
    assert "at M=2" not in text


def test_the_bubble_is_measured_against_a_one_stage_run_that_splits_each_layer_alike(tmp_path: Path) -> None:
    """A pipeline on data=2,stage=2,model=2: its reference is its own layout without stages (2x2) where the report
    has it, else a one-stage run on another data axis at the same rows per device (4x2), said as such; never one
    whose model axis differs (2x4 splits each layer four ways: other work per device)."""
    def report(folder: str, *refs: str) -> str:
        meshes = {"exact": ("2x2", 4), "data4": ("4x2", 8), "tp4": ("2x4", 8)}
        rows = [_run("piped", "dp+pp+tp", 8, 500.0, (2.0, 4.0, 2.0, 6.0), stages=2, microbatches=4, per_shard=32,
                     transfers=(5, 1.0), sent=0.5, mesh="data=2,stage=2,model=2")]
        rows += [_run(ref, "dp+pp+tp", meshes[ref][1], 600.0, (8.0, 16.0, 8.0, 12.0), stages=1, microbatches=4,
                      per_shard=32, mesh=meshes[ref][0]) for ref in refs]
        with Store(tmp_path / folder / "sweep.db") as store:
            for r in rows:
                store.add(r)
        return write_report(tmp_path / folder).markdown.read_text()

    text = report("all", "tp4", "data4", "exact")
    assert "x 4/4 microbatches / 2 stages, exact)" in text and "another data axis" not in text
    text = report("no-exact", "tp4", "data4")
    assert ("x 4/4 microbatches / 2 stages, data4, a one-stage run on mesh 4x2 (data axis 4, this run's 2) at the "
            "same rows per device)") in text
    text = report("other-split", "tp4")
    assert "bubble by the schedule's formula" not in text
    assert "No one-stage run of the same model at the same microbatch size, splitting each layer alike, to " \
           "measure the bubble of piped" in text


def test_one_strategy_on_two_meshes_is_told_apart_by_its_mesh_in_the_memory_sentence(tmp_path: Path) -> None:
    """dp+tp on 4x2 and on 2x4 beside a pipeline: each named with its mesh (both were 'dp+tp', with nothing to say
    which was which)."""
    rows = [_run("dp", "dp", 8, 100.0, (8.0, 16.0, 8.0, 10.0)),
            _run("tp2", "dp+tp", 8, 100.0, (4.0, 8.0, 4.0, 10.0), mesh="4x2"),
            _run("tp4", "dp+tp", 8, 100.0, (2.0, 4.0, 2.0, 10.0), mesh="2x4"),
            _run("pp", "pp", 4, 500.0, (2.0, 4.0, 2.0, 6.0), stages=4, microbatches=8, transfers=(33, 1.0), sent=0.5)]
    with Store(tmp_path / "sweep.db") as store:
        for r in rows:
            store.add(r)
    text = write_report(tmp_path).markdown.read_text()
    assert "; dp+tp on 4x2 12.0 (1/2.0 of dp's); dp+tp on 2x4 6.0 (1/4.0 of dp's); pp gpipe M=8 6.0" in text
