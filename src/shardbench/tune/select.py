"""What `shardbench tune` decides: the objective a layout is ranked by (a small table: adding one is one entry),
which of the planned layouts to measure within the budget, and, once measured, the winner, the regret of the
plan's top choice and Kendall's tau of the plan's step times against the measured ones."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardbench.errors import ConfigError
from shardbench.measure.run_record import Cost
from shardbench.report.kendall import MIN_TAU_RUNS, describe_tau, kendall_tau
from shardbench.plan.predict import Prediction
from shardbench.plan.recommend import amounts
from shardbench.plan.target import Target
from shardbench.prices import PriceTable, epoch_cost
from shardbench.tune.space import Point

MIB = 2**20
# A measured run's wall time besides its compilation and steps: `shardbench train` starting (Python, JAX, the
# data): a 5-step run of mlp-small on 8 CPU devices took 10.96 s wall, 5.6 s of it the run's own, on a 2-core Intel
# Xeon (benchmarks/data/tune-costs/costs-2026-11-29.txt).
# A budget that does not hold this much is refused before anything is compiled.
START_S = 5.0


@dataclass(frozen=True)
class Planned:
    """One layout as the plan saw it: its prediction, or why there is none (refused, failed to compile)."""

    point: Point
    prediction: Prediction | None
    problem: str = ""  # "refused: ..." or "failed to compile: ..."
    target: Target | None = None  # what it was planned for (its devices and chip: what an objective may price)

    @property
    def fits(self) -> bool:
        return self.prediction is not None and self.prediction.fits

    @property
    def predicted(self) -> Prediction:
        """The prediction of a layout that has one (those ranked, chosen and measured)."""
        if self.prediction is None:
            raise ValueError(f"{self.point.name} was not predicted: {self.problem}")
        return self.prediction

    @property
    def dropped(self) -> str:
        """Why the layout is out of the running ('' when it fits)."""
        if self.prediction is None:
            return self.problem
        p = self.prediction
        if p.fits:
            return ""
        need, usable = amounts(p.total_bytes, p.memory_bytes)
        return f"does not fit: {need} per device of {usable} usable"


@dataclass(frozen=True)
class MeasuredFigures:
    """What a measured run gives an objective: its median step and its memory per device (None: not measured),
    and its record's cost of an epoch."""

    step_s: float | None
    memory_bytes: float | None
    cost: Cost | None = None
    timed_steps: int | None = None  # the intervals its median step rests on (None: the record does not say)


@dataclass(frozen=True)
class Objective:
    """What tune minimises: `predicted` from a planned layout that fits (its prediction, batch and target),
    `measured` from its run (None when the run did not measure it); `show` formats a value."""

    name: str
    what: str
    predicted: Callable[[Planned], float]
    measured: Callable[[Planned, MeasuredFigures], float | None]
    show: Callable[[float], str]


def _per_example(step_s: float | None, batch: int) -> float | None:
    return None if step_s is None else step_s / batch


OBJECTIVES: dict[str, Objective] = {
    # Seconds per example: the step time when the batch is fixed; with --batch-size a,b the faster per example.
    "time": Objective("time", "step time per example",
                      lambda p: p.predicted.step_s / p.point.batch,
                      lambda p, m: _per_example(m.step_s, p.point.batch),
                      lambda v: f"{v * 1e6:,.1f} us/example"),
    "memory": Objective("memory", "memory per device",
                        lambda p: p.predicted.total_bytes,
                        lambda p, m: m.memory_bytes,
                        lambda v: f"{v / MIB:,.1f} MiB"),
}



def _cost(prices: PriceTable) -> Objective:
    """On-demand dollars per example on the layout's target, from `prices` (`--prices`, else the packaged table):
    the step's seconds x the hourly price x the target's devices (its chips on TPU v2 and v3, two devices a chip; a
    row priced per host, the CPU's: x its hosts) / 3600, over the batch. Every layout of one tune runs on all of
    its target's devices, so within a tune this is the time objective times one constant: it ranks as `time` does
    and differs in what it reports (dollars)."""

    def per_example(p: Planned, step_s: float | None) -> float | None:
        if step_s is None or p.target is None:
            return None
        price = prices.lookup(p.target.chip.name if p.target.chip else "cpu")
        if price is None:
            return None
        cost = epoch_cost(price, step_s, 1, p.target.devices, hosts=p.target.nodes)
        return cost.on_demand_usd / p.point.batch

    def predicted(p: Planned) -> float:
        value = per_example(p, p.predicted.step_s)
        return math.inf if value is None else value

    return Objective("cost", "on-demand dollars per example (the price table: --prices)", predicted,
                     lambda p, m: per_example(p, m.step_s),
                     lambda v: f"${v * 1e6:,.4f} per million examples")


# Objectives that need the price table: built with it (`objective`).
PRICED: dict[str, Callable[[PriceTable], Objective]] = {"cost": _cost}
OBJECTIVE_NAMES = (*OBJECTIVES, *PRICED)


def objective(name: str, prices: PriceTable, target: Target) -> Objective:
    """The objective `--objective` names; `cost` on a target the price table has no row for is one line."""
    if name not in PRICED:
        return OBJECTIVES[name]
    chip = target.chip.name if target.chip else "cpu"
    if prices.lookup(chip) is None:
        raise ConfigError(f"--objective {name}: the price table ({prices.origin}) has no row for {chip}, the "
                          f"target's device: add [devices.{chip}] to a table of your own and pass --prices FILE, "
                          f"or use --objective time")
    return PRICED[name](prices)


def rank(planned: Sequence[Planned], objective: Objective) -> list[Planned]:
    """The layouts that fit, best first by the objective (ties: the faster predicted step)."""
    fitting = [p for p in planned if p.fits]
    return sorted(fitting, key=lambda p: (objective.predicted(p), p.predicted.step_s))


def compile_each_s(compile_wall_s: float, workers: int, compiled: int) -> float:
    """One candidate's compilation, from the plan's: its wall time over the candidates each worker compiled."""
    return compile_wall_s * max(min(workers, compiled), 1) / max(compiled, 1)


def estimate_run_s(p: Planned, steps: int, compile_s: float) -> float:
    """A measured run's wall time: start-up, its train step's compilation and `steps` predicted steps."""
    return START_S + compile_s + steps * (p.prediction.step_s if p.prediction else 0.0)


def check_budget_floor(budget_min: float) -> None:
    """Before anything compiles: a budget that cannot hold even a run's start-up is one line."""
    if not math.isfinite(budget_min) or budget_min <= 0:
        raise ConfigError(f"--budget-min {budget_min:g}: give the minutes the measured runs may take, more than 0")
    if budget_min * 60 < START_S:
        raise ConfigError(f"--budget-min {budget_min:g} ({budget_min * 60:.1f} s) is too small for one run: a run "
                          f"takes about {START_S:.0f} s to start before it compiles or steps; give more than "
                          f"{math.ceil(START_S / 60 * 10) / 10:g} (that holds the start-up alone: the plan's estimate "
                          f"of its top choice, compilation and steps included, is what the budget must hold)")


def select(ranked: Sequence[Planned], k: int, budget_s: float, estimate: Callable[[Planned], float]) -> list[Planned]:
    """The plan's top `k` in rank order, as many of them as fit the budget together (the first that would
    overrun it ends the choice). One line when not even the top one fits."""
    chosen: list[Planned] = []
    total = 0.0
    for p in ranked[:k]:
        cost = estimate(p)
        if total + cost > budget_s:
            break
        chosen.append(p)
        total += cost
    if ranked and not chosen:
        top = ranked[0]
        raise ConfigError(f"--budget-min {budget_s / 60:g} is too small for one run: the plan's top choice, "
                          f"{top.point.name}, is estimated at {estimate(top):.0f} s (start-up, compilation and its "
                          f"steps); give at least {math.ceil(estimate(top) / 6) / 10:g}")
    return chosen


def regret(top: float, best: float) -> float | None:
    """How much worse the plan's top choice measured than the best measured: (top - best) / best (None where the
    best is 0 and the top is not)."""
    return (top - best) / best if best else (0.0 if top == best else None)


@dataclass(frozen=True)
class Verdict:
    """The measured verdict over the chosen layouts (those whose run measured the objective)."""

    winner: Planned
    winner_value: float
    plan_top: Planned
    plan_top_value: float | None  # None: the plan's top choice failed to measure
    regret: float | None
    orders: dict[int, tuple[list[float], list[float]]]  # per batch size: predicted and measured step times
    measured: int

    def taus(self) -> dict[int, float | None]:
        """Kendall's tau of predicted against measured step times per batch size (the runs of one batch are one
        piece of work; across batches the order would rank batch sizes, not layouts); None under MIN_TAU_RUNS
        runs, or where every prediction or measurement is alike."""
        return {batch: kendall_tau(*pair) if len(pair[0]) >= MIN_TAU_RUNS else None
                for batch, pair in self.orders.items()}

    def tau_texts(self) -> dict[int, str]:
        """Each batch size's tau with its n, or why it says nothing there."""
        return {batch: describe_tau(*pair) for batch, pair in self.orders.items()}


def outcome(chosen: Sequence[Planned], measured: dict[str, MeasuredFigures], objective: Objective) -> Verdict | None:
    """The winner (best measured objective), the regret of the plan's top choice (`chosen[0]`) against it, and
    per batch size the predicted and measured step times of the runs with one (for Kendall's tau). `measured` is
    keyed by `Point.name`; None when no run measured."""
    values: dict[str, float] = {}
    for p in chosen:
        value = objective.measured(p, measured[p.point.name]) if p.point.name in measured else None
        if value is not None:
            values[p.point.name] = value
    if not values:
        return None
    winner = min((p for p in chosen if p.point.name in values), key=lambda p: values[p.point.name])
    best = values[winner.point.name]
    top = chosen[0]
    top_value = values.get(top.point.name)
    orders: dict[int, tuple[list[float], list[float]]] = {}
    for p in chosen:
        if p.point.name in measured and (step := measured[p.point.name].step_s) is not None:
            predicted, steps = orders.setdefault(p.point.batch, ([], []))
            predicted.append(p.predicted.step_s)
            steps.append(step)
    return Verdict(winner, best, top, top_value, None if top_value is None else regret(top_value, best),
                   dict(sorted(orders.items())), len(values))
