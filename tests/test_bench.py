"""`shardbench bench` without running its cases: the float32 matmul arithmetic both sides get, the trimmed
defaults on an accelerator, how the tables name both (and the median rate and the remat table's ratios),
and a case past its timeout becoming a row."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardbench.bench import bench_cmd
from shardbench.bench.matmul import TorchMatmul, jax_matmul, label, torch_matmul
from shardbench.bench.tables import render


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cmd.add_parser(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_torch_gets_the_matmul_arithmetic_jax_uses() -> None:
    h100, v100 = (9, 0), (7, 0)
    for precision in ("default", "high"):
        assert torch_matmul(precision, "cuda", h100) == TorchMatmul("high", True, "TF32")
        assert jax_matmul(precision, "gpu", h100) == "TF32"
        assert torch_matmul(precision, "cuda", v100).label == jax_matmul(precision, "gpu", v100) == "float32"
    assert torch_matmul("highest", "cuda", h100) == TorchMatmul("highest", False, "float32")
    assert jax_matmul("highest", "gpu", h100) == "float32"
    for precision in ("default", "high", "highest"):  # the CPU: full float32 on both sides, whatever is asked
        assert torch_matmul(precision, "cpu") == TorchMatmul("highest", False, "float32")
        assert jax_matmul(precision, "cpu") == "float32"
    assert jax_matmul("high", "tpu") == "bfloat16 x3"
    assert label("float32", {"JAX": "TF32", "PyTorch": "TF32"}) == "TF32 both"
    assert label("float32", {"JAX": "TF32", "PyTorch": "float32"}) == "JAX TF32, PyTorch float32"
    assert label("bfloat16", {"JAX": "bfloat16"}) == "bfloat16 matmuls both"
    with pytest.raises(ValueError, match="medium"):
        torch_matmul("medium", "cuda", h100)


def _torch():  # type: ignore[no-untyped-def]
    """torch, or a skip saying how to install it (`make test` does). Installed but failing to import is a failure,
    not a skip: a broken build would otherwise pass as absent."""
    from conftest import skip_if_requested

    from shardbench.bench.torch_vit import available

    skip_if_requested("SHARDBENCH_SKIP_TORCH")
    reason = available()
    if reason is not None and "not installed" in reason:
        pytest.skip(f"{reason} (the CPU build; `make test` installs it, the 'torch' extra is pip install "
                    f"'shardbench[torch]')")
    assert reason is None, reason
    import torch

    return torch


def test_torch_worker_sets_the_mapped_precision(monkeypatch) -> None:
    torch = _torch()
    from shardbench.bench.torch_vit import set_matmul_precision

    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32)
    try:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda where=None: (9, 0))
        got = set_matmul_precision("default", torch.device("cuda", 0))
        assert got["matmul"] == "TF32" and got["float32_matmul_precision"] == "high"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        got = set_matmul_precision("highest", torch.device("cuda", 0))
        assert got == {"matmul": "float32", "float32_matmul_precision": "highest", "allow_tf32": False,
                       "cudnn_allow_tf32": False}
        assert set_matmul_precision("default", torch.device("cpu"))["matmul"] == "float32"
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[1:]


def test_the_pytorch_baseline_is_the_seed_vit_and_trains() -> None:
    """The baseline `bench` times against shardbench: the seed ViT's parameter count (hand-counted in the models'
    docs), and its train step runs on the CPU with full float32 matmuls, as JAX's does there."""
    _torch()  # skips where torch is not installed
    from shardbench.bench import torch_vit
    from shardbench.config import ModelConfig
    from shardbench.presets import get_preset

    assert torch_vit.count_params(torch_vit.build_model(get_preset("vit-seed").model)) == 10_695_562
    tiny = ModelConfig(patch_size=8, embed_dim=32, num_layers=1, num_heads=2, mlp_dim=64)
    step, info, where = torch_vit.prepare(tiny, batch_size=8, compile=False, threads=1)
    step()
    torch_vit.synchronize(where)
    assert where.type == "cpu" and info["device"] == "cpu" and info["compiled"] == "none"
    assert info["matmul"] == "float32" and info["params"] == torch_vit.count_params(torch_vit.build_model(tiny))
    assert info["first_step_s"] > 0 and info["threads"] == 1 and info["compile_mode"] == "none"


def _planned(monkeypatch, platform: str, *argv: str) -> tuple[argparse.Namespace, dict[str, list[dict]]]:
    monkeypatch.setenv("JAX_PLATFORMS", platform)  # what `malloc.target_platform` reads first
    args = _args(*argv)
    groups: dict[str, list[dict]] = {}
    for group, entries in bench_cmd.plan(args):
        groups.setdefault(group, []).extend(entries)
    return args, groups


def test_accelerator_defaults_are_trimmed_and_say_so(monkeypatch) -> None:
    args, groups = _planned(monkeypatch, "cuda")
    assert [e["label"] for e in groups["layers"]] == ["6 layers scan", "6 layers unrolled", "12 layers scan",
                                                      "12 layers unrolled"]
    assert {e["timeout"] for e in groups["layers"]} == {bench_cmd.ACCELERATOR_DEFAULTS["compile_timeout"]}
    assert [e["label"] for e in groups["batch"]] == ["batch 256"]
    assert args.timeout == 600 and args.settings == [("float32", 128), ("bfloat16", 1024)]
    assert any("--layers 6,12,24" in note for note in args.trimmed)
    assert any("--batches 64,256" in note for note in args.trimmed)
    steps = [e for e in groups["step"] if e["setting"] == "float32 b128"]
    assert steps[0]["kwargs"]["matmul_precision"] == "default"
    # Explicit flags run what they name, untrimmed.
    args, groups = _planned(monkeypatch, "cuda", "--layers", "6,12,24", "--batches", "64,256", "--timeout", "900")
    assert "24 layers unrolled" in [e["label"] for e in groups["layers"]]
    assert {e["timeout"] for e in groups["layers"]} == {900}
    assert [e["label"] for e in groups["batch"]] == ["batch 64", "batch 256"] and args.trimmed == []


def test_one_layer_is_named_in_the_singular_and_read_back_by_the_layers_table(monkeypatch) -> None:
    """A depth of 1 was labelled "1 layers scan"; the layers table reads the depth and the kind back from the
    label, so both spellings must give the row of 1."""
    from shardbench.bench.tables import layers_table

    _, groups = _planned(monkeypatch, "cpu", "--groups", "layers", "--layers", "1,2")
    labels = [e["label"] for e in groups["layers"]]
    assert labels == ["1 layer scan", "1 layer unrolled", "2 layers scan", "2 layers unrolled"]
    record = {"cases": [{"group": "layers", "label": label, "result": {"compile_s": float(i + 1)}}
                        for i, label in enumerate(labels)]}
    assert layers_table(record)[2:] == ["| 1 | 1.0 | 2.0 | - / - |", "| 2 | 3.0 | 4.0 | - / - |"]


def test_cpu_defaults_stay(monkeypatch) -> None:
    args, groups = _planned(monkeypatch, "cpu")
    assert [e["label"] for e in groups["layers"]][-1] == "24 layers unrolled"
    assert {e["timeout"] for e in groups["layers"]} == {600}
    assert [e["label"] for e in groups["batch"]] == ["batch 64", "batch 256"]
    assert args.trimmed == [] and args.timeout == 600 and args.settings == [("float32", 128)]


def test_matmul_precision_flag_drives_every_side(monkeypatch) -> None:
    args, groups = _planned(monkeypatch, "cuda", "--matmul-precision", "highest", "--groups", "step")
    for e in groups["step"]:
        if e["case"] == "matmul-peak":
            assert e["kwargs"]["matmul_precision"] == "highest"
        else:
            assert e["kwargs"]["overrides"]["precision.matmul_precision"] == "highest"
    args, _ = _planned(monkeypatch, "cuda", "--set", "precision.matmul_precision=high", "--groups", "step")
    assert args.matmul_precision == "high"
    from shardbench.errors import ConfigError

    with pytest.raises(ConfigError, match="disagree"):
        _planned(monkeypatch, "cuda", "--matmul-precision", "highest", "--set", "precision.matmul_precision=high")


def _case(setting: str, label: str, case: str, **result: object) -> dict:
    return {"group": "step", "label": label, "case": case, "kwargs": {}, "setting": setting, "result": result}


def test_tables_name_the_matmul_arithmetic_and_what_was_trimmed() -> None:
    """The step tables name each setting's matmul arithmetic, the trimmed defaults and a timed-out case. Rates of
    30, 10 and 11 images/s over three windows: the median is 11.0 (the mean would be 17.0, the middle window 10.0);
    at 1 GFLOP per image against a 1 TFLOP/s peak that is 1.1% MFU."""
    ok = {"rates": [30.0, 10.0, 11.0], "train_flops_per_image": 1e9}
    record = {
        "machine": {}, "preset": "vit-seed", "dtype": "float32", "batch_size": 128, "matmul_precision": "default",
        "settings": ["float32 b128", "bfloat16 b1024"],
        "timing": {"warmup": 3, "windows": 5},
        "trimmed": ["layers 6,12,24 -> 6,12: pass --layers 6,12,24 to run them"],
        "cases": [
            _case("float32 b128", "matmul peak", "matmul-peak", rates=[1e12], size=8192, matmul="TF32"),
            _case("float32 b128", "shardbench", "shardbench", matmul="TF32", **ok),
            _case("float32 b128", "pytorch compile", "torch", matmul="TF32", **ok),
            _case("bfloat16 b1024", "shardbench", "shardbench", matmul="bfloat16", **ok),
            _case("bfloat16 b1024", "pytorch compile", "torch",
                  error="timed out: no answer within 120 s, stopped (see --timeout)"),
            {"group": "layers", "label": "12 layers unrolled", "case": "compile", "kwargs": {}, "setting": None,
             "result": {"error": "timed out: no answer within 120 s, stopped (see --timeout)"}},
        ],
    }
    text = render(record)
    assert "## Train step, one device, float32 b128 (TF32 both)" in text
    assert "## Train step, one device, bfloat16 b1024 (bfloat16 matmuls both)" in text
    assert "| shardbench | TF32 | 11.0 | 10.0 - 30.0 | 1.1% |" in text and "| step | matmul |" in text
    assert "Trimmed on an accelerator: layers 6,12,24 -> 6,12" in text
    assert "| 12 | - | timed out: no answer within 120 s" in text
    assert "| pytorch compile | - | timed out:" in text
    # PyTorch's arithmetic is said where a PyTorch contender ran (float32 b128), not where none did
    assert "PyTorch given the closest" in text
    record["cases"] = [c for c in record["cases"] if not c["label"].startswith("pytorch")]
    assert "Matmul precision default" in render(record) and "PyTorch" not in render(record)


def test_the_remat_table_gives_each_policys_time_and_memory_against_none() -> None:
    """A remat group as `bench` records it: --remat none at 10 images/s with 100 MiB of compiled temporaries,
    block at 8 images/s with 70 MiB, full at 5 images/s with 40 MiB. Against none, full's step takes
    10 / 5 = 2.00x the time (time per step is the inverse of the rate) in 40 / 100 = 0.40x the memory; block's
    10 / 8 = 1.25x and 0.70x; none's own row 1.00x both."""
    def remat(policy: str, rate: float, temp_mib: int) -> dict:
        return {"group": "remat", "label": f"remat {policy}", "case": "shardbench", "kwargs": {}, "setting": None,
                "result": {"rates": [rate] * 3, "temp_bytes": temp_mib * 2**20, "train_flops_per_image": 1e9}}

    record = {"machine": {}, "preset": "vit-seed", "dtype": "float32", "batch_size": 128,
              "matmul_precision": "default", "settings": ["float32 b128"], "timing": {"warmup": 3, "windows": 5},
              "cases": [remat("none", 10.0, 100), remat("block", 8.0, 70), remat("full", 5.0, 40)]}
    table = render(record).split("## Activation checkpointing", 1)[1].strip().splitlines()
    assert table == [
        "| --remat | compiled temporaries MiB | memory vs none | images/s | time per step vs none |",
        "|---|---:|---:|---:|---:|",
        "| none | 100 | 1.00x | 10.0 | 1.00x |",
        "| block | 70 | 0.70x | 8.0 | 1.25x |",
        "| full | 40 | 0.40x | 5.0 | 2.00x |"]


def test_a_case_past_its_timeout_becomes_a_row_and_the_rest_run(tmp_path) -> None:
    """The worker cannot even import JAX in 0.05 s: it is stopped, and the next case still runs."""
    args = argparse.Namespace(timeout=600.0, steps_per_window=1, min_window_s=0.0)
    entries = [{"label": "slow", "case": "pipeline", "alloc": "other", "timeout": 0.05,
                "kwargs": {"images": 64, "batch": 8, "seconds": 0.1, "one_core": True}},
               {"label": "unknown", "case": "no-such-case", "alloc": "other", "kwargs": {}}]
    with (tmp_path / "bench.log").open("w") as log:
        results = bench_cmd.run_pool(entries, args, log, lambda line: None, warmup=0, windows=1)
    assert results[0]["error"].startswith("timed out: no answer within 0 s")
    assert "error" in results[1] and not results[1]["error"].startswith("timed out")


def test_the_baselines_are_refused_a_model_they_do_not_build(monkeypatch) -> None:
    """seed-style nnx and PyTorch build the seed's ViT only: a preset or --set that changes the model is refused
    in the step group, in one line naming what differs, and allowed in the groups that time shardbench alone."""
    from shardbench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"not this one \(--model.stem conv, --model.pool sequence, ") as err:
        _planned(monkeypatch, "cpu", "--preset", "vit-cifar-cct")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"not this one \(--model.pool mean\)"):
        _planned(monkeypatch, "cpu", "--set", "model.pool=mean", "--groups", "step")
    _, groups = _planned(monkeypatch, "cpu", "--preset", "vit-cifar-spt", "--groups", "batch",
                          "--batch-size", "96", "--batches", "48,96")
    assert set(groups) == {"batch"}


# The smallest step group a CPU runs: vit-tiny narrowed to one block, one window of two steps.
TINY = ["--preset", "vit-tiny", "--dtype", "float32", "--batch-size", "16", "--warmup", "1", "--windows", "1",
        "--steps-per-window", "2", "--peak-size", "256", "--set=model.num_layers=1", "--set=model.embed_dim=32",
        "--set=model.mlp_dim=64", "--set=model.num_heads=2"]


def _bench(out: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "shardbench", "bench", "--out", str(out), *argv],
                            env=dict(os.environ, JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_contender_that_errors_or_times_out_makes_bench_exit_1_and_say_which(tmp_path: Path) -> None:
    """Every contender stopped after 1 s (none can import JAX and compile in that): exit 1, one line on stderr
    naming each, and both files written with the rows that say why."""
    proc = _bench(tmp_path, "--groups", "step", "--baselines", "seed-style", "--timeout", "1", *TINY)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert lines[-1].startswith("shardbench bench: 3 of 3 case(s) errored or timed out: matmul peak (float32 b16): "
                                "timed out"), err[-2000:]
    assert "seed-style nnx (float32 b16): timed out" in lines[-1]
    rows = json.loads((tmp_path / "bench.json").read_text())["cases"]
    assert [r["label"] for r in rows] == ["matmul peak", "shardbench", "seed-style nnx"]
    assert "| shardbench | - | timed out:" in (tmp_path / "bench.md").read_text()


@pytest.mark.slow
def test_bench_writes_its_files_after_each_group(tmp_path: Path) -> None:
    """Stopped (SIGKILL) while its second group runs, bench keeps the first group's rows in both files."""
    proc = _bench(tmp_path, "--groups", "pipeline,alloc", "--pipeline-seconds", "0.5", *TINY)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("pipeline: ") and line.rstrip().endswith(" s"):  # the first group is done
                break
        else:
            pytest.fail(f"bench ended before its second group: {proc.wait()} {proc.stderr.read()[-2000:]}")
    finally:
        proc.kill()
        proc.wait()
    rows = json.loads((tmp_path / "bench.json").read_text())["cases"]
    assert [(r["group"], r["label"]) for r in rows] == [("pipeline", "host pipeline")]
    pipeline = rows[0]["result"]
    assert "error" not in pipeline and pipeline["cores"] == 1 and pipeline["images_per_s"] > 0
    assert "On-device augmentation" in (tmp_path / "bench.md").read_text()


def test_reduce_overhead_is_a_torch_compile_contender_that_names_its_mode(monkeypatch) -> None:
    _, groups = _planned(monkeypatch, "cpu", "--groups", "step", "--baselines",
                         "pytorch-compile,pytorch-reduce-overhead")
    torch_entries = {e["label"]: e["kwargs"] for e in groups["step"] if e["case"] == "torch"}
    assert torch_entries["pytorch reduce-overhead"]["compile_mode"] == "reduce-overhead"
    assert "compile_mode" not in torch_entries["pytorch compile"]  # torch.compile's default mode
    args = _args()
    assert args.baselines == "seed-style,pytorch-eager,pytorch-compile"  # opt-in


def _failed_part_way_record() -> dict:
    """A step group where the matmul peak and one baseline timed out after 2 of 5 windows and shardbench measured,
    with a batch group beside it."""
    timed_out = "timed out: no answer within 600 s, stopped (see --timeout)"
    fast = [1e6, 1e6]  # the partial windows: far above any real rate, so a table that used them would show it
    return {
        "machine": {}, "preset": "vit-seed", "dtype": "float32", "batch_size": 128, "matmul_precision": "default",
        "settings": ["float32 b128"], "timing": {"warmup": 3, "windows": 5},
        "cases": [
            _case("float32 b128", "matmul peak", "matmul-peak", rates=[1.0, 1.0], size=4096, error=timed_out),
            _case("float32 b128", "shardbench", "shardbench", rates=[10.0] * 5, train_flops_per_image=1e9),
            _case("float32 b128", "seed-style nnx", "seed-style", rates=[5.0] * 5, train_flops_per_image=1e9),
            _case("float32 b128", "pytorch compile", "torch", rates=fast, train_flops_per_image=1e9,
                  error=timed_out),
            {"group": "batch", "label": "batch 256", "case": "shardbench", "kwargs": {}, "setting": None,
             "result": {"rates": [20.0] * 3, "train_flops_per_image": 1e9}},
        ],
    }


def test_a_contender_that_failed_part_way_gives_no_rate_anywhere() -> None:
    """Its partial windows make no ratio, headline or MFU: the headline is over the baselines that measured, and
    with the matmul peak failed, no MFU against it is given, saying why."""
    text = render(_failed_part_way_record())
    assert "| pytorch compile | - | timed out: no answer within 600 s" in text
    shardbench_row = next(line for line in text.splitlines() if line.startswith("| shardbench |"))
    # MFU (measured), MFU (data sheet), x seed-style, x pytorch compile: the failed baseline gives no ratio.
    assert "| 10.0 | 10.0 - 10.0 | - | - | 2.00x | - |" in shardbench_row, shardbench_row
    assert "shardbench / best baseline (of those that measured; not pytorch compile): 2.00x" in text
    assert "MFU against the measured peak: not given (the matmul peak timed out: no answer within 600 s" in text
    assert "Matmul peak (float32, 4096^2 through JAX" in text and "GFLOP/s" not in text
    # The batch table: its header is a table's (the note in it made a fifth cell, and no table), the note below.
    assert "| batch | images/s per device | MFU | compiled temporaries MiB |\n|---:|---:|---:|---:|\n" in text
    assert "| 256 | 20.0 | - |" in text
    assert "No MFU: the matmul peak timed out" in text
    assert "Warning" not in text  # no load average recorded


def test_a_bench_of_scaling_groups_only_is_titled_by_them_and_a_busy_host_is_warned_of() -> None:
    """Only the batch group ran (at batch 256): the title names it, not 'float32 b128', which no case ran. The host
    was busy when the bench began (load average 4.5 on 2 cores): the record says so and the page warns."""
    record = _failed_part_way_record()
    record["cases"] = [c for c in record["cases"] if c["group"] == "batch"]
    record["machine"] = {"cpu_count": 2, "load_average": 4.5}
    text = render(record)
    assert text.splitlines()[0] == "# shardbench bench: vit-seed, float32, batch"
    assert "load average 4.5 at the start." in text
    assert ("**Warning:** the host's load average was 4.5 over 2 cores when the bench started: other processes "
            "were using the CPU") in text
    # the step group did not run: its windows and warm-up are not described
    assert "Throughput: median of at most 3 timed windows after 1 warm-up step;" in text
    record["machine"]["load_average"] = 0.2
    assert "Warning" not in render(record)


def test_the_allocator_lines_say_when_the_two_sides_windows_overlap() -> None:
    """The committed CPU bench's allocator group: tuned windows 24.3, 24.3, 27.1 images/s against the default's
    18.7, 25.6, 17.6. Medians 24.3 and 18.7 (1.30x), but a default window (25.6) lies inside the tuned range, so the
    lines say that no difference was measured; with the default's windows all below 24.3 they do not."""
    def alloc(label: str, rates: list[float]) -> dict:
        return {"group": "alloc", "label": label, "case": "shardbench", "kwargs": {}, "setting": None,
                "result": {"rates": rates, "compile_s": 6.0}}

    record = {"machine": {}, "preset": "vit-seed", "dtype": "float32", "batch_size": 128,
              "matmul_precision": "default", "settings": ["float32 b128"], "timing": {"warmup": 3, "windows": 5},
              "cases": [alloc("tuned allocator", [24.3, 24.3, 27.1]),
                        alloc("glibc default allocator", [18.7, 25.6, 17.6])]}
    text = render(record)
    assert "24.3 images/s; with glibc's default: 18.7 images/s (1.30x), timed in alternation (windows 24.3 - 27.1 " \
           "and 17.6 - 25.6)" in text
    assert "windows overlap: this run measured no difference" in text
    record["cases"][1]["result"]["rates"] = [18.7, 19.0, 17.6]
    assert "overlap" not in render(record)


def test_a_bench_stopped_before_any_group_finished_is_titled_by_the_groups_asked() -> None:
    """Stopped (SIGTERM) while the pipeline and layers groups ran, no case finished: the title names those groups,
    not the step group's setting ('float32 b128'), which was never asked for."""
    record = _failed_part_way_record()
    record.update(cases=[], groups=["pipeline", "layers"], finished=False, stopped="SIGTERM")
    text = render(record)
    assert text.splitlines()[0] == "# shardbench bench: vit-seed, float32, layers, pipeline"
    assert "**Not finished (stopped by SIGTERM):** the group(s) pipeline, layers did not run" in text


def _fake_pool(monkeypatch, ready: dict, answer, *, steps_per_window: int, min_window_s: float, windows: int
               ) -> tuple[dict, list[str]]:
    """`run_pool` of one contender (warm-up 0) whose worker is a fake: ready with `ready`, each step command
    answered by `answer(command, n)` (n: the step commands so far). Returns its result and every command asked."""
    asked: list[str] = []

    class FakeWorker:
        def __init__(self, entry: dict, log: object, timeout: float) -> None:
            pass

        def read(self) -> dict:
            return {"ready": ready}

        def ask(self, command: str) -> dict:
            asked.append(command)
            return {"peak_bytes": None} if command == "memory" else answer(command, len(
                [a for a in asked if a != "memory"]))

        def close(self) -> None:
            pass

    monkeypatch.setattr(bench_cmd, "Worker", FakeWorker)
    args = argparse.Namespace(timeout=600.0, steps_per_window=steps_per_window, min_window_s=min_window_s)
    entry = {"label": "shardbench", "case": "shardbench", "alloc": "train", "kwargs": {}}
    [got] = bench_cmd.run_pool([entry], args, None, lambda line: None, warmup=0,  # type: ignore[arg-type]
                               windows=windows)
    return got, asked


def test_run_pool_keeps_a_failed_contenders_windows_apart(monkeypatch) -> None:
    """A contender that times out in its third window ends with the error and no `rates`: its two windows are
    kept apart as `partial_rates`. A fake worker stands in for the process."""
    got, _ = _fake_pool(monkeypatch, {"work_per_step": 8, "first_step_s": 1.0},
                        lambda command, n: {"error": "timed out"} if n == 3 else {"seconds": 1.0},
                        steps_per_window=2, min_window_s=0.0, windows=5)
    assert got["error"] == "timed out" and "rates" not in got and got["partial_rates"] == [16.0, 16.0]


def test_windows_without_warm_up_are_sized_by_a_step_after_the_first(monkeypatch) -> None:
    """--warmup 0 with windows of at least 1 s: the first step took 7.8 s with its compilation, a step after it
    0.125 s, so a window is 8 steps (it was 1, sized by the first step). A fake worker stands in for the process."""
    got, asked = _fake_pool(monkeypatch, {"work_per_step": 16, "first_step_s": 7.8},
                            lambda command, n: {"seconds": 0.125 * int(command.split()[1])},
                            steps_per_window=0, min_window_s=1.0, windows=2)
    # the untimed sizing window of 8 steps lasted 1 s: the timed windows are 8 steps
    assert asked == ["steps 1", "steps 8", "steps 8", "steps 8", "memory"] and got["steps_per_window"] == 8
    assert got["rates"] == [128.0, 128.0]


def test_windows_are_grown_until_one_lasts_min_window_s(monkeypatch) -> None:
    """A step after the first took 0.5 s (a recompilation, first calls), the steady ones 0.01 s: sized by it alone a
    window was 2 steps, 0.02 s of timing. Untimed windows grow it (2 steps: 0.02 s, so 100 steps: 1.0 s) until one
    lasts the 1 s asked; the timed windows are then 100 steps. A fake worker stands in for the process."""
    got, asked = _fake_pool(monkeypatch, {"work_per_step": 16, "first_step_s": 7.8},
                            lambda command, n: {"seconds": 0.5 if n == 1 else 0.01 * int(command.split()[1])},
                            steps_per_window=0, min_window_s=1.0, windows=2)
    assert asked == ["steps 1", "steps 2", "steps 100", "steps 100", "steps 100", "memory"]
    assert got["steps_per_window"] == 100 and got["rates"] == [1600.0, 1600.0]


def test_a_worker_that_fails_while_its_windows_are_sized_is_a_failed_contender(monkeypatch) -> None:
    got, _ = _fake_pool(monkeypatch, {"work_per_step": 16, "first_step_s": 7.8},
                        lambda command, n: {"error": "timed out"} if n == 2 else {"seconds": 0.01},
                        steps_per_window=0, min_window_s=1.0, windows=2)
    assert got["error"] == "timed out" and "rates" not in got


@pytest.mark.parametrize("flag", ["--timeout", "--min-window-s", "--pipeline-seconds"])
@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_seconds_flags_must_be_finite(monkeypatch, flag: str, value: str) -> None:
    """inf and nan passed a `< 0` test and crashed as internal errors, --min-window-s inf after every compile."""
    from shardbench.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^{flag} {value}: give a finite number of seconds") as err:
        _planned(monkeypatch, "cpu", "--groups", "step", flag, value)
    assert "\n" not in str(err.value)
    if flag == "--timeout":
        assert "0: the default, 600 s" in str(err.value)


@pytest.mark.parametrize("key, flag", [("precision.dtype=bfloat16", "--dtype"),
                                       ("train.batch_size=64", "--batch-size")])
def test_set_refuses_what_the_step_group_sets_per_setting(monkeypatch, key: str, flag: str) -> None:
    """Applied to the batch and remat groups but overridden in the step group, such a --set made bench.md's title
    name one dtype and batch while other rows ran another: it is refused, pointing to the flag."""
    from shardbench.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^--set {key}: .* use {flag}") as err:
        _planned(monkeypatch, "cpu", "--groups", "batch,remat", "--set", key)
    assert "\n" not in str(err.value)


def test_the_baselines_are_refused_a_step_with_a_recipe_they_do_not_run(monkeypatch) -> None:
    """vit-cifar is the seed's ViT, but its step adds stochastic depth, mixing, TrivialAugment and label smoothing,
    none of which the baselines run: refused in the step group, naming each, and the presets offered instead are
    ones the step group takes."""
    from shardbench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        _planned(monkeypatch, "cpu", "--preset", "vit-cifar", "--groups", "step")
    said = str(err.value)
    assert ("not this one (--model.drop-path 0.1, --data.mixup 1, --data.cutmix 0.5, --data.trivial-augment, "
            "--train.label-smoothing 0.1)") in said and "\n" not in said
    offered = said.rsplit("(", 1)[1].rstrip(")").split(", ")
    assert "vit-seed" in offered and "vit-cifar" not in offered
    for preset in offered:
        _planned(monkeypatch, "cpu", "--preset", preset, "--groups", "step", "--batch-size", "8")


@pytest.mark.parametrize("argv, says", [
    (["--baselines", "seed-style,seed-style"], "--baselines 'seed-style,seed-style' names seed-style twice"),
    (["--dtype", "float32,float32", "--batch-size", "8"], "names float32 b8 twice"),
    (["--groups", "batch", "--batches", "8,8"], "--batches '8,8' names 8 twice"),
    (["--groups", "step,step"], "--groups 'step,step' names step twice"),
    (["--dtype", "float16", "--batch-size", "8"], "--dtype float16: the seed-style baseline's matmuls cannot run "
                                                  "in float16 on a CPU"),
    (["--peak-size", "1000000"], "--peak-size 1000000: give a side from 1 to 32,768"),
    (["--windows", "0"], "--windows 0: give a whole number >= 1"),
    (["--warmup", "-1"], "--warmup -1: give a whole number >= 0"),
    (["--steps-per-window", "-2"], "--steps-per-window -2: give a whole number >= 0"),
    # Each value as the configuration field it sets declares it, in the words train uses.
    (["--dtype", "float32,float8"], "unknown --dtype 'float8': choose one of float32, bfloat16, float16"),
    # A list given empty is a mistake, not the default (a whole default bench ran for --dtype '' or ',').
    (["--dtype", ","], "--dtype ',': give one value or a comma list"),
    (["--dtype", ""], "--dtype '': give one value or a comma list"),
    (["--batch-size", ""], "--batch-size '': give one value or a comma list"),
    (["--groups", "batch", "--batches", " "], "--batches ' ': give one value or a comma list"),
    (["--groups", "layers", "--layers", ","], "--layers ',': give one value or a comma list"),
    (["--matmul-precision", "max"], "unknown --matmul-precision 'max': choose one of default, high, highest"),
    (["--groups", "step,speed"], "unknown --groups 'speed': choose one of step, batch,"),
    (["--groups", "batch", "--batches", "8,x"], "--batches 'x' is not a whole number"),
    (["--groups", "batch", "--batches", "8,0"], "--batches 0: each value must be in (0, 2^31), got 0"),
    (["--groups", "layers", "--layers", "6,0"], "--layers 0: each value must be in (0, 2^31), got 0"),
    (["--batch-size", "0"], "--batch-size must be in (0, 2^31), got 0"),
])
def test_bench_refuses_in_one_line_what_would_fail_or_mislead_after_the_compiles(monkeypatch, argv: list[str],
                                                                                   says: str) -> None:
    """Each of these ran every compile first: repeated names timed twice under one label (tables mixing them,
    a ratio against the wrong row), float16 failed the seed-style baseline on a CPU, a huge peak ran out of
    memory; and the counts' refusal named none of the three flags."""
    from shardbench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        _planned(monkeypatch, "cpu", *argv)
    assert says in str(err.value) and "\n" not in str(err.value)
    _planned(monkeypatch, "cpu", "--dtype", "float16", "--batch-size", "8", "--baselines", "pytorch-eager")


def test_a_bench_out_folder_holding_an_earlier_bench_is_refused(tmp_path: Path) -> None:
    """Its bench.json and bench.md would have stood beside this run's log as if they were this run's."""
    (tmp_path / "bench.json").write_text("{}")
    done = subprocess.run([sys.executable, "-m", "shardbench", "bench", "--out", str(tmp_path), *TINY],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (f"shardbench: error: --out {tmp_path} already holds a bench "
                                                    f"(bench.json): choose another --out, or remove it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]


def test_torch_compiles_cold_in_a_worker() -> None:
    """JAX's persistent cache is off in a worker, so the first step's compile is cold; inductor's on-disk cache
    served torch.compile's from an earlier run's compile."""
    for alloc in ("train", "other", "tuned", "default"):
        assert bench_cmd.worker_environ(alloc)["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] == "1"


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_sigterm_stops_the_bench_and_its_workers_and_the_files_say_so(tmp_path: Path) -> None:
    """SIGTERM to bench alone (a scheduler's, `timeout`'s): it ended at once and its workers ran on as orphans,
    one for 200 s. Now: exit 143, no worker left, and bench.json and bench.md keep the step group and say the
    pipeline group did not finish."""
    proc = _bench(tmp_path, "--groups", "step,pipeline", "--baselines", "seed-style", *TINY,
                  "--pipeline-seconds", "300")  # the pipeline group outlasts the signal
    assert proc.stdout is not None
    workers: list[int] = []
    try:
        for line in proc.stdout:
            if line.strip().startswith("host pipeline: preparing"):
                deadline = time.monotonic() + 30
                while not workers and time.monotonic() < deadline:
                    workers = _children(proc.pid)
                    time.sleep(0.1)
                break
        else:
            pytest.fail(f"bench ended before its pipeline group: {proc.wait()} {proc.stderr.read()[-2000:]}")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)  # read on: a full stdout pipe would hold its exit
        assert proc.returncode == 143, err[-2000:]
    finally:
        proc.kill()
    assert workers, "no worker process found"
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in workers):
        assert time.monotonic() < deadline, f"workers still running: {workers}"
        time.sleep(0.2)
    assert "stopped (SIGTERM)" in err
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["finished"] is False and record["stopped"] == "SIGTERM" and record["groups"] == ["step", "pipeline"]
    assert {r["group"] for r in record["cases"]} == {"step"}
    page = (tmp_path / "bench.md").read_text()
    assert "**Not finished (stopped by SIGTERM):** the group(s) pipeline did not run to their end" in page
    assert "| shardbench | float32 |" in page  # the step group's table stays


def _state(pid: int) -> str:
    try:
        return {"Z": "zombie"}.get(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0], "running")
    except OSError:
        return "zombie"
