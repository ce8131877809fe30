"""`shardbench plan --validate DIR`: predict every measured run below DIR on the hardware it ran on and say how
far off the planner is: memory and step-time error per run, their mean absolute percentage error and worst error,
and Kendall's tau between the predicted and the measured rankings; where DIR names held-out runs
(`shardbench.plan.calibration.HELD_OUT`), the same for them apart. The predictions are kept in
DIR/plan-validation.json, which `shardbench report` shows beside the measurements."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardbench.errors import ShardbenchError
from shardbench.jsonfile import write_json_atomic
from shardbench.plan.calibration import HELD_OUT, Coefficients, held_out, to_dict
from shardbench.report.kendall import MIN_TAU_RUNS, describe_tau, kendall_tau
from shardbench.plan.predict import Prediction, predict
from shardbench.report.speed import comparable, label
from shardbench.report.write import PREDICTIONS


@dataclass(frozen=True)
class Check:
    name: str
    measured_step: float | None
    predicted_step: float | None
    measured_memory: float | None
    predicted_memory: float | None
    memory_kind: str
    problem: str = ""
    held_out: bool = False  # named in the folder's held-out.txt: no fit saw it
    group: str = ""  # the work it does (`report.speed.comparable`: model, shape, batch), named among the folder's

    @staticmethod
    def error(measured: float | None, predicted: float | None) -> float | None:
        return None if not measured or predicted is None else (predicted - measured) / measured


def mape(pairs: list[tuple[float | None, float | None]]) -> float | None:
    errors = [abs(Check.error(m, p)) for m, p in pairs if Check.error(m, p) is not None]
    return sum(errors) / len(errors) if errors else None


def worst(checks: list[Check], figure: str) -> tuple[float, str] | None:
    """The largest error in absolute value of `figure` ('step' or 'memory'), signed, with its run's name."""
    errors = [(e, c.name) for c in checks
              if (e := Check.error(getattr(c, f"measured_{figure}"), getattr(c, f"predicted_{figure}"))) is not None]
    return max(errors, key=lambda pair: abs(pair[0])) if errors else None


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"


def validate_dir(directory: Path, calibrate: list[Path], workers: int) -> int:
    """Print the validation of `directory` and write DIR/plan-validation.json; 0 when at least one run was
    predicted."""
    from shardbench.plan.measured import calibrate as fit_runs
    from shardbench.plan.measured import measured_runs

    calibration = fit_runs(calibrate, workers)
    coefficients = calibration.coefficients
    in_sample = any(directory.resolve() == d.resolve() for d in calibrate)
    held = held_out(directory)
    checks: list[Check] = []
    predictions: dict[str, Prediction] = {}
    measured = measured_runs(directory, workers)
    keys = [comparable(m.run) for m in measured]
    for m, key in zip(measured, keys, strict=True):
        group = label(key, keys)
        if m.result is None or m.hardware is None:
            checks.append(Check(m.run.name, m.step_s, None, m.memory_bytes, None, m.memory_kind, m.problem,
                                m.run.name in held, group))
            continue
        compiled_for, target = m.result["platform"], m.hardware.platform
        scale, source = calibration.activation_scale(compiled_for, target, m.dtype)
        p = predict(m.result, m.hardware, coefficients[target], batch=m.cfg.train.batch_size,
                    remat=m.cfg.model.remat, dtype=m.dtype, activation_scale=scale, activation_source=source,
                    runtime_bytes=calibration.runtime(compiled_for, target))
        predictions[m.run.name] = p
        checks.append(Check(m.run.name, m.step_s, p.step_s, m.memory_bytes, p.total_bytes, m.memory_kind,
                            held_out=m.run.name in held, group=group))
    if not predictions:
        raise ShardbenchError(f"--validate {directory}: no run could be predicted"
                              + (f" ({checks[0].problem})" if checks else ""))
    used = {m.hardware.platform for m in measured if m.hardware is not None}
    compilers = sorted({p.compiler for p in predictions.values()})
    print(render(directory, checks, {k: v for k, v in coefficients.items() if k in used}, in_sample, compilers,
                 bool(held)))
    for platform in sorted(used & set(calibration.activation_ratios)):
        ratios = ", ".join(f"{d} x {r:.3f}" for d, r in sorted(calibration.activation_ratios[platform].items()))
        print(f"activations ({platform}, where another compiler's are borrowed): {ratios}, plus "
              f"{calibration.runtime_bytes.get(platform, 0.0) / 2**20:.1f} MiB the runtime holds "
              f"({calibration.activation_sources.get(platform, 'assumed')})")
    write_json_atomic(directory / PREDICTIONS, {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "coefficients": {k: to_dict(v) for k, v in coefficients.items()}, "in_sample": in_sample,
        "compilers": compilers, "activation_ratios": calibration.activation_ratios,
        "runtime_bytes": calibration.runtime_bytes,
        "runs": {name: p.to_dict() for name, p in predictions.items()},
        "summary": summary(checks),
        **({"held_out": sorted(held), "held_out_summary": summary([c for c in checks if c.held_out]),
            "fitted_summary": summary([c for c in checks if not c.held_out])} if held else {})})
    print(f"\npredictions written to {directory / PREDICTIONS} (shardbench report {directory} shows them beside the "
          f"measurements)")
    return 0


def step_taus(ok: list[Check]) -> list[dict[str, str | int | float | None]]:
    """Kendall's tau of the step-time ranking within each group of the same work (`Check.group`): across groups
    the plan's order would rank models and batch sizes, not layouts. None under MIN_TAU_RUNS runs."""
    out: list[dict[str, str | int | float | None]] = []
    for group in dict.fromkeys(c.group for c in ok):
        members = [c for c in ok if c.group == group]
        measured, predicted = [c.measured_step or 0.0 for c in members], [c.predicted_step or 0.0 for c in members]
        out.append({"group": group, "runs": len(members), "text": describe_tau(predicted, measured),
                    "tau": kendall_tau(measured, predicted) if len(members) >= MIN_TAU_RUNS else None})
    return out


def summary(checks: list[Check]) -> dict[str, Any]:
    ok = [c for c in checks if c.predicted_step is not None and c.measured_step]
    memory = [c for c in checks if c.predicted_memory is not None and c.measured_memory]
    step_worst, memory_worst = worst(ok, "step"), worst(memory, "memory")
    return {
        "runs": len(ok),
        "step_mape": mape([(c.measured_step, c.predicted_step) for c in ok]),
        "memory_mape": mape([(c.measured_memory, c.predicted_memory) for c in memory]),
        "step_worst": step_worst[0] if step_worst else None,
        "step_worst_run": step_worst[1] if step_worst else None,
        "memory_worst": memory_worst[0] if memory_worst else None,
        "memory_worst_run": memory_worst[1] if memory_worst else None,
        "step_tau_by_group": step_taus(ok),
        "memory_tau": kendall_tau([c.measured_memory for c in memory], [c.predicted_memory for c in memory])
        if len(memory) > 1 else None,
    }


def render(directory: Path, checks: list[Check], coefficients: dict[str, Coefficients], in_sample: bool,
           compilers: list[str] | None = None, split: bool = False) -> str:
    head = ["run", "memory measured", "predicted", "error", "step measured", "predicted", "error"]
    rows = [head]
    for c in checks:
        name = f"{c.name} (held out)" if c.held_out else c.name
        if c.predicted_step is None:
            rows.append([name, "", "", "", "", "", f"not predicted: {c.problem}"])
            continue
        rows.append([name, f"{(c.measured_memory or 0) / 2**20:.1f} MiB ({c.memory_kind})",
                     f"{(c.predicted_memory or 0) / 2**20:.1f} MiB",
                     _pct(Check.error(c.measured_memory, c.predicted_memory)),
                     "–" if c.measured_step is None else f"{c.measured_step * 1e3:.1f} ms",
                     f"{(c.predicted_step or 0) * 1e3:.1f} ms",
                     _pct(Check.error(c.measured_step, c.predicted_step))])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"validation of the planner on {directory}: {len(checks)} run(s)", ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]

    def fmt(v: float | int | None, pct: bool = True) -> str:
        return "–" if v is None else (f"{v:.1%}" if pct else f"{v:.2f}")

    def line(s: dict[str, Any]) -> str:
        def worst_of(figure: str) -> str:
            value = s[f"{figure}_worst"]
            return "" if value is None else f", worst {value:+.1%} ({s[f'{figure}_worst_run']})"

        groups = s["step_tau_by_group"]
        taus = "; ".join(f"{g['group'] + ': ' if len(groups) > 1 else ''}{g['text']}" for g in groups) or "no run"
        return (f"memory: mean absolute error {fmt(s['memory_mape'])}{worst_of('memory')}; step time: mean absolute "
                f"error {fmt(s['step_mape'])}{worst_of('step')} over {s['runs']} run(s); Kendall's tau of the "
                f"step-time ranking within each group of the same work (model, shape, batch): {taus}")

    lines += ["", line(summary(checks))]
    if split:
        lines += [f"held out (named in {directory / HELD_OUT}; no fit saw them): "
                  + line(summary([c for c in checks if c.held_out])),
                  "not held out (fitted to, if the coefficients were fitted here): "
                  + line(summary([c for c in checks if not c.held_out]))]
    lines += [f"coefficients ({platform}): {c.describe()}" for platform, c in coefficients.items()]
    if compilers:
        lines.append(f"compiled with: {', '.join(compilers)}")
    if in_sample and split:
        lines.append("note: calibrated on this folder but its held-out runs: only the held-out line is an "
                     "out-of-sample error")
    elif in_sample:
        lines.append("note: the model was calibrated on these same runs (in-sample): calibrate on other runs for "
                     "an honest error")
    return "\n".join(lines)

