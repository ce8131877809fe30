"""A profiled run's trace read for where its train steps spent their time (`measure.kernels.trace_time`) and the
report's Profiles section: the collectives' kinds against those the compiled program holds (counted from its HLO,
another route), their time against a plain count of the trace's events, a one-device run with none, the
evaluation step's ops left out, and a copied or damaged folder."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
from jax.profiler import ProfileData

from shardbench.errors import ShardbenchError
from shardbench.measure.kernels import _leaves, collective_of, find_trace, trace_time
from shardbench.report.write import write_report
from shardbench.train.loop import run

pytestmark = pytest.mark.slow  # two profiled runs and three reports


@pytest.mark.parametrize(("name", "kind"), [
    ("all-reduce.73", "all-reduce"), ("all-reduce", "all-reduce"), ("all-gather-start.2", "all-gather"),
    ("all-gather-done", "all-gather"), ("reduce-scatter.1", "reduce-scatter"), ("all-to-all.4", "all-to-all"),
    ("collective-permute-start.3", "collective-permute"), ("send.1", "send/recv"), ("recv-done.2", "send/recv"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all-reduce"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "all-gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce-scatter"), ("ncclDevKernel_SendRecv", "send/recv"),
    ("ragged-all-to-all.2", "ragged-all-to-all"), ("collective-broadcast.1", "collective-broadcast"),
    ("ppermute.28", "collective-permute"), ("psum_scatter.2", "reduce-scatter"), ("psum.1", "all-reduce"),
    ("fusion.12", None), ("all-reduce-scatter-fusion", None), ("sender_fusion", None), ("copy_bitcast_fusion", None),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", None),
])
def test_collectives_are_known_by_their_names(name: str, kind: str | None) -> None:
    assert collective_of(name) == kind


def _event(name: str, start: int, ns: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, start_ns=start, duration_ns=ns)


@pytest.mark.parametrize(("events", "kept"), [
    ([("while", 0, 100), ("x", 0, 30), ("y", 40, 20), ("z", 70, 30)], ["x", "y", "z"]),  # a loop's span, not again
    ([("while", 0, 100), ("call", 10, 50), ("x", 10, 20), ("y", 35, 25), ("after", 120, 5)], ["x", "y", "after"]),
    ([("op", 5, 10), ("marker", 5, 0)], ["op"]),  # an event of no length holds nothing, and adds nothing
    ([("a", 0, 10), ("b", 9, 10)], ["a", "b"]),  # overlapping by 1 ns is not holding
    ([("a", 0, 10), ("b", 10, 10)], ["a", "b"]),  # back to back
    ([], []),
])
def test_each_threads_ops_count_once_the_innermost(events: list[tuple[str, int, int]], kept: list[str]) -> None:
    assert [e.name for e in _leaves([_event(*e) for e in reversed(events)])] == kept
    assert len(_leaves([_event("outer", 0, 10), _event("same", 0, 10)])) == 1  # one span twice: counted once


def test_collectives_of_two_kinds_overlap_only_when_they_run_at_once() -> None:
    from shardbench.measure.kernels import _Event, _kinds_overlap

    def op(name: str, start: int, ns: int) -> _Event:
        return _Event(name, ns, start, "0", None, None)

    after = [op("all-reduce.1", 0, 10), op("all-gather.2", 10, 5), op("fusion.3", 2, 20)]
    assert not _kinds_overlap(after)  # one after the other; a fusion beside them is no collective
    assert _kinds_overlap([op("all-reduce.1", 0, 10), op("all-gather.2", 9, 5)])
    assert not _kinds_overlap([op("all-reduce.1", 0, 10), op("all-reduce.2", 5, 10)])  # one kind


def test_a_trace_without_ops_and_a_reading_that_cannot_tell_the_train_step_say_so(tmp_path: Path) -> None:
    """A trace of nothing is no measurement (it read as 0 ms a step); a reading that counts every program says
    that an evaluation's ops may be among them."""
    import jax

    from shardbench.measure.kernels import TraceTime
    from shardbench.report.traces import trace_findings
    from shardbench.report.content import ReportedRun

    jax.profiler.start_trace(str(tmp_path / "empty"))
    jax.profiler.stop_trace()
    with pytest.raises(ShardbenchError, match="the trace holds no ops"):
        trace_time(find_trace(tmp_path / "empty"), window_steps=3)
    run = ReportedRun("r", "complete", None, None, {}, {}, None,
                      traced=TraceTime(3, 1, 5.0, 4.0, 0.0, {}, (), counted_steps=False, train_only=False))
    assert ("r: 3 train steps (the profile window's length: the trace does not count them) (the trace does not "
            "tell the train step's program from the others, so every op in it counts, an evaluation's too) traced "
            "on 1 device") in trace_findings([run])[0]


def test_a_copied_folder_of_sweeps_finds_each_runs_trace_under_its_sweep(tmp_path: Path) -> None:
    """A folder holding sweeps: a run's folder is <sweep>/runs/<name>, and the sweep put its trace under
    <sweep>/tensorboard/plugins/profile/<name>; the copy's own is read, not the path its record names."""
    from shardbench.measure.run_record import RunRecord
    from shardbench.report.content import ReportedRun
    from shardbench.report.traces import PROFILES, _trace_folder

    sweep = tmp_path / "copy" / "sweep-a"
    trace = sweep / PROFILES / "run-x"
    trace.mkdir(parents=True)
    (trace / "vm.xplane.pb").write_bytes(b"")
    (tmp_path / "original" / PROFILES / "run-x").mkdir(parents=True)  # the original's, still there
    (tmp_path / "original" / PROFILES / "run-x" / "vm.xplane.pb").write_bytes(b"")
    record = RunRecord(profile=str(tmp_path / "original" / PROFILES / "run-x"))
    run = ReportedRun("x", "complete", None, None, {}, {}, record, folder=sweep / "runs" / "run-x")
    assert _trace_folder(run, tmp_path / "copy") == trace
    assert _trace_folder(run, tmp_path / "elsewhere") == tmp_path / "original" / PROFILES / "run-x"


Op = tuple[str, int, int, int, int]  # name, device, execution, start ns, ns


def _ops(trace: Path) -> dict[tuple[str, int], list[Op]]:
    """Written apart from the reader: every XLA op of the trace, by program (its name and id)."""
    out: dict[tuple[str, int], list[Op]] = {}
    for plane in ProfileData.from_file(str(trace)).planes:
        for line in plane.lines if plane.name == "/host:CPU" else ():
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    out.setdefault((stats["hlo_module"], stats["program_id"]), []).append(
                        (event.name, stats["device_ordinal"], stats["run_id"], int(event.start_ns),
                         int(event.duration_ns)))
    return out


def _per_step(ops: list[Op], keep: str | tuple[str, ...] = "", span: bool = False) -> float:
    """The ms during which some op whose name starts with `keep` ran in a step on a device (intervals merged over
    the threads, a loop's span holding its body's ops), or the step's span from its first op to its last: the
    median over a device's steps, then the devices' mean; from the plain list."""
    steps: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for name, device, execution, start, ns in ops:
        steps.setdefault((device, execution), [])
        if name.startswith(keep):
            steps[device, execution].append((start, start + ns))
    by_device: dict[int, list[int]] = {}
    for (device, _), spans in steps.items():
        total, covered_to = 0, None
        for start, end in sorted(spans):
            if covered_to is None or start > covered_to:
                total, covered_to = total + end - start, end
            elif end > covered_to:
                total, covered_to = total + end - covered_to, end
        if span:
            total = max(end for _, end in spans) - min(start for start, _ in spans)
        by_device.setdefault(device, []).append(total)
    return sum(statistics.median(v) for v in by_device.values()) / len(by_device) / 1e6


def test_a_trace_gives_each_devices_time_in_collectives_and_the_report_says_it(micro, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    window = {"train.profile": True, "train.profile_skip": 2, "train.profile_steps": 3, "train.log_every": 100}
    # 128 examples, 10% held for validation: 3 steps an epoch, so an evaluation falls inside the window (steps 3-5)
    sharded = micro(**window, **{"train.steps": 6, "parallel.strategy": "fsdp", "parallel.devices": 2,
                                 "parallel.mesh": "2", "train.eval": True, "data.synthetic_train": 128,
                                 "train.batch_size": 32, "train.out": str(runs / "fsdp")})
    one = micro(**window, **{"train.steps": 6, "parallel.strategy": "single", "parallel.devices": 1,
                             "parallel.mesh": "none", "train.out": str(runs / "single")})
    summary = run(sharded)
    alone_name = run(one)["run_name"]

    trace = find_trace(runs / "fsdp")
    t = trace_time(trace, window_steps=99)  # the trace counts its steps: the window's length is not used
    programs = _ops(trace)
    assert {name for name, _ in programs} == {"jit_train_step", "jit_eval_step"}  # the evaluation ran, uncounted
    (train,) = [ops for (name, _), ops in programs.items() if name == "jit_train_step"]
    assert (t.steps, t.counted_steps, t.devices) == (len({o[2] for o in train}), True, len({o[1] for o in train}))
    assert (t.steps, t.devices) == (3, 2)
    # the kinds the trace timed are those the compiled step holds, as the record counted them from its HLO
    assert set(t.collective_ms) == set(summary["measurements"]["comms"]) == {"all-reduce", "all-gather"}
    for kind in t.collective_ms:
        assert t.collective_ms[kind] == pytest.approx(_per_step(train, kind), rel=1e-12)
    assert t.busy_ms == pytest.approx(_per_step(train), rel=1e-12)
    assert t.span_ms == pytest.approx(_per_step(train, span=True), rel=1e-12)
    assert t.collectives_ms == pytest.approx(_per_step(train, ("all-reduce", "all-gather")), rel=1e-12)
    assert 0 < t.collectives_ms < t.busy_ms <= t.span_ms and t.collective_share == t.collectives_ms / t.span_ms
    alone = trace_time(find_trace(runs / "single"), window_steps=3)
    assert alone.collective_ms == {} and alone.collectives_ms == 0 and alone.devices == 1 and alone.steps == 3

    text = write_report(runs).markdown.read_text()
    assert "## Profiles" in text and "collectives ms/step (trace)" in text and "traced step ms" in text
    kinds = ", ".join(f"{kind} {ms:,.1f}" if ms >= 0.1 else f"{kind} {ms:.3f}" for kind, ms in t.collective_ms.items())
    # kinds overlap where, in some step, an all-reduce and an all-gather ran at once (on two threads)
    overlap = any(a[3] < g[3] + g[4] and g[3] < a[3] + a[4] for a in train if a[0].startswith("all-reduce")
                  for g in train if g[0].startswith("all-gather") and (g[1], g[2]) == (a[1], a[2]))
    assert t.kinds_overlap == overlap
    said = f"% of the traced step: {kinds}{'; the kinds overlap in time' if overlap else ''})"
    assert said in text
    assert f"{summary['run_name']}: 3 train steps traced on 2 devices, their median {t.span_ms:,.1f} ms from" in text
    assert f"{alone_name}: 3 train steps traced on 1 device, " in text and "The device ran XLA's ops for" in text
    assert f"collectives took from none ({alone_name}) to {t.collectives_ms:,.1f} ms ({summary['run_name']})" in text
    assert "and no collectives" in text and "A traced step usually runs slower than an untraced one" in text
    assert "On simulated devices a collective's time in the trace includes its wait" in text

    # a folder of runs copied elsewhere reads its own traces, whatever became of the originals its records name; a
    # damaged one is named, and the rest stays
    copy = tmp_path / "copy"
    shutil.copytree(runs, copy)
    for original in runs.rglob("*.xplane.pb"):
        original.write_bytes(b"replaced since")
    assert said in write_report(copy).markdown.read_text()
    find_trace(copy / "single").write_bytes(b"not a trace")
    text = write_report(copy).markdown.read_text()
    assert f"{alone_name}: was profiled, but" in text and "not a readable profiler trace" in text
    assert said in text


def test_pmap_a_pipeline_and_a_ring_are_read_as_their_train_steps(micro, tmp_path: Path) -> None:
    """pmap names its train and evaluation programs alike (`jit__fun`): the train step is the one compiled first,
    whose time the reading gives, the evaluation's left out. A pipeline's permutes run inside a while loop whose
    op spans them: each op counts once (the while's span not again), and the permutes are collectives. A ring's
    permutes are named by their jax primitive (`ppermute.N`): collectives, of the kinds the record counted."""
    window = {"train.profile": True, "train.profile_skip": 2, "train.profile_steps": 3, "train.log_every": 100,
              "train.steps": 6}
    runs = {
        "pmap": micro(**window, **{"parallel.strategy": "dp", "parallel.devices": 2, "parallel.mesh": "2",
                                   "parallel.spmd": "pmap", "train.eval": True, "data.synthetic_train": 128,
                                   "train.out": str(tmp_path / "pmap")}),
        "pp": micro(**window, **{"parallel.strategy": "pp", "parallel.devices": 2, "parallel.mesh": "stage=2",
                                 "parallel.microbatches": 2, "train.out": str(tmp_path / "pp")}),
        "ring": micro(**window, **{"parallel.strategy": "cp", "parallel.devices": 2, "parallel.mesh": "seq=2",
                                   "parallel.context": "ring", "model.pool": "mean",
                                   "train.out": str(tmp_path / "ring")}),
    }
    summaries = {name: run(cfg) for name, cfg in runs.items()}
    for name, summary in summaries.items():
        t = trace_time(find_trace(tmp_path / name), window_steps=3)
        assert (t.steps, t.counted_steps, t.devices) == (3, True, 2), name
        assert set(t.collective_ms) == set(summary["measurements"]["comms"]), name  # as the HLO counts them
        assert not any(op.startswith("while") for op, _ in t.top), name

    programs = _ops(find_trace(tmp_path / "pmap"))
    assert {name for name, _ in programs} == {"jit__fun"} and len(programs) == 2  # train and evaluation
    first = min(programs)  # the train step, compiled before the first evaluation
    assert len({o[2] for o in programs[first]}) == 3
    t = trace_time(find_trace(tmp_path / "pmap"), window_steps=3)
    assert t.busy_ms == pytest.approx(_per_step(programs[first]), rel=1e-12)
    assert t.collective_ms["all-reduce"] == pytest.approx(_per_step(programs[first], "all-reduce"), rel=1e-12)

    (train,) = [ops for (name, _), ops in _ops(find_trace(tmp_path / "pp")).items() if name == "jit_train_step"]
    t = trace_time(find_trace(tmp_path / "pp"), window_steps=3)
    assert any(o[0].startswith("while") for o in train) and "collective-permute" in t.collective_ms
    assert t.busy_ms == pytest.approx(_per_step(train), rel=1e-12)
    assert t.collective_ms["collective-permute"] == pytest.approx(_per_step(train, "collective-permute"), rel=1e-12)
    assert "collective-permute" in trace_time(find_trace(tmp_path / "ring"), window_steps=3).collective_ms


def test_runs_sharing_a_trace_folder_and_a_launch_are_named_for_what_the_trace_holds(micro, tmp_path: Path) -> None:
    """Two runs of one name under one profile root: the later trace replaced the earlier, so neither is read and
    both say why. A run of two processes: only process 0 traces, so its devices are named as some of the run's."""
    import dataclasses

    from shardbench.measure.kernels import TraceTime
    from shardbench.report.traces import trace_findings

    shared = {"train.profile": True, "train.profile_skip": 1, "train.profile_steps": 1, "train.steps": 3,
              "train.profile_root": str(tmp_path / "profiles"), "train.log_every": 100}
    first = run(micro(**shared, **{"train.out": str(tmp_path / "runs" / "a")}))
    second = run(micro(**shared, **{"optim.lr": 1e-2, "train.out": str(tmp_path / "runs" / "b")}))
    assert first["profile"] == second["profile"]
    text = write_report(tmp_path / "runs").markdown.read_text()
    assert f"its trace folder {first['profile']} is also" in text and "give each run its own --train.run-name" in text
    assert "traced on" not in text

    from shardbench.report.write import load_runs
    (one, *_), _ = load_runs(tmp_path / "runs")
    launched = dataclasses.replace(one, record=dataclasses.replace(one.rec, measurements=dataclasses.replace(
        one.m, processes=2, devices=8)), traced=TraceTime(3, 4, 10.0, 9.0, 2.0, {"all-reduce": 2.0}, (), True))
    assert ("1 train step traced" not in (found := trace_findings([launched]))[0]
            and "3 train steps traced on 4 of its 8 devices (process 0's; its other processes trace nothing)"
            in found[0])
