"""What a run costs: the price table (prices.toml, or `--prices FILE`) and dollars and kWh per epoch.

`load_prices` reads and checks a table (one-line ConfigError naming what is wrong and what would be right);
`PriceTable.lookup` finds a device's row by `--target` chip name or JAX `device_kind`; `epoch_cost` turns a step
time into dollars (on-demand and spot) and kWh per epoch and per billion tokens or million images, with the
energy measured (NVML, `shardbench.measure.energy`) or estimated from the table's watts. docs/cost.md says how.
"""

from __future__ import annotations

import datetime
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench.errors import ConfigError
from shardbench.hardware import BY_NAME, chip_for_kind
from shardbench.measure.run_record import Cost

if TYPE_CHECKING:
    from shardbench.measure.energy import Window
    from shardbench.measure.run_record import Measurements

PACKAGED = "packaged"
CPU = "cpu"
DEVICE_NAMES: tuple[str, ...] = (*BY_NAME, CPU)
REQUIRED = ("on_demand", "spot", "watts", "source", "date")
OPTIONAL = ("estimated", "per")
FIGURES = ("on_demand", "spot", "watts")  # what `estimated` may name
# Far above any device's or host's figures (an 8-GPU host is about $100 an hour and 10 kW): a larger one is a
# typo, and at 1e308 a run's cost would come out as infinity.
MOST = {"on_demand": 1e5, "spot": 1e5, "watts": 1e6}
TOP_KEYS = ("currency", "taken", "devices")
# What the per-unit figures count, by the throughput's unit: (scale, name).
PER_UNIT = {"tokens": (1e9, "billion tokens"), "images": (1e6, "million images"),
            "examples": (1e6, "million examples")}


@dataclass(frozen=True)
class DevicePrice:
    """One row: a device's hourly prices in US dollars and its power."""

    name: str  # a --target chip name (src/shardbench/hardware.py) or "cpu"
    on_demand: float  # $ per device-hour: per chip, per GPU (per host-hour when per == "host")
    spot: float  # $ per device-hour, spot or preemptible
    watts: float  # board power / TDP per device: per chip, per GPU (per host when per == "host")
    source: str  # where the figures come from
    date: str  # when they were published or taken
    estimated: tuple[str, ...] = ()  # which of on_demand, spot, watts are estimates
    per: str = "device"  # "device", or "host" for a row priced per machine

    def describe(self) -> str:
        """The row's provenance in one line."""
        est = f"; estimated: {', '.join(self.estimated)}" if self.estimated else ""
        return f"{self.name}: {self.source} ({self.date}{est})"


@dataclass(frozen=True)
class PriceTable:
    devices: dict[str, DevicePrice]
    origin: str  # "packaged" or the --prices file
    taken: str = ""

    def lookup(self, device_kind: str) -> DevicePrice | None:
        """The row for a `--target` chip name ("h100", "tpu-v5e", "cpu") or a JAX device_kind ("NVIDIA H100 80GB
        HBM3", "TPU v5 lite", "cpu"); None when the table has none."""
        kind = device_kind.strip().lower()
        if kind in self.devices:
            return self.devices[kind]
        chip = chip_for_kind(kind)
        return self.devices.get(chip.name) if chip is not None else None


def significant(value: float, digits: int) -> str:
    """`value` to `digits` significant digits in plain notation: 0.0000206, 1.23, 1,235 (never 0.0000 for a cost of
    two hundred-thousandths of a dollar, nor 2.06e-05 in a table)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(digits - 1 - math.floor(math.log10(abs(value))), 0)
    return f"{value:,.{decimals}f}"


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}")


def _row(where: str, name: str, row: Any) -> DevicePrice:
    at = f"{where} [devices.{name}]"
    if name not in DEVICE_NAMES:
        raise _fail(where, f"unknown device '{name}': name a --target chip or cpu ({', '.join(DEVICE_NAMES)})")
    if not isinstance(row, dict):
        raise _fail(at, "should be a table of on_demand, spot, watts, source, date")
    unknown = sorted(set(row) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise _fail(at, f"unknown key '{unknown[0]}': the keys are {', '.join(REQUIRED + OPTIONAL)}")
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        what = {"source": "the URL or document the figures come from", "date": "when they were published or taken",
                "watts": "the device's power in watts"}.get(missing[0], "dollars per device-hour")
        raise _fail(at, f"missing '{missing[0]}': give {what}")
    for key in FIGURES:
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _fail(at, f"{key} = {value!r} is not a number: give "
                            f"{'watts' if key == 'watts' else 'dollars per device-hour'}")
        if value < 0 or (key == "watts" and value == 0):
            raise _fail(at, f"{key} = {value}: give {'more than 0 watts' if key == 'watts' else '0 dollars or more'}")
        if value > MOST[key]:  # a typo's exponent, which would price a run at infinity
            raise _fail(at, f"{key} = {value:g}: give at most {MOST[key]:,.0f} "
                            f"{'watts' if key == 'watts' else 'dollars an hour'}")
    if row["spot"] > row["on_demand"]:  # a spot or preemptible price is at most the on-demand one: swapped columns
        raise _fail(at, f"spot = {row['spot']} is more than on_demand = {row['on_demand']}: a spot price is at most "
                        f"the on-demand one (are the two swapped?)")
    if isinstance(row["date"], (datetime.date, datetime.time)):  # unquoted in TOML (date = 2025-06-01)
        row = {**row, "date": _iso_date(at, row["date"])}
    for key, give in (("source", "the URL the figures come from"), ("date", 'a date, e.g. 2025-06-01 or "2025-06"')):
        if not isinstance(row[key], str):
            raise _fail(at, f"{key} = {row[key]!r} is not text: give {give}")
        if not row[key].strip():
            raise _fail(at, f"{key} is empty: give {give}")
    estimated = row.get("estimated", [])
    if not isinstance(estimated, list) or any(e not in FIGURES for e in estimated):
        raise _fail(at, f"estimated = {estimated!r}: give a list of some of {', '.join(FIGURES)}")
    per = row.get("per", "device")
    if per not in ("device", "host"):
        raise _fail(at, f"per = {per!r}: give \"device\" or \"host\"")
    return DevicePrice(name, float(row["on_demand"]), float(row["spot"]), float(row["watts"]), row["source"].strip(),
                       row["date"].strip(), tuple(estimated), per)


def _iso_date(at: str, value: datetime.date | datetime.time) -> str:
    """A TOML date (or date and time) as its ISO string, "2025-06-01"; a time of day alone is no date."""
    if isinstance(value, datetime.time):
        raise _fail(at, f"date = {value.isoformat()} is a time of day: give a date, e.g. 2025-06-01 or \"2025-06\"")
    return value.isoformat()


def _a_date(value: object) -> bool:
    """A TOML date, or text that is one: 2026-11-25, or its month, 2026-11 ("yesterday" and 2026-13-45 are not)."""
    if isinstance(value, datetime.date):
        return True
    if not isinstance(value, str):
        return False
    for form in ("%Y-%m-%d", "%Y-%m"):
        try:
            datetime.datetime.strptime(value.strip(), form)
            return True
        except ValueError:
            pass
    return False


def parse_prices(text: str, where: str = "the packaged price table") -> PriceTable:
    """A table from TOML text; `where` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise _fail(where, f"not valid TOML ({err}): fix the syntax") from None
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise _fail(where, f"unknown key '{unknown[0]}': the top level holds {', '.join(TOP_KEYS)}")
    if "taken" in data and not _a_date(data["taken"]):
        raise _fail(where, f"taken = {data['taken']!r}: give the date the prices were taken, e.g. 2026-11-25")
    if str(data.get("currency", "USD")).upper() != "USD":
        raise _fail(where, f"currency = {data['currency']!r}: shardbench reports US dollars; give \"USD\" prices")
    devices = data.get("devices")
    if not isinstance(devices, dict) or not devices:
        raise _fail(where, "no [devices.NAME] rows: give at least one, e.g. [devices.h100]")
    rows = {name: _row(where, name, row) for name, row in devices.items()}
    return PriceTable(rows, where, str(data.get("taken", "")))


def load_prices(path: Path | None = None) -> PriceTable:
    """The table at `path` (a `--prices` file), or the packaged prices.toml when None. One-line ConfigError when
    the file is missing or wrong; nothing is compiled or run before this check."""
    if path is None:
        table = parse_prices(resources.files("shardbench").joinpath("prices.toml").read_text(encoding="utf-8"))
        return PriceTable(table.devices, PACKAGED, table.taken)
    where = f"--prices {path}"
    if path.is_dir():
        raise _fail(where, "is a folder: give a price table file (TOML, the layout of shardbench's prices.toml)")
    if not path.is_file():
        raise _fail(where, "no such file: give a price table (TOML, the layout of shardbench's prices.toml)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise _fail(where, f"cannot be read ({err}): give a readable UTF-8 TOML file") from None
    return parse_prices(text, where)


def prices_from_flag(value: str) -> PriceTable:
    """`--prices`'s value ('' = the packaged table) as a table."""
    return load_prices(Path(value).expanduser() if value else None)


def _power(price: DevicePrice, count: int, devices: int, measured: Window | None) -> tuple[float, int]:
    """(watts, how many draw them): the measured watts per GPU x the run's devices, else the row's watts x what
    the row prices (chips, or hosts for a row priced per host)."""
    if measured is not None:
        return measured.watts_per_gpu, devices
    return price.watts, count


def priced_count(price: DevicePrice, devices: int, hosts: int) -> int:
    """What `price` counts of a run on `devices` JAX devices over `hosts` machines: the hosts for a row priced per
    host, else the chips the devices occupy (a TPU v2 or v3 chip is two JAX devices, and its row is per chip)."""
    if price.per == "host":
        return hosts
    chip = BY_NAME.get(price.name)
    return devices if chip is None else chip.chips(devices)


def price_basis(price: DevicePrice) -> str:
    """What `price`'s hourly price is for, as `priced_count` counts it (`row_basis`)."""
    return row_basis(price.name, price.per)


def row_basis(name: str, per: str = "device") -> str:
    """What row `name`'s hourly price is for: a host for a row priced per host (the packaged cpu row), a chip where
    a chip is several JAX devices (TPU v2 and v3), else a device."""
    if per == "host":
        return "per host"
    chip = BY_NAME.get(name)
    if chip is not None and chip.devices_per_chip > 1:
        return f"per chip of {chip.devices_per_chip} JAX devices"
    return "per device"


def epoch_cost(price: DevicePrice, step_time_s: float, steps_per_epoch: int, devices: int, *, hosts: int = 1,
               unit: str = "examples", units_per_step: float | None = None, measured: Window | None = None,
               energy_note: str = "", prices: str = PACKAGED) -> Cost:
    """Dollars and kWh for one epoch of `steps_per_epoch` steps of `step_time_s` on `devices` JAX devices (`hosts`
    machines, for a row priced per host).

    on_demand_usd = price.on_demand x count x step_time_s x steps_per_epoch / 3600 (spot likewise), where count is
    the chips the `devices` are (`priced_count`: half of them on TPU v2 and v3, all of them elsewhere), or `hosts`
    for a row priced per host. kWh = the measured average watts per GPU x `devices` x epoch seconds / 3.6e6 when
    `measured` (an NVML window) is given, else the table's watts x count (energy "estimated"): NVML measures each
    GPU, whatever the row prices. With `units_per_step` (tokens, images or examples of `unit` in one step), the
    same per billion tokens or per million images or examples.
    `tune --objective cost` ranks by `.on_demand_usd`."""
    count = priced_count(price, devices, hosts)
    epoch_s = step_time_s * steps_per_epoch
    watts, powered = _power(price, count, devices, measured)
    dollars = price.on_demand * count * epoch_s / 3600
    spot = price.spot * count * epoch_s / 3600
    kwh = watts * powered * epoch_s / 3.6e6
    per = on_demand_per = spot_per = kwh_per = None
    if units_per_step and steps_per_epoch:
        scale, per = PER_UNIT.get(unit, PER_UNIT["examples"])
        epochs = scale / (units_per_step * steps_per_epoch)  # epochs per billion tokens (or million images)
        on_demand_per, spot_per, kwh_per = dollars * epochs, spot * epochs, kwh * epochs
    return Cost(
        device=price.name, devices=count, priced_per=price_basis(price), epoch_time_s=epoch_s,
        steps_per_epoch=steps_per_epoch,
        on_demand_usd=dollars, spot_usd=spot, kwh=kwh, energy="measured" if measured is not None else "estimated",
        watts_per_device=watts, measured_joules=None if measured is None else measured.joules,
        measured_s=None if measured is None else measured.seconds,
        energy_note=None if measured is not None else (energy_note or "the price table's watts x devices x time"),
        per=per, on_demand_usd_per=on_demand_per, spot_usd_per=spot_per, kwh_per=kwh_per, prices=prices,
        price_source=price.describe())


def row_for(table: PriceTable, device_kind: str, platform: str | None) -> DevicePrice | None:
    """The row that prices a run on devices of `device_kind` (JAX's name) and `platform`: the chip's, else on a CPU
    the cpu row; None where the table has neither."""
    return table.lookup(device_kind) or (table.lookup(CPU) if platform == "cpu" else None)


def run_cost(table: PriceTable, measured: Measurements, steps_per_epoch: int, energy: Window | None = None,
             energy_note: str = "") -> Cost:
    """The run record's cost section from its measurements (a Cost whose `not_measured` says why, when the step
    time or the device's price is missing)."""
    step = measured.step_time_s.median if measured.step_time_s is not None else None
    kind = measured.device_kind or measured.platform or ""
    price = row_for(table, kind, measured.platform)
    if price is None:
        return Cost(prices=table.origin, not_measured=f"the price table has no row for device '{kind}'")
    if not step or not measured.devices:
        return Cost(device=price.name, prices=table.origin, not_measured="no step time to price")
    rate = measured.throughput
    per_example = (rate.units_per_s / rate.examples_per_s if rate is not None and rate.units_per_s
                   and rate.examples_per_s else 1.0)
    unit = rate.unit if rate is not None and rate.unit else "examples"
    units = measured.global_batch * per_example if measured.global_batch else None
    # A row priced per host counts machines, not processes: several processes of one run may share one host.
    hosts = len({p.get("host") for p in measured.per_process if p.get("host")}) or 1
    return epoch_cost(price, step, steps_per_epoch, measured.devices, hosts=hosts, unit=unit,
                      units_per_step=units, measured=energy, energy_note=energy_note, prices=table.origin)


__all__ = ["DEVICE_NAMES", "DevicePrice", "PriceTable", "epoch_cost", "load_prices", "parse_prices",
           "price_basis", "priced_count", "prices_from_flag", "row_basis", "row_for", "run_cost", "significant"]
