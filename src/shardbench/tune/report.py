"""What `shardbench tune` writes: tune.json (every layout planned: its prediction, whether it fits, why it was
dropped, whether it was chosen and what it measured), tune.md (predicted against measured for the runs, the
winner, the regret of the plan's top choice, Kendall's tau and the chart), the sweep's own report, and the
winner as a ready `shardbench train` command and as a sweep file, winner.toml."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError, DataError
from shardbench.jsonfile import write_json_atomic
from shardbench.measure.timing import MIN_MEASURED_STEPS
from shardbench.plan.target import Target
from shardbench.report.speed import FEW_STEPS_MARGIN
from shardbench.tune.select import MIB, MeasuredFigures, Objective, Planned, Verdict, outcome
from shardbench.tune.space import LIST_FLAGS, Dropped, Space, layout_settings, user_settings

TUNE_JSON = "tune.json"
WINNER = "winner.toml"


@dataclass
class Tuning:
    """One tune, filled in as it goes: the space, every layout planned, the chosen ones and their runs."""

    cfg: config_lib.Config
    target: Target
    objective: Objective
    space: Space
    top_k: int
    budget_min: float
    steps: int
    out: Path
    dropped: list[Dropped] = field(default_factory=list)  # before planning
    planned: list[Planned] = field(default_factory=list)
    estimate: dict[str, float] = field(default_factory=dict)  # layout name -> estimated run wall, s
    chosen: list[Planned] = field(default_factory=list)  # in the plan's order
    runs: dict[str, str] = field(default_factory=dict)  # run name -> layout name
    measured: dict[str, MeasuredFigures] = field(default_factory=dict)  # layout name -> measured figures
    measure_wall_s: float | None = None

    @property
    def run_of(self) -> dict[str, str]:
        return {layout: run for run, layout in self.runs.items()}


def _layout_row(t: Tuning, p: Planned, rank: dict[str, int]) -> dict[str, Any]:
    c, name = p.point.candidate, p.point.name
    m = t.measured.get(name)
    return {"name": name, "batch": p.point.batch, "strategy": c.strategy, "mesh": c.mesh, "remat": c.remat,
            "dtype": c.dtype, "grad_accum": c.grad_accum, "microbatches": c.microbatches, "schedule": c.schedule,
            "fits": p.fits,
            "predicted_step_s": p.prediction.step_s if p.prediction else None,
            "predicted_memory_bytes": p.prediction.total_bytes if p.prediction else None,
            "objective": t.objective.predicted(p) if p.fits else None,
            "rank": rank.get(name), "dropped": p.dropped or None, "problem": p.problem or None,
            "prediction": p.prediction.to_dict() if p.prediction else None,
            "estimated_run_s": t.estimate.get(name), "chosen": name in {q.point.name for q in t.chosen},
            "run": t.run_of.get(name),
            "measured_step_s": m.step_s if m else None, "measured_memory_bytes": m.memory_bytes if m else None}


def summary(t: Tuning) -> Verdict | None:
    return outcome(t.chosen, t.measured, t.objective) if t.measured else None


def write_json(t: Tuning) -> Path:
    """tune.json: the space, every layout (planned or dropped before planning) and, once measured, the verdict.
    Its "runs" (run name -> the plan's prediction) is what `shardbench report` sets beside the measurements."""
    from shardbench.tune.select import rank as ranked_by

    order = {p.point.name: i for i, p in enumerate(ranked_by(t.planned, t.objective), 1)}
    verdict = summary(t)
    data = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **identity(t), "config": config_lib.flatten(t.cfg),
        "layouts": [_layout_row(t, p, order) for p in t.planned],
        "dropped_before_planning": [{"name": d.what, "dropped": d.reason} for d in t.dropped],
        "runs": {run: next(p.prediction.to_dict() for p in t.chosen if p.point.name == layout and p.prediction)
                 for run, layout in t.runs.items()},
        "measure_wall_s": t.measure_wall_s,
        "result": None if verdict is None else {
            "winner": verdict.winner.point.name, "winner_run": t.run_of.get(verdict.winner.point.name),
            "winner_objective": verdict.winner_value, "plan_top": verdict.plan_top.point.name,
            "plan_top_objective": verdict.plan_top_value, "regret": verdict.regret,
            "kendall_tau_by_batch": {str(batch): tau for batch, tau in verdict.taus().items()},
            "measured": verdict.measured, "command": " ".join(winner_command(t, verdict.winner))},
    }
    t.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(t.out / TUNE_JSON, data)
    return t.out / TUNE_JSON


def identity(t: Tuning) -> dict[str, Any]:
    """What makes a tune the one it is, besides its configuration: the target, the objective, the budget and the
    space (in tune.json; a resumed tune must match it)."""
    return {"target": t.target.spec, "devices": t.target.devices, "objective": t.objective.name,
            "top_k": t.top_k, "budget_min": t.budget_min, "measure_steps": t.steps,
            "space": {"strategies": list(t.space.strategies), "remats": list(t.space.remats),
                      "dtypes": list(t.space.dtypes), "grad_accum": list(t.space.accums),
                      "batch_sizes": list(t.space.batches), "microbatches_per_stage": list(t.space.per_stage),
                      "schedules": list(t.space.schedules), "train_examples": t.space.examples}}


# ------------------------------------------------------------------------------------------ --resume
# Fields a resume may give otherwise: its folder and flag, and --devices, whose count the tune's identity holds as
# resolved ("devices": --devices 0 means every device, the same 8 as --devices 8 on an 8-device host).
RESUME_MAY_CHANGE = ("train.out", "train.resume", "parallel.devices")


def resumed(t: Tuning) -> Tuning:
    """`t`, built from this command's flags, with what the interrupted tune in `t.out` planned and chose (read
    back from its tune.json), ready to measure the runs its sweep has not recorded. One line where `t.out` holds
    no tune whose runs had started, or one started with other flags."""
    path = t.out / TUNE_JSON
    if not path.exists():
        raise ConfigError(f"--resume: {t.out} holds no tune to finish (no {TUNE_JSON}); drop --resume and give an "
                          f"empty or new --out to start one")
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise DataError(f"--resume: {path} is unreadable ({err}): drop --resume and give another --out to start "
                        f"again") from None
    if not (isinstance(data, dict) and isinstance(data.get("layouts", []), list)
            and all(isinstance(row, dict) for row in data.get("layouts", []))
            and isinstance(data.get("space") or {}, dict) and isinstance(data.get("config") or {}, dict)
            and isinstance(data.get("dropped_before_planning", []), list)):
        raise DataError(f"--resume: {path} is not a tune's record (a JSON object with its layouts): drop --resume "
                        f"and give another --out to start again")
    differs = _difference(data, t)
    if differs:
        raise ConfigError(f"--resume: {t.out} holds a tune started with other flags ({differs}); give the flags it "
                          f"was started with, or drop --resume and give another --out")
    rows = data.get("layouts", [])
    try:
        planned = [_planned_from(row, t.target) for row in rows]
        chosen = sorted(((p, row["rank"]) for p, row in zip(planned, rows) if row["chosen"]),
                        key=lambda pair: pair[1])
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(f"--resume: {path} is damaged (a layout lacks {err}): drop --resume and give another "
                        f"--out to start again") from None
    if not chosen:
        raise ConfigError(f"--resume: the tune in {t.out} chose no layout to measure (it stopped before, or was "
                          f"refused): drop --resume and give another --out to start again")
    if any(p.prediction is None for p, _ in chosen):
        raise ConfigError(f"--resume: {t.out / TUNE_JSON} keeps no prediction of its chosen layouts (an older "
                          f"shardbench wrote it): drop --resume and give another --out to start again")
    t.dropped = [Dropped(d["name"], d["dropped"]) for d in data.get("dropped_before_planning", [])]
    t.planned = planned
    t.estimate = {row["name"]: row["estimated_run_s"] for row in rows if row["estimated_run_s"] is not None}
    t.chosen = [p for p, _ in chosen]  # in the plan's order
    t.runs = {row["run"]: row["name"] for row in rows if row["run"]}
    return t


# The flag that sets each part of a tune's identity, as a difference on --resume names it.
IDENTITY_FLAGS = {"target": "--target", "devices": "--devices", "objective": "--objective", "top_k": "--top-k",
                  "budget_min": "--budget-min", "measure_steps": "--measure-steps", "strategies": "--candidates",
                  "remats": "--remat", "dtypes": "--dtype", "grad_accum": "--grad-accum",
                  "batch_sizes": "--batch-size", "microbatches_per_stage": "--microbatches-per-stage",
                  "schedules": "--schedules", "train_examples": "the training examples"}


def _difference(data: dict[str, Any], t: Tuning) -> str | None:
    """The first field where tune.json's tune and `t` differ ('--flag: as stored there, as given now'); None when
    they are alike. The space's lists are compared as sets (the stored plan is what resumes: the order they were
    given in changes nothing), the configuration's fields one by one, but for RESUME_MAY_CHANGE and those a list of
    the space stands for (LIST_FLAGS: the configuration holds the first value given, which a reordered list
    changes)."""
    def flat(tune: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        parts = {**{k: v for k, v in tune.items() if k != "space"}, **(tune.get("space") or {})}
        named = {IDENTITY_FLAGS.get(k, k): sorted(v, key=str) if isinstance(v, list) else v for k, v in parts.items()}
        return {**named, **{k: v for k, v in config.items() if k not in RESUME_MAY_CHANGE and k not in LIST_FLAGS}}

    now = json.loads(json.dumps(flat(identity(t), config_lib.flatten(t.cfg))))
    stored = flat({k: data.get(k) for k in identity(t)}, data.get("config") or {})
    key = next((k for k in dict.fromkeys([*now, *stored]) if now.get(k) != stored.get(k)), None)
    if key is None:
        return None
    flag = config_lib.flag_name(key) if key in config_lib.SPECS else key  # a configuration field by its flag
    return f"{flag}: {stored.get(key)!r} there, {now.get(key)!r} now"


def _planned_from(row: dict[str, Any], target: Target) -> Planned:
    """A layout of tune.json as it was planned: its point, its prediction (or why there is none)."""
    from shardbench.plan.candidates import Candidate
    from shardbench.plan.predict import Prediction
    from shardbench.tune.space import Point

    candidate = Candidate(row["strategy"], row["mesh"], row["remat"], row["dtype"], row["grad_accum"],
                          row["microbatches"], row["schedule"])
    stored = row.get("prediction")
    prediction = (None if stored is None else
                  Prediction(**{f.name: stored[f.name] for f in dataclasses.fields(Prediction)}))
    return Planned(Point(candidate, row["batch"]), prediction, row.get("problem") or "", target)


# ------------------------------------------------------------------------------------------ the winner
ALWAYS = ("parallel.strategy", "parallel.mesh", "parallel.devices")  # said in every ready command


def winner_settings(t: Tuning, p: Planned) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the user's own settings, the layout's): what `shardbench train` needs besides the preset; the layout's
    fields only where they differ from the preset's (its strategy, mesh and devices always)."""
    from shardbench.presets import get_preset

    given = config_lib.flatten(get_preset(t.cfg.preset))
    layout = {k: v for k, v in layout_settings(t.cfg, p.point, t.target.devices).items()
              if k in ALWAYS or given.get(k) != v}
    return {k: v for k, v in user_settings(t.cfg).items() if k not in layout}, layout


def winner_command(t: Tuning, p: Planned) -> list[str]:
    """The ready command: `shardbench train --preset P`, the user's flags, then the layout's."""
    from shardbench.sweep.runner import _arg

    own, layout = winner_settings(t, p)
    cmd = ["shardbench", "train", "--preset", t.cfg.preset]
    for key, value in {**own, **layout}.items():
        cmd += _arg(key, value)
    return cmd


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string is a JSON string for these values


def winner_toml(t: Tuning, p: Planned) -> str:
    """The winner as a sweep file of one run (`shardbench sweep --sweep-file winner.toml`): the preset, the
    user's settings as its base and the layout as its one axis."""
    own, layout = winner_settings(t, p)
    entry = ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in layout.items())
    lines = [f"# shardbench tune's winner: {p.point.name}", f"# train it: {' '.join(winner_command(t, p))}",
             f"preset = {json.dumps(t.cfg.preset)}", f"axes = [[{{{entry}}}]]", "", "[base]"]
    lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in own.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ tune.md
def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:,.1f} ms"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value / MIB:,.1f} MiB"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"


def table(t: Tuning) -> list[list[str]]:
    """Predicted against measured for the chosen layouts, in the plan's order; the objective's own column where it
    is not one of those already (memory per device is the measured memory column)."""
    own = t.objective.name != "memory"
    rows = [["plan rank", "layout", "run", "predicted step", "measured step", "error", "predicted memory",
             "measured memory", *([f"measured {t.objective.name}"] if own else [])]]
    for i, p in enumerate(t.chosen, 1):
        m = t.measured.get(p.point.name)
        pred = p.prediction
        error = (None if m is None or not m.step_s or pred is None else (pred.step_s - m.step_s) / m.step_s)
        value = None if m is None else t.objective.measured(p, m)
        rows.append([str(i), p.point.name, t.run_of.get(p.point.name, "–"), _ms(pred.step_s if pred else None),
                     _ms(m.step_s if m else None), _pct(error), _mib(pred.total_bytes if pred else None),
                     _mib(m.memory_bytes if m else None),
                     *(["failed" if value is None else t.objective.show(value)] if own else [])])
    return rows


def cost_table(t: Tuning) -> tuple[list[list[str]], str]:
    """Dollars (on demand) and kWh of an epoch for the chosen layouts: predicted from the plan's step time and the
    price table (`--prices`), measured from each run's record; and the line that says how."""
    from shardbench.data.epochs import steps_per_epoch
    from shardbench.plan.plan_cmd import epoch_examples
    from shardbench.prices import epoch_cost, prices_from_flag

    table = prices_from_flag(t.cfg.train.prices)
    chip = t.target.chip.name if t.target.chip else "cpu"
    price = table.lookup(chip)
    examples = epoch_examples(t.cfg)
    if price is None or examples is None:
        why = (f"the price table ({table.origin}) has no row for {chip}" if price is None else
               f"{t.cfg.data.dataset} gives no epoch size before it is read; see each run's record")
        return [], f"cost per epoch: {why}"
    rows = [["layout", "predicted $/epoch", "predicted kWh/epoch", "measured $/epoch", "measured kWh/epoch"]]
    for p in t.chosen:
        steps = steps_per_epoch(examples, p.point.batch)  # a layout's own batch (--batch-size may list several)
        pred = (epoch_cost(price, p.prediction.step_s, steps, t.target.devices, hosts=t.target.nodes)
                if p.prediction and steps else None)
        m = t.measured.get(p.point.name)
        got = m.cost if m is not None and m.cost is not None and m.cost.on_demand_usd is not None else None
        rows.append([p.point.name, _usd(pred.on_demand_usd if pred else None), _kwh(pred.kwh if pred else None),
                     _usd(got.on_demand_usd if got else None), _kwh(got.kwh if got else None)])
    return rows, (f"cost per epoch ({examples} examples over each layout's batch) at {price.describe()}, on "
                  f"{t.target.priced_on(price.per)}; energy from the table's watts (estimated) unless a run "
                  f"measured it")


def _usd(value: float | None) -> str:
    return "–" if value is None else f"${value:,.4g}"


def _kwh(value: float | None) -> str:
    return "–" if value is None else f"{value:,.4g}"


def planned_line(t: Tuning) -> str:
    """What was planned, dropped and measured, in one line."""
    fits = sum(p.fits for p in t.planned)
    planned = sum(p.prediction is not None for p in t.planned)
    return (f"planned {len(t.planned)} layout(s) on {t.target.spec} ({planned} predicted, {fits} fit; "
            f"{len(t.dropped)} part(s) of the space dropped before planning); measured the plan's top {len(t.chosen)} "
            f"by {t.objective.what} within --budget-min {t.budget_min:g}"
            + (f" (took {t.measure_wall_s / 60:.1f} min)" if t.measure_wall_s is not None else ""))


def no_verdict_line(t: Tuning) -> str:
    """Why there is no winner: no chosen layout's run measured the objective."""
    return (f"no winner: none of the {len(t.chosen)} measured run(s) gave {t.objective.what} (each run's status and "
            f"error: report/report.md; its output: runs/<run>.log)")


def verdict_lines(t: Tuning, v: Verdict | None) -> list[str]:
    lines = [planned_line(t)]
    if v is None:
        return [*lines, no_verdict_line(t)]
    lines.append(f"winner: {v.winner.point.name}, measured {t.objective.show(v.winner_value)}")
    if v.plan_top_value is None:
        lines.append(f"the plan's top choice, {v.plan_top.point.name}, did not measure: no regret")
    elif v.plan_top is v.winner:
        lines.append(f"the plan's top choice is the winner: regret 0.0% over the {v.measured} measured")
    else:
        lines.append(f"the plan's top choice, {v.plan_top.point.name}, measured "
                     f"{t.objective.show(v.plan_top_value)}: regret {_pct(v.regret)} against the best measured")
    if few := few_steps_line(t):
        lines.append(few)
    texts = v.tau_texts()
    lines.append("predicted against measured step time, per batch size (one batch's runs are one piece of work): "
                 + ("no run measured a step time" if not texts else
                    "; ".join(f"batch {batch}: {text}" for batch, text in texts.items())))
    return lines


def few_steps_line(t: Tuning) -> str:
    """Where measured steps rest on fewer than MIN_MEASURED_STEPS timed steps, what that leaves of the verdict (as
    the sweep's report says of such runs: a gap within FEW_STEPS_MARGIN is within one step's noise); else ''."""
    counts = sorted({m.timed_steps for m in t.measured.values()
                     if m.step_s is not None and m.timed_steps is not None and m.timed_steps < MIN_MEASURED_STEPS})
    if not counts:
        return ""
    steps = " or ".join(map(str, counts))
    return (f"the measured step times rest on {steps} timed step(s) (fewer than {MIN_MEASURED_STEPS}): a gap within "
            f"{FEW_STEPS_MARGIN:.0%} between them is within one step's noise, so the winner and the regret may not "
            f"hold; a larger --measure-steps ({t.steps} now) times more")


def dropped_counts(t: Tuning) -> list[tuple[int, str]]:
    """Why layouts were dropped, counted, commonest first."""
    counts: dict[str, int] = {}
    for reason in [p.dropped for p in t.planned if p.dropped] + [d.reason for d in t.dropped]:
        counts[reason] = counts.get(reason, 0) + 1
    return sorted(((n, r) for r, n in counts.items()), key=lambda pair: -pair[0])


def render_markdown(t: Tuning, v: Verdict | None, chart: str | None) -> str:
    """tune.md: the verdict (or why there is none), predicted against measured, the cost of an epoch, the winner's
    command where there is a winner, and what was dropped."""
    model = t.cfg.model.factory or t.cfg.preset
    lines = [f"# shardbench tune: {model} on {t.target.spec}, objective {t.objective.name}", ""]
    lines += [f"- {line}" for line in verdict_lines(t, v)]
    rows = table(t)
    lines += ["", "## Predicted against measured", "", "| " + " | ".join(rows[0]) + " |",
              "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]
    if chart:
        lines += ["", f"![predicted against measured step time]({chart})"]
    costs, how = cost_table(t)
    lines += ["", "## Cost per epoch", ""]
    if costs:
        lines += ["| " + " | ".join(costs[0]) + " |", "|" + "---|" * len(costs[0])]
        lines += ["| " + " | ".join(r) + " |" for r in costs[1:]] + [""]
    lines.append(how)
    where = (f"every layout planned, with its prediction and why it was dropped: `{TUNE_JSON}`; the plan(s): "
             f"`plan*/plan.md`; the measured runs' report: `report/report.md`.")
    if v is not None:
        lines += ["", "## The winner", "", "```", " ".join(winner_command(t, v.winner)), "```", "",
                  f"or `shardbench sweep --sweep-file {t.out / WINNER}` (one run); {where}"]
    else:
        lines += ["", "## No winner", "", where[0].upper() + where[1:]]
    counted = dropped_counts(t)
    if counted:
        lines += ["", "## Dropped", "", "| layouts | why |", "|---:|---|"]
        lines += [f"| {n} | {r.replace('|', '/')} |" for n, r in counted]
    return "\n".join(lines) + "\n"


def finish(t: Tuning) -> int:
    """After the runs: the sweep's report (with the plan's chart), tune.md, with a winner winner.toml, then
    tune.json with the verdict, last, so that a verdict there means every file of it was written (a tune stopped
    before is finished by --resume); the table printed, and with a winner the ready command. 1 when no run
    measured the objective (tune.md and the report say which runs failed and why)."""
    from shardbench.report.write import write_report

    v = summary(t)
    paths = write_report(t.out, writing=True)
    chart = paths.charts.get("plan_vs_measured")
    if v is not None:
        (t.out / WINNER).write_text(winner_toml(t, v.winner))
    (t.out / "tune.md").write_text(render_markdown(t, v, None if chart is None else
                                                   chart.relative_to(t.out).as_posix()), encoding="utf-8")
    write_json(t)
    rows = table(t)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows))
    if v is None:
        print("\n".join(["", *verdict_lines(t, v), f"tune: {t.out / 'tune.md'}, {t.out / TUNE_JSON}, "
                                                    f"{paths.markdown}, the runs' output: {t.out / 'runs'}"]),
              flush=True)
        return 1
    print("\n".join(["", *verdict_lines(t, v), "", "ready command for the winner:",
                     "  " + " ".join(winner_command(t, v.winner)),
                     f"tune: {t.out / 'tune.md'}, {t.out / TUNE_JSON}, {t.out / WINNER}, {paths.markdown}"]),
          flush=True)
    return 0
