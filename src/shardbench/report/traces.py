"""Where each profiled run's train steps spent their time, read from its profiler trace: the time in collectives
measured, where the rest of the report can only count their bytes (`shardbench.measure.kernels.trace_time`).

A run trained with --profile records its trace's folder (`profile` in summary.json). A folder of runs copied
elsewhere is looked up again under its own `tensorboard/plugins/profile/<run>/`, where train and sweep put it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shardbench.errors import ShardbenchError
from shardbench.measure.kernels import find_trace, trace_time
from shardbench.report.content import ReportedRun

PROFILES = Path("tensorboard", "plugins", "profile")  # under a run's (or a sweep's) --out
WINDOW_STEPS = 3  # --train.profile-steps' default, for a record whose configuration does not give it


def _trace_folder(run: ReportedRun, sweep_dir: Path) -> Path | None:
    """The run's trace folder under the folder the report reads (a copy's own, where train and sweep put it: under
    the run's folder, or under a sweep's, which may lie between it and the folder reported), else where its record
    says it was written."""
    recorded = run.rec.profile
    if not recorded:
        return None
    top = sweep_dir.resolve()
    here = [] if run.folder is None else [run.folder, *run.folder.parents]
    roots = [p for p in here if p.resolve() == top or top in p.resolve().parents] + [sweep_dir]
    found = [root / PROFILES / Path(recorded).name for root in dict.fromkeys(roots)] + [Path(recorded)]
    return next((p for p in found if p.is_dir() and any(p.rglob("*.xplane.pb"))), None)


def with_traces(runs: list[ReportedRun], sweep_dir: Path) -> list[ReportedRun]:
    """The runs with `traced` (their trace's time by kind) where --profile left a trace this report can read,
    and `trace_error` (why not) where it recorded one that is missing or unreadable, or that another run of the
    same name wrote to the same folder (the later replaced the earlier: whose it holds cannot be told)."""
    profiled = [run.ok and bool(run.rec.profile) for run in runs]
    folders = [_trace_folder(run, sweep_dir) if p else None for run, p in zip(runs, profiled, strict=True)]
    sharing: dict[Path, list[int]] = {}
    for i, folder in enumerate(folders):
        if folder is not None:
            sharing.setdefault(folder.resolve(), []).append(i)
    out = []
    for i, (run, folder) in enumerate(zip(runs, folders, strict=True)):
        if not profiled[i]:
            out.append(run)
            continue
        others = [] if folder is None else [runs[j].name for j in sharing[folder.resolve()] if j != i]
        if folder is None:
            error = f"its trace is in neither {run.rec.profile} nor {PROFILES}/{Path(run.rec.profile).name} here"
        elif others:
            error = (f"its trace folder {folder} is also {', '.join(others)}'s (runs of one name under one profile "
                     f"root): the later trace replaced the earlier, and whose it holds cannot be told; give each "
                     f"run its own --train.run-name")
        else:
            error = None
        if error is not None:
            out.append(dataclasses.replace(run, trace_error=error))
            continue
        assert folder is not None
        window = run.config.get("train.profile_steps") or WINDOW_STEPS
        try:
            out.append(dataclasses.replace(run, traced=trace_time(find_trace(folder), int(window))))
        except ShardbenchError as err:
            out.append(dataclasses.replace(run, trace_error=str(err)))
    return out


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value >= 0.1 else f"{value:.3f}"


def trace_findings(runs: list[ReportedRun]) -> list[str]:
    """Per profiled run: its traced step (beside its untraced median), the part some op ran and the part some
    collective ran, by kind, and its longest ops; the span of collective time across the runs; what a simulated
    device's collective time is; and the traces that could not be read."""
    traced = [r for r in runs if r.traced is not None]
    sentences = []
    for run in traced:
        t = run.traced
        assert t is not None
        where = "kernels" if (run.m.platform or "cpu").lower() != "cpu" else "XLA's ops"
        steps = f"{t.steps} train step{'' if t.steps == 1 else 's'}" + (
            "" if t.counted_steps else " (the profile window's length: the trace does not count them)")
        if not t.train_only:
            steps += (" (the trace does not tell the train step's program from the others, so every op in it "
                      "counts, an evaluation's too)")
        on = f"{t.devices} device{'' if t.devices == 1 else 's'}"
        if (run.m.processes or 1) > 1:  # only process 0 traces: its devices alone are in the trace
            on = f"{t.devices} of its {run.devices or '?'} devices (process 0's; its other processes trace nothing)"
        untraced = f"; untraced, its median step is {_ms(1e3 * run.step_median)} ms" if run.step_median else ""
        span = (f"their median {_ms(t.span_ms)} ms from first op to last" if t.counted_steps else
                f"{_ms(t.span_ms)} ms a step from the window's first op to its last (the gaps between steps in it)")
        text = (f"{run.name}: {steps} traced on {on}, {span}{untraced}. "
                f"{'Each device' if t.devices > 1 else 'The device'} ran {where} for {_ms(t.busy_ms)} ms of it")
        if t.collective_ms:
            kinds = ", ".join(f"{kind} {_ms(ms)}" for kind, ms in t.collective_ms.items())
            if t.kinds_overlap:
                kinds += "; the kinds overlap in time"
            share = 100 * (t.collective_share or 0.0)
            text += f" and collectives for {_ms(t.collectives_ms)} ms ({share:.0f}% of the traced step: {kinds})"
        else:
            text += " and no collectives"
        top = "; ".join(f"`{name if len(name) <= 60 else name[:57] + '...'}` {_ms(ms)} ms" for name, ms in t.top)
        ran = "streams" if where == "kernels" else "threads"
        sentences.append(text + (f". The longest ops, their time summed over the {ran} that ran them: {top}."
                                 if top else "."))
    with_collectives = [r for r in traced if r.traced and r.traced.collective_ms]
    if len(traced) > 1 and with_collectives:
        low = min(traced, key=lambda r: r.traced.collectives_ms if r.traced else 0.0)
        high = max(traced, key=lambda r: r.traced.collectives_ms if r.traced else 0.0)
        assert low.traced is not None and high.traced is not None
        least = f"{_ms(low.traced.collectives_ms)} ms" if low.traced.collective_ms else "none"
        sentences.append(f"Measured in the traces, collectives took from {least} ({low.name}) to "
                         f"{_ms(high.traced.collectives_ms)} ms ({high.name}) of each device's traced step.")
    beside = [r for r in traced if r.step_median and r.traced]
    if beside:
        slower = sum(1 for r in beside if r.traced and 1e3 * (r.step_median or 0.0) < r.traced.span_ms)
        sentences.append(f"A traced step usually runs slower than an untraced one, as the profiler records every op "
                         f"(here the traced step was the longer in {slower} of {len(beside)} runs), so these times "
                         f"are parts of the traced step, set beside the median step rather than subtracted from it.")
    if any(r.simulated for r in with_collectives):
        sentences.append("On simulated devices a collective's time in the trace includes its wait for the other "
                         "devices, which take turns on the host's cores: it measures that rendezvous, not a link, "
                         "varies with the order in which the host runs the devices, and carries to no real device. "
                         "Real devices' traces (a GPU's or a TPU's) time the collectives' kernels themselves.")
    elif any((r.m.platform or "cpu").lower() != "cpu" for r in with_collectives):
        sentences.append("A collective that XLA overlaps with compute runs in the same part of the step as the "
                         "kernels it overlaps: the collectives' and the ops' times are not to be added.")
    sentences += [f"{r.name}: was profiled, but {r.trace_error}." for r in runs if r.trace_error]
    return sentences
