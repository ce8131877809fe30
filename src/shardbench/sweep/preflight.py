"""Check every run of a sweep before the first one starts: the checks `shardbench train` makes before it loads
data or compiles (choices, mesh and device count, strategy against the model's dimensions, batch against the
data axis, SPMD style, profile window, parameters against a device's memory, and the batch against the training
examples where the configuration gives their count), so that a typo or an impossible layout is named up front instead of
an hour into the sweep.

The checks need JAX and the devices a run would see, so they run in a child process per distinct device count
(`python -m shardbench.startup shardbench.sweep.preflight`, configurations on stdin, {run name: refusal} on
stdout), set up as a run's own process would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from shardbench import config as config_lib
from shardbench import startup
from shardbench.devices import check_split, planned_processes
from shardbench.errors import ConfigError
from shardbench.parsing import override
from shardbench.sweep.grid import Sweep, run_config


class Checked(NamedTuple):
    """What the checks found: {run name: why `shardbench train` would refuse it}, and {run name: the notes its
    layout gets} (`shardbench train` prints them: a strategy's axis the mesh gives one device, arrays an FSDP
    tactic leaves whole) for the runs that would start."""

    refused: dict[str, str]
    notes: dict[str, list[str]]


def refusals(sweep: Sweep, profile: bool = False, processes: Mapping[str, tuple[int, int]] | None = None
             ) -> Checked:
    """What `shardbench train` would refuse, and note, of every run of `sweep`; `profile`: the sweep's --profile,
    which each run is given when it starts, so its window is checked now; `processes`: {run name: (its processes,
    the devices of each, 0 for its devices split evenly)} where the sweep runs it in several, checked as they
    would check it once joined."""
    extra = {"train.profile": True} if profile else {}
    found: dict[str, str] = {}
    configs: dict[str, dict[str, Any]] = {}
    for run in sweep.runs:
        flat = run_config(sweep.base_preset, run) | extra
        count, per_process = (processes or {}).get(run.name, (1, 0))
        try:
            check_split(int(flat["parallel.devices"]), count, per_process)
        except ConfigError as err:
            found[run.name] = str(err)
            continue
        configs[run.name] = flat | {PROCESSES: count}
    checked = check_in_processes(configs)
    found.update(checked.refused)
    return Checked({run.name: found[run.name] for run in sweep.runs if run.name in found},
                   {run.name: checked.notes[run.name] for run in sweep.runs if checked.notes.get(run.name)})


PROCESSES = "_processes"  # beside a configuration sent to the check: the processes its run will have


def check_in_processes(configs: dict[str, dict[str, Any]], env: dict[str, str] | None = None) -> Checked:
    """The refusals and layout notes of the flattened configurations, as `shardbench train` would give them, each
    checked in a child process (environment `env`, default this one's) set up with the devices that configuration
    asks for, and with its run's process count (PROCESSES, default 1) for the checks that depend on it."""
    by_devices: dict[int, dict[str, dict[str, Any]]] = {}
    for name, flat in configs.items():
        by_devices.setdefault(int(flat["parallel.devices"]), {})[name] = flat
    found: dict[str, str] = {}
    notes: dict[str, list[str]] = {}
    for group in by_devices.values():
        done = subprocess.run([sys.executable, "-m", "shardbench.startup", "shardbench.sweep.preflight"],
                              input=json.dumps(group),
                              capture_output=True, text=True, env=env if env is not None else os.environ.copy())
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the sweep's configuration check failed: {last}")
        answer = Checked(*json.loads(done.stdout))
        found.update(answer.refused)
        notes.update(answer.notes)
    return Checked({name: found[name] for name in configs if name in found},
                   {name: notes[name] for name in configs if notes.get(name)})


def check(configs: dict[str, dict[str, Any]]) -> Checked:
    """In this process (whose devices are not set up yet): each configuration's refusal, if any, and the notes on
    its layout of one that passes."""
    with startup.quiet_imports():
        from shardbench.capacity import check_fits
        from shardbench.data.sources import known_train_rows
        from shardbench.errors import ShardbenchError
        from shardbench.flags import setup_devices
        from shardbench.parallel.checks import layout_notes
        from shardbench.preflight import check_batch_fits_data, check_runnable

    processes = {name: int(flat.pop(PROCESSES, 1)) for name, flat in configs.items()}
    cfgs = {name: override(config_lib.Config(), flat) for name, flat in configs.items()}
    if cfgs:
        setup_devices(next(iter(cfgs.values())))  # one device count per process (see `refusals`)
    out: dict[str, str] = {}
    notes: dict[str, list[str]] = {}
    for name, cfg in cfgs.items():
        try:
            with planned_processes(processes[name]):
                _, layout, spec = check_runnable(cfg)
            check_fits(cfg, spec, layout)  # the parameters alone past a device's memory
            rows = known_train_rows(cfg)
            if rows is not None:  # a batch past the examples, where the configuration gives their count
                check_batch_fits_data(cfg, rows, cfg.data.dataset)
        except ShardbenchError as err:
            out[name] = str(err)
            continue
        notes[name] = layout_notes(spec, layout, cfg.parallel.mesh)
    return Checked(out, notes)


def main() -> int:
    configs = json.loads(sys.stdin.read())
    channel = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints stays out of the answer
    channel.write(json.dumps(check(configs)))
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
