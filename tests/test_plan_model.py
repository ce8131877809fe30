"""The planner's models and where they compile: the step-time breakdown adds up, the memory breakdown is the
one a run records, the GPU compiler is chosen through the allocator's probe, and `--calibrate`/`--validate`
read records measured on an H100 (the copy shipped in benchmarks/data) on this CPU-only host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shardbench import malloc
from shardbench.measure.memory import memory_report
from shardbench.plan.calibration import DEFAULTS, H100_RECORDS, HELD_OUT, Calibration, held_out
from shardbench.plan.predict import Hardware, memory, predict, step_features
from shardbench.plan.steptime import Coefficients, StepFeatures, step_time
from shardbench.plan.workers import _environ, compiler_platform

H100_DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h100-2026-11-24"

COEFF = Coefficients(efficiency=0.5, memory_efficiency=0.8, kernel_s=2e-6, collective_s=3e-5, fixed_s=1e-3,
                     overlap=0.25, source="test", compute_memory_overlap=0.5, low_precision_traffic=0.6)


def test_the_breakdown_adds_up_to_the_step_time() -> None:
    """Every term of the formula is in the breakdown, each at its hand-computed value: matmuls 4 ms, traffic
    1 ms x 0.6 / 0.8 = 0.75 ms, half the shorter hidden (4.375 ms), 500 kernels x 2 us, 1 ms per step, and
    three quarters of 40 collectives x 30 us and of each link's 2 ms and 1 ms exposed. Dropping any term from
    `parts()` (the per-collective cost, say) breaks the sum. (< 1 s)"""
    f = StepFeatures(compute_s=2e-3, traffic_s=1e-3, kernels=500, collectives=40,
                     link_s={"intra": 2e-3, "inter": 1e-3}, low_precision=True)
    t = step_time(f, COEFF)
    assert t.matmul_s == pytest.approx(4e-3) and t.traffic_s == pytest.approx(0.75e-3)
    assert t.compute_s == pytest.approx(4e-3 + 0.5 * 0.75e-3) and t.bound == "compute"
    assert t.kernels_s == pytest.approx(1e-3) and t.fixed_s == pytest.approx(1e-3)
    assert t.collectives_s == pytest.approx(0.75 * 40 * 3e-5)
    assert t.links_s == pytest.approx({"intra": 1.5e-3, "inter": 0.75e-3})
    parts = t.parts()
    assert set(parts) == {"compute", "kernels", "fixed", "collectives", "link intra", "link inter"}
    assert sum(parts.values()) == pytest.approx(t.total_s, rel=1e-12)
    assert t.total_s == pytest.approx(4.375e-3 + 1e-3 + 1e-3 + 0.75 * (1.2e-3 + 3e-3))
    # The prediction carries the same breakdown.
    hw = Hardware(name="test", platform="gpu", peak_flops=1e12, peak_source="t", memory_bytes=1e9,
                  memory_source="t", bandwidth={"intra": 1e9, "inter": 1e8}, bandwidth_source="t",
                  memory_bandwidth=1e11, memory_bandwidth_source="t")
    p = predict(_result("cpu", collectives=[{"kind": "all-reduce", "link": "intra", "group": 8, "count": 3,
                                             "bytes": 1_000_000}]),
                hw, COEFF, batch=8, remat="none", dtype="bfloat16", activation_scale=0.5, activation_source="t")
    assert sum(p.breakdown_s.values()) == pytest.approx(p.step_s, rel=1e-12)
    assert p.breakdown_s["collectives"] == pytest.approx(0.75 * 3 * 3e-5)


def _result(platform: str, *, collectives: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"devices": 8, "platform": platform, "device_kind": "NVIDIA H100 80GB HBM3" if platform == "gpu" else "cpu",
            "state": {"params_bytes": 1000, "optimizer_bytes": 2000, "gradients_bytes": 1000, "model_state_bytes": 24},
            "compiled": {"argument_bytes": 3100, "output_bytes": 3000, "alias_bytes": 3000, "temp_bytes": 9000,
                         "generated_code_bytes": 0},
            "flops": {"analytic_per_step": 8e9, "xla_per_device": None}, "bytes_accessed": 1e8, "kernels": 100,
            "collectives": collectives or [], "unknown_trip_counts": 0}


def test_full_remat_predicts_a_third_more_matmuls_and_block_none() -> None:
    """The same compiled candidate, 8e9 analytic FLOPs per step on 8 devices, 1e9 per device: at a 1e12 FLOP/s
    peak that is 1 ms of matmuls with remat none; full recomputes each block's forward (forward + backward is 3
    forward passes, 4 with it: x 4/3), 4/3 ms; block recomputes element-wise work alone, which the matmul count
    leaves out: 1 ms. With no memory traffic the prediction's compute is that at the 50% efficiency: 2 ms,
    8/3 ms, 2 ms. Nothing is compiled. (< 1 s)"""
    hw = Hardware(name="test", platform="gpu", peak_flops=1e12, peak_source="t", memory_bytes=1e9,
                  memory_source="t", bandwidth={"intra": 1e9, "inter": 1e8}, bandwidth_source="t",
                  memory_bandwidth=1e11, memory_bandwidth_source="t")
    result = {**_result("gpu"), "bytes_accessed": 0}
    compute = {r: step_features(result, hw, r, "float32").compute_s for r in ("none", "block", "full")}
    assert compute == pytest.approx({"none": 1e-3, "block": 1e-3, "full": 4e-3 / 3}, rel=1e-12)
    predicted = {r: predict(result, hw, COEFF, batch=8, remat=r, dtype="float32", activation_scale=1.0,
                            activation_source="t").compute_s for r in ("none", "block", "full")}
    assert predicted == pytest.approx({"none": 2e-3, "block": 2e-3, "full": 8e-3 / 3}, rel=1e-12)
    # Counted by XLA instead (a model of your own with no formula): 1e9 FLOPs per device in the compiled program,
    # whose recomputation is already among them: 1 ms whatever the policy, not 4/3 ms again for full.
    counted = {**result, "flops": {"analytic_per_step": None, "xla_per_device": 1e9}}
    assert {r: step_features(counted, hw, r, "float32").compute_s for r in ("none", "full")} == pytest.approx(
        {"none": 1e-3, "full": 1e-3}, rel=1e-12)


class _Analysis:
    argument_size_in_bytes, output_size_in_bytes, alias_size_in_bytes = 3100, 3000, 3000
    temp_size_in_bytes, generated_code_size_in_bytes = 9000, 0


class _Compiled:
    def memory_analysis(self) -> _Analysis:
        return _Analysis()


def test_a_plan_and_a_run_record_break_memory_down_alike() -> None:
    """One breakdown (`shardbench.measure.memory.breakdown`) for both: with the target's own compiler (scale 1,
    no runtime bytes) the plan's parts are the run record's and add up to the compiled total. (< 1 s)"""
    import numpy as np

    params = np.zeros(250, np.float32)
    record = memory_report(_Compiled(), params, np.zeros(500, np.float32), [], gradients=params,
                           model_state=np.zeros(6, np.float32))
    plan = memory(_result("gpu"), 1.0)
    b = record.breakdown
    assert (plan.params_bytes, plan.optimizer_bytes, plan.model_state_bytes, plan.gradients_bytes) == (
        b.params_bytes, b.optimizer_bytes, b.model_state_bytes, b.gradients_bytes) == (1000, 2000, 24, 1000)
    # By hand: the activations are the 9,000 temporary bytes less the 1,000 of gradients XLA holds among them; the
    # rest of the 12,100 compiled bytes (arguments 3,100 + outputs 3,000 - aliased 3,000 + temporaries 9,000),
    # beyond the state, the gradients and the activations, is other: 12,100 - 1,000 - 2,000 - 24 - 1,000 - 8,000.
    assert (plan.activations_bytes, plan.other_bytes) == (b.activations_temporaries_bytes, b.other_bytes) == (8000, 76)
    assert plan.total_bytes == record.total_bytes == 3100 + 3000 - 3000 + 9000
    scaled = memory(_result("cpu"), 0.5, runtime_bytes=77)
    assert scaled.total_bytes == plan.total_bytes - 0.5 * plan.activations_bytes + 77


@pytest.mark.parametrize(("environ", "plugin", "devices", "expected"), [
    ({}, True, True, "gpu"),  # a CUDA plugin and /dev/nvidia*: JAX would run on the GPUs, so they compile
    ({}, True, False, "cpu"),  # the plugin but no GPU
    ({}, False, True, "cpu"),  # a GPU but no plugin
    ({"JAX_PLATFORMS": "cpu"}, True, True, "cpu"),  # told to use the CPU
    ({"JAX_PLATFORMS": "cuda"}, False, False, "gpu"),  # told to use CUDA
])
def test_the_gpu_compiler_is_chosen_through_the_allocators_probe(
        monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], plugin: bool, devices: bool, expected: str) -> None:
    """The worker for a GPU job compiles with the GPU compiler exactly where `malloc.target_platform` (the
    probe that picks the allocator) says JAX runs on a GPU; else it is pinned to the CPU. (< 1 s)"""
    monkeypatch.setattr(malloc.importlib.util, "find_spec",
                        lambda name: object() if plugin and name == "jax_cuda13_plugin" else None)
    monkeypatch.setattr(malloc.glob, "glob", lambda pattern: ["/dev/nvidiactl"] if devices and "nvidia" in pattern
                        else [])
    for name in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    job = {"name": "r", "config": {"parallel.devices": 1}, "link_span": 1, "gpu_kind": "h100"}
    assert malloc.target_platform(os.environ) == expected
    assert compiler_platform(job, os.environ) == expected
    env = _environ(job)
    assert (env.get("JAX_PLATFORMS") == "cpu") == (expected == "cpu")
    assert compiler_platform({**job, "gpu_kind": None}, os.environ) == "cpu"  # a CPU target never


def test_every_prediction_names_its_compiler() -> None:
    """A step the GPU compiler compiled is predicted with its own temporaries; one the CPU compiler compiled
    for a GPU target borrows the calibrated ratio for its dtype and says so. (< 1 s)"""
    hw = Hardware(name="1 h100", platform="gpu", peak_flops=989e12, peak_source="t", memory_bytes=60e9,
                  memory_source="t", bandwidth={"intra": 450e9, "inter": 50e9}, bandwidth_source="t",
                  memory_bandwidth=3.35e12, memory_bandwidth_source="t")
    cal = Calibration()
    for platform, compiler, own in [("gpu", "gpu compiler (NVIDIA H100 80GB HBM3)", True),
                                    ("cpu", "cpu compiler", False)]:
        scale, source = cal.activation_scale(platform, "gpu", "bfloat16")
        p = predict(_result(platform), hw, DEFAULTS["gpu"], batch=8, remat="none", dtype="bfloat16",
                    activation_scale=scale, activation_source=source, runtime_bytes=cal.runtime(platform, "gpu"))
        assert p.compiler == p.sources["compiler"] == compiler
        assert compiler in p.sources["state"]
        assert (scale == 1.0 and p.runtime_bytes == 0) == own
        assert ("the GPU compiler's own temporaries" in source) == own
        assert own or ("x 0.407" in source and "2026-11-24" in source and "H100 80GB HBM3" in source)
    assert "2026-11-24" in DEFAULTS["gpu"].source and "jax 0.11.2" in H100_RECORDS


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    environ.pop("XLA_FLAGS", None)
    script = "import sys; from shardbench.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=environ,
                          timeout=600)


@pytest.mark.slow
def test_calibrate_and_validate_read_h100_records_on_a_cpu_host(tmp_path: Path) -> None:
    """lm-seed's two H100 runs (the shipped copy of the 2026-11-24 records: jax 0.11.2, another machine and
    platform) are recompiled here by the CPU compiler, calibrated on and predicted as GPU runs on the H100's
    data sheet: the activation ratio per dtype is fitted from the GPU compiler's temporaries in the records,
    and the validation names the compiler and the hardware. Two runs are too few to refit the step time, so
    it keeps the shipped GPU default. In sample on purpose: this is about reading the records, not accuracy
    (benchmarks/plan-h100.md has the held-out errors). (about 20-30 s: two lm-seed compiles on 2 cores)"""
    runs = tmp_path / "lm-seed"
    for name in ["batch_32_dtype_float32", "batch_32_dtype_bfloat16"]:
        shutil.copytree(H100_DATA / "runs" / name, runs / name)
    done = _cli("plan", "--validate", str(runs), "--calibrate", str(runs), "--workers", "2",
                env={"SHARDBENCH_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    saved = json.loads((runs / "plan-validation.json").read_text())
    assert saved["summary"]["runs"] == 2 and saved["compilers"] == ["cpu compiler"] and saved["in_sample"]
    assert saved["coefficients"]["gpu"]["source"] == DEFAULTS["gpu"].source  # too few runs to refit
    # The runtime's bytes beyond the program: the median of what each record's peak held beyond its compiled total.
    extra = []
    for name in ("batch_32_dtype_float32", "batch_32_dtype_bfloat16"):
        mem = json.loads((runs / name / "summary.json").read_text())["measurements"]["memory"]
        c = mem["compiled"]
        extra.append(mem["peak_bytes_in_use"] - (c["argument_bytes"] + c["output_bytes"] - c["alias_bytes"]
                                                 + c["temp_bytes"]))
    assert saved["runtime_bytes"]["gpu"] == pytest.approx(sum(extra) / 2)
    ratios = saved["activation_ratios"]["gpu"]
    assert 0.0 < ratios["bfloat16"] < ratios["float32"] < 1.0  # the CPU's bfloat16 temporaries overstate more
    for name, p in saved["runs"].items():
        assert p["compiler"] == "cpu compiler" and "h100" in p["sources"]["compute"].lower()
        assert "fitted to 2 gpu run(s)" in p["sources"]["activations"]
    assert "compiled with: cpu compiler" in done.stdout and "(runtime peak)" in done.stdout
    # One run per dtype: its fitted ratio reproduces its own peak, so 0 here is by construction (in sample).
    assert saved["summary"]["memory_mape"] == pytest.approx(0.0, abs=1e-9)


MIB = 2**20


def test_the_activation_ratio_is_the_weighted_median_of_the_runs_own_ratios() -> None:
    """`fit_activations` by its definition: each run's own ratio is (measured peak - other bytes) / CPU
    activations, and the predicted peak other + r x CPU activations is off by (CPU / measured) x |r - own| of the
    peak, so the r of least mean relative error is the median of the own ratios weighted by CPU / measured.
    float32, three runs (listed out of order): own ratios 0.5 (weight 200/100 = 2), 0.6 and 0.9 (weights
    100/200 = 0.5): half the total weight is 1.5, reached by 0.5 alone, so 0.5, not the max (0.9), the mean
    (0.667) or the unweighted median (0.6). With three runs the weighted median is the smallest, largest or middle
    one, so bfloat16 has five: own ratios 0.2, 0.3, 0.4, 0.9 (weight 0.5 each) and 0.6 (weight 300/200 = 1.5),
    half of 3.5 is 1.75, reached at 0.6 (0.5 + 0.5 + 0.5 + 1.5): not the min, max, mean 0.48 or median 0.4."""
    from shardbench.plan.calibration import fit_activations

    float32 = [("float32", 110.0, 100.0, 200.0), ("float32", 0.0, 200.0, 100.0), ("float32", 140.0, 100.0, 200.0)]
    bfloat16 = [("bfloat16", 200.0 - 100 * r, 100.0, 200.0) for r in (0.9, 0.2, 0.4, 0.3)]
    bfloat16.append(("bfloat16", 20.0, 300.0, 200.0))  # (200 - 20) / 300 = 0.6
    found = fit_activations(float32 + bfloat16)
    assert found == {"float32": pytest.approx(0.5), "bfloat16": pytest.approx(0.6)}


@dataclass(frozen=True)
class _Measured:
    """What `calibrate` reads of a recompiled GPU run (`plan.measured.Measured`), without compiling one."""

    runtime: float  # bytes the runtime held beyond the compiled program
    peak: float
    activations: float = 100 * MIB  # the CPU compiler's
    dtype: str = "float32"
    result: dict[str, Any] = field(default_factory=lambda: {"compiled": True, "platform": "cpu"})
    hardware: Any = field(default_factory=lambda: SimpleNamespace(platform="gpu"))
    step_s: float | None = None  # no step time: only the memory model is fitted

    @property
    def memory_bytes(self) -> float:
        return self.peak

    def memory_parts(self) -> tuple[float, float]:
        return 0.0, self.activations

    def runtime_extra(self) -> float:
        return self.runtime


def test_the_runtime_bytes_are_the_median_of_the_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three GPU runs whose runtime held 10, 20 and 90 MiB beyond their compiled programs: the runtime bytes are
    the median, 20 MiB (the mean would be 40). Each peak is its runtime bytes + 50 MiB and no other bytes, so
    with 20 MiB held every run's own activation ratio is (peak - 20 MiB) / 100 MiB: 0.4, 0.5, 1.2, weights
    100/60, 100/70, 100/140; half the total weight (1.90) is passed at 0.5 (1.67 + 1.43). (< 1 s: nothing
    is compiled)"""
    from shardbench.plan import measured

    runs = [_Measured(runtime=r * MIB, peak=(r + 50) * MIB) for r in (90, 10, 20)]
    monkeypatch.setattr(measured, "measured_runs", lambda *args, **kw: runs)
    found = measured.calibrate([tmp_path], workers=1, progress=None)
    assert found.runtime_bytes["gpu"] == 20 * MIB
    assert found.activation_ratios["gpu"]["float32"] == pytest.approx(0.5)
    assert found.activation_sources["gpu"] == f"fitted to 3 gpu run(s) in {tmp_path}"


@dataclass(frozen=True)
class _Timed(_Measured):
    """A recompiled CPU run with a step time: what the step-time fit reads."""

    result: dict[str, Any] = field(default_factory=lambda: {"compiled": True, "platform": "cpu"})
    hardware: Any = field(default_factory=lambda: SimpleNamespace(platform="cpu"))

    def features(self) -> Any:
        from shardbench.plan.steptime import StepFeatures

        return StepFeatures(compute_s=self.step_s or 0.0, traffic_s=0.0, kernels=0.0, collectives=0.0, link_s={})


def test_calibrate_says_when_it_has_too_few_runs_to_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three measured CPU runs are fewer than a fit takes: the defaults are kept, as before, and now said (the
    plan printed "recompiling 3 measured run(s)" and then the default coefficients, as if fitted). Four are fitted,
    with no note. (< 1 s: nothing is compiled)"""
    import io

    from shardbench.plan import measured
    from shardbench.plan.calibration import DEFAULTS

    for count, fitted in ((3, False), (4, True), (0, False)):
        runs = [_Timed(runtime=0.0, peak=0.0, step_s=0.01 * (i + 1)) for i in range(count)]
        monkeypatch.setattr(measured, "measured_runs", lambda *args, **kw: runs)
        said = io.StringIO()
        found = measured.calibrate([tmp_path], workers=1, progress=said)
        notes = [line for line in said.getvalue().splitlines() if "note:" in line]
        if fitted:
            assert found.coefficients["cpu"] != DEFAULTS["cpu"] and not notes, notes
        elif count:
            assert found.coefficients["cpu"] == DEFAULTS["cpu"]
            assert notes == [f"shardbench: note: --calibrate {tmp_path}: 3 cpu run(s) with a step time, fewer than "
                             f"the 4 a fit takes: the cpu default coefficients are used"]
        else:
            assert notes == [f"shardbench: note: --calibrate {tmp_path}: no run there has a step time to fit to "
                             f"(failed, refused or unmeasured runs only): the default coefficients are used"]


def test_the_held_out_runs_are_the_stated_rules_draw() -> None:
    """runs/held-out.txt names what its own rule draws (a third of each model's runs, at random with the
    records' date as the seed), so the split cannot have been picked by hand after scoring it. (< 1 s)"""
    import random

    names: dict[str, list[str]] = {}
    for config in sorted((H100_DATA / "runs").glob("*/config.json")):
        names.setdefault(json.loads(config.read_text())["preset"], []).append(config.parent.name)
    rng = random.Random(20261124)
    drawn: list[str] = []
    for model in sorted(names):
        drawn += rng.sample(sorted(names[model]), max(1, round(len(names[model]) / 3)))
    assert held_out(H100_DATA / "runs") == frozenset(drawn) and len(drawn) == 3


def test_the_shipped_gpu_defaults_are_the_saved_calibration() -> None:
    """The GPU defaults are the coefficients `plan --calibrate` printed into plan-calibrate.json (its raw output,
    beside the records), rounded as written in calibration.py, and that fit left the held-out runs out. (< 1 s)"""
    saved = json.loads((H100_DATA / "plan-calibrate.json").read_text())
    fitted, shipped = saved["coefficients"]["gpu"], DEFAULTS["gpu"]
    for name in ("efficiency", "memory_efficiency", "fixed_s", "kernel_s", "low_precision_traffic",
                 "compute_memory_overlap"):
        assert getattr(shipped, name) == pytest.approx(fitted[name], rel=1e-3, abs=1e-9), name
    ratios = Calibration().activation_ratios["gpu"]
    assert ratios["float32"] == pytest.approx(saved["activation_ratios"]["gpu"]["float32"], rel=1e-3)
    assert ratios["bfloat16"] == pytest.approx(saved["activation_ratios"]["gpu"]["bfloat16"], rel=1e-3)
    assert Calibration().runtime_bytes["gpu"] == saved["runtime_bytes"]["gpu"]
    assert saved["held_out"] == sorted(held_out(H100_DATA / "runs"))
    assert "fitted to 6 gpu run(s)" in fitted["source"]


def test_a_held_out_name_that_matches_no_run_is_refused(tmp_path: Path) -> None:
    """A typo in held-out.txt would silently fit to every run: it stops with one line instead. (< 1 s)"""
    from shardbench.errors import ConfigError
    from shardbench.plan.measured import measured_runs

    shutil.copytree(H100_DATA / "runs" / "batch_32_dtype_float32", tmp_path / "batch_32_dtype_float32")
    (tmp_path / HELD_OUT).write_text("# a comment\nbatch_32_dtype_flaot32\n")
    with pytest.raises(ConfigError, match="batch_32_dtype_flaot32: no such run"):
        measured_runs(tmp_path, 1, None, held_out(tmp_path))


def test_validation_gives_the_worst_error_beside_the_mean_and_the_held_out_apart() -> None:
    """The printed summary names the worst run's signed error beside the mean, over all runs and over the
    held-out ones alone (a mean of 3 runs hid a -23% miss). (< 1 s)"""
    from shardbench.plan.validate import Check, render, summary

    checks = [Check("a", 0.010, 0.0099, 100.0, 100.0, "runtime peak", held_out=True),
              Check("b", 0.002, 0.0016, 100.0, 110.0, "runtime peak", held_out=True),
              Check("c", 0.010, 0.005, 100.0, 100.0, "runtime peak")]
    held = summary([c for c in checks if c.held_out])
    assert held["step_mape"] == pytest.approx((0.01 + 0.2) / 2) and held["step_worst"] == pytest.approx(-0.2)
    assert held["step_worst_run"] == "b" and held["memory_worst"] == pytest.approx(0.1)
    text = render(Path("d"), checks, {}, in_sample=True, split=True)
    assert "held out (named in d/held-out.txt; no fit saw them): memory: mean absolute error 5.0%, worst +10.0% (b); " \
           "step time: mean absolute error 10.5%, worst -20.0% (b)" in text
    assert "b (held out)" in text and "worst -50.0% (c)" in text


def _gpu_run(devices: int, kind: str = "NVIDIA H100 80GB HBM3") -> Any:
    """A measured run as `plan.measured` reads where it ran: its platform, device count and kind."""
    from types import SimpleNamespace

    return SimpleNamespace(m=SimpleNamespace(platform="gpu", devices=devices, device_kind=kind, mfu=None))


def test_a_measured_run_on_more_gpus_than_a_node_holds_spans_nodes(tmp_path: Path) -> None:
    """An H100 node holds 8: a run measured on 16 H100s ran on 2 nodes of 8 (a collective among devices 0-15
    crosses nodes, one among 0-7 does not), a run on 4 on one node; as the planner's 2x8xh100 and 4xh100 are."""
    from shardbench.measure.links import INTER, INTRA, link_of
    from shardbench.plan.measured import link_span, ran_on, where_it_ran
    from shardbench.plan.target import parse_target
    from shardbench.presets import get_preset

    sixteen, four = ran_on(_gpu_run(16)), ran_on(_gpu_run(4))
    planned = parse_target("2x8xh100")
    assert (sixteen.devices, sixteen.per_node, sixteen.nodes) == (planned.devices, planned.per_node, 2)
    assert (four.devices, four.nodes) == (4, 1)
    span = link_span(_gpu_run(16))
    assert span == 8 and link_of(((tuple(range(16)),)), 16, span) == INTER
    assert link_of(((tuple(range(8)),)), 16, span) == INTRA
    hw = where_it_ran(_gpu_run(16), get_preset("mlp-small"), tmp_path)
    assert hw.name == "16 h100 on 2 node(s) x 8"


def test_one_node_of_a_chip_with_no_bandwidth_between_nodes_gets_only_its_nvlink(tmp_path: Path) -> None:
    """8xv100: the V100 SXM2 sheet's NVLink, 300 GB/s both ways, is 150 GB/s per direction inside the node; the
    sheet gives none between nodes, so none is claimed (and one node's traffic crosses none). An H100 node keeps
    both of its figures: NVLink 900 GB/s both ways (450 each), 400 Gb/s (50 GB/s) per GPU between nodes. A
    measured run on 16 V100s would span 2 nodes: not predicted, with why."""
    from shardbench.plan.machine import hardware
    from shardbench.plan.measured import ran_on
    from shardbench.plan.target import parse_target

    v100 = hardware(parse_target("8xv100"), "bfloat16", "default", tmp_path)
    assert v100.bandwidth["intra"] == 300e9 / 2 and v100.bandwidth_source == (
        "data sheet: 150 GB/s per direction inside a node")
    h100 = hardware(parse_target("2x8xh100"), "bfloat16", "default", tmp_path)
    assert (h100.bandwidth["intra"], h100.bandwidth["inter"]) == (900e9 / 2, 400e9 / 8)
    assert h100.bandwidth_source == "data sheet: 450 GB/s per direction inside a node, 50 GB/s across nodes"
    assert ran_on(_gpu_run(16, "Tesla V100-SXM2-32GB")) == ("runs on 16 v100 span 2 nodes, and the v100's data sheet "
                                                            "gives no bandwidth between nodes: not predicted")
    assert ran_on(_gpu_run(8, "Tesla V100-SXM2-32GB")).nodes == 1


def test_each_link_is_called_what_the_chips_data_sheet_calls_it(tmp_path: Path) -> None:
    """An L4 has no NVLink: its GPUs reach each other over PCIe Gen4 x16, 32 GB/s per direction, so the plan's
    recommendation (and its table's column) name PCIe there; an H100 node's link is NVLink, a TPU slice's ICI."""
    from shardbench.plan.candidates import Candidate
    from shardbench.plan.machine import hardware
    from shardbench.plan.predict import predict
    from shardbench.plan.recommend import Row, rank, recommendation
    from shardbench.plan.target import parse_target

    l4 = hardware(parse_target("8xl4"), "bfloat16", "default", tmp_path)
    assert l4.bandwidth["intra"] == 32e9 and l4.link_name("intra") == "PCIe"
    # no bandwidth across nodes on its sheet: infinite (not timed) in the plan, null in plan.json, strict JSON
    from shardbench.jsonfile import finite

    assert l4.bandwidth["inter"] == float("inf") and finite(l4.__dict__)["bandwidth"]["inter"] is None
    json.dumps(finite(l4.__dict__), allow_nan=False)
    assert hardware(parse_target("8xh100"), "bfloat16", "default", tmp_path).link_name("intra") == "NVLink"
    assert hardware(parse_target("tpu-v5e:2x2"), "bfloat16", "default", tmp_path).link_name("intra") == "ICI"
    # Two layouts on the L4 node, one moving five times the other's bytes over the link: the recommendation says
    # over which link the slower spends its step.
    rows = [Row(Candidate(strategy, "8x1", "none", "bfloat16"),
                predict(_result("cpu", collectives=[{"kind": "all-reduce", "link": "intra", "group": 8, "count": 1,
                                                     "bytes": moved}]),
                        l4, COEFF, batch=8, remat="none", dtype="bfloat16", activation_scale=1.0,
                        activation_source="t"))
            for strategy, moved in (("dp", 10**8), ("fsdp", 5 * 10**8))]
    line = recommendation(rank(rows), l4)
    assert "communicating over PCIe" in line and "NVLink" not in line, line


def test_a_tpu_v3_target_is_planned_per_jax_device(tmp_path: Path) -> None:
    """The plan's hardware is per JAX device: a TPU v3 device is one of its chip's two TensorCores, with half the
    data sheet's 123 TF bf16, 32 GiB and 900 GB/s (61.5 TF, 16 GiB, 450 GB/s), and the name counts both devices
    and chips; a v5e device is its whole chip (197 TF, 16 GB), as before."""
    from shardbench.plan.machine import hardware
    from shardbench.plan.target import parse_target

    v3 = hardware(parse_target("tpu-v3:4x4"), "bfloat16", "default", tmp_path)
    assert v3.peak_flops == 123e12 / 2 and v3.memory_bytes == 16 * 2**30 and v3.memory_bandwidth == 900e9 / 2
    assert v3.name == "32 devices (16 tpu-v3 chips) on a 4x4 slice (ICI throughout)"
    assert "123 TFLOP/s a chip, 61.5 TFLOP/s per device (2 devices a chip" in v3.peak_source
    assert "32 GiB a chip, 16 GiB per device" in v3.memory_source
    assert "0.45 TB/s per device" in v3.memory_bandwidth_source
    f32 = hardware(parse_target("tpu-v2:2x2"), "float32", "highest", tmp_path)  # six bf16 passes, half a chip
    assert f32.peak_flops == pytest.approx(45e12 / 6 / 2) and f32.memory_bytes == 8 * 2**30
    v5e = hardware(parse_target("tpu-v5e:4x4"), "bfloat16", "default", tmp_path)
    assert (v5e.peak_flops, v5e.memory_bytes, v5e.memory_bandwidth) == (197e12, 16e9, 819e9)
    assert v5e.name == "16 tpu-v5e on a 4x4 slice (ICI throughout)"
    assert v5e.peak_source == "data sheet: tpu-v5e bf16 197 TFLOP/s (Cloud TPU v5e system architecture)"
