"""The price table and the cost per epoch: hand-computed dollars and kWh for a known table, the packaged table's
rows, one-line errors (exit 2) for bad tables through the commands, older run records still read, and the cost
in the run record, the plan and the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardbench import cli
from shardbench.errors import ConfigError
from shardbench.hardware import BY_NAME
from shardbench.measure.energy import Window
from shardbench.measure.run_record import (
    SCHEMA_VERSION, Cost, Measurements, PartialEpoch, RecordError, RunRecord, StepTimes, Throughput, from_json, to_json,
)
from shardbench.presets import get_preset
from shardbench.prices import DevicePrice, epoch_cost, load_prices, parse_prices, run_cost

KNOWN = """
currency = "USD"
[devices.h100]
on_demand = 2.0
spot = 1.0
watts = 500
source = "a test"
date = "2026-11-25"

[devices.cpu]
per = "host"
on_demand = 0.36
spot = 0.18
watts = 100
source = "a test"
date = "2026-11-25"
estimated = ["watts"]
"""
ROW = 'on_demand = 2.0\nspot = 1.0\nwatts = 500\nsource = "s"\ndate = "d"\n'


def test_cost_of_an_epoch_by_hand() -> None:
    h100 = parse_prices(KNOWN).devices["h100"]
    # 400 steps of 0.25 s: an epoch of 100 s on 4 devices. Dollars: 2.0 $/h x 4 x 100 s / 3600 s/h = 0.2222...;
    # spot half that; kWh: 500 W x 4 x 100 s / 3.6e6 J/kWh = 0.05556. 1e5 tokens a step, 4e7 an epoch: a billion
    # tokens is 25 epochs, $5.556 on demand.
    cost = epoch_cost(h100, 0.25, 400, 4, unit="tokens", units_per_step=1e5)
    assert cost.epoch_time_s == 100.0
    assert cost.on_demand_usd == pytest.approx(2 / 9)
    assert cost.spot_usd == pytest.approx(1 / 9)
    assert cost.kwh == pytest.approx(0.2 / 3.6)
    assert cost.per == "billion tokens" and cost.on_demand_usd_per == pytest.approx(50 / 9)
    assert cost.spot_usd_per == pytest.approx(25 / 9)  # 25 epochs at $1/9 each
    assert cost.kwh_per == pytest.approx(25 * 0.2 / 3.6)
    assert cost.energy == "estimated" and cost.watts_per_device == 500
    images = epoch_cost(h100, 0.25, 400, 4, unit="images", units_per_step=1000)  # 4e5 an epoch: 2.5 per million
    assert images.per == "million images" and images.on_demand_usd_per == pytest.approx(2.5 * 2 / 9)


def test_measured_energy_replaces_the_table_watts() -> None:
    h100 = parse_prices(KNOWN).devices["h100"]
    # 2 GPUs used 6,000 J in 10 s: 300 W each; an epoch of 100 s on 4 devices: 300 x 4 x 100 / 3.6e6 kWh.
    cost = epoch_cost(h100, 0.25, 400, 4, measured=Window(6000.0, 10.0, 2))
    assert cost.energy == "measured" and cost.watts_per_device == 300
    assert cost.kwh == pytest.approx(0.12 / 3.6) and cost.measured_joules == 6000.0
    assert cost.on_demand_usd == pytest.approx(2 / 9)  # dollars do not depend on the power


PER_HOST_H100 = """
[devices.h100]
per = "host"
on_demand = 55.04
spot = 22.0
watts = 5600
source = "a p5.48xlarge, 8 GPUs"
date = "2026-11-25"
"""
EIGHT_AT_600W = Window(8 * 600 * 10.0, 10.0, 8)  # NVML: 8 GPUs used 48,000 J in 10 s, 600 W each


def test_measured_energy_on_a_row_priced_per_host_counts_the_gpus() -> None:
    """NVML measures watts per GPU: a row priced per machine still pays for 1 host, but the 8 GPUs draw the power.
    100 steps of 1 s on one host of 8 GPUs: 600 W x 8 x 100 s / 3.6e6 = 0.1333 kWh (not 600 W x 1 host)."""
    row = parse_prices(PER_HOST_H100).devices["h100"]
    cost = epoch_cost(row, 1.0, 100, 8, hosts=1, measured=EIGHT_AT_600W)
    assert cost.kwh == pytest.approx(0.48 / 3.6) and cost.energy == "measured" and cost.watts_per_device == 600
    assert cost.devices == 1 and cost.on_demand_usd == pytest.approx(55.04 * 100 / 3600)  # dollars: one host
    estimated = epoch_cost(row, 1.0, 100, 8, hosts=1)  # the row's watts are the machine's: 5600 W x 1 host
    assert estimated.kwh == pytest.approx(0.56 / 3.6)


def test_repricing_a_measured_run_with_a_row_priced_per_host_counts_the_gpus() -> None:
    """`report --prices` prices a run again (report.cost.priced): its measured joules, on 8 GPUs at 600 W, give
    0.1333 kWh over a 100 s epoch under a per-host row as under the per-device row it was first priced with,
    and the other way round: a record first priced per host (one host counted) still holds 8 GPUs' power."""
    from shardbench.report.content import ReportedRun
    from shardbench.report.cost import priced

    m = _measurements(step_time_s=StepTimes(median=1.0))

    def repriced(first_table: str, then: str) -> Cost | None:
        first = run_cost(parse_prices(first_table), m, 100, energy=EIGHT_AT_600W)
        assert first.kwh == pytest.approx(0.48 / 3.6)  # 600 W x 8 GPUs x 100 s, whatever the row prices
        record = RunRecord(schema_version=SCHEMA_VERSION, status="complete", steps=100, measurements=m, cost=first)
        return priced(ReportedRun("r", "complete", None, None, {}, {}, record), parse_prices(then)).rec.cost

    per_host = repriced(KNOWN, PER_HOST_H100)
    assert per_host is not None and per_host.energy == "measured" and per_host.devices == 1
    assert per_host.kwh == pytest.approx(0.48 / 3.6) and per_host.on_demand_usd == pytest.approx(55.04 * 100 / 3600)
    per_device = repriced(PER_HOST_H100, KNOWN)
    assert per_device is not None and per_device.energy == "measured" and per_device.devices == 8
    assert per_device.watts_per_device == pytest.approx(600) and per_device.kwh == pytest.approx(0.48 / 3.6)
    assert per_device.on_demand_usd == pytest.approx(2.0 * 8 * 100 / 3600)


def test_a_row_priced_per_host_counts_hosts_not_devices() -> None:
    cpu = parse_prices(KNOWN).devices["cpu"]
    cost = epoch_cost(cpu, 1.0, 3600, 8, hosts=1)  # an hour on one host, whatever its 8 simulated devices
    assert cost.devices == 1 and cost.on_demand_usd == pytest.approx(0.36) and cost.kwh == pytest.approx(0.1)
    assert "estimated: watts" in (cost.price_source or "")


def test_tpu_v2_and_v3_jax_devices_are_priced_as_chips() -> None:
    """A TPU v3 chip is two JAX devices and its row is per chip-hour: an epoch of 100 s on 32 v3 devices (a 4x4
    slice, 16 chips) at the packaged $2.00 and $0.60 per chip-hour and 220 W a chip is 2.00 x 16 x 100 / 3600 =
    $0.8889 on demand, $0.2667 spot and 220 x 16 x 100 / 3.6e6 = 0.0978 kWh, not twice that; a v5e chip is one
    device (16 devices, 16 chips at $1.20)."""
    table = load_prices()
    v3, v5e = table.lookup("tpu-v3"), table.lookup("tpu-v5e")
    assert v3 is not None and (v3.on_demand, v3.spot, v3.watts) == (2.00, 0.60, 220)
    cost = epoch_cost(v3, 0.25, 400, 32)
    assert cost.devices == 16 and cost.epoch_time_s == 100.0
    assert cost.on_demand_usd == pytest.approx(2.00 * 16 * 100 / 3600)
    assert cost.spot_usd == pytest.approx(0.60 * 16 * 100 / 3600)
    assert cost.kwh == pytest.approx(220 * 16 * 100 / 3.6e6)
    assert v5e is not None and epoch_cost(v5e, 0.25, 400, 16).on_demand_usd == pytest.approx(1.20 * 16 * 100 / 3600)
    # The record of a run measured on a v3-8 (JAX: 8 "TPU v3" devices, 4 chips): 100 steps of 0.5 s.
    run = run_cost(table, _measurements(platform="tpu", device_kind="TPU v3", devices=8), 100)
    assert run.device == "tpu-v3" and run.devices == 4
    assert run.on_demand_usd == pytest.approx(2.00 * 4 * 50 / 3600)


def test_lookup_by_device_kind_and_chip_name() -> None:
    table = load_prices()
    for kind, name in [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100-pcie"), ("h100", "h100"),
                       ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L4", "l4"),
                       ("TPU v5 lite", "tpu-v5e"), ("TPU v5", "tpu-v5p"), ("TPU v6 lite", "tpu-v6e"),
                       ("TPU v4", "tpu-v4"), ("cpu", "cpu")]:
        found = table.lookup(kind)
        assert found is not None and found.name == name, kind
    assert table.lookup("a quantum annealer") is None


def _said_of(source: str, figure: str) -> str:
    """What `source` says of one figure: its own part (the sources read "...; watts: ...; spot: our estimate, ..."
    at the top level, outside parentheses), else the opening part, which is the on-demand price's."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(source):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ";" and depth == 0:
            parts.append(source[start:at].strip())
            start = at + 1
    parts.append(source[start:].strip())
    label = figure.replace("_", "-")
    own = [p for p in parts[1:] if label in p.split(":")[0].split(" and ")]
    return own[0] if own else parts[0]


def _unsaid_estimates(row: DevicePrice) -> list[str]:
    """The estimated figures whose part of the source does not say they are estimates. A spot price put at a share
    of on-demand is one by how it is made (docs/cost.md: 40% of on-demand where no spot list price is given)."""
    return [figure for figure in row.estimated
            if "estimate" not in (said := _said_of(row.source, figure))
            and not (figure == "spot" and "of on-demand" in said)]


def test_an_estimate_unsaid_in_its_own_part_of_the_source_is_found() -> None:
    """The check of the packaged rows can fail: a row whose source calls its spot price an estimate but lists its
    watts as estimated has said nothing of the watts."""
    row = parse_prices(KNOWN.replace('estimated = ["watts"]', 'estimated = ["watts", "spot"]').replace(
        'source = "a test"\ndate = "2026-11-25"\nestimated',
        'source = "https://x (n2); watts: a data sheet; spot: our estimate, 40% of on-demand"\n'
        'date = "2026-11-25"\nestimated')).devices["cpu"]
    assert row.estimated == ("watts", "spot") and _unsaid_estimates(row) == ["watts"]


def test_a_date_written_as_a_toml_date_reads_as_its_iso_string(tmp_path: Path) -> None:
    """TOML's own date (unquoted) is a date as good as a quoted one: the row keeps it as "2025-06-01"; a date and
    time keeps both; a time of day alone is no date, refused in one line."""
    table = tmp_path / "dated.toml"
    table.write_text(KNOWN.replace('date = "2026-11-25"', "date = 2025-06-01", 1))
    loaded = load_prices(table)
    assert loaded.devices["h100"].date == "2025-06-01" and loaded.devices["cpu"].date == "2026-11-25"
    assert "(2025-06-01" in loaded.devices["h100"].describe()
    stamped = parse_prices(KNOWN.replace('date = "2026-11-25"', "date = 2025-06-01T12:30:00", 1))
    assert stamped.devices["h100"].date == "2025-06-01T12:30:00"
    with pytest.raises(ConfigError, match=r"\[devices.h100\]: date = 12:30:00 is a time of day: give a date") as err:
        parse_prices(KNOWN.replace('date = "2026-11-25"', "date = 12:30:00", 1))
    assert "\n" not in str(err.value)


def test_packaged_table_prices_every_chip_with_a_source_and_date() -> None:
    table = load_prices()
    assert table.origin == "packaged" and set(table.devices) == {*BY_NAME, "cpu"}
    for row in table.devices.values():
        assert row.source.startswith(("http", "our estimate from http")) or "https://" in row.source, row.name
        assert row.date and row.on_demand > 0 and 0 < row.spot <= row.on_demand and row.watts > 0
        assert _unsaid_estimates(row) == [], row.name  # each estimated figure says so where its source names it
    assert 8 * table.devices["h100"].on_demand == pytest.approx(55, abs=0.5)  # the "about $55 an hour"


BAD = [
    ("currency = \"USD\"\n[devices.h100\n", "not valid TOML"),
    ("[devices.h100]\n" + ROW + "ondemand = 3\n", "unknown key 'ondemand': the keys are on_demand"),
    ("[devices.h100]\n" + ROW.replace("on_demand = 2.0", "on_demand = -1"), "on_demand = -1: give 0 dollars or more"),
    ("[devices.h100]\n" + ROW.replace("on_demand = 2.0", "on_demand = 1e308"),
     "on_demand = 1e+308: give at most 100,000 dollars an hour"),
    ("[devices.h100]\n" + ROW.replace("watts = 500", "watts = 5e9"), "watts = 5e+09: give at most 1,000,000 watts"),
    ("[devices.h100]\n" + ROW.replace("watts = 500\n", ""), "missing 'watts'"),
    ("[devices.h100]\n" + ROW.replace('source = "s"\n', ""), "missing 'source': give the URL"),
    ("[devices.h100]\n" + ROW.replace('date = "d"\n', ""), "missing 'date'"),
    ("[devices.h100]\n" + ROW.replace('source = "s"', 'source = " "'), "source is empty"),
    ("[devices.h100]\n" + ROW.replace('date = "d"', "date = 2025"), "date = 2025 is not text: give a date"),
    ("[devices.h1000]\n" + ROW, "unknown device 'h1000': name a --target chip or cpu"),
    ("[devices.h100]\n" + ROW.replace("spot = 1.0", 'spot = "cheap"'), "spot = 'cheap' is not a number"),
    ("[devices.h100]\n" + ROW + 'estimated = ["price"]\n', "estimated = ['price']: give a list of some of"),
    ('currency = "EUR"\n[devices.h100]\n' + ROW, "currency = 'EUR'"),
    ('prices = 1\n[devices.h100]\n' + ROW, "unknown key 'prices': the top level holds"),
    ('currency = "USD"\n', "no [devices.NAME] rows"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(":")[0][:30] for _, m in BAD])
def test_bad_table_is_one_line_and_exit_2_through_plan(tmp_path: Path, text: str, message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_prices(bad)
    assert message in str(err.value) and "\n" not in str(err.value) and str(bad) in str(err.value)
    code = cli.main(["plan", "--preset", "lm-tiny", "--target", "8xh100", "--prices", str(bad),
                     "--out", str(tmp_path / "plan")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "plan").exists()  # nothing was compiled or written


def test_missing_table_through_train_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.toml"
    assert cli.main(["train", "--preset", "lm-tiny", "--prices", str(missing), "--out", str(tmp_path / "r")]) == 2
    assert cli.main(["report", str(tmp_path), "--prices", str(missing)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all("no such file: give a price table" in line for line in lines)
    assert not (tmp_path / "r").exists()


def test_bad_table_through_the_program(tmp_path: Path) -> None:
    """`python -m shardbench plan --prices bad.toml`, as a user runs it: one line on stderr, exit 2."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[devices.h100]\n" + ROW.replace("spot = 1.0", "spot = -3"))
    done = subprocess.run([sys.executable, "-m", "shardbench", "plan", "--preset", "lm-tiny", "--target", "8xh100",
                           "--prices", str(bad)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "[devices.h100]: spot = -3: give 0 dollars or more" in done.stderr


def _measurements(**extra: object) -> Measurements:
    fields: dict[str, object] = {
        "platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "devices": 8, "processes": 1, "global_batch": 32,
        "step_time_s": StepTimes(median=0.5),
        "throughput": Throughput(examples_per_s=64.0, unit="tokens", units_per_s=64.0 * 1024),
        "partial_epochs": [PartialEpoch(steps=10, of=100, time_s=5.0)]}
    fields.update(extra)
    return Measurements(**fields)  # type: ignore[arg-type]


def test_run_cost_from_measurements() -> None:
    # 100 steps of 0.5 s on 8 H100s at $2/h: 8 x 50 s x 2 / 3600 = $0.2222; 32 x 1024 tokens a step.
    cost = run_cost(parse_prices(KNOWN), _measurements(), 100, energy_note="no NVML here")
    assert cost.on_demand_usd == pytest.approx(8 * 50 * 2 / 3600)
    assert cost.per == "billion tokens"
    assert cost.on_demand_usd_per == pytest.approx(8 * 0.5 * 2 / 3600 * 1e9 / (32 * 1024))
    assert cost.energy == "estimated" and cost.energy_note == "no NVML here"
    none = run_cost(parse_prices(KNOWN), _measurements(device_kind="TPU v4", platform="tpu"), 100)
    assert none.on_demand_usd is None and "no row for device 'TPU v4'" in (none.not_measured or "")


def test_older_records_still_read_and_the_new_section_round_trips() -> None:
    assert SCHEMA_VERSION >= 3  # the cost section came with version 3
    v2 = {"schema_version": 2, "status": "complete", "steps": 10, "measurements": {"platform": "cpu"}}
    old = from_json(v2)
    assert old.schema_version == 2 and old.cost is None and old.steps == 10
    cost = run_cost(load_prices(), _measurements(), 100)
    record = RunRecord(schema_version=SCHEMA_VERSION, status="complete", cost=cost)
    again = from_json(json.loads(json.dumps(to_json(record))))
    assert again.cost == cost
    with pytest.raises(RecordError, match=f"version-{SCHEMA_VERSION + 1} run record"):
        from_json({"schema_version": SCHEMA_VERSION + 1})


def _run_folder(root: Path, name: str, summary: dict[str, object]) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(get_preset("lm-tiny").to_json())
    (folder / "summary.json").write_text(json.dumps(summary))


def test_report_shows_the_cost_of_new_and_old_records(tmp_path: Path) -> None:
    from shardbench.report.write import write_report

    measured = to_json(_measurements())
    new = {"schema_version": 3, "status": "complete", "run_name": "new", "devices": 8, "steps": 10,
           "measurements": measured, "cost": to_json(run_cost(parse_prices(KNOWN), _measurements(), 100))}
    old = {"schema_version": 2, "status": "complete", "run_name": "old", "devices": 8, "steps": 10,
           "measurements": measured}
    _run_folder(tmp_path / "runs", "new", new)
    _run_folder(tmp_path / "runs", "old", old)
    text = write_report(tmp_path / "runs", tmp_path / "out").markdown.read_text()
    head = next(line for line in text.splitlines() if line.startswith("| run |"))
    assert "$/epoch on-demand" in head and "kWh/epoch" in head and "$/billion tokens" in head
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()
            if line.startswith(("| new", "| old"))}
    assert "| 0.222 |" in rows["new"]  # its own record's table: 8 x 50 s x $2/h
    assert "| 0.764 |" in rows["old"]  # schema 2, priced with the packaged table: 8 x 50 s x $6.88/h
    assert "estimated (500 W)" in rows["new"] and "Cost per epoch is" in text
    # --prices prices every run again with the given table.
    table = tmp_path / "mine.toml"
    table.write_text(KNOWN.replace("on_demand = 2.0", "on_demand = 4.0"))
    assert cli.main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "again"), "--prices", str(table)]) == 0
    again = (tmp_path / "again" / "report.md").read_text()
    assert again.count("| 0.444 |") == 2 and f"--prices {table}" in again


def test_a_report_of_runs_priced_by_different_tables_names_which_priced_which(tmp_path: Path) -> None:
    """Two runs of one layout, one trained with the packaged table, one with --prices of its own: the report said
    only "(--prices mine.toml, packaged price table)" beneath costs 4x apart; it names each table's runs and how to
    price them alike, and runs.csv gives each run's table beside its cost."""
    import csv

    from shardbench.report.write import write_report

    measured = _measurements()
    for name, table in (("a", parse_prices(KNOWN)), ("b", parse_prices(KNOWN.replace("on_demand = 2.0",
                                                                                    "on_demand = 8.0"),
                                                                       "--prices mine.toml"))):
        _run_folder(tmp_path / "runs", name, {"schema_version": SCHEMA_VERSION, "status": "complete",
                                              "run_name": name, "devices": 8, "steps": 10,
                                              "measurements": to_json(measured),
                                              "cost": to_json(run_cost(table, measured, 100))})
    paths = write_report(tmp_path / "runs", tmp_path / "out")
    assert ("**The runs were priced by different tables** (--prices mine.toml: `b`; the packaged price table: `a`): "
            "compare their costs only within one table, or price them all alike with `shardbench report --prices "
            "FILE`.") in paths.markdown.read_text()
    with (tmp_path / "out" / "runs.csv").open() as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    assert (rows["a"]["price_table"], rows["b"]["price_table"]) == ("the packaged price table", "--prices mine.toml")
    one = write_report(tmp_path / "runs", tmp_path / "again", prices=parse_prices(KNOWN, "--prices all.toml"))
    assert "priced by different tables" not in one.markdown.read_text()


def test_the_report_names_each_rows_basis_from_the_records_and_shows_small_costs(tmp_path: Path) -> None:
    """Runs priced with a table whose cpu row is per device: the report made without --prices names that row
    "per device", as the records priced it (the packaged table prices cpu per host); a CPU epoch's cost of a few
    hundred-thousandths of a dollar shows its figures, not 0.0000; and a folder whose runs have no cost says why."""
    from shardbench.report.write import write_report

    per_device = KNOWN.replace('per = "host"\n', "")
    cpu = _measurements(platform="cpu", device_kind="cpu", step_time_s=StepTimes(median=0.0063))
    cost = run_cost(parse_prices(per_device), cpu, 14)
    assert cost.priced_per == "per device" and cost.devices == 8
    record = {"schema_version": SCHEMA_VERSION, "status": "complete", "run_name": "cpu", "devices": 8, "steps": 14,
              "measurements": to_json(cpu), "cost": to_json(cost)}
    _run_folder(tmp_path / "runs", "cpu", record)
    text = write_report(tmp_path / "runs", tmp_path / "out").markdown.read_text()
    assert "row cpu: per device" in text and "row cpu: per host" not in text
    row = next(line for line in text.splitlines() if line.startswith("| cpu "))
    dollars = 0.36 * 8 * 14 * 0.0063 / 3600  # $0.0000706: three significant digits, not four decimals
    assert f"| {dollars:.7f} |" in row and "| 0.0000 |" not in row, row
    none = {**record, "run_name": "none", "cost": to_json(run_cost(parse_prices(KNOWN.split("[devices.cpu]")[0]),
                                                                   cpu, 14))}
    _run_folder(tmp_path / "bare", "none", none)
    bare = write_report(tmp_path / "bare", tmp_path / "out2").markdown.read_text()
    assert "No cost: the price table has no row for device 'cpu'." in bare
    # One run priced and one not, in one folder: the empty cells of the one without are explained, by table.
    _run_folder(tmp_path / "runs", "none", {**none, "cost": to_json(run_cost(parse_prices(
        KNOWN.split("[devices.cpu]")[0], "--prices h100-only.toml"), cpu, 14))})
    both = write_report(tmp_path / "runs", tmp_path / "out3").markdown.read_text()
    assert "row cpu: per device" in both
    assert ("No cost for 1 run(s) (`none`: the price table has no row for device 'cpu' (by the --prices "
            "h100-only.toml price table)).") in both


def test_price_table_files_are_checked_as_a_user_writes_them(tmp_path: Path) -> None:
    """A folder is named as a folder; "usd" is US dollars; a `taken` that is no date, and a spot price above the
    on-demand one (the columns swapped), are refused."""
    with pytest.raises(ConfigError, match=r"is a folder: give a price table file"):
        load_prices(tmp_path)
    assert parse_prices(KNOWN.replace('currency = "USD"', 'currency = "usd"')).devices["h100"].on_demand == 2.0
    with pytest.raises(ConfigError, match=r"taken = \[1, 2\]: give the date the prices were taken"):
        parse_prices("taken = [1, 2]\n" + KNOWN)
    for text in ('"yesterday"', '"2025-13-45"', '""'):  # text that is no date (the docs said it was refused)
        with pytest.raises(ConfigError, match="give the date the prices were taken, e.g. 2026-11-25"):
            parse_prices(f"taken = {text}\n" + KNOWN)
    for text in ('"2025-06"', '"2025-06-01"', "2025-06-01"):
        assert parse_prices(f"taken = {text}\n" + KNOWN).taken == text.strip('"')
    with pytest.raises(ConfigError, match=r"\[devices.h100\]: spot = 50.0 is more than on_demand = 2.0: a spot "
                                          r"price is at most the on-demand one \(are the two swapped\?\)$"):
        parse_prices(KNOWN.replace("spot = 1.0", "spot = 50.0"))


@pytest.mark.slow
def test_a_run_priced_by_a_table_without_its_device_says_so_at_its_start(
        micro, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table has no cpu row: the run trains, and its first lines say its record will have no cost (it said
    nothing, and the report dropped the cost columns without a reason)."""
    from shardbench.train.loop import run

    table = tmp_path / "h100-only.toml"
    table.write_text(KNOWN.split("[devices.cpu]")[0])
    summary = run(micro(**{"train.prices": str(table), "train.steps": 1}))
    assert summary["cost"]["not_measured"] == "the price table has no row for device 'cpu'"
    assert (f"shardbench: note: the --prices {table} price table has no row for device 'cpu': this run's record "
            f"will have no cost") in capsys.readouterr().out


@pytest.mark.slow
def test_a_trained_run_records_its_cost(micro, tmp_path: Path) -> None:
    """A micro run on 8 simulated CPU devices with a table of its own: the record's cost section, by hand from
    the record's own step time (one host at $0.36/h and 100 W: the CPU row is priced per host)."""
    from shardbench.train.loop import run

    table = tmp_path / "mine.toml"
    table.write_text(KNOWN)
    cfg = micro(**{"parallel.strategy": "dp", "train.steps": 6, "train.prices": str(table)})
    run(cfg)
    saved = json.loads((Path(cfg.train.out) / "summary.json").read_text())
    record = from_json(saved)  # strict: this version's own fields only
    c, m = record.cost, record.measurements
    assert saved["schema_version"] == SCHEMA_VERSION and c is not None and m is not None
    assert c.device == "cpu" and c.devices == 1 and c.prices == f"--prices {table}"
    epoch = m.step_time_s.median * 14  # 512 x 0.9 = 461 training images, 14 steps of 32
    assert c.steps_per_epoch == 14 and c.epoch_time_s == pytest.approx(epoch)
    assert c.on_demand_usd == pytest.approx(0.36 * epoch / 3600) and c.kwh == pytest.approx(100 * epoch / 3.6e6)
    assert c.energy == "estimated" and c.energy_note == "no energy counters on cpu"
    assert c.per == "million images" and c.on_demand_usd_per == pytest.approx(c.on_demand_usd * 1e6 / (32 * 14))


@pytest.mark.slow
def test_plan_prints_and_writes_the_cost_of_each_candidate(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Per candidate, from KNOWN's h100 row ($2.00 on demand, $1.00 spot, 500 W) on 8 devices and the
    candidate's predicted step: an epoch of 115 steps, and per billion tokens, lm-tiny's step being 32 sequences
    of 64 tokens, 2,048 tokens: $2 x 8 x step / 3600 x 1e9 / 2,048 on demand (the tokens, not the 32 sequences)."""
    table = tmp_path / "mine.toml"
    table.write_text(KNOWN)
    out = tmp_path / "plan"
    assert cli.main(["plan", "--preset", "lm-tiny", "--target", "8xh100", "--candidates", "dp,fsdp", "--remat",
                     "none", "--workers", "1", "--prices", str(table), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cost per epoch:" in printed and "$/billion tokens on-demand" in printed
    plan = json.loads((out / "plan.json").read_text())
    step = {c["name"]: c["prediction"]["step_s"] for c in plan["candidates"]}
    costs = plan["cost"]["candidates"]
    assert [c["name"] for c in costs] == list(step)
    for c in costs:  # lm-tiny: 4,096 generated sequences, 3,686 after validation, 115 steps of 32
        assert c["steps_per_epoch"] == 115 and c["devices"] == 8 and c["energy"] == "estimated"
        assert c["on_demand_usd"] == pytest.approx(2.0 * 8 * step[c["name"]] * 115 / 3600)
        assert c["kwh"] == pytest.approx(500 * 8 * step[c["name"]] * 115 / 3.6e6)
        assert c["per"] == "billion tokens"
        assert c["on_demand_usd_per"] == pytest.approx(2.0 * 8 * step[c["name"]] / 3600 * 1e9 / (32 * 64))
        assert c["spot_usd_per"] == pytest.approx(1.0 * 8 * step[c["name"]] / 3600 * 1e9 / (32 * 64))
        assert c["kwh_per"] == pytest.approx(500 * 8 * step[c["name"]] / 3.6e6 * 1e9 / (32 * 64))
    lm_tiny = get_preset("lm-tiny")  # the 32 x 64 tokens per step above
    assert (lm_tiny.train.batch_size, lm_tiny.model.seq_len) == (32, 64)
    md = (out / "plan.md").read_text()
    assert "## Cost" in md
    # The table's figures, as the report writes costs: three significant digits in plain notation (it wrote
    # $0.0004993 beside $0.0005, and 5.087e-05).
    keys = ("on_demand_usd", "spot_usd", "kwh", "on_demand_usd_per", "spot_usd_per", "kwh_per")
    for c in costs:
        row = next(line for line in md.split("## Cost")[1].splitlines()
                   if line.startswith("| ") and f"| {c['name']} |" in line)
        cells = [cell.strip() for cell in row.strip(" |").split("|")][2:]
        assert len(cells) == len(keys), row
        for cell, key in zip(cells, keys):
            figure = cell.removeprefix("$").replace(",", "")
            assert "e" not in figure and float(figure) == pytest.approx(c[key], rel=5e-3), (key, cell, c[key])
            if c[key] < 100:
                assert len(figure.replace(".", "").lstrip("0")) == 3, (key, cell)


@pytest.mark.slow
def test_plans_cost_line_counts_what_the_row_prices_and_names_a_missing_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a CPU target KNOWN's cpu row is priced per host: the line says 1 host, as the figure counts (it said 8
    devices); a table without the target's chip names the row to add, not the target."""
    table = tmp_path / "mine.toml"
    table.write_text(KNOWN)
    common = ["plan", "--preset", "lm-tiny", "--candidates", "dp", "--remat", "none", "--workers", "1", "--prices",
              str(table)]
    assert cli.main([*common, "--target", "cpu", "--out", str(tmp_path / "cpu")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("cost at cpu"))
    assert "; 1 host(s);" in line, line
    cost = json.loads((tmp_path / "cpu" / "plan.json").read_text())["cost"]["candidates"][0]
    assert cost["devices"] == 1 and cost["priced_per"] == "per host"
    table.write_text("currency = \"USD\"\n[devices.cpu]\n" + KNOWN.split("[devices.cpu]")[1])
    assert cli.main([*common, "--target", "2x8xh100", "--out", str(tmp_path / "h100")]) == 0
    printed = capsys.readouterr().out
    assert f"cost: the price table (--prices {table}) has no row for h100 (--target 2x8xh100): add [devices.h100]" in printed


@pytest.mark.slow
def test_plan_of_a_batch_larger_than_the_epoch_prices_per_token_only(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """36 training examples cannot fill one step of 64: no per-epoch figures (they were a crash after compiling),
    the per-token ones as for any plan, and the line says why. Per billion tokens, from KNOWN's h100 row ($2.00
    on demand, $1.00 spot) on 8 devices: a step of 64 sequences of lm-tiny's 64 tokens, 4,096 tokens, costs
    $2 x 8 x step / 3600, so $2 x 8 x step / 3600 x 1e9 / 4,096 per billion."""
    table = tmp_path / "mine.toml"
    table.write_text(KNOWN)
    assert cli.main(["plan", "--preset", "lm-tiny", "--data.synthetic-train", "40", "--batch-size", "64",
                     "--candidates", "dp", "--remat", "none", "--workers", "1", "--target", "8xh100",
                     "--prices", str(table), "--out", str(tmp_path / "plan")]) == 0
    printed = capsys.readouterr().out
    assert "no whole step in an epoch: --batch-size 64 is more than its 36 examples" in printed
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    costs = plan["cost"]["candidates"]
    step = plan["candidates"][0]["prediction"]["step_s"]
    assert get_preset("lm-tiny").model.seq_len == 64 and len(costs) == 1 and step > 0
    assert "on_demand_usd" not in costs[0] and costs[0]["per"] == "billion tokens"
    assert costs[0]["on_demand_usd_per"] == pytest.approx(2.0 * 8 * step / 3600 * 1e9 / (64 * 64))
    assert costs[0]["spot_usd_per"] == pytest.approx(1.0 * 8 * step / 3600 * 1e9 / (64 * 64))


def test_a_row_priced_per_host_counts_machines_not_processes() -> None:
    """Two processes of one CPU run on one machine pay for one host; on two machines, for two."""
    from shardbench.measure.run_record import Measurements, StepTimes
    from shardbench.prices import load_prices, run_cost

    table = load_prices()
    hourly = table.lookup("cpu").on_demand

    def measured(hosts: list[str]) -> Measurements:
        return Measurements(platform="cpu", device_kind="cpu", devices=8, global_batch=64, processes=len(hosts),
                            step_time_s=StepTimes(median=0.5), per_process=[{"host": h} for h in hosts])

    one, two = run_cost(table, measured(["a", "a"]), 10), run_cost(table, measured(["a", "b"]), 10)
    assert one.devices == 1 and one.on_demand_usd == pytest.approx(hourly * 0.5 * 10 / 3600)
    assert two.devices == 2 and two.on_demand_usd == pytest.approx(2 * one.on_demand_usd)
