"""The sweep report: Markdown table and sentences computed from hand-made runs, valid PNG charts, and the HTML
page checked in headless Chromium (rows, charts, click-to-sort with missing values last).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from conftest import held_by_another_process
from shardbench import config as config_lib
from shardbench.errors import EXIT_CODES, DataError, ShardbenchError
from shardbench.measure.run_record import from_json
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.report import report_cmd
from shardbench.report.plots import axis_label
from shardbench.report.speed import NOT_A_CAUSE
from shardbench.report.write import ReportPaths, load_runs, write_report
from shardbench.store import RunRow, Store, lock_runs

MIB = 2**20
CHARTS = ("step_time", "throughput", "epoch_time", "peak_memory", "mfu", "comms", "memory_breakdown")
BASE = config_lib.flatten(get_preset("vit-tiny"))


def record(name: str, strategy: str, mesh: str, devices: int, *, breakdown: tuple[float, float, float, float],
           total: float, comms: dict[str, tuple[int, float]], epochs: list[float], step_ms: float, img_s: float,
           mfu: float | None, acc: float, peak: float | None = None,
           partial: tuple[int, int, float] | None = None, sent: dict[str, float] | None = None) -> dict[str, Any]:
    """A summary.json as `shardbench train` writes it; every size is given in MiB. `comms`: per kind, executions
    and payload; `sent`: per kind, the bytes each device sends, as records keep them now (None: a record written
    before they were kept)."""
    params, optimizer, gradients, activations = breakdown
    return {
        "status": "complete", "run_name": name, "strategy": strategy, "mesh": mesh, "devices": devices,
        "steps": 40, "resumed_from": 0, "time_s": sum(epochs) + 5.0, "images_per_s": img_s, "train_loss": 2.1,
        "test_loss": 2.0, "test_accuracy": acc, "epochs": [], "out": f"runs/{name}",
        "measurements": {
            "platform": "cpu", "device_kind": "cpu", "devices": devices, "processes": 1,
            "compile": {"lower_s": 0.5, "compile_s": 3.25},
            "step_time_s": {"median": step_ms / 1e3, "p90": step_ms * 1.25 / 1e3, "measured_steps": 37,
                            "excluded_steps": 3},
            "epoch_time_s": epochs,
            "partial_epochs": [] if partial is None else [{"steps": partial[0], "of": partial[1],
                                                           "time_s": partial[2]}],
            "throughput": {"examples_per_s": img_s, "examples_per_s_per_device": img_s / devices},
            "flops": {"analytic_per_step": 1.2e12, "xla_per_step": None, "formula": "6 * params * tokens"},
            "mfu": {"mfu": mfu, "peak_flops_per_s_per_device": 9.9e11 if mfu is not None else None,
                    "peak_source": "calibrated matmul (cpu)" if mfu is not None else None,
                    "not_measured": None if mfu is not None else "no peak FLOP/s is known for device kind cpu"},
            "memory": {
                "peak_bytes_in_use": None if peak is None else int(peak * MIB),
                "compiled": {"argument_bytes": 1, "output_bytes": 1, "temp_bytes": 1, "alias_bytes": 1,
                             "generated_code_bytes": 1},
                "total_bytes": int(total * MIB),
                "breakdown": {"params_bytes": int(params * MIB), "optimizer_bytes": int(optimizer * MIB),
                              "gradients_bytes": int(gradients * MIB),
                              "activations_temporaries_bytes": int(activations * MIB)},
            },
            "comms": {k: {"count": c, "bytes": int(b * MIB)}
                      | ({} if sent is None else {"sent_bytes": int(sent[k] * MIB)}) for k, (c, b) in comms.items()},
            "comms_total_bytes": int(sum(b for _, b in comms.values()) * MIB),
            **({} if sent is None else {"comms_total_sent_bytes": int(sum(sent.values()) * MIB)}),
        },
    }


def row(name: str, overrides: dict[str, Any], rec: dict[str, Any] | None, error: tuple[str, str] | None = None
        ) -> RunRow:
    config = BASE | overrides | {"train.out": f"sweep/runs/{name}"}
    kind, message = error if error else (None, None)
    return RunRow(name, "failed" if error else "complete", kind, message, overrides, config, rec, 1.0e9, 1.0e9 + 60,
                  60.0)


def sweep_rows() -> list[RunRow]:
    """Five complete runs over four strategies (one precision pair differing only in compute dtype) and an OOM."""
    def over(strategy: str, devices: int, mesh: str, dtype: str = "float32", batch: int = 128) -> dict[str, Any]:
        return {"parallel.strategy": strategy, "parallel.devices": devices, "parallel.mesh": mesh,
                "precision.dtype": dtype, "train.batch_size": batch}

    return [
        row("single_fp32", over("single", 1, "1"), record(
            "single_fp32", "single", "1", 1, breakdown=(40.1, 80.2, 40.1, 41.2), total=210.0, comms={},
            epochs=[12.5, 11.5], step_ms=95.0, img_s=1300.0, mfu=0.31, acc=0.412)),
        row("single_bf16", over("single", 1, "1", dtype="bfloat16"), record(
            "single_bf16", "single", "1", 1, breakdown=(40.1, 80.2, 40.1, 22.0), total=191.0, comms={},
            epochs=[9.0, 8.0], step_ms=70.0, img_s=1800.0, mfu=0.42, acc=0.405)),
        row("dp_8", over("dp", 8, "8"), record(
            "dp_8", "dp", "8", 8, breakdown=(40.1, 80.2, 40.1, 6.0), total=170.0,
            comms={"all-reduce": (6, 40.1)}, epochs=[4.0, 3.5], step_ms=30.0, img_s=4200.0, mfu=0.12, acc=0.40)),
        row("fsdp_8", over("fsdp", 8, "8"), record(
            "fsdp_8", "fsdp", "8", 8, breakdown=(5.0125, 10.025, 5.0125, 6.0), total=28.0,
            comms={"all-gather": (12, 70.2), "reduce-scatter": (6, 35.1)}, epochs=[5.0, 4.5], step_ms=38.0,
            img_s=3400.0, mfu=None, acc=0.40)),
        row("dptp_4x2", over("dp+tp", 8, "4x2"), record(
            "dptp_4x2", "dp+tp", "4x2", 8, breakdown=(20.05, 40.1, 20.05, 8.0), total=90.0,
            comms={"all-reduce": (30, 25.0), "all-gather": (6, 5.0)}, epochs=[], step_ms=45.0,
            img_s=2900.0, mfu=0.08, acc=0.39, partial=(40, 352, 2.5))),
        row("fsdp_8_batch_4096", over("fsdp", 8, "8", batch=4096), None,
            ("oom", "RESOURCE_EXHAUSTED: out of memory allocating 1.20GiB")),
    ]


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        store.set_meta("preset", "vit-tiny")
        for r in sweep_rows():
            store.add(r)
    return directory


@pytest.fixture
def written(sweep_dir: Path) -> ReportPaths:
    return write_report(sweep_dir)


def _no_cause_claimed(speed: str) -> None:
    """No slowdown is explained by what it moves or where it runs: a record has no time for its collectives, and
    a cause needs a measurement ("1.30x slower: it moves 2.1 MiB ..." was such a claim)."""
    for sentence in speed.splitlines():
        if " slower (" in sentence:
            assert "):" not in sentence and " because " not in sentence and "it moves" not in sentence, sentence


def markdown_table(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    return [dict(zip(header, [c.strip() for c in line.strip("|").split(" | ")], strict=True)) for line in lines[1:]]


def test_markdown_table_has_every_run_with_its_numbers(written: ReportPaths) -> None:
    assert written.directory == written.markdown.parent and written.markdown.name == "report.md"
    rows = {r["run"]: r for r in markdown_table(written.markdown.read_text())}
    assert list(rows) == [r.name for r in sweep_rows()]  # store order
    fp32 = rows["single_fp32"]
    assert (fp32["status"], fp32["strategy"], fp32["devices"], fp32["batch"]) == ("complete", "single", "1", "128")
    assert (fp32["param dtype"], fp32["dtype"], fp32["epoch time s"]) == ("float32", "float32", "12.00")
    assert (fp32["step ms median"], fp32["step ms p90"], fp32["compile s"]) == ("95.0", "118.8", "3.25")
    # Records without a schema version divided by wall time (1,300 img/s): the report derives the steady state,
    # batch / median step = 128 / 0.095 s, as step time and MFU use it.
    assert (fp32["img/s"], fp32["MFU %"], fp32["memory/device MiB"]) == ("1,347", "31.0", "210.0 (compiled)")
    assert (fp32["params MiB"], fp32["optimizer MiB"], fp32["activations MiB"]) == ("40.1", "80.2", "41.2")
    assert (fp32["comms/step MiB"], fp32["collectives"], fp32["test acc %"]) == ("0.00", "none", "41.2")
    fsdp = rows["fsdp_8"]
    # Records written before bytes sent were kept: the payload, said beside the figure.
    assert (fsdp["img/s/device"], fsdp["MFU %"], fsdp["comms/step MiB"]) == ("421", "–", "105.30 (payload)")
    assert fsdp["collectives"] == "all-gather×12, reduce-scatter×6"
    failed = rows["fsdp_8_batch_4096"]
    assert (failed["status"], failed["strategy"], failed["batch"], failed["epoch time s"]) == (
        "failed (oom)", "fsdp", "4,096", "–")


def test_runs_csv_holds_the_tables_runs_with_their_values_as_measured(written: ReportPaths) -> None:
    """runs.csv: one row per run in store order, failed included with its reason; the swept settings as columns;
    numbers unrounded and without separators (128 / 0.095 s, not "1,347"), units in the column names, the memory
    figure's source in a column of its own, an empty cell where the table shows a dash."""
    import csv

    assert written.csv == written.directory / "runs.csv"
    assert "Every value of this table, unrounded, is in `runs.csv` beside this report" in written.markdown.read_text()
    assert "is in <code>runs.csv</code> beside this report" in written.html.read_text()
    with written.csv.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = {r["run"]: r for r in reader}
        fields = reader.fieldnames or []
    assert list(rows) == [r.name for r in sweep_rows()]
    assert fields[:2] == ["run", "status"] and set(fields[2:7]) == {
        "parallel.strategy", "parallel.devices", "parallel.mesh", "precision.dtype", "train.batch_size"}
    assert fields[fields.index("mem_mib") + 1] == "memory_source" and fields[-1] == "error"
    assert fields[fields.index("compile_s") + 1] == "compile_from_cache"
    fp32 = rows["single_fp32"]
    assert (fp32["status"], fp32["parallel.strategy"], fp32["parallel.devices"], fp32["precision.dtype"]) == (
        "complete", "single", "1", "float32")
    assert float(fp32["img_s"]) == 128 / 0.095 and float(fp32["step_ms_median"]) == 0.095 * 1e3
    assert float(fp32["step_ms_p90"]) == 0.095 * 1.25 * 1e3 and float(fp32["mfu_pct"]) == 0.31 * 100
    assert (float(fp32["mem_mib"]), fp32["memory_source"]) == (int(210.0 * 2**20) / 2**20, "compiled")
    assert fp32["error"] == "" and fp32["collectives"] == "none" and fp32["compile_from_cache"] == "False"
    assert float(rows["fsdp_8"]["comms_mib"]) == (int(70.2 * 2**20) + int(35.1 * 2**20)) / 2**20
    assert rows["fsdp_8"]["mfu_pct"] == ""
    failed = rows["fsdp_8_batch_4096"]
    assert (failed["status"], failed["train.batch_size"], failed["step_ms_median"], failed["memory_source"]) == (
        "failed (oom)", "4096", "", "")
    assert failed["error"] == "oom: RESOURCE_EXHAUSTED: out of memory allocating 1.20GiB"


@pytest.mark.parametrize("meta, says", [
    ({"preset": "vit-tiny"}, "(preset vit-tiny)"),  # a store from before the origin was kept
    ({"preset": "lm", "origin": "sweep file", "base_preset": "lm-tiny"}, "(sweep file lm on lm-tiny)"),
    ({"preset": "strategies", "origin": "sweep preset", "base_preset": "vit-tiny"},
     "(sweep preset strategies on vit-tiny)"),
    ({"preset": "lm-tiny", "origin": "preset", "base_preset": "lm-tiny"}, "(preset lm-tiny)"),
])
def test_the_report_says_what_the_sweeps_name_is(tmp_path: Path, meta: dict[str, str], says: str) -> None:
    """A sweep file's name is not called a preset ("preset lm" for lm.toml, "preset pp" for pp.toml)."""
    with Store(tmp_path / "sweep.db") as store:
        for key, value in meta.items():
            store.set_meta(key, value)
        store.add(sweep_rows()[0])
    assert f"Read from `sweep.db` {says} in " in write_report(tmp_path).markdown.read_text()


def test_a_stopped_sweeps_report_says_which_planned_runs_are_not_recorded(tmp_path: Path) -> None:
    """A sweep planned as three runs and stopped after the first: the report says so and names the two left, and
    how to finish (it read "1 run, 1 complete, 0 failed" as if that were the sweep); a finished one says nothing."""
    with Store(tmp_path / "sweep.db") as store:
        store.set_meta("runs", [{"name": n, "overrides": {}, "settings": {}} for n in
                                ("single_fp32", "single_bf16", "dp_8")])
        store.add(sweep_rows()[0])
    paths = write_report(tmp_path)
    assert paths.pending == ("single_bf16", "dp_8")
    assert (f"1 run, 1 complete, 0 failed. The sweep is unfinished: 2 planned runs not recorded yet (`single_bf16`, "
            f"`dp_8`); `shardbench sweep --out {tmp_path} --resume` finishes it.") in paths.markdown.read_text()
    with Store(tmp_path / "sweep.db") as store:  # a tune's measurements: its own command finishes them
        store.set_meta("origin", "tune")
    assert ("The tune is unfinished: 2 planned runs not recorded yet (`single_bf16`, `dp_8`); `shardbench tune` "
            "with its flags and --resume finishes it.") in write_report(tmp_path).markdown.read_text()
    with Store(tmp_path / "sweep.db") as store:
        for r in sweep_rows()[1:3]:
            store.add(r)
    assert write_report(tmp_path).pending == () and "unfinished" not in write_report(tmp_path).markdown.read_text()



def test_a_stopped_sweeps_report_names_what_its_runs_not_recorded_yet_would_sweep(tmp_path: Path) -> None:
    """Stopped after its first run, a sweep over the batch size has one configuration so far: the report says so
    of the runs recorded, and names the values still planned (it said that nothing was swept)."""
    first = sweep_rows()[2]
    later = [{"name": f"dp_8_batch_{b}", "overrides": {**first.overrides, "train.batch_size": b}, "settings": {}}
             for b in (256, 512)]
    with Store(tmp_path / "sweep.db") as store:
        store.set_meta("runs", [{"name": first.name, "overrides": first.overrides, "settings": {}}, *later])
        store.add(first)
    paths = write_report(tmp_path)
    text = paths.markdown.read_text()
    assert ("## What was swept\n\nNothing among the runs recorded so far: they share one configuration.\n\n"
            "Planned but not recorded yet: `train.batch_size` = 256, 512.\n") in text
    assert "Planned but not recorded yet: <code>train.batch_size</code> = 256, 512." in paths.html.read_text()
    with Store(tmp_path / "sweep.db") as store:  # once every run is recorded, the plan adds nothing
        for planned in later:
            store.add(dataclasses.replace(first, name=planned["name"], overrides=planned["overrides"]))
    text = write_report(tmp_path).markdown.read_text()
    assert "- `train.batch_size`: 128, 256, 512\n" in text and "not recorded yet" not in text


def test_a_mesh_left_to_its_default_says_what_it_ran_as(tmp_path: Path) -> None:
    """Beside the same mesh written out, a default mesh is shown with the mesh its record says it ran as."""
    dp = sweep_rows()[2]
    default = dataclasses.replace(dp, name="dp_default", overrides={**dp.overrides, "parallel.mesh": ""},
                                  config={**dp.config, "parallel.mesh": ""})
    with Store(tmp_path / "sweep.db") as store:
        store.add(dp)
        store.add(default)
    paths = write_report(tmp_path)
    assert "- `parallel.mesh`: 8, (default, ran as 8)\n" in paths.markdown.read_text()
    assert "<code>parallel.mesh</code>: 8, (default, ran as 8)</li>" in paths.html.read_text()


def test_a_running_sweeps_report_says_it_is_running_not_how_to_finish_it(tmp_path: Path) -> None:
    """A report of a sweep still running (another process holds the folder's lock) says so and shows the runs so
    far; it said "--resume finishes it", which a second sweep there would refuse. The same folder once the
    sweep's process has ended is a stopped sweep again, and the sweep reporting itself at its end is not running."""
    with Store(tmp_path / "sweep.db") as store:
        store.set_meta("runs", [{"name": n, "overrides": {}, "settings": {}} for n in ("single_fp32", "dp_8")])
    with held_by_another_process(tmp_path):
        with pytest.raises(ShardbenchError, match="the sweep writing it is still running its first of 2 planned "
                                                  "runs; report it once a run has ended"):
            write_report(tmp_path)
        with Store(tmp_path / "sweep.db") as store:
            store.add(sweep_rows()[0])
        text = write_report(tmp_path).markdown.read_text()
        assert ("The sweep is still running: 1 planned run not recorded yet (`dp_8`); this report shows the runs "
                "recorded so far.") in text and "--resume" not in text
    text = write_report(tmp_path).markdown.read_text()
    assert "still running" not in text and f"`shardbench sweep --out {tmp_path} --resume` finishes it." in text
    with lock_runs(tmp_path, "sweep"):  # the sweep's own report at its end
        assert "still running" not in write_report(tmp_path, writing=True).markdown.read_text()


def test_a_sweep_stopped_before_its_first_run_ended_is_said_so_with_how_to_finish(tmp_path: Path) -> None:
    """Ctrl-C during a sweep's first run: the plan is stored, no run is. `report` names the planned runs and how to
    finish them (it said "no runs to report (no runs in a sweep.db and no summary.json below it)")."""
    with Store(tmp_path / "sweep.db") as store:
        store.set_meta("runs", [{"name": n, "overrides": {}, "settings": {}} for n in ("strategy_dp", "strategy_fsdp")])
    with pytest.raises(ShardbenchError) as raised:
        write_report(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path}: no run recorded yet: the sweep planned 2 runs (strategy_dp, strategy_fsdp) and was stopped "
        f"before the first ended; finish it with 'shardbench sweep --out {tmp_path} --resume', then report it")

def test_what_the_sweep_set_for_every_run_is_said_as_held_fixed(tmp_path: Path) -> None:
    """A sweep's base (the flags given one value: --steps 8, --model.embed-dim 64) is what it held fixed, said in
    both renderings (only a swept field left with one value was); a base field the runs vary is said as swept."""
    with Store(tmp_path / "sweep.db") as store:
        store.set_meta("base", {"train.steps": 8, "model.embed_dim": 64, "parallel.strategy": "dp"})
        for r in sweep_rows()[:3]:
            store.add(r)
    paths = write_report(tmp_path)
    text = paths.markdown.read_text()
    fixed = next(line for line in text.splitlines() if line.startswith("Set the same for every run: "))
    assert "`train.steps` = 8" in fixed and "`model.embed_dim` = 64" in fixed
    assert "parallel.strategy" not in fixed and "- `parallel.strategy`: single, dp\n" in text
    assert "<code>train.steps</code> = 8" in paths.html.read_text()


def test_a_field_held_fixed_that_a_run_never_reads_names_that_run(tmp_path: Path) -> None:
    """`sweep --strategy single,dp --devices 8`: --devices 8 is set for every run, and single trains on one device
    (its record says 1). "Set the same for every run: `parallel.devices` = 8" read as if single had 8."""
    with Store(tmp_path / "sweep.db") as store:
        store.set_meta("base", {"train.steps": 8, "parallel.devices": 8})
        for name, strategy, devices in (("strategy_single", "single", 1), ("strategy_dp", "dp", 8)):
            store.add(row(name, {"parallel.strategy": strategy, "parallel.devices": 8, "parallel.mesh": ""}, record(
                name, strategy, "none" if devices == 1 else "8", devices, breakdown=(40.1, 80.2, 40.1, 6.0),
                total=170.0, comms={}, epochs=[4.0], step_ms=30.0, img_s=4200.0, mfu=0.12, acc=0.40)))
    paths = write_report(tmp_path)
    fixed = next(line for line in paths.markdown.read_text().splitlines() if line.startswith("Set the same for "))
    assert "`parallel.devices` = 8 (not read by strategy_single), `train.steps` = 8," in fixed, fixed
    assert "<code>parallel.devices</code> = 8 (not read by strategy_single)" in paths.html.read_text()


def test_a_sweep_of_a_model_of_your_own_names_that_model(tmp_path: Path) -> None:
    """A sweep of `--model mymlp.py:build`: the report said "preset vit-seed" and gave the model as the kind its
    task implies ("mlp"), naming no file. The source line and the table's model column name it."""
    factory = str(tmp_path / "mymlp.py:build")
    with Store(tmp_path / "sweep.db") as store:
        store.set_meta("preset", "vit-seed")
        store.set_meta("base", {"model.factory": factory, "model.task": "regress"})
        for name, strategy in (("strategy_dp", "dp"), ("strategy_fsdp", "fsdp")):
            store.add(row(name, {"parallel.strategy": strategy, "model.factory": factory, "model.kind": "mlp"},
                          record(name, strategy, "8", 8, breakdown=(1.0, 2.0, 1.0, 1.0), total=5.0, comms={},
                                 epochs=[1.0], step_ms=10.0, img_s=100.0, mfu=0.1, acc=0.5)))
    text = write_report(tmp_path).markdown.read_text()
    assert "Read from `sweep.db` (preset vit-seed, with the model mymlp.py:build) in " in text
    table = markdown_table(text)
    assert {r["model"] for r in table} == {"mymlp.py:build"}, table


def test_markdown_explains_precision_and_strategies_from_the_data(written: ReportPaths) -> None:
    text = written.markdown.read_text()
    assert "`precision.dtype`: float32, bfloat16" in text and "`parallel.strategy`: single, dp, fsdp, dp+tp" in text
    assert ("Compute dtype bfloat16 vs float32 at strategy single, mesh 1, devices 1, batch 128: "
            "activations/temporaries 41.2 -> 22.0 MiB, while parameters + optimizer state + gradients stay "
            "160.4 MiB (they are stored in the parameter dtype, float32), so the compiled total per device shrinks "
            "only 9% (210.0 -> 191.0 MiB).") in text
    assert "The parameter dtype sets the bytes of parameters, optimizer state and gradients" in text
    assert "FSDP shards parameters and optimizer state over the data axis: 15.0 MiB" in text
    assert "1/8.0 of the 120.3 MiB a full replica holds" in text
    assert "has 105.3 MiB of collective payload per device per step (all-gather, reduce-scatter)" in text
    assert "dp_8, fsdp_8, dptp_4x2: recorded before the bytes each device sends were kept" in text
    assert "DP replicates parameters and optimizer state on every device: 120.3 MiB" in text
    assert "the same as a full replica (120.3 MiB)" in text
    assert "A single device holds the whole model" in text and "needs no collectives" in text
    assert "- `fsdp_8_batch_4096`: oom: RESOURCE_EXHAUSTED: out of memory allocating 1.20GiB" in text
    for name in CHARTS:
        assert f"]({name}.png)" in text


def test_simulated_devices_are_said_to_share_the_host_and_slowdowns_name_no_cause(written: ReportPaths) -> None:
    """The sweep's 8-device runs are simulated CPU devices: the report says they share the host's cores and which
    comparisons do not carry to real devices; the slowdowns (fsdp moves 105 MiB of collectives against dp's 40)
    state what differs and claim no cause."""
    text = written.markdown.read_text()
    simulated = text.split("### Simulated devices", 1)[1].split("###", 1)[0]
    assert "The runs on 8 devices use simulated devices on this host's CPU: they all share its cores" in simulated
    assert "do not carry those speed comparisons to GPUs or TPUs" in simulated
    carries = simulated.split("What does carry:", 1)[1]
    assert "the bytes of parameters, optimizer state and gradients each device holds" in carries
    # The bytes sent carry only where the collectives are the same: not a jit zero2/fsdp gradient reduction, an
    # all-reduce and a slice on a CPU, a reduce-scatter on GPUs and TPUs (docs/parallelism.md).
    assert ("The bytes each device sends carry where the collectives are the same: under jit the CPU compiler "
            "reduces gradients that live in slices (zero2, fsdp) with an all-reduce and a slice") in carries
    speed = text.split("### Speed", 1)[1].split("###", 1)[0]
    # Every setting that differs from the fastest's is named (the strategy, the mesh, the devices, the compute
    # dtype), and nothing else: no MFU stands in for a difference.
    assert ("fsdp_8 is 1.27x slower (38.0 ms against 30.0 ms); it differs in: parallel.strategy fsdp against dp; "
            "105.3 MiB of collective payload per device per step (all-gather, reduce-scatter) against 40.1 MiB.") \
        in speed
    assert ("single_fp32 is 3.17x slower (95.0 ms against 30.0 ms); it differs in: parallel.devices 1 against 8; "
            "parallel.mesh 1 against 8; parallel.strategy single against dp; 0.0 MiB of collective payload per "
            "device per step against 40.1 MiB.") in speed
    assert ("single_bf16 is 2.33x slower (70.0 ms against 30.0 ms); it differs in: parallel.devices 1 against 8; "
            "parallel.mesh 1 against 8; parallel.strategy single against dp; precision.dtype bfloat16 against "
            "float32; 0.0 MiB of collective payload per device per step against 40.1 MiB.") in speed
    # 30.0 against 40.1 MiB: a quarter less, named (within 2x, it went unnamed before).
    assert ("dptp_4x2 is 1.50x slower (45.0 ms against 30.0 ms); it differs in: parallel.mesh 4x2 against 8; "
            "parallel.strategy dp+tp against dp; 30.0 MiB of collective payload per device per step (all-reduce, "
            "all-gather) against 40.1 MiB.") in speed
    assert "MFU" not in speed
    assert NOT_A_CAUSE in speed
    _no_cause_claimed(speed)


def test_a_real_gpu_sweep_is_not_called_simulated(tmp_path: Path) -> None:
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for r in sweep_rows()[:3]:
            assert r.record is not None
            r.record["measurements"]["platform"] = "gpu"
            store.add(r)
    assert "Simulated devices" not in write_report(directory).markdown.read_text()


def test_charts_are_valid_pngs(written: ReportPaths) -> None:
    assert sorted(written.charts) == sorted(CHARTS)
    assert written.clipped == {}  # no title, note, label or legend runs past a chart's edge
    for name, path in written.charts.items():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 600 and height >= 150 and len(data) > 10_000, (name, width, height, len(data))


def _charts_named(markdown: Path) -> set[str]:
    return set(re.findall(r"\]\(([\w.]+\.png)\)", markdown.read_text()))


def test_an_interrupted_report_leaves_the_last_whole_report_or_none(sweep_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while a report is written (here, as its last file is written) leaves the folder's earlier report as
    it was, every chart it names in place, and a new folder without report.md or charts: nothing half-written."""
    first = write_report(sweep_dir)
    before = first.markdown.read_text()
    assert _charts_named(first.markdown) == {f"{name}.png" for name in CHARTS}
    with Store(sweep_dir / "sweep.db") as store:  # a run more: the next report differs
        store.add(dataclasses.replace(sweep_rows()[0], name="once_more"))

    def interrupted(*args: Any, **kwargs: Any) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr("shardbench.report.runs_csv.write_csv", interrupted)
    fresh = tmp_path / "fresh"
    for out in (None, fresh):
        with pytest.raises(KeyboardInterrupt):
            write_report(sweep_dir, out)
    assert first.markdown.read_text() == before
    assert all((first.directory / name).is_file() for name in _charts_named(first.markdown))
    assert not list(first.directory.glob(".*")) and not list(fresh.iterdir())


def test_a_new_report_removes_the_charts_it_left_out_and_what_killed_writers_left(written: ReportPaths) -> None:
    out = written.directory
    (out / "plan_vs_measured.png").write_bytes(b"an earlier report's chart")  # this sweep has no plan
    (out / "notes.txt").write_text("the user's own")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / f".writing-{int(gone.stdout)}").mkdir()  # a writer killed before it finished
    (out / f".writing-{int(gone.stdout)}" / "report.md").write_text("half")
    again = write_report(out.parent)
    assert sorted(again.charts) == sorted(CHARTS) and not (out / "plan_vs_measured.png").exists()
    assert (out / "notes.txt").read_text() == "the user's own" and not list(out.glob(".writing-*"))


def test_long_run_names_fit_the_charts_and_stay_whole_in_the_table(tmp_path: Path) -> None:
    """Two runs of 200-character names (a sweep's longest, differing only in their last characters): each chart
    shows their start and end, so they stay apart and nothing runs past the chart's edge; the table names them
    whole."""
    stem = "cache_dir__" + "_".join(["x" * 60] * 3)
    runs = [r for r in sweep_rows() if r.status == "complete"][:2]
    names = [f"{stem[:187]}_{digest}" for digest in ("0123456789ab", "ba9876543210")]
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for r, name in zip(runs, names, strict=True):
            store.add(dataclasses.replace(r, name=name, record={**r.record, "run_name": name}))
    written = write_report(directory)
    assert written.clipped == {}
    labels = [axis_label(n) for n in names]
    assert labels[0] != labels[1] and all(len(label) == 60 and label.endswith(n[-12:])
                                          for label, n in zip(labels, names, strict=True))
    assert all(f"| {n} " in written.markdown.read_text() for n in names)


def test_memory_chart_marks_compiled_totals_when_some_runs_report_a_peak(tmp_path: Path) -> None:
    from shardbench.report.content import COLUMNS, ReportedRun
    from shardbench.report.plots import peak_memory

    def run(name: str, peak: float | None) -> ReportedRun:
        return ReportedRun(name, "complete", None, None, {}, BASE, from_json(record(
            name, "dp", "8", 8, breakdown=(1.0, 2.0, 1.0, 4.0), total=9.0, comms={}, epochs=[1.0], step_ms=1.0,
            img_s=10.0, mfu=None, acc=0.1, peak=peak)))

    mixed = peak_memory([run("gpu", 12.5), run("cpu", None)], tmp_path)
    assert "compiled totals" in mixed.note and mixed.path.stat().st_size > 10_000
    assert peak_memory([run("gpu", 12.5)], tmp_path).note == ""
    memory = next(c for c in COLUMNS if c.key == "mem_mib")
    assert (memory.text(run("gpu", 12.5)), memory.text(run("cpu", None))) == ("12.5 (peak)", "9.0 (compiled)")


def test_plain_folder_of_runs_is_reported_and_empty_folder_is_an_error(tmp_path: Path) -> None:
    for dtype in ("float32", "bfloat16"):
        cfg = override(get_preset("vit-tiny"), {"precision.dtype": dtype,
                                                                      "train.out": f"runs/{dtype}"})
        run_dir = tmp_path / "runs" / dtype
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(cfg.to_json())
        acts = 30.0 if dtype == "float32" else 15.0
        (run_dir / "summary.json").write_text(json.dumps(record(
            f"tiny_{dtype}", "dp", "8", 8, breakdown=(10.0, 20.0, 10.0, acts), total=40.0 + acts, comms={},
            epochs=[2.0], step_ms=10.0, img_s=100.0, mfu=None, acc=0.3)))
    paths = write_report(tmp_path / "runs", out_dir=tmp_path / "out")
    text = paths.markdown.read_text()
    assert [r["run"] for r in markdown_table(text)] == ["tiny_bfloat16", "tiny_float32"]
    assert "`precision.dtype`: bfloat16, float32" in text
    assert "activations/temporaries 30.0 -> 15.0 MiB" in text and "shrinks 21% (70.0 -> 55.0 MiB)" in text
    assert ("Model FLOPs utilisation per run: left out, as no run reports an MFU (no peak FLOP/s is known for device "
            "kind cpu).") in text
    assert "Communication per step: left out, as no run moves bytes between devices." in text
    assert sorted(paths.charts) == ["epoch_time", "memory_breakdown", "peak_memory", "step_time", "throughput"]
    with pytest.raises(ShardbenchError, match="no runs to report"):
        write_report(tmp_path / "out")
    # A folder of unfinished runs only (config.json, no summary.json): each is named, as it is beside finished ones.
    (tmp_path / "unfinished" / "r1").mkdir(parents=True)
    (tmp_path / "unfinished" / "r1" / "config.json").write_text((tmp_path / "runs" / "float32" / "config.json")
                                                                 .read_text())
    with pytest.raises(ShardbenchError, match=re.escape(
            "unfinished: no runs to report: 1 run folder without a summary.json (unfinished, or stopped): r1; finish "
            "it with its train command and --resume, then report")):
        write_report(tmp_path / "unfinished")


def test_sweeps_reported_together_keep_their_refused_runs_and_another_tools_config_is_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two sweeps copied into one folder: their refused runs are in their sweep.db alone (the folders were read
    and the refused one vanished, "5 runs, 5 complete, 0 failed"), and a config.json another tool wrote (a
    Hugging Face model's) was counted an unfinished run whose every field differed."""
    rows = sweep_rows()
    for name, kept in (("sA", rows[:2] + rows[-1:]), ("sB", rows[2:4])):
        with Store(tmp_path / "both" / name / "sweep.db") as store:
            store.set_meta("preset", "vit-tiny")
            for r in kept:
                store.add(r)
    (tmp_path / "both" / "sB" / "runs" / "dp_8").mkdir(parents=True)  # a run's own folder, read through sweep.db
    twin = tmp_path / "both" / "sC"  # a third sweep, with a run of one of sA's names
    with Store(twin / "sweep.db") as store:
        store.add(rows[0])
    (tmp_path / "both" / "hf_model").mkdir()
    (tmp_path / "both" / "hf_model" / "config.json").write_text('{"architectures": ["Bert"], "hidden_size": 8}')
    assert report_cmd.run(argparse.Namespace(dir=tmp_path / "both", out=tmp_path / "out", prices=None)) == 0
    err = capsys.readouterr().err
    assert "left out 1 folder(s) whose config.json is not a shardbench run's: hf_model" in err
    text = (tmp_path / "out" / "report.md").read_text()
    assert ("Read from the run folders below it and the sweep.db of `sA`, `sB`, `sC` in "
            f"`{tmp_path / 'both'}`: 6 runs, 5 complete, 1 failed.") in text
    assert "Left out, as their config.json is not a shardbench run's: `hf_model`." in text
    names = [r["run"] for r in markdown_table(text.split("## Failed runs")[0])]
    assert sorted(names) == ["dp_8", "fsdp_8", "fsdp_8_batch_4096", "sA/single_fp32", "sC/single_fp32",
                             "single_bf16"]
    assert "fsdp_8_batch_4096" in text.split("## Failed runs")[1] and "RESOURCE_EXHAUSTED" in text
    assert "architectures" not in text and "hidden_size" not in text
    (tmp_path / "hf_only" / "hf_model").mkdir(parents=True)
    (tmp_path / "hf_only" / "hf_model" / "config.json").write_text('{"architectures": ["Bert"]}')
    with pytest.raises(ShardbenchError, match="the config.json of hf_model is not a shardbench run's"):
        write_report(tmp_path / "hf_only")


def test_a_hand_written_run_folder_is_read_or_refused_in_one_line(tmp_path: Path) -> None:
    """A record whose list is null reads as an empty list; one whose list is a number, or a config.json that is
    not a table of sections, is refused naming the file (never an internal error)."""
    rec = record("tiny", "dp", "8", 8, breakdown=(10.0, 20.0, 10.0, 30.0), total=70.0, comms={}, epochs=[2.0],
                 step_ms=10.0, img_s=100.0, mfu=None, acc=0.3)
    assert from_json({**rec, "measurements": {**rec["measurements"], "partial_epochs": None}}) \
        .measurements.partial_epochs == []
    with pytest.raises(ShardbenchError, match=r"summary.json.measurements.partial_epochs should be a list, not int"):
        from_json({**rec, "measurements": {**rec["measurements"], "partial_epochs": 3}})
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(rec))
    (run_dir / "config.json").write_text("[1]")
    with pytest.raises(DataError, match=r"config.json is not a run's configuration \(a JSON object of sections\)"):
        write_report(tmp_path / "runs", out_dir=tmp_path / "out")


def test_what_a_record_lacks_is_explained_from_the_record(tmp_path: Path) -> None:
    """A run too short for a step time, and one trained for part of an epoch: the report, the charts and
    the sweep's progress line give the record's own reason. A run folder that never finished is listed."""
    from shardbench.report.terminal import progress_line

    rec = record("short", "dp", "8", 8, breakdown=(1.0, 2.0, 1.0, 4.0), total=8.5, comms={}, epochs=[],
                 step_ms=1.0, img_s=10.0, mfu=None, acc=0.1)
    why = "not measured: 1 step(s) give 0 interval(s); timing warm-up 2"
    rec["measurements"]["step_time_s"] = {"median": None, "p90": None, "measured_steps": 0, "excluded_steps": 0,
                                          "not_measured": why}
    rec["measurements"]["mfu"]["not_measured"] = f"no step time: {why}"
    rec["measurements"]["partial_epochs"] = [{"steps": 1, "of": 16, "time_s": 0.5}]
    folder = tmp_path / "runs"
    for name in ("short", "unfinished"):
        (folder / name).mkdir(parents=True)
        (folder / name / "config.json").write_text(get_preset("vit-tiny").to_json())
    (folder / "short" / "summary.json").write_text(json.dumps(rec))
    paths = write_report(folder, out_dir=tmp_path / "out")
    text = paths.markdown.read_text()
    assert f"left out, as no run reports an MFU (no step time: {why})." in text
    assert "Step time per run: left out, as no run has a step time." in text
    assert "step_time" not in paths.charts and "epoch_time" not in paths.charts  # nothing to draw: no chart
    assert paths.incomplete == ("unfinished",) and "no summary.json: the run did not finish" in text
    assert paths.clipped == {}
    # An unfinished run left to --strategy auto is listed with the layout it started with (its layout.json), not
    # as 'auto': pp on stage=2.
    import jax

    from shardbench.parallel.rules import make_layout
    from shardbench.rundir import LAYOUT_RECORD, layout_record

    (folder / "unfinished" / LAYOUT_RECORD).write_text(json.dumps(layout_record(
        make_layout("pp", "stage=2", jax.devices()[:2]))))
    listed = write_report(folder, out_dir=tmp_path / "again").markdown.read_text()
    listed_row = next(line for line in listed.splitlines() if line.startswith("| unfinished |"))
    assert listed_row.split(" | ")[2:4] == ["pp", "stage=2"], listed_row
    # What it started with is shown, never taken for a setting: both runs were left to auto and the default mesh,
    # so nothing was swept. Given dp and fsdp on the default mesh (8x1 resolved from its layout.json for the
    # unfinished one), the strategy alone was.
    swept = listed.split("## What was swept")[1].split("##")[0]
    assert "Nothing: the runs share one configuration." in swept, swept
    for name, strategy in (("short", "dp"), ("unfinished", "fsdp")):
        config = get_preset("vit-tiny")
        config = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, strategy=strategy))
        (folder / name / "config.json").write_text(config.to_json())
    (folder / "unfinished" / LAYOUT_RECORD).write_text(json.dumps(layout_record(
        make_layout("fsdp", "", jax.devices()))))
    swept = write_report(folder, out_dir=tmp_path / "third").markdown.read_text().split("## What was swept")[1]
    assert "parallel.strategy" in swept.split("##")[0] and "parallel.mesh" not in swept.split("##")[0], swept
    line = progress_line(1, 1, row("short", {}, rec))
    assert f"step time {why}" in line and "step -" not in line


def test_a_complete_run_without_a_step_time_is_named_with_its_reason_where_it_is_left_out(tmp_path: Path) -> None:
    """Beside a timed run, one whose step time was dropped vanished from the speed ranking without a word, and
    the MFU chart named it without the reason its record gives."""
    why = "not credible: the median of 2 interval(s), 1 ms, would run the step's FLOPs at 130% of the peak"
    for name, step_ms in (("timed", 10.0), ("dropped", 1.0)):
        rec = record(name, "dp", "8", 8, breakdown=(1.0, 2.0, 1.0, 4.0), total=8.5, comms={}, epochs=[1.0],
                     step_ms=step_ms, img_s=10.0, mfu=0.3, acc=0.1)
        if name == "dropped":
            rec["measurements"]["step_time_s"] |= {"median": None, "p90": None, "not_measured": why}
            rec["measurements"]["mfu"] |= {"mfu": None, "not_measured": f"no step time: {why}"}
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.json").write_text(get_preset("vit-tiny").to_json())
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps(rec))
    text = write_report(tmp_path / "runs", out_dir=tmp_path / "out").markdown.read_text()
    assert "The only timed run: timed, 10.0 ms per step." in text
    assert f"Left out of the ranking: dropped (no step time: {why})." in text
    assert f"Omitted, no MFU: dropped (no step time: {why})." in text


def test_parameter_dtype_pair_says_the_state_bytes_move() -> None:
    from shardbench.report.content import ReportedRun
    from shardbench.report.findings import precision_findings

    def run(param_dtype: str, state: float) -> ReportedRun:
        config = BASE | {"precision.param_dtype": param_dtype, "train.out": f"runs/{param_dtype}"}
        return ReportedRun(param_dtype, "complete", None, None, {"precision.param_dtype": param_dtype}, config, from_json(
            record(param_dtype, "dp", "8", 8, breakdown=(state / 4, state / 2, state / 4, 10.0), total=state + 10.0,
                   comms={}, epochs=[1.0], step_ms=1.0, img_s=10.0, mfu=None, acc=0.1)))

    assert precision_findings([run("float32", 160.0), run("bfloat16", 80.0)], {}) == [
        "Parameter dtype bfloat16 vs float32: parameters + optimizer state + gradients 160.0 -> 80.0 MiB (they "
        "follow the parameter dtype) and activations/temporaries 10.0 -> 10.0 MiB, so the compiled total per "
        "device shrinks 47% (170.0 -> 90.0 MiB)."]


def test_terminal_lines_of_a_sweep() -> None:
    from shardbench.report.terminal import progress_line, summary_table

    rows = sweep_rows()
    assert progress_line(1, 6, rows[0]) == ("[1/6] single_fp32  complete  29.0s  1347 img/s  step 0.095s  "
                                            "mem 210.0 MiB (compiled)  comms 0.0 MiB")
    assert progress_line(6, 6, rows[-1]).startswith("[6/6] fsdp_8_batch_4096  FAILED (oom): RESOURCE_EXHAUSTED")
    table = summary_table(rows).splitlines()
    assert table[0].split()[:3] == ["run", "status", "epoch"] and len(table) == 2 + len(rows)
    assert table[2].split()[:3] == ["single_fp32", "complete", "12.00"]


def test_report_command_prints_paths_html_last(sweep_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    report_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(sweep_dir), "--out", str(tmp_path / "elsewhere")])
    assert report_cmd.run(args) == 0
    printed = capsys.readouterr().out.split()
    assert printed[0] == str(tmp_path / "elsewhere" / "report.md")
    assert printed[-1] == str(tmp_path / "elsewhere" / "report.html")
    assert all(Path(p).exists() for p in printed)


def _unwritable(folder: Path, argv: list[str]) -> list[str]:
    """`argv` run where `folder` cannot be written to: its mode for a user, a read-only mount of it in a mount
    namespace of its own for root (whom modes do not stop)."""
    if os.geteuid() != 0:
        for p in (folder, *folder.iterdir()):
            p.chmod(0o555 if p.is_dir() else 0o444)
        return argv
    if subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("root without a mount namespace of its own (unshare -m): no folder can be made read-only here")
    q = shlex.quote(str(folder))
    return ["unshare", "-m", "sh", "-c", f'mount --bind {q} {q} && mount -o remount,bind,ro {q} && exec "$@"',
            "sh", *argv]


def test_a_sweep_the_reader_cannot_write_to_is_reported_and_left_as_it_was(tmp_path: Path) -> None:
    """Another user's sweep, or a read-only copy: `report --out` elsewhere reads its sweep.db without writing in
    its folder (neither WAL's files nor the tables a sweep creates)."""
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    with Store(sweep / "sweep.db") as store:
        store.set_meta("preset", "vit-tiny")
        for r in sweep_rows():
            store.add(r)
    before = {p.name: p.read_bytes() for p in sweep.iterdir()}
    try:
        argv = _unwritable(sweep, [sys.executable, "-m", "shardbench", "report", str(sweep), "--out", str(out)])
        done = subprocess.run(argv, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                              timeout=300, check=False)
    finally:
        for p in (sweep, *sweep.iterdir()):
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert done.returncode == 0, done.stderr
    assert all(f"| {r.name} " in (out / "report.md").read_text() for r in sweep_rows())
    assert {p.name: p.read_bytes() for p in sweep.iterdir()} == before


def test_a_finished_sweeps_report_leaves_its_database_and_folder_as_they_were(tmp_path: Path) -> None:
    """A report of a finished sweep (a committed or copied one) wrote SQLite's -wal and -shm files beside its
    sweep.db, which a read-only connection may not remove: files in the sweep's folder that no sweep wrote."""
    sweep = tmp_path / "sweep"
    with Store(sweep / "sweep.db") as store:
        store.set_meta("preset", "vit-tiny")
        for r in sweep_rows():
            store.add(r)
    before = {p.name: p.read_bytes() for p in sweep.iterdir()}
    assert sorted(before) == ["sweep.db"]  # the sweep closed: its writes are in the file
    runs, _ = load_runs(sweep)  # what report and plan --validate read a sweep through
    assert [r.name for r in runs] == [r.name for r in sweep_rows()]
    assert {p.name: p.read_bytes() for p in sweep.iterdir()} == before


def test_a_sweep_resumed_where_it_cannot_write_is_told_so_not_that_its_database_is_damaged(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    with Store(sweep / "sweep.db") as store:
        store.set_meta("preset", "vit-tiny")
    try:
        argv = _unwritable(sweep, [sys.executable, "-m", "shardbench", "sweep", "--resume", "--out", str(sweep)])
        done = subprocess.run(argv, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                              timeout=300, check=False)
    finally:
        for p in (sweep, *sweep.iterdir()):
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert done.returncode == EXIT_CODES["files"], done.stderr
    line = done.stderr.strip()  # SQLite's reason varies: root's read-only mount, a user's file mode
    assert line.startswith(f"shardbench: error: {sweep / 'sweep.db'}: cannot write to it (") and line.endswith(
        "): give --out a folder you can write to"), line


def test_an_empty_or_foreign_database_is_read_as_what_it_is(tmp_path: Path) -> None:
    """Read-only, an empty file is a sweep with no runs, and a database of other tables is no sweep's."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with Store(empty, read_only=True) as store:
        assert store.runs() == [] and store.get_meta("preset") is None
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE songs (title TEXT)")
    with pytest.raises(DataError, match="is not a sweep database"):
        Store(foreign, read_only=True)
    assert empty.read_bytes() == b""


# ----------------------------------------------------------------------------------- the page in a browser
def _browser_page():  # type: ignore[no-untyped-def]
    from conftest import missing, skip_if_requested

    skip_if_requested("SHARDBENCH_SKIP_BROWSER")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("SHARDBENCH_SKIP_BROWSER", "playwright is not installed (the test extra)")
    executable = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(executable).exists():
        missing("SHARDBENCH_SKIP_BROWSER", "no chromium binary (apt-get install chromium)")
    return sync_playwright, executable


def _column(page: Any, key: str) -> list[float | None]:
    texts = page.eval_on_selector_all(f"table#runs tbody tr td[data-key='{key}']",
                                      "cells => cells.map(c => c.textContent)")
    return [None if t == "–" else float(t.split()[0].replace(",", "")) for t in texts]


def _expected(values: list[float | None], reverse: bool) -> list[float | None]:
    present = sorted((v for v in values if v is not None), reverse=reverse)
    return present + [None] * (len(values) - len(present))


@pytest.mark.slow
def test_html_page_in_chromium(written: ReportPaths) -> None:
    from shardbench.report.html import NARROW_SCALE

    sync_playwright, executable = _browser_page()
    page_text = written.html.read_text()
    assert "http://" not in page_text and "https://" not in page_text
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            outside: list[str] = []
            page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(written.html.as_uri())
            page.wait_for_load_state("load")

            assert page.locator("table#runs tbody tr").count() == len(sweep_rows())
            # 23 + test loss + cost's 4 ($/epoch on demand and spot, kWh/epoch, energy: these records are priced
            # with the packaged table); model, spmd, tokens/s and the per-image cost are hidden
            assert page.locator("th[data-key]").count() == 28
            charts = page.locator("img.chart")
            assert charts.count() == len(CHARTS)
            shots = written.directory / "screenshots"
            shots.mkdir(exist_ok=True)
            for i in range(charts.count()):
                chart = charts.nth(i)
                chart.scroll_into_view_if_needed()
                assert chart.evaluate("img => img.complete && img.naturalWidth") > 0, chart.get_attribute("id")
                assert chart.is_visible()
                # As a reader sees it: shown whole (not scaled past the page or cut by it), with a drawing in it.
                box = chart.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 1400
                shot = shots / f"chart-{i}.png"
                chart.screenshot(path=str(shot))
                pixels = np.asarray(Image.open(shot).convert("L"))
                assert (pixels < 200).mean() > 0.01, f"{shot} is nearly blank"
            page.screenshot(path=str(shots / "page.png"), full_page=True)
            findings = page.locator("#findings").inner_text()
            assert "Compute dtype bfloat16 vs float32" in findings
            # The speed finding comes first, and the layouts are said to be one computation.
            assert findings.index("Speed") < findings.index("Precision and memory")
            assert "Fastest: dp_8, 30.0 ms per step" in findings
            assert "are the same computation in different layouts" in findings
            assert page.locator("img#chart-step_time").is_visible()
            assert "projected" in page.locator("#figure-epoch_time figcaption").inner_text()

            for key in ("epoch_s", "mfu_pct", "img_s_device"):
                original = _column(page, key)
                header = page.locator(f"th[data-key='{key}']")
                header.click()
                assert _column(page, key) == _expected(original, reverse=False), key
                assert header.get_attribute("aria-sort") == "ascending" and "▲" in header.inner_text()
                header.click()
                assert _column(page, key) == _expected(original, reverse=True), key
                assert header.get_attribute("aria-sort") == "descending" and "▼" in header.inner_text()
            # Rows move whole: the failed run's status comes along with its missing numbers.
            assert page.locator("table#runs tbody tr").last.get_attribute("data-run") == "fsdp_8_batch_4096"
            page.locator("th[data-key='run']").click()
            names = page.eval_on_selector_all("table#runs tbody tr", "rows => rows.map(r => r.dataset.run)")
            assert names == sorted(r.name for r in sweep_rows())
            # A phone's width: each chart keeps 0.64 of its own width (a one-panel chart 640 px, its text legible;
            # the two-panel throughput chart alike, not squeezed into 640) in a strip that scrolls sideways, where
            # it shrank to a quarter; the sticky run column leaves room for the figures and names the run whole
            # in its title.
            page.set_viewport_size({"width": 400, "height": 800})
            widths = [charts.nth(i).evaluate("img => [img.width, img.naturalWidth]") for i in range(charts.count())]
            assert all(shown == round(NARROW_SCALE * own) for shown, own in widths), widths
            assert {own for _, own in widths} >= {1000, 1400}, widths  # one panel and two
            assert page.evaluate("document.documentElement.scrollWidth") <= 400  # the page itself does not scroll
            first = page.locator("table#runs tbody tr td").first
            assert first.evaluate("td => td.getBoundingClientRect().width") <= 0.4 * 400 + 20
            assert first.get_attribute("title") == names[0]
            # A table longer than the window keeps its header row in view as it scrolls.
            page.set_viewport_size({"width": 400, "height": 120})
            wrap = page.locator(".table-wrap")
            assert wrap.evaluate("w => w.scrollHeight > w.clientHeight + 60")
            wrap.evaluate("w => { w.scrollTop = 60; }")
            tops = wrap.evaluate("w => [w.getBoundingClientRect().top, w.querySelector('th').getBoundingClientRect().top]")
            assert abs(tops[1] - tops[0]) <= 2, tops
            assert not outside and not errors, (outside, errors)
        finally:
            browser.close()


def test_accuracy_across_seeds_says_whether_a_difference_beats_the_spread(tmp_path: Path) -> None:
    """Four precisions x three seeds, accuracies chosen by hand: float32 80.0/81.0/82.0 (mean 81.00, spread
    2.00), bfloat16 compute 80.5/81.5/82.5 (+0.50: within), bfloat16 parameters 75.0/75.5/76.0 (-5.50:
    larger than the spread of 2.00), float16 compute 82.0/83.0/86.0 (mean 83.67, half its range 2.00 where the
    standard deviation is 2.08; +2.67: within its own spread of 4.00, the larger of the two, not float32's)."""
    directory = tmp_path / "sweep"
    accuracies = {("float32", "float32"): (0.80, 0.81, 0.82), ("float32", "bfloat16"): (0.805, 0.815, 0.825),
                  ("bfloat16", "bfloat16"): (0.75, 0.755, 0.76), ("float32", "float16"): (0.82, 0.83, 0.86)}
    with Store(directory / "sweep.db") as store:
        for (param, compute), accs in accuracies.items():
            for seed, acc in enumerate(accs):
                name = f"{param}_{compute}_seed_{seed}"
                over = {"precision.param_dtype": param, "precision.dtype": compute, "train.seed": seed}
                store.add(row(name, over, record(name, "single", "1", 1, breakdown=(1, 2, 1, 1), total=5.0,
                                                 comms={}, epochs=[1.0], step_ms=10.0, img_s=10.0, mfu=0.1,
                                                 acc=acc)))
    text = write_report(directory).markdown.read_text()
    assert "### Accuracy across seeds" in text
    assert "parameters float32, compute float32: test accuracy 81.00% ± 1.00 over 3 seeds (80.00–82.00%)" in text
    assert ("parameters float32, compute bfloat16 vs parameters float32, compute float32: +0.50 points, within the "
            "seed-to-seed spread (2.00 points)") in text
    assert ("parameters bfloat16, compute bfloat16 vs parameters float32, compute float32: -5.50 points, larger "
            "than the seed-to-seed spread (2.00 points)") in text
    assert "parameters float32, compute float16: test accuracy 83.67% ± 2.00 over 3 seeds (82.00–86.00%)" in text
    assert ("parameters float32, compute float16 vs parameters float32, compute float32: +2.67 points, within the "
            "seed-to-seed spread (4.00 points)") in text


def test_speed_ties_and_a_layout_that_computes_something_else(tmp_path: Path) -> None:
    """Three layouts of one computation at batch 128: b is 5% slower than a, with a step spread of 10% where a's is
    2% (a tie: the larger spread is the noise), c twice as slow with an all-reduce of 40 MiB per step (on a ring of
    8 each device sends 2 x 7/8 x 40 = 70 MiB) and a test loss 25% off (not the same computation)."""
    directory = tmp_path / "sweep"

    def rec(name: str, step_ms: float, comms: dict[str, tuple[int, float]], test_loss: float,
            spread: float) -> dict[str, Any]:
        sent = {kind: 2 * 7 / 8 * payload for kind, (_, payload) in comms.items()}
        made = record(name, "dp", "8", 8, breakdown=(1, 2, 1, 1), total=5.0, comms=comms, epochs=[],
                      step_ms=step_ms, img_s=0.0, mfu=0.1, acc=0.5, partial=(10, 100, 1.0), sent=sent)
        made["measurements"]["step_time_s"]["p90"] = step_ms * (1 + spread) / 1e3
        made["test_loss"] = test_loss
        return made

    runs = {"a": (100.0, {}, 2.0, 0.02), "b": (105.0, {}, 2.0, 0.10),
            "c": (200.0, {"all-reduce": (6, 40.0)}, 2.5, 0.10)}
    with Store(directory / "sweep.db") as store:
        for i, (name, (step, comms, loss, spread)) in enumerate(runs.items()):
            store.add(row(name, {"parallel.mesh": f"{8 >> i}x{1 << i}"}, rec(name, step, comms, loss, spread)))
    paths = write_report(directory)
    text = paths.markdown.read_text()
    speed = text.split("### Speed", 1)[1].split("###", 1)[0]
    assert "Fastest: a, 100.0 ms per step" in speed
    assert "b ties with a (105.0 ms against 100.0 ms): the 5.0% difference is within the spread of their step times" in speed
    # The bytes are a fact, not a cause: nothing timed the collectives, so the sentence names no cause.
    assert ("c is 2.00x slower (200.0 ms against 100.0 ms); it differs in: parallel.mesh 2x4 against 8x1; 70.0 MiB "
            "sent in collectives per device per step (all-reduce) against 0.0 MiB.") in speed
    assert NOT_A_CAUSE in speed
    _no_cause_claimed(speed)
    assert "a, b, c should be the same computation but differ" in text and "at test loss" in text
    assert paths.differing and paths.differing[0].startswith("a, b, c differ by 2.0e-01 at test loss")
    # no run trained a whole epoch: the epoch chart is projected (100 steps x the median step)
    assert "epoch_time" in paths.charts and "projected" in text


def test_the_seeds_mesh_by_batch_charts_from_a_short_sweep(tmp_path: Path) -> None:
    """A mesh x batch grid of runs that trained part of an epoch each: the seeds' two charts, epoch time
    (projected) and memory per mesh grouped by batch size, still come out; a chart with nothing is left out."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for mesh in ("8x1", "4x2", "2x4"):
            for batch in (64, 256):
                name = f"mesh_{mesh}_batch_{batch}"
                made = record(name, "dp+tp", mesh, 8, breakdown=(1, 2, 1, batch / 64), total=4 + batch / 64,
                              comms={}, epochs=[], step_ms=batch / 8, img_s=0.0, mfu=None, acc=0.3,
                              partial=(5, 50_000 // batch, 1.0))
                store.add(row(name, {"parallel.mesh": mesh, "train.batch_size": batch}, made))
    paths = write_report(directory)
    assert {"mesh_batch_epoch_time", "mesh_batch_memory", "epoch_time", "step_time"} <= set(paths.charts)
    assert "mfu" not in paths.charts and "comms" not in paths.charts  # nothing to draw: left out, said in a line
    text = paths.markdown.read_text()
    assert "Communication per step: left out" in text and "left out, as no run reports an MFU" in text
    for name in ("mesh_batch_epoch_time", "mesh_batch_memory"):
        image = Image.open(paths.charts[name])
        assert image.size[0] >= 500 and (np.asarray(image.convert("L")) < 200).mean() > 0.01
    assert paths.clipped == {}


def test_runs_of_different_models_are_ranked_apart(tmp_path: Path) -> None:
    """An MLP sweep and an LM sweep in one report: each model's runs are ranked among themselves (an LM's
    examples are not an MLP's), however fast the other model's runs are."""
    directory = tmp_path / "sweep"

    def rec(name: str, step_ms: float) -> dict[str, Any]:
        return record(name, "dp", "8", 8, breakdown=(1, 2, 1, 1), total=5.0, comms={}, epochs=[],
                      step_ms=step_ms, img_s=0.0, mfu=0.1, acc=0.5, partial=(10, 100, 1.0))

    runs = {"mlp_a": ("mlp", 10.0), "mlp_b": ("mlp", 30.0), "lm_a": ("lm", 200.0), "lm_b": ("lm", 100.0)}
    with Store(directory / "sweep.db") as store:
        for name, (kind, step) in runs.items():
            store.add(row(name, {"model.kind": kind}, rec(name, step)))
    paths = write_report(directory)
    text = paths.markdown.read_text()
    speed = text.split("### Speed", 1)[1].split("###", 1)[0]
    assert "Fastest lm run: lm_b, 100.0 ms per step" in speed and "lm_a is 2.00x slower" in speed
    assert "Fastest mlp run: mlp_a, 10.0 ms per step" in speed and "mlp_b is 3.00x slower" in speed
    assert "lm_b is" not in speed and "lm_a is 20" not in speed
    # nor on one chart's axis, where an MLP's examples/s stood beside an LM's sequences/s as "examples per second"
    assert "throughput" not in paths.charts
    assert ("Training throughput per run: left out, as the runs train 2 models (mlp, lm), whose examples are not "
            "alike; the table gives each run's in its own unit.") in text


def test_runs_of_one_model_at_different_sequence_lengths_are_ranked_apart(tmp_path: Path) -> None:
    """A long-context sweep: a step at 4k tokens is not the work of one at 1k, so each length's runs are ranked
    among themselves; remat, a layout setting, does not split them."""
    directory = tmp_path / "sweep"

    def rec(name: str, step_ms: float) -> dict[str, Any]:
        return record(name, "dp", "8", 8, breakdown=(1, 2, 1, 1), total=5.0, comms={}, epochs=[],
                      step_ms=step_ms, img_s=0.0, mfu=0.1, acc=0.5, partial=(10, 100, 1.0))

    runs = {"short_ring": (1024, "none", 10.0), "short_gather": (1024, "full", 20.0),
            "long_ring": (4096, "none", 300.0), "long_gather": (4096, "none", 100.0)}
    with Store(directory / "sweep.db") as store:
        for name, (tokens, remat, step) in runs.items():
            store.add(row(name, {"model.kind": "lm", "model.seq_len": tokens, "model.remat": remat},
                          rec(name, step)))
    speed = write_report(directory).markdown.read_text().split("### Speed", 1)[1].split("###", 1)[0]
    assert "Fastest run at seq_len 1024: short_ring, 10.0 ms per step" in speed
    assert "short_gather is 2.00x slower" in speed
    assert "Fastest run at seq_len 4096: long_gather, 100.0 ms per step" in speed
    assert "long_ring is 3.00x slower" in speed and "long_gather is" not in speed and "long_ring is 30" not in speed


def test_a_slowdown_names_what_auto_ran_from_the_records(tmp_path: Path) -> None:
    """A sweep over --model.qkv-layout auto,fused: the settings say only 'auto', the records what it ran (seq-major
    on a GPU under cuDNN's attention, here written by hand); the slowdown names both."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for name, layout, ran, step_ms in (("auto", "auto", "seq-major", 25.0), ("fused", "fused", "fused", 50.0)):
            made = record(name, "dp", "8", 8, breakdown=(1, 2, 1, 1), total=5.0, comms={}, epochs=[],
                          step_ms=step_ms, img_s=0.0, mfu=0.1, acc=0.5, partial=(10, 100, 1.0))
            made["measurements"]["qkv_layout"] = ran
            store.add(row(name, {"model.qkv_layout": layout}, made))
    speed = write_report(directory).markdown.read_text().split("### Speed", 1)[1].split("###", 1)[0]
    assert "it differs in: model.qkv_layout fused against auto (seq-major)" in speed
    # The note under the table explains what the table shows: no epoch column (no run trained a whole epoch),
    # no payload label (both records keep bytes sent), no predicted columns.
    note = write_report(directory).markdown.read_text()
    assert "Throughput is the global batch" in note and "comms are the bytes each device sends" in note
    assert "Epoch time is" not in note and "payload" not in note and '"Predicted" columns' not in note


def test_the_table_note_explains_the_epoch_column_and_payloads_where_the_table_has_them(tmp_path: Path) -> None:
    """Runs that trained whole epochs show the epoch column, and a record written before bytes sent were kept
    shows its comms as a payload: the note under the table explains both."""
    directory = tmp_path / "sweep"
    with Store(directory / "sweep.db") as store:
        for name, sent in (("kept", {"all-reduce": 2 * 7 / 8 * 40.0}), ("older", None)):
            made = record(name, "dp", "8", 8, breakdown=(1, 2, 1, 1), total=5.0, comms={"all-reduce": (6, 40.0)},
                          epochs=[2.0, 2.0], step_ms=50.0, img_s=0.0, mfu=0.1, acc=0.5, sent=sent)
            store.add(row(name, {"parallel.mesh": "8"}, made))
    note = write_report(directory).markdown.read_text()
    assert "Epoch time is the mean wall time per whole epoch" in note
    assert '("payload": the collectives\' buffers, from a record written before bytes sent were kept)' in note


def test_a_tick_label_beyond_the_view_is_not_taken_for_a_clipped_text() -> None:
    """A log axis spanning less than a decade labels its minor ticks; those past the view (6 on an axis from 6.7 to
    45) are kept by matplotlib but never drawn. They were reported as clipped; a text really past the edge is."""
    from matplotlib.figure import Figure

    from shardbench.report.plots import clipped_texts

    fig = Figure(figsize=(6.0, 4.0), dpi=100, layout="constrained")
    ax = fig.subplots()
    ax.plot([7.0, 40.0], [7.0, 40.0])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(6.7, 45.0)
    ax.set_ylim(6.7, 45.0)
    beyond = [t.get_text() for t, loc in zip(ax.xaxis.get_minorticklabels(), ax.xaxis.get_minorticklocs(),
                                             strict=False) if t.get_text() and not 6.7 <= loc <= 45.0]
    assert beyond  # the case itself: a labelled minor tick outside the view
    assert clipped_texts(fig) == ()
    fig.text(0.98, 0.5, "a note running past the right edge", ha="left")
    assert clipped_texts(fig) == ("a note running past the right edge",)
