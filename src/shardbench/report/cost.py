"""Cost in a report: dollars (on demand, spot) and kWh per epoch for each run, and per billion tokens or million
images, with whether the energy was measured (NVML) or estimated from the price table's watts.

A run's record carries the cost its run priced (`RunRecord.cost`, schema 3). `shardbench report --prices FILE`
prices every run again from its measurements with that table (a measured power is kept); a record from before
schema 3 is priced with the packaged table, so older sweeps get the columns too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, TypeVar

from shardbench.measure.energy import Window
from shardbench.measure.run_record import Cost, RunRecord
from shardbench.prices import PriceTable, load_prices, row_basis, run_cost


class PricedRun(Protocol):
    """What pricing reads of a `report.content.ReportedRun` (a dataclass; named here by its shape, so that this
    module, which `content` reads its columns from, need not import it back)."""

    @property
    def record(self) -> RunRecord | None: ...

    @property
    def rec(self) -> RunRecord: ...

    @property
    def ok(self) -> bool: ...


Run = TypeVar("Run", bound=PricedRun)


def cost(run: PricedRun) -> Cost:
    return run.rec.cost or Cost()


def steps_per_epoch(run: PricedRun) -> int | None:
    """Steps in a whole epoch: as the record's cost or partial epoch says, else its steps over its whole epochs."""
    if run.rec.cost is not None and run.rec.cost.steps_per_epoch:
        return run.rec.cost.steps_per_epoch
    if run.steps_per_epoch:
        return run.steps_per_epoch
    epochs = len(run.m.epoch_time_s or [])
    if epochs and run.rec.steps and not run.rec.resumed_from:
        return run.rec.steps // epochs
    return None


def priced(run: Run, table: PriceTable) -> Run:
    """`run` with its record's cost worked out from its measurements with `table`."""
    steps = steps_per_epoch(run)
    if run.record is None or run.record.measurements is None or not steps:
        return run
    old = run.record.cost
    # A measured power survives repricing: the same joules over the same seconds on as many GPUs.
    measured = None
    if old is not None and old.energy == "measured" and old.measured_joules and old.measured_s and \
            old.watts_per_device:
        gpus = max(1, round(old.measured_joules / old.measured_s / old.watts_per_device))
        measured = Window(old.measured_joules, old.measured_s, gpus)
    note = (old.energy_note or "") if old is not None else ""
    fresh = run_cost(table, run.record.measurements, steps, measured, note)
    return dataclasses.replace(run, record=dataclasses.replace(run.record, cost=fresh))


def with_costs(runs: list[Run], table: PriceTable | None = None) -> list[Run]:
    """Every run with a cost: with `table` (--prices) all are priced again; without, a record that has none (older
    than schema 3) is priced with the packaged table."""
    if table is not None:
        return [priced(r, table) for r in runs]
    if all(r.rec.cost is not None for r in runs if r.ok):
        return runs
    packaged = load_prices()
    return [r if r.rec.cost is not None or not r.ok else priced(r, packaged) for r in runs]


def _energy(run: PricedRun) -> str | None:
    """'measured (312 W)' or 'estimated (700 W)': how the kWh were had, and the power per device they used."""
    c = cost(run)
    if c.energy is None or not c.watts_per_device:
        return c.energy
    return f"{c.energy} ({c.watts_per_device:,.0f} W)"


def _per(label: str, get: Callable[[Cost], float | None]) -> Callable[[PricedRun], float | None]:
    def value(run: PricedRun) -> float | None:
        c = cost(run)
        return get(c) if c.per == label else None

    return value


# (key, label, numeric, significant digits, value) of the report's cost columns; `report.content.COLUMNS` makes
# them optional columns, shown where some run has a cost. Significant digits, not decimals: a small CPU run's
# epoch costs a few hundred-thousandths of a dollar, which fixed decimals showed as 0.0000.
COST_COLUMNS: tuple[tuple[str, str, bool, int, Callable[[PricedRun], object]], ...] = (
    ("usd_epoch", "$/epoch on-demand", True, 3, lambda r: cost(r).on_demand_usd),
    ("usd_epoch_spot", "$/epoch spot", True, 3, lambda r: cost(r).spot_usd),
    ("kwh_epoch", "kWh/epoch", True, 3, lambda r: cost(r).kwh),
    ("energy", "energy", False, 0, _energy),
    ("usd_per_1b_tokens", "$/billion tokens", True, 3, _per("billion tokens", lambda c: c.on_demand_usd_per)),
    ("usd_per_1m_images", "$/million images", True, 3, _per("million images", lambda c: c.on_demand_usd_per)),
    ("usd_per_1m_examples", "$/million examples", True, 3, _per("million examples", lambda c: c.on_demand_usd_per)),
)


def priced_by(row: str, table: PriceTable) -> str:
    """What a price row's hourly price is for in `table` (`prices.price_basis`): for a record from before it kept
    its own (`Cost.priced_per`)."""
    price = table.devices.get(row)
    return row_basis(row, price.per if price is not None else "device")


def cost_note(runs: list[PricedRun], table: PriceTable | None = None) -> str:
    """The table note's sentence on cost: which price table and rows, what each row's price is for (as each record
    priced it; for an older record, as `table`, the --prices table, else the packaged one, has it), and how energy
    was had. Where no run has a cost, why not; where only some have none, which and why."""
    costs = [cost(r) for r in runs if r.ok and cost(r).on_demand_usd is not None]
    if not costs:
        why = sorted({cost(r).not_measured for r in runs if r.ok and cost(r).not_measured})
        return f" No cost: {'; '.join(why)}." if why else ""
    tables = sorted({c.prices or "packaged" for c in costs})
    fallback = table or load_prices()
    basis = {c.device or "?": c.priced_per or priced_by(c.device or "?", fallback) for c in costs}
    rows = "; ".join(f"row {row}: {basis[row]}" for row in sorted(basis))
    # The page stays offline (no links): the rows' sources and dates are in each record's cost.price_source.
    note = (f" Cost per epoch is steps per epoch x median step x the row's hourly price x the hosts, chips or "
            f"devices it is for ({rows}; {', '.join(tables)} price table: sources and dates in each record's "
            f"cost.price_source and docs/cost.md); kWh is measured power (NVML) where the energy column says "
            f"measured, else the table's watts.")
    if len(tables) > 1:  # runs trained with different --prices: their costs compare only within one table
        by: dict[str, list[str]] = {}
        for r in runs:
            if r.ok and cost(r).on_demand_usd is not None:
                by.setdefault(cost(r).prices or "packaged", []).append(f"`{r.name}`")
        named = "; ".join(f"{t}: {', '.join(names)}" for t, names in sorted(by.items()))
        note += (f" **The runs were priced by different tables** ({named}): compare their costs only within one "
                 f"table, or price them all alike with `shardbench report --prices FILE`.")
    unpriced = [r for r in runs if r.ok and cost(r).on_demand_usd is None]
    if unpriced:  # their cells are empty: say why, and by which table, beside those that have a cost
        each = "; ".join(f"`{r.name}`: {cost(r).not_measured or 'its record has no cost'}"
                         f"{f' (by the {cost(r).prices} price table)' if cost(r).prices else ''}" for r in unpriced)
        note += f" No cost for {len(unpriced)} run(s) ({each})."
    return note


__all__ = ["COST_COLUMNS", "cost_note", "priced", "priced_by", "with_costs"]
