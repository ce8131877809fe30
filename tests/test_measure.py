"""Measurements checked against what is known exactly: a hand count of FLOPs, gradient bytes, no
collectives on one device, and the record every run writes."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from shardbench.measure.comms import count_collectives
from shardbench.measure.memory import per_device_bytes
from shardbench.measure.profile import ProfileWindow
from shardbench.models.vit import flops_per_example
from shardbench.presets import get_preset
from shardbench.tasks import get_task
from shardbench.train.console import summary_line
from shardbench.train.loop import run
from shardbench.optim import build_optimizer
from shardbench.preflight import check_run
from shardbench.train.spmd import make_steps
from shardbench.train.state import init_state


def test_vit_seed_flops_match_a_hand_count() -> None:
    # Per image: every matmul parameter meets every token once (2 FLOPs per multiply-add) plus attention's
    # two T x T products; the patch embedding meets only the 64 patches, the head only the class token.
    per_layer = 2 * (4 * 384 * 384 + 2 * 384 * 1536) * 65 + 2 * 2 * 65 * 65 * 384
    forward = 2 * 64 * (4 * 4 * 3) * 384 + 6 * per_layer + 2 * 384 * 10
    assert forward == 1_421_492_736
    got = flops_per_example(get_preset("vit-seed").model, 32)
    assert got == {"forward": forward, "train": 3 * forward}


def _stopped_window(root: Path, run_name: str, monkeypatch: pytest.MonkeyPatch) -> ProfileWindow:
    """A profile window stopped as after a trace: jax's folder of the trace is made by hand (no profiler runs)."""
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: None)
    window = ProfileWindow(root, run_name, 0, 1, enabled=True)
    window._tmp = root.parent / "trace-tmp"
    (window._tmp / "plugins" / "profile" / "2026_01_01_00_00_00").mkdir(parents=True)
    (window._tmp / "plugins" / "profile" / "2026_01_01_00_00_00" / "host.xplane.pb").write_text("trace")
    window.stop()
    return window


@pytest.mark.parametrize("run_name", ["VICTIM", "../../victim", "..", ".", "", "a/../../../victim", "link"])
def test_a_profile_never_removes_a_folder_outside_its_own(run_name: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace replaces the folder of an earlier one of the same name under <root>/plugins/profile, and only
    that: a run name that leads elsewhere (an absolute path, '..', a link out) leaves every other folder as it
    was, and the trace is kept under jax's own name."""
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "data.txt").write_text("x")
    root = tmp_path / "out" / "tensorboard"
    profiles = root / "plugins" / "profile"
    profiles.mkdir(parents=True)
    (profiles / "link").symlink_to(victim, target_is_directory=True)
    window = _stopped_window(root, str(victim) if run_name == "VICTIM" else run_name, monkeypatch)
    assert (victim / "keep" / "data.txt").read_text() == "x"
    assert window.path == profiles / "2026_01_01_00_00_00"
    assert (window.path / "host.xplane.pb").read_text() == "trace"
    assert (profiles / "link").is_symlink() and (profiles / "link").resolve() == victim


def test_a_profile_replaces_the_earlier_trace_of_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "tensorboard"
    earlier = root / "plugins" / "profile" / "mesh_8_1_batch_32"
    earlier.mkdir(parents=True)
    (earlier / "old.xplane.pb").write_text("old")
    window = _stopped_window(root, "mesh_8_1_batch_32", monkeypatch)
    assert window.path == earlier and sorted(p.name for p in earlier.iterdir()) == ["host.xplane.pb"]


def test_a_trace_that_cannot_be_filed_leaves_no_temporary_folder(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A file where the profile root's folder must go: filing the trace fails, and jax's temporary folder of it
    is removed all the same (a run that crashes on it must not leave megabytes in /tmp)."""
    root = tmp_path / "afile"
    root.write_text("")
    with pytest.raises(OSError):
        _stopped_window(root, "mesh_8_1_batch_32", monkeypatch)
    assert not (tmp_path / "trace-tmp").exists()


def test_a_run_stopped_inside_the_window_ends_the_trace_and_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """Ctrl-C while tracing left jax's temporary folder in /tmp and the profiler running: the trace is ended,
    the folder removed, nothing filed as the window, and the stop goes on up."""
    window = ProfileWindow(tmp_path / "tensorboard", "run", 0, 3, enabled=True)
    with pytest.raises(KeyboardInterrupt), window.abandoned_on_error():
        window.before_step(1)
        started = window._tmp
        assert started is not None and started.is_dir()
        raise KeyboardInterrupt
    assert not started.exists() and not window.active and window.path is None
    assert not (tmp_path / "tensorboard").exists()
    jax.profiler.start_trace(str(tmp_path / "again"))  # the profiler was stopped: a new trace can start
    jax.profiler.stop_trace()


def test_a_profile_root_that_cannot_hold_the_trace_is_refused_before_training(micro, tmp_path: Path) -> None:
    """The trace is filed after its window, mid-run: a --train.profile-root that cannot hold it is refused by
    the pre-flight check, in one line naming the flag, before a step trains or --out is made."""
    from shardbench.errors import FileFault
    from shardbench.preflight import check_run

    blocker = tmp_path / "afile"
    blocker.write_text("")
    cfg = micro(**{"train.profile": True, "train.profile_root": str(blocker), "train.out": str(tmp_path / "run"),
                   "train.profile_skip": 0, "train.profile_steps": 1})
    with pytest.raises(FileFault, match=f"--train.profile-root {blocker}/plugins/profile: {blocker} is a file"):
        check_run(cfg)
    assert not (tmp_path / "run").exists()
    check_run(micro(**{"train.profile": False, "train.profile_root": str(blocker)}))  # no trace: nothing to hold


def test_a_profile_window_traces_its_steps_and_no_more(micro) -> None:
    """--profile with a window of 3 steps after 2, on 2 devices: the trace holds 3 executions of the train step
    (it held 4: the step before the window, still running behind the host when the trace started), and the kernel
    table gives each device's time and launches per step (it summed the devices' into one step)."""
    from jax.profiler import ProfileData

    from shardbench.measure.kernels import find_trace, kernel_table, render

    cfg = micro(**{"train.steps": 7, "train.profile": True, "train.profile_skip": 2, "train.profile_steps": 3,
                   "parallel.strategy": "dp", "parallel.devices": 2, "parallel.mesh": "2",
                   "train.log_every": 100})  # no step logged: the host runs ahead of the devices, as it does
    summary = run(cfg)
    trace = find_trace(Path(cfg.train.out))
    assert summary_line(summary).endswith(f"; trace {summary['profile']}; -> {cfg.train.out}")  # where to open it
    assert trace.is_relative_to(summary["profile"])
    executions: dict[str, set[int]] = {}
    for plane in ProfileData.from_file(str(trace)).planes:
        for line in plane.lines if plane.name == "/host:CPU" else ():
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    executions.setdefault(stats["hlo_module"], set()).add(stats["run_id"])
    assert {module: len(runs) for module, runs in executions.items()} == {"jit_train_step": 3}
    kernels, total, devices = kernel_table(trace, top=10_000)
    assert devices == 2
    once = min(k.count for k in kernels)  # an op outside the layers' loop: once a step on each device
    assert once == 3 * 2
    table = render(kernels, total, 3, devices)
    assert f"over 3 step(s) on 2 devices, {total / 1e6 / 6:.2f} ms per step, each device's mean" in table
    assert any(line.endswith(f"| 1 | {100 * k.share:.1f}% |") for k in kernels if k.count == once
               for line in table.splitlines())


def _compiled_step(micro, strategy: str, mesh: str):
    cfg = micro(**{"parallel.strategy": strategy, "parallel.mesh": mesh})
    plan = check_run(cfg)
    tx = build_optimizer(cfg.optim, 10)
    state = init_state(cfg, plan.spec, plan.layout, tx)
    steps = make_steps(cfg, get_task(cfg), plan.spec, plan.layout, tx, ("image", "label"))
    batch = {"image": np.zeros((32, 32, 32, 3), np.uint8), "label": np.zeros(32, np.int32),
             "mask": np.ones(32, bool)}
    return steps.train.lower(state, steps.place(batch)).compile(), state


@pytest.mark.slow
def test_dp_step_all_reduces_exactly_the_gradient_bytes(micro) -> None:
    compiled, state = _compiled_step(micro, "dp", "8")
    report = count_collectives(compiled.as_text())
    gradient_bytes = per_device_bytes(state.params)  # replicated: the whole gradient on every device
    assert set(report.by_kind) == {"all-reduce"}
    # The gradients, plus the two float32 scalars averaged for the metrics (loss and accuracy).
    assert report.by_kind["all-reduce"].bytes == gradient_bytes + 2 * 4


@pytest.mark.slow
def test_single_device_step_has_no_collectives(micro) -> None:
    compiled, _ = _compiled_step(micro, "single", "none")
    assert count_collectives(compiled.as_text()).total_count == 0


@pytest.mark.slow
def test_fsdp_step_gathers_parameters(micro) -> None:
    compiled, state = _compiled_step(micro, "fsdp", "8")
    report = count_collectives(compiled.as_text())
    # The forward gathers every sharded weight back to full size, and the backward may gather it again (or keep the
    # forward's): between once and twice their whole bytes. (The arrays no dim of which divides stay whole.)
    sharded = sum(x.nbytes for x in jax.tree.leaves(state.params) if not x.sharding.is_fully_replicated)
    assert sharded <= report.by_kind["all-gather"].bytes <= 2 * sharded, (report.by_kind, sharded)


@pytest.mark.slow
def test_every_run_records_its_measurements(micro, tmp_path: Path) -> None:
    cfg = micro(**{"parallel.strategy": "fsdp", "parallel.mesh": "8", "train.steps": 8, "train.profile": True,
                   "train.profile_skip": 3, "train.profile_steps": 2})
    summary = run(cfg)
    saved = json.loads((Path(cfg.train.out) / "summary.json").read_text())
    assert saved["run_name"] == summary["run_name"] == "mesh_8_1_batch_32_fsdp"
    m = saved["measurements"]
    assert m["compile"]["lower_s"] > 0 and m["compile"]["compile_s"] > 0
    # 8 steps give 7 intervals (ended by steps 2-8): the warm-up's 2 and 3, and the profiler's window over steps 4
    # and 5 (its start settled in step 3), are left out; steps 6, 7 and 8 are timed.
    assert (m["step_time_s"]["excluded_steps"], m["step_time_s"]["measured_steps"]) == (4, 3)
    assert m["step_time_s"]["median"] <= m["step_time_s"]["p90"]
    # 8 of the epoch's 14 steps: no whole epoch, so no epoch time, and the partial one says what it was.
    assert m["epoch_time_s"] == [] and m["throughput"]["examples_per_s"] > 0
    assert [(e["steps"], e["of"]) for e in m["partial_epochs"]] == [(8, 14)] and m["partial_epochs"][0]["time_s"] > 0
    assert m["throughput"]["examples_per_s_per_device"] == pytest.approx(m["throughput"]["examples_per_s"] / 8)
    assert m["flops"]["analytic_per_step"] == flops_per_example(cfg.model, 32)["train"] * 32
    assert 0 < m["mfu"]["mfu"] < 1 and m["mfu"]["peak_source"].startswith("host float32 matmul peak")
    assert m["mfu"]["peak_measured_at"] and m["mfu"]["not_measured"] is None
    b = m["memory"]["breakdown"]
    assert sum(b.values()) == m["memory"]["total_bytes"]  # the parts add up to the compiled total
    assert b["optimizer_bytes"] == pytest.approx(2 * b["params_bytes"], abs=64)  # Adam: two moments + counters
    assert m["memory"]["total_bytes"] >= m["memory"]["compiled"]["temp_bytes"]
    assert m["comms"]["all-gather"]["count"] > 0 and m["comms_total_bytes"] > 0
    trace = Path(cfg.train.out) / "tensorboard" / "plugins" / "profile" / "mesh_8_1_batch_32_fsdp"
    assert saved["profile"] == str(trace)
    assert any(p.name.endswith(".xplane.pb") for p in trace.iterdir())


@pytest.mark.slow
def test_a_lone_run_uses_the_hosts_cached_peak_until_asked_to_recalibrate(micro, monkeypatch) -> None:
    monkeypatch.delenv("SHARDBENCH_PEAK_FILE")  # handed to the other tests' runs by tests/conftest.py
    # A quiet host: a peak measured while the suite's other worker loads the cores is, rightly, not cached.
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))
    out = micro().train.out
    first = run(micro(**{"train.steps": 3}))["measurements"]["mfu"]
    second = run(micro(**{"train.steps": 3, "train.out": out + "-2"}))["measurements"]["mfu"]
    third = run(micro(**{"train.steps": 3, "train.out": out + "-3", "train.recalibrate_peak": True}))[
        "measurements"]["mfu"]
    assert first["peak_origin"] == "measured now" and second["peak_origin"].startswith("host cache ")
    assert second["peak_flops_per_s_per_device"] == first["peak_flops_per_s_per_device"]
    assert second["peak_measured_at"] == first["peak_measured_at"]
    assert third["peak_origin"] == "measured now"


def test_an_mfu_over_the_peak_from_many_steps_drops_the_mfu_and_keeps_the_step_time(
        micro, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host peak measured while other work loaded the cores reads low, and a run on quieter cores then computes
    faster than it. From 7 timed steps the median is a measurement: it stood dropped as "not credible" (and tune
    took the next layout as its winner); the step time now stands and the MFU alone goes, naming the peak. From
    fewer than 5 steps the step time is still dropped (`test_custom_model`)."""
    from shardbench.measure.peak import PEAK_FILE_ENV

    low = tmp_path / "low-peak.json"  # a millionth of any CPU's: every step beats it
    low.write_text(json.dumps({"float32": {"dtype": "float32", "flops_per_s": 1e3, "measured_at": "then",
                                           "host": "here"}}))
    monkeypatch.setenv(PEAK_FILE_ENV, str(low))
    m = run(micro(**{"train.steps": 10}))["measurements"]
    steps, mfu = m["step_time_s"], m["mfu"]
    assert steps["measured_steps"] >= 5 and steps["median"] > 0 and m["throughput"]["examples_per_s"] > 0
    assert mfu["mfu"] is None and mfu["peak_flops_per_s_per_device"] == pytest.approx(1e3 / 8)
    assert mfu["not_measured"].startswith(f"above the peak: the median of {steps['measured_steps']} step(s), ")
    assert ", measured then), so that peak reads low" in mfu["not_measured"]
    assert "--train.recalibrate-peak measures it again" in mfu["not_measured"]


@pytest.mark.parametrize(("strategy", "mesh", "devices", "name"), [
    ("cp", "seq=4", 4, "mesh_seq4_batch_32"),
    ("cp", "seq=8", 8, "mesh_seq8_batch_32"),
    ("dp+cp", "data=2,seq=4", 8, "mesh_data2_seq4_batch_32"),
    ("cp+tp", "model=2,seq=4", 8, "mesh_model2_seq4_batch_32"),
    ("dp+pp", "data=2,stage=4", 8, "mesh_data2_stage4_batch_32"),
    ("dp+ep", "data=2,expert=4", 8, "mesh_data2_expert4_batch_32"),
    # Meshes of data and model keep the seed's data_model names, as the published records have them.
    ("dp", "2", 2, "mesh_2_1_batch_32"),
    ("fsdp", "8", 8, "mesh_8_1_batch_32_fsdp"),
    ("dp+tp", "4x2", 8, "mesh_4_2_batch_32"),
    ("tp", "1x8", 8, "mesh_1_8_batch_32"),
    ("single", "none", 1, "mesh_none_batch_32"),
])
def test_a_runs_default_name_names_every_axis_its_mesh_splits(strategy: str, mesh: str, devices: int,
                                                               name: str) -> None:
    """The name is the run's record's run_name and its profile trace's folder: context parallelism on seq=4 and
    on seq=8, and dp+cp on data=2,seq=4, were all named as one device or as dp on two ('mesh_1_1', 'mesh_2_1')."""
    from shardbench.measure.collect import default_run_name
    from shardbench.parallel.rules import make_layout
    from shardbench.parsing import override

    cfg = override(get_preset("vit-tiny"), {"train.batch_size": 32})
    assert default_run_name(cfg, make_layout(strategy, mesh, jax.devices()[:devices])) == name


def test_a_runs_default_name_tells_a_bfloat16_first_moment_from_the_plain_run() -> None:
    """--optim.mu-dtype bfloat16 halves Adam's first moment: the run's record and trace were named as the
    float32 run's."""
    from shardbench.measure.collect import default_run_name
    from shardbench.parallel.rules import make_layout
    from shardbench.parsing import override

    cfg = override(get_preset("vit-tiny"), {"train.batch_size": 32})
    layout = make_layout("dp", "2", jax.devices()[:2])
    plain = default_run_name(cfg, layout)
    assert default_run_name(override(cfg, {"optim.mu_dtype": "bfloat16"}), layout) == f"{plain}_mu_bfloat16"
    # SGD keeps no moment: the setting does nothing there (a note says so), and the name does not claim it
    sgd = override(cfg, {"optim.optimizer": "sgd"})
    assert default_run_name(override(sgd, {"optim.mu_dtype": "bfloat16"}), layout) == default_run_name(sgd, layout)


def test_a_runs_default_name_tells_remat_and_the_context_parallel_attention_apart() -> None:
    """--remat block and the ring or contiguous attention of cp were named as the plain run: two such runs with
    one profile root wrote their traces to one folder, the second replacing the first."""
    from shardbench.measure.collect import default_run_name
    from shardbench.parallel.rules import make_layout
    from shardbench.parsing import override

    cfg = override(get_preset("lm-tiny"), {"train.batch_size": 32})
    dp = make_layout("dp", "2", jax.devices()[:2])
    assert default_run_name(override(cfg, {"model.remat": "block"}), dp) == "mesh_2_1_batch_32_remat_block"
    cp = make_layout("cp", "seq=4", jax.devices()[:4])
    names = {default_run_name(override(cfg, {"parallel.context": context, "parallel.context_order": order}), cp)
             for context in ("all-gather", "ring") for order in ("head-tail", "contiguous")}
    assert names == {"mesh_seq4_batch_32", "mesh_seq4_batch_32_ring", "mesh_seq4_batch_32_contiguous",
                     "mesh_seq4_batch_32_ring_contiguous"}
    assert default_run_name(override(cfg, {"parallel.context": "ring"}), dp) == "mesh_2_1_batch_32"  # no cp
    # tp with and without Megatron's sequence parallelism: named alike, one trace replaced the other
    tp = make_layout("tp", "model=4", jax.devices()[:4])
    assert default_run_name(override(cfg, {"parallel.sequence_parallel": True}), tp) == "mesh_1_4_batch_32_seqpar"
    assert default_run_name(cfg, tp) == "mesh_1_4_batch_32"
    # a pipeline's schedule, microbatches and a circular layout's repeats: the runs a pipeline user compares
    pp = make_layout("pp", "stage=2", jax.devices()[:2])
    named = {(schedule, m, r): default_run_name(override(cfg, {"parallel.schedule": schedule,
                                                                "parallel.microbatches": m, "parallel.repeats": r}), pp)
             for schedule, m, r in [("gpipe", 0, 1), ("gpipe", 8, 1), ("1f1b", 8, 1), ("circular", 8, 2)]}
    assert named == {("gpipe", 0, 1): "mesh_stage2_batch_32", ("gpipe", 8, 1): "mesh_stage2_batch_32_mb_8",
                     ("1f1b", 8, 1): "mesh_stage2_batch_32_1f1b_mb_8",
                     ("circular", 8, 2): "mesh_stage2_batch_32_circular_mb_8_repeats_2"}
    assert default_run_name(override(cfg, {"parallel.microbatches": 8}), dp) == "mesh_2_1_batch_32"  # no pp


def test_a_damaged_stored_peak_is_measured_again_not_a_crash_of_every_run(tmp_path: Path, monkeypatch) -> None:
    """A sweep's handed-over peak file and the host cache hold one entry per dtype: one edited or damaged
    (`{"float32": 5}`) ended every remaining run of a sweep with a TypeError (exit 70, recorded as a crash). It is
    measured again, and the cache mended."""
    from shardbench.measure.peak import CACHE_NAME, PEAK_FILE_ENV, host_key, host_peak

    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))  # a quiet host's measurement is cached
    handed = tmp_path / "peak.json"
    handed.write_text(json.dumps({"float32": 5}))
    monkeypatch.setenv(PEAK_FILE_ENV, str(handed))
    (tmp_path / CACHE_NAME).write_text(json.dumps({f"{host_key()} | float32": {"dtype": "float32"}}))
    peak = host_peak("float32", tmp_path)
    assert peak.origin == "measured now" and peak.flops_per_s > 0
    again = host_peak("float32", tmp_path)
    assert again.origin.startswith("host cache ") and again.flops_per_s == peak.flops_per_s


def test_the_last_line_says_what_few_steps_its_step_time_is_the_median_of() -> None:
    """A median over a few intervals reads like any other: under five, the line says how many."""
    base = {"run_name": "r", "steps": 12, "devices": 1, "strategy": "single", "mesh": "none", "time_s": 1.0,
            "out": "o", "measurements": {"step_time_s": {"median": 0.0775, "measured_steps": 2}}}
    assert ", step 77.5 ms (over 2 step(s))" in summary_line(base)
    base["measurements"]["step_time_s"]["measured_steps"] = 5
    assert ", step 77.5 ms;" in summary_line(base) + ";" and "over" not in summary_line(base)


def test_the_last_line_calls_its_train_loss_the_last_steps() -> None:
    """The epoch lines' "train loss" is the epoch's mean; the last line's is the last step's alone, and says so
    (both were "train loss", two figures under one name)."""
    base = {"run_name": "r", "steps": 12, "devices": 1, "strategy": "single", "mesh": "none", "time_s": 1.0,
            "out": "o", "measurements": {}, "train_loss": 1.01834}
    assert "; last step's train loss 1.0183" in summary_line(base)


@pytest.mark.slow
def test_a_peak_measured_on_a_busy_host_says_it_may_read_low(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep's (or tune's) peak measured while other work loads the cores reads low, and every MFU above it
    high: a load average above half the cores is said beside the figure, and the figure is not kept as the host's
    cached one, which lone runs divide by; a quiet host's is, with no note; a peak already measured into the folder
    is kept without a word. (A real measurement, in its own process.)"""
    import os

    from shardbench.measure.peak import CACHE_NAME, PEAK_FILE_ENV, host_key, host_peak
    from shardbench.sweep.sweep_cmd import peak_file

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "getloadavg", lambda: (cores * 2.0, 0.0, 0.0))
    handed = peak_file(tmp_path / "busy", ["float32"], tmp_path / "cache", "sweep")
    said = capsys.readouterr()
    assert handed and "sweep: host matmul peak float32 " in said.out
    load = f"load average {cores * 2.0:.1f} on {cores} core(s)"
    assert said.err.strip() == (f"shardbench: note: the host was at {load} as its matmul peak was measured: other "
                                f"work on the cores reads the peak low and MFU high, so it is not kept as the host's "
                                f"cached figure, and the runs' records and report say so; measure on a quiet host (a "
                                f"lone run: --train.recalibrate-peak)")
    # the figure handed to the runs carries the load, which their records keep (`Mfu.peak_busy`)
    monkeypatch.setenv(PEAK_FILE_ENV, handed[PEAK_FILE_ENV])
    assert host_peak("float32", tmp_path / "cache").busy == load
    assert peak_file(tmp_path / "busy", ["float32"], tmp_path / "cache", "sweep") == handed  # kept: no word
    assert capsys.readouterr() == ("", "")
    # the busy host's figure stands for the sweep's runs alone; a lone run's cache never saw it
    assert not (tmp_path / "cache" / CACHE_NAME).exists()
    monkeypatch.setattr(os, "getloadavg", lambda: (cores / 4, 0.0, 0.0))
    peak_file(tmp_path / "quiet", ["float32"], tmp_path / "cache", "tune")
    said = capsys.readouterr()
    assert "tune: host matmul peak float32 " in said.out and said.err == ""
    quiet = json.loads((tmp_path / "quiet" / "peak.json").read_text())["float32"]
    cached = json.loads((tmp_path / "cache" / CACHE_NAME).read_text())
    assert cached == {f"{host_key()} | float32": quiet}  # a quiet host's is kept for lone runs
    # A lone run measuring its own peak on a busy host neither caches it nor hides the load.
    monkeypatch.delenv(PEAK_FILE_ENV)
    monkeypatch.setattr(os, "getloadavg", lambda: (cores * 2.0, 0.0, 0.0))
    lone = host_peak("bfloat16", tmp_path / "cache")
    assert lone.busy == load and lone.origin == "measured now"
    assert list(json.loads((tmp_path / "cache" / CACHE_NAME).read_text())) == [f"{host_key()} | float32"]
