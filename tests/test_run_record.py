"""The run record: one versioned schema, written by `train` and read back through `from_json`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import flax
import jax
import pytest

from shardbench.errors import DataError
from shardbench.measure.run_record import (
    SCHEMA_VERSION, Breakdown, Collective, Measurements, RecordError, RunRecord, field_table, from_json, to_json,
)
from shardbench.report.write import load_runs
from shardbench.train.loop import run

RECORDS = Path(__file__).resolve().parents[1] / "benchmarks" / "data"


@pytest.mark.slow
def test_train_writes_a_versioned_record_that_reads_back_typed(micro) -> None:
    cfg = micro(**{"parallel.strategy": "dp", "parallel.mesh": "8", "train.steps": 3})
    run(cfg)
    saved = json.loads((Path(cfg.train.out) / "summary.json").read_text())
    record = from_json(saved)
    assert record.schema_version == SCHEMA_VERSION == saved["schema_version"]
    assert record.versions is not None and record.versions.jax == jax.__version__
    assert record.versions.flax == flax.__version__ and record.host and record.device_kind == "cpu"
    m = record.measurements
    assert isinstance(m, Measurements) and m.step_time_s is not None
    assert m.step_time_s.median == saved["measurements"]["step_time_s"]["median"]
    assert isinstance(m.comms["all-reduce"], Collective)
    assert m.comms["all-reduce"].bytes == saved["measurements"]["comms"]["all-reduce"]["bytes"]
    # dp on 8 devices: every all-reduce spans the 8, so each device sends 2 x 7/8 of its payload on a ring.
    assert m.comms["all-reduce"].sent_bytes == pytest.approx(2 * 7 / 8 * m.comms["all-reduce"].bytes, abs=8)
    assert m.comms_total_sent_bytes == sum(c.sent_bytes for c in m.comms.values())
    assert m.comms_unknown_trip_counts == 0
    assert (m.attention, m.qkv_layout) == ("einsum", "fused")  # auto on the CPU: what the ViT's blocks ran
    assert m.memory is not None and m.memory.breakdown is not None and m.memory.breakdown.params_bytes > 0
    # Written from the types and read back into them, the measurements are exactly what was written: the
    # types are the schema, field for field.
    assert to_json(m) == saved["measurements"]


def test_records_of_the_previous_layout_are_read_and_newer_ones_refused() -> None:
    old = {"status": "complete", "run_name": "mesh_8_batch_128", "images_per_s": 1234.0,
           "measurements": {"step_time_s": {"median": 0.1, "p90": 0.12, "measured_steps": 5, "excluded_steps": 2}},
           "something_older": 1}
    record = from_json(old)  # version 0: no schema_version, unknown fields tolerated, missing ones None
    assert record.schema_version == 0 and record.images_per_s == 1234.0
    assert record.measurements is not None and record.measurements.step_time_s.warmup is None
    with pytest.raises(RecordError,
                       match=f"is a version-{SCHEMA_VERSION + 1} run record; this shardbench reads versions 0 to "
                             f"{SCHEMA_VERSION}"):
        from_json({"schema_version": SCHEMA_VERSION + 1})
    # A version that no shardbench writes is damage, not a newer record to upgrade for (True and -1 were read).
    for version in ("8", None, True, -1, 2.0):
        with pytest.raises(RecordError, match=re.escape(f"summary.json.schema_version is {version!r}: a run "
                                                        f"record's version is a whole number from 0 to")):
            from_json({"schema_version": version})
    assert issubclass(RecordError, DataError)  # a file that cannot be used: exit 4, as a truncated one
    with pytest.raises(RecordError, match=r"summary.json.measurements has unknown field 'stepp_time_s'"):
        from_json({"schema_version": SCHEMA_VERSION, "measurements": {"stepp_time_s": {}}})
    # Written before the bytes each device sends and the loops of unknown trip count were kept: read as None.
    payload_only = from_json({"schema_version": SCHEMA_VERSION, "measurements": {
        "comms": {"all-reduce": {"count": 1, "bytes": 4096}}, "comms_total_bytes": 4096}})
    m = payload_only.measurements
    assert m.comms["all-reduce"] == Collective(count=1, bytes=4096, sent_bytes=None)
    assert m.comms_total_sent_bytes is None and m.comms_unknown_trip_counts is None
    # Version 4, written before the attention was kept: read as None, and its own fields strictly.
    v4 = from_json({"schema_version": 4, "measurements": {"comms_unknown_trip_counts": 0}})
    assert v4.measurements.attention is None and v4.measurements.comms_unknown_trip_counts == 0
    assert from_json({"schema_version": 5, "measurements": {"attention": "cudnn"}}).measurements.attention == "cudnn"
    # Version 5, written before a model of your own's one-device count was kept: read as None.
    v5 = from_json({"schema_version": 5, "measurements": {"flops": {"mfu_uses": "xla"}}})
    assert v5.measurements.flops.traced_per_step is None and v5.measurements.flops.mfu_uses == "xla"
    assert from_json({"schema_version": 6, "measurements": {"flops": {
        "traced_per_step": 2.0}}}).measurements.flops.traced_per_step == 2.0
    # Version 6, written before a cost kept what its row's price is for: read as None, the rest as written.
    v6 = from_json({"schema_version": 6, "cost": {"device": "cpu", "devices": 1}})
    assert v6.cost is not None and v6.cost.priced_per is None and v6.cost.device == "cpu"
    with pytest.raises(RecordError, match="unknown field 'priced_pre'"):
        from_json({"schema_version": SCHEMA_VERSION, "cost": {"priced_pre": "per host"}})
    assert from_json({"schema_version": 7, "cost": {"priced_per": "per host"}}).cost.priced_per == "per host"
    # Version 7, written before the q/k/v layout was kept: read as None, the rest as written.
    v7 = from_json({"schema_version": 7, "measurements": {"attention": "cudnn"}})
    assert v7.measurements.qkv_layout is None and v7.measurements.attention == "cudnn"
    assert from_json({"schema_version": 8, "measurements": {
        "qkv_layout": "seq-major"}}).measurements.qkv_layout == "seq-major"
    # Version 8, written before a busy host's load was kept beside its peak: read as None.
    v8 = from_json({"schema_version": 8, "measurements": {"mfu": {"peak_origin": "measured now"}}})
    assert v8.measurements.mfu.peak_busy is None and v8.measurements.mfu.peak_origin == "measured now"
    assert SCHEMA_VERSION == 9 and from_json({"schema_version": 9, "measurements": {"mfu": {
        "peak_busy": "load average 5.1 on 2 core(s)"}}}).measurements.mfu.peak_busy == "load average 5.1 on 2 core(s)"


def test_every_field_is_documented_with_its_unit_in_one_place() -> None:
    rows = field_table()
    paths = [path for path, _, _ in rows]
    assert "measurements.step_time_s.median" in paths and "measurements.comms.*.bytes" in paths
    assert "measurements.comms.*.sent_bytes" in paths and "measurements.comms_unknown_trip_counts" in paths
    assert "measurements.partial_epochs[].steps" in paths
    assert all(doc for _, _, doc in rows), [p for p, _, d in rows if not d]
    units = dict((path, unit) for path, unit, _ in rows)
    assert units["measurements.step_time_s.median"] == "s" and units["measurements.mfu.peak_flops_per_s_per_device"] \
        == "FLOP/s"
    assert RunRecord().schema_version == 0


def test_the_docs_field_table_is_the_schemas_own() -> None:
    """docs/measurements.md's table of every field is `field_table()`'s output, row for row (it had drifted: the
    attention field of version 5 was missing)."""
    lines = (Path(__file__).resolve().parents[1] / "docs" / "measurements.md").read_text().splitlines()
    start = lines.index("| field | unit | meaning |") + 2
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("| ")), len(lines))
    assert lines[start:end] == [f"| `{path}` | {unit} | {doc} |" for path, unit, doc in field_table()]


def test_the_published_records_of_earlier_versions_still_load_for_the_report() -> None:
    """Every summary.json under benchmarks/data (written by an earlier shardbench) reads through the one
    schema, and the report's loader takes each folder of them as runs with their memory breakdown."""
    summaries = sorted(RECORDS.rglob("summary.json"))
    assert summaries, f"no records under {RECORDS}"
    for path in summaries:
        data = json.loads(path.read_text())
        record = from_json(data, str(path))
        # Read as strictly as this version's own records: every field they hold is still in the schema, so
        # renaming or dropping one fails here.
        from_json({**data, "schema_version": SCHEMA_VERSION}, str(path))
        assert isinstance(record.measurements.memory.breakdown, Breakdown), path
    folders = sorted({p.parent.parent for p in summaries})
    loaded = [run for folder in folders for run in load_runs(folder)[0]]
    assert len(loaded) == len(summaries) and all(r.ok and r.part("params") > 0 for r in loaded)
