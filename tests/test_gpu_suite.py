"""The GPU suite's every part runs on a CPU at tiny sizes (`--smoke`), writing what a GPU run would write;
a part whose budget runs out lists what it skipped with the command that runs it."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_suite  # noqa: E402

pytestmark = pytest.mark.slow  # every test here starts processes or trains for tens of seconds


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("suite")
    done = subprocess.run([sys.executable, str(SUITE), "--smoke", "--out", str(out / "results"),
                           "--work", str(out / "work")], env=dict(os.environ), capture_output=True, text=True,
                          timeout=900)
    return out, done


@pytest.fixture(scope="module")
def smoke(smoke_run: tuple[Path, subprocess.CompletedProcess[str]]) -> Path:
    return smoke_run[0] / "results"


def _cases(results: Path, part: str) -> dict[str, dict]:
    record = json.loads((results / f"{part}.json").read_text())
    assert record["part"] == part and record["smoke"] and record["commit"] and record["device"]
    return {c["name"]: c for c in record["cases"]}


def _torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def test_every_part_writes_its_files(smoke_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    top, done = smoke_run
    smoke = top / "results"
    # The suite exits 1 when any case failed or timed out: 0 here means every case of every part ran or was refused.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for part in gpu_suite.PARTS:
        text = (smoke / f"{part}.md").read_text()
        assert text.startswith(f"## {part} (smoke run") and "commit" in text
        cases = _cases(smoke, part)
        assert cases, part
        # Every case ran: only cuDNN's attention, which a CPU cannot run, is refused; nothing failed, timed out
        # or was left out for the budget.
        for name, c in cases.items():
            cudnn = name in ("attention cudnn", gpu_suite.LM_CUDNN, gpu_suite.LM_SEQ_MAJOR)
            ran = c["status"].startswith("refused: ") if cudnn else c["status"] == "ok"
            assert ran, (part, name, c["status"])
    # The bench part's every contender gave figures: none errored or timed out (PyTorch eager where torch is here).
    rows = json.loads((smoke / "bench-raw.json").read_text())["cases"]
    assert [r["label"] for r in rows] == 2 * ["matmul peak", "shardbench", "seed-style nnx",
                                              *(["pytorch eager"] if _torch_installed() else [])]  # 2 dtypes
    assert all("error" not in r["result"] and r["result"].get("rates") for r in rows), rows
    # the results folder stays small: runs, logs and caches went to --work
    assert not list(smoke.rglob("*.xplane.pb")) and not list(smoke.rglob("checkpoints"))
    # and it holds no path of this machine: --work is `<work>`, the checkout's paths are relative to its root
    for path in smoke.glob("*.*"):
        if path.suffix in (".json", ".md"):
            text = path.read_text()
            assert str(top) not in text and str(ROOT) not in text, path.name
    assert "--out <work>/compile-runs/" in (smoke / "compile.json").read_text()
def test_variants_compare_with_the_baseline(smoke: Path) -> None:
    for part in ("variants-bf16", "variants-f32"):
        cases = _cases(smoke, part)
        assert cases["baseline"]["status"] == "ok" and len(cases["baseline"]["losses"]) >= 3
        # what auto ran on the CPU, from the run's record: the einsum attention, so the fused q/k/v projection
        assert (cases["baseline"]["attention"], cases["baseline"]["qkv_layout"]) == ("einsum", "fused")
        if part == "variants-bf16":  # variants-f32's smoke run repeats only the refusal, which differs
            assert cases["qkv split"]["losses_agree"] is True  # the same arithmetic, another layout
            assert cases["qkv split"]["qkv_layout"] == "split"
            assert "| einsum (split) |" in (smoke / "variants-bf16.md").read_text()
            assert cases["cudnn layernorm"]["status"] == "ok"
            assert "--xla_gpu_enable_cudnn_layer_norm=true" in cases["cudnn layernorm"]["xla_flags"]
            # the LM's pair: its cudnn case is compared with the LM's fused one (refused here), never the ViT's
            lm = cases[gpu_suite.LM_FUSED]
            assert lm["status"] == "ok" and lm["attention"] == "fused" and "losses_agree" not in lm
            assert cases[gpu_suite.LM_CUDNN]["status"].startswith("refused: ")
            assert cases[gpu_suite.LM_SEQ_MAJOR]["status"].startswith("refused: ")
            assert gpu_suite.rerun_command("variants-bf16", [gpu_suite.LM_CUDNN], gpu_suite.cases_for(
                part, gpu_suite.Sizes(False), argparse.Namespace(), smoke, smoke)) == (
                f"--part variants-bf16 --cases '{gpu_suite.LM_FUSED},{gpu_suite.LM_CUDNN}'")
        else:
            assert set(cases) == {"baseline", "attention cudnn"}
        # cuDNN's attention cannot run on a CPU: refused in one line, before compiling
        assert cases["attention cudnn"]["status"].startswith("refused: ")
        assert "cudnn" in cases["attention cudnn"]["status"].lower()
        ok = [c for c in cases.values() if c["status"] == "ok"]
        for c in ok:  # throughput is the batch over the median step of the case's own run record
            batch = int(c["command"].split("--batch-size ")[1].split()[0])
            run_dir = c["command"].split("--out ")[-1].split()[0].replace("<work>", str(smoke.parent / "work"))
            record = json.loads((Path(run_dir) / "summary.json").read_text())
            median = record["measurements"]["step_time_s"]["median"]
            assert c["step_ms"] == pytest.approx(1e3 * median, rel=1e-9), c["name"]
            assert c["examples_per_s"] == pytest.approx(batch / (c["step_ms"] / 1e3), rel=1e-9)


def test_compile_part_sees_its_cache(smoke: Path) -> None:
    cases = _cases(smoke, "compile")
    cold = next(c for name, c in cases.items() if "cold" in name)
    assert cold["cache_hits"] == "off"
    again = cases["the same program again"]
    hits, requests = (int(v) for v in again["cache_hits"].split("/"))
    assert requests > 0 and hits == requests  # every program of the second run came from the cache
    second = cases["bfloat16 b512 with that cache (a second batch size)"]
    assert int(second["cache_hits"].split("/")[0]) < requests  # another batch is another program


def test_profile_plan_accuracy_and_bench(smoke: Path) -> None:
    profile = (smoke / "profile.md").read_text()
    assert "### Kernels: baseline" in profile and "| kernel | ms/step |" in profile
    # the report's reading of the same trace: on a CPU its ops name their program, so the steps are counted
    assert "The report's reading of this trace: train steps 2 counted in the trace;" in profile
    assert json.loads((smoke / "plan-validation.json").read_text())
    assert "mean absolute error" in (smoke / "plan.md").read_text()
    accuracy = _cases(smoke, "accuracy")["recipe vit-cifar"]
    assert 0.0 <= accuracy["test_accuracy"] <= 1.0
    assert (smoke / "accuracy-recipe-vit-cifar.png").stat().st_size > 1000
    page = gpu_suite.collect(smoke)
    assert all(f"## {part} (smoke run" in page for part in gpu_suite.PARTS)


def test_bench_compares_every_contender_in_each_setting(smoke: Path) -> None:
    """`shardbench bench` as the bench part ran it: real worker processes, real compilations, interleaved windows;
    a setting per dtype, a rate per window for each contender, and one table per setting."""
    record = json.loads((smoke / "bench-raw.json").read_text())
    assert record["settings"] == ["float32 b16", "bfloat16 b16"]
    steps = {(c["setting"], c["label"]): c["result"] for c in record["cases"] if c["group"] == "step"}
    contenders = ("shardbench", "seed-style nnx", *(["pytorch eager"] if _torch_installed() else []))
    for setting in record["settings"]:
        for label in ("matmul peak", *contenders):
            assert len(steps[setting, label]["rates"]) == 2, steps[setting, label]  # --windows 2
            assert min(steps[setting, label]["rates"]) > 0
        for label in contenders:
            assert "peak_bytes" in steps[setting, label]  # asked of every worker; None on the CPU
        assert steps[setting, "shardbench"]["train_flops_per_image"] == steps[setting, "seed-style nnx"][
            "train_flops_per_image"]
    assert steps["bfloat16 b16", "matmul peak"]["dtype"] == "bfloat16"
    assert steps["float32 b16", "seed-style nnx"]["params"] > 0
    table = (smoke / "bench.md").read_text()
    assert "shardbench bench" in table and table.count("shardbench / best baseline") == 2
    assert "## Train step, one device, bfloat16 b16" in table and "MFU (data sheet)" in table
    for label in contenders:
        rows = [line for line in table.splitlines() if line.startswith(f"| {label} | ")]
        assert len(rows) == 2, label
        for row in rows:
            float(row.split("|")[3].replace(",", ""))  # its images/s: a number, not an error or a timeout


def test_a_part_out_of_budget_lists_what_it_did_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_suite, "check_gpu", lambda args: None)  # as on a GPU machine: the GPU run's cases
    assert gpu_suite.main(["--part", "compile", "--out", str(tmp_path / "r"), "--work", str(tmp_path / "w"),
                           "--budget-s", "0"]) == 0  # no case started: not a failure
    cases = _cases_any(tmp_path / "r" / "compile.json")
    assert len(cases) == 12 and all(c["status"].startswith("not run: budget:") for c in cases)
    text = (tmp_path / "r" / "compile.md").read_text()
    assert "--part compile --cases 'lm-seed float32 cold'" in text
    # one command for all of them, and a variant's rerun brings the baseline its losses are compared with
    assert gpu_suite.rerun_command("variants-f32", ["qkv split", "no triton gemm"]) == (
        "--part variants-f32 --cases 'baseline,qkv split,no triton gemm'")


def test_a_case_near_the_end_of_the_budget_gets_a_grace_within_the_part_limit() -> None:
    gpu = argparse.Namespace(smoke=False, case_timeout_s=420.0)
    assert gpu_suite.case_timeout_s(30.0, gpu) == 30.0 + gpu_suite.GRACE_S  # not exactly the time left
    assert gpu_suite.case_timeout_s(-5.0, gpu) == gpu_suite.GRACE_S
    assert gpu_suite.case_timeout_s(500.0, gpu) == 420.0
    # the budget, the grace and ~20 s of the part's own overhead stay within the 9-minute limit of a part
    assert gpu_suite.BUDGET_S + gpu_suite.GRACE_S + 20 <= gpu_suite.PART_LIMIT_S == 540
    # and each part's planned cases, at their estimates, are either started in the budget or listed as not run:
    # variants-f32's measured float32 processes (43.6-44.9 s on the H100) are within its estimate
    sizes, args = gpu_suite.Sizes(False), argparse.Namespace(variant="", recipe="vit-cifar", data_path="x")
    f32 = gpu_suite.cases_for("variants-f32", sizes, args, Path("/nonexistent"), Path("/w"))
    assert all(c.est_s >= 44.9 for c in f32 if "cudnn" not in c.name)


def test_recipe_estimates_have_a_per_step_floor_from_the_h100_records() -> None:
    """vit-cifar's estimate is its own measured 152 s (plus the overhead); vit-cifar-spt's 35,100 steps of 384
    images (128 distinct x 3) cannot go below the attention of 9 layers of 12 heads, whatever its FLOPs say."""
    from shardbench.models.vit import flops_per_example
    from shardbench.presets import get_preset

    assert gpu_suite.recipe_estimate_s("vit-cifar") == pytest.approx(152 + gpu_suite.RECIPE_OVERHEAD_S)
    assert gpu_suite.recipe_steps("vit-cifar-spt") == 35_100
    spt = gpu_suite.recipe_estimate_s("vit-cifar-spt")
    # By hand: LSA's attention runs as einsums (1.39 ms a layer at vit-seed's 1024 x 8 heads x 65 tokens), 9 layers
    # at 384 x 12 heads x 65 tokens; the rest of the step is vit-cifar's measured 152 s / 8,700 steps less its
    # fused attention (6 layers at 512 x 8 x 65), scaled by the batch and each image's FLOPs.
    attention = 9 * 1.39e-3 * (384 * 12 * 65) / (1024 * 8 * 65)
    assert gpu_suite.attention_step_s("vit-cifar-spt") == pytest.approx(attention)
    cifar, lsa = get_preset("vit-cifar"), get_preset("vit-cifar-spt")
    ratio = (flops_per_example(lsa.model, lsa.data.image_size)["train"]
             / flops_per_example(cifar.model, cifar.data.image_size)["train"])
    rest = (152 / 8700 - 6 * 1.28e-3 * (512 * 8 * 65) / (1024 * 8 * 65)) * 384 / 512 * ratio
    assert spt == pytest.approx(35_100 * (rest + attention) + 40)
    assert spt > 35_100 * gpu_suite.attention_step_s("vit-cifar-spt") + gpu_suite.RECIPE_OVERHEAD_S
    assert 350 < spt < gpu_suite.BUDGET_S  # inferred ~380 s: it still fits a part alone
    for name in gpu_suite.recipes():  # never below the FLOPs-based figure
        floor = gpu_suite.recipe_steps(name) * gpu_suite.flops_step_s(name) + gpu_suite.RECIPE_OVERHEAD_S
        assert gpu_suite.recipe_estimate_s(name) >= floor


def test_exit_2_is_a_refusal_only_with_a_known_refusal_message(tmp_path: Path) -> None:
    cudnn = gpu_suite.CUDNN_REFUSALS
    said = ("shardbench: error: --model.attention cudnn needs an NVIDIA GPU (cuDNN), and this platform is cpu: use "
            "--model.attention fused or einsum here")
    assert gpu_suite.exit_status(2, 5.0, said, cudnn).startswith("refused: ")
    assert gpu_suite.exit_status(2, 5.0, said, ()).startswith("failed (2")  # a case that expects no refusal
    # A real process whose own command is wrong: argparse's exit 2 is a failure, not a refusal.
    code, seconds, last = gpu_suite.run_process(["train", "--no-such-flag", "1"], tmp_path / "log", 120, True)
    assert code == 2 and gpu_suite.exit_status(code, seconds, last, cudnn).startswith("failed (2")
    assert gpu_suite.exit_status(1, 5.0, "boom", cudnn) == "failed (1): boom"
    assert gpu_suite.exit_status(None, 5.0, "", cudnn) == "timed out after 5 s"


def test_a_case_whose_results_cannot_be_read_fails_alone(tmp_path: Path) -> None:
    """A train case that exited 0 but left no summary.json: its row says so, the part goes on (no exception)."""
    args = argparse.Namespace(smoke=True, cases="")
    record = gpu_suite.Part("compile", tmp_path, {"date": "d", "commit": "c", "device": "cpu"}, True, False)
    run = gpu_suite.PartRun("compile", args, tmp_path, tmp_path / "w", gpu_suite.Sizes(True), record)
    case = gpu_suite.train_case(gpu_suite.Sizes(True), "mlp-small float32 cold", "mlp-small", "float32", 1024)
    row = {"name": case.name, "status": "ok"}
    (tmp_path / "run").mkdir()
    gpu_suite.finish_safely(run, case, row, tmp_path / "run", 0)
    assert row["status"].startswith("failed: reading its results: FileNotFoundError") and "summary.json" in row[
        "status"]
    record.add(row)
    assert record.failures() == [f"compile/{case.name}: {row['status'][:200]}"]


def test_without_a_gpu_the_suite_stops_in_one_line(tmp_path: Path) -> None:
    """Not --smoke on this CPU machine: JAX_PLATFORMS=cuda finds no GPU, so nothing runs on the CPU."""
    done = subprocess.run([sys.executable, str(SUITE), "--part", "compile", "--cases", "mlp-small float32 cold",
                           "--out", str(tmp_path / "r"), "--work", str(tmp_path / "w")], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_suite: JAX cannot use a GPU here (JAX_PLATFORMS=cuda): ")
    if not importlib.util.find_spec("jax_cuda12_plugin"):  # what a user can do about it, not JAX's bare assert
        assert "no CUDA plugin for JAX is installed (pip install -U 'jax[cuda12]')" in lines[0], lines[0]
    assert not (tmp_path / "w" / "compile-runs").exists() and not (tmp_path / "r").exists()  # nothing written
    # Nor where no case would fit the budget: a page of a GPU run is never written on another device.
    done = subprocess.run([sys.executable, str(SUITE), "--part", "compile", "--budget-s", "0", "--out",
                           str(tmp_path / "r"), "--work", str(tmp_path / "w")], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1 and not (tmp_path / "r").exists(), done.stderr
    # A record that says it ran on the CPU fails a GPU run's case.
    assert gpu_suite.device_problem("cpu", "cpu") == "failed: ran on cpu (platform cpu), not a GPU"
    assert gpu_suite.device_problem(None, None).startswith("failed: ")
    assert gpu_suite.device_problem("gpu", "NVIDIA H100 80GB HBM3") is None


def test_a_bench_contender_that_times_out_fails_the_bench_case(tmp_path: Path) -> None:
    """A real `shardbench bench` whose contenders are stopped after 1 s: it exits 1 naming them, its files are
    written, and the suite's reading of its bench.json fails the case."""
    sizes, args = gpu_suite.Sizes(True), argparse.Namespace(variant="")
    argv = gpu_suite.cases_for("bench", sizes, args, tmp_path, tmp_path / "w")[0].argv
    code, _, last = gpu_suite.run_process([*argv, "--timeout", "1"], tmp_path / "log", 300, True)
    assert code == 1 and last.startswith("shardbench bench: ") and "shardbench (float32 b16): timed out" in last
    record = json.loads((tmp_path / "w" / "bench-raw" / "bench.json").read_text())
    problem = gpu_suite.bench_problem(record, smoke=True)
    assert problem is not None and problem.startswith("failed: ") and "seed-style nnx (float32 b16): timed out" in problem


def test_a_case_that_times_out_makes_the_suite_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = "vit-seed float32 b128 cold"  # one of --smoke's cases
    # A real process past its timeout: shardbench cannot even import JAX in half a second.
    assert gpu_suite.main(["--smoke", "--part", "compile", "--cases", case, "--out", str(tmp_path / "r"),
                           "--work", str(tmp_path / "w"), "--case-timeout-s", "0.5"]) == 1
    err = capsys.readouterr().err
    assert f"compile/{case}: timed out after" in err
    assert _cases_any(tmp_path / "r" / "compile.json")[0]["status"].startswith("timed out")


def _cases_any(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cases"]


ENV = {"date": "d", "commit": "c", "device": "cpu"}


def _bench_run(tmp_path: Path, keep_earlier: bool) -> tuple[gpu_suite.PartRun, gpu_suite.Case]:
    out, work = tmp_path / "r", tmp_path / "w"
    out.mkdir(exist_ok=True)
    case = gpu_suite.cases_for("bench", gpu_suite.Sizes(True), argparse.Namespace(variant=""), out, work)[0]
    record = gpu_suite.Part("bench", out, ENV, True, keep_earlier)
    run = gpu_suite.PartRun("bench", argparse.Namespace(smoke=True, cases=""), out, work, gpu_suite.Sizes(True), record)
    return run, case


def _finish_bench(tmp_path: Path, code: int | None, status: str, last: str = "", keep: bool = True) -> str:
    """The bench case's row and section as a run (with --cases: `keep`) ending in `code` leaves them; bench.md."""
    run, case = _bench_run(tmp_path, keep)
    row = {"name": case.name, "status": status, **({"log_tail": ["...", last]} if code != 0 else {})}
    gpu_suite.finish_safely(run, case, row, tmp_path / "run", code)
    run.record.add(row)
    return (tmp_path / "r" / "bench.md").read_text()


def test_a_rerun_replaces_sections_and_an_unfinished_bench_publishes_nothing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """bench's tables are the bench case's section: a --cases rerun replaces them (not a second copy), and a
    bench that timed out or crashed publishes nothing, not an earlier run's tables and bench-raw.json."""
    raw = tmp_path / "w" / "bench-raw"
    raw.mkdir(parents=True)
    (raw / "bench.md").write_text("## TABLE A")
    (raw / "bench.json").write_text(json.dumps({"cases": []}))
    assert _finish_bench(tmp_path, 0, "ok", keep=False).count("TABLE A") == 1
    assert _finish_bench(tmp_path, 0, "ok").count("TABLE A") == 1  # --cases: replaced, not appended
    said = "shardbench bench: 1 of 6 case(s) errored or timed out: shardbench (float32 b16): timed out"
    assert _finish_bench(tmp_path, 1, f"failed (1): {said}", said).count("TABLE A") == 1  # finished: published
    assert (tmp_path / "r" / "bench-raw.json").exists()
    for code, last in ((None, ""), (1, "ZeroDivisionError: division by zero"), (2, "shardbench: error: --x")):
        page = _finish_bench(tmp_path, code, "timed out after 5 s" if code is None else f"failed ({code}): {last}",
                             last)
        assert "TABLE A" not in page and not (tmp_path / "r" / "bench-raw.json").exists(), (code, last)
    # and the bench case starts from an empty folder: an earlier run's files are gone before it runs

    def fake_run_process(argv: list[str], log: Path, timeout: float, smoke: bool) -> tuple[None, float, str]:
        log.write_text("killed\n")
        return None, 1.0, "killed"

    monkeypatch.setattr(gpu_suite, "run_process", fake_run_process)
    run, case = _bench_run(tmp_path, True)
    run.logs.mkdir(parents=True)
    gpu_suite.run_case(run, case, {"name": case.name}, 10.0)
    assert not raw.exists()


def test_collect_refuses_a_folder_without_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in --collect must not replace the results page with an empty one."""
    page = tmp_path / "results.md"
    page.write_text("the committed results")
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "typo", tmp_path / "empty"):
        assert gpu_suite.main(["--collect", str(folder), "--to", str(page)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"gpu_suite: --collect {folder}: no part's file there")
        assert page.read_text() == "the committed results"
    (tmp_path / "empty" / "compile.md").write_text("## compile")
    assert gpu_suite.main(["--collect", str(tmp_path / "empty"), "--to", str(page)]) == 0
    assert "## compile" in page.read_text()
    assert f"--to {page}`" in page.read_text()  # the page names itself, not another GPU's page


def test_cases_refuses_a_name_the_part_does_not_have(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--out", str(tmp_path / "r"), "--work", str(tmp_path / "w")]
    assert gpu_suite.main(["--smoke", "--part", "compile", "--cases", "mlp-small float32 cold", *common]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # mlp-small is not among --smoke's compile cases
    assert len(err) == 1 and err[0].startswith("gpu_suite: --part compile --cases: 'mlp-small float32 cold' is not")
    assert "'vit-seed float32 b128 cold'" in err[0] and not (tmp_path / "r").exists()  # nothing written
    assert gpu_suite.main(["--smoke", "--cases", "baseline", *common]) == 2  # --part all: whose cases?
    assert capsys.readouterr().err.strip() == "gpu_suite: --cases names cases of one part: give --part PART"


def test_a_case_reading_a_cache_brings_the_case_that_fills_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run alone, "the same program again" would compile cold and report 0 hits as its warm figure."""
    monkeypatch.setattr(gpu_suite, "check_gpu", lambda args: None)  # as on a GPU machine: the GPU run's cases
    common = ["--out", str(tmp_path / "r"), "--work", str(tmp_path / "w"), "--budget-s", "0"]
    assert gpu_suite.main(["--part", "compile", "--cases", "the same program again", *common]) == 0
    cases = _cases_any(tmp_path / "r" / "compile.json")
    assert [c["name"] for c in cases] == ["vit-seed bfloat16 b1024 filling a cache", "the same program again"]
    assert cases[1]["status"].endswith(
        "--part compile --cases 'vit-seed bfloat16 b1024 filling a cache,the same program again'")
    assert gpu_suite.main(["--part", "autotune", "--cases", "autotune 0: b512 from that cache", *common]) == 0
    cases = _cases_any(tmp_path / "r" / "autotune.json")
    assert [c["name"] for c in cases] == ["autotune 0: b1024 filling a cache", "autotune 0: b512 from that cache"]
    assert cases[1]["status"].endswith(
        "--part autotune --cases 'autotune 0: b1024 filling a cache,autotune 0: b512 from that cache'")


def test_smoke_honours_a_given_budget(tmp_path: Path) -> None:
    """--smoke has no budget unless --budget-s is given: then it starts no case that does not fit."""
    assert gpu_suite.main(["--smoke", "--part", "compile", "--out", str(tmp_path / "r"), "--work",
                           str(tmp_path / "w"), "--budget-s", "0", "--case-timeout-s", "0.5"]) == 0
    cases = _cases_any(tmp_path / "r" / "compile.json")
    assert len(cases) == 4 and all(c["status"].startswith("not run: budget:") for c in cases)


def test_a_case_whose_cache_filler_failed_is_not_run_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The case that fills the cache exits 1: "the same program again" would compile cold and report that as its
    warm figure, so it is not run, and its row says which case it waited on and how that ended."""
    ran: list[str] = []

    def fake_run_process(argv: list[str], log: Path, timeout: float, smoke: bool) -> tuple[int, float, str]:
        ran.append(argv[argv.index("--out") + 1])
        log.write_text("RuntimeError: boom\n")
        return 1, 1.0, "RuntimeError: boom"

    monkeypatch.setattr(gpu_suite, "run_process", fake_run_process)
    common = ["--out", str(tmp_path / "r"), "--work", str(tmp_path / "w")]
    assert gpu_suite.main(["--smoke", "--part", "compile", "--cases", "the same program again", *common]) == 1
    filling, again = _cases_any(tmp_path / "r" / "compile.json")
    assert len(ran) == 1 and ran[0].endswith(gpu_suite.slug(filling["name"]))
    assert filling["status"] == "failed (1): RuntimeError: boom"
    assert again["status"] == ("not run: 'vit-seed bfloat16 b1024 filling a cache', whose output it reads, "
                               "ended failed (1): RuntimeError: boom")
    # Its filler over the budget and itself within it: it waits for the filler, and the rerun command brings both.
    ran.clear()
    assert gpu_suite.main(["--smoke", "--part", "compile", "--cases", "the same program again", *common,
                           "--budget-s", "20"]) == 0
    filling, again = _cases_any(tmp_path / "r" / "compile.json")
    assert not ran and filling["status"].startswith("not run: budget: 32 s expected, 20 s left")
    assert again["status"] == ("not run: budget: 'vit-seed bfloat16 b1024 filling a cache', whose output it "
                               "reads, was not run; run them with --part compile --smoke --cases "
                               "'vit-seed bfloat16 b1024 filling a cache,the same program again'")


def test_the_commit_comes_from_commit_where_git_cannot_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device machine gets a copy of the tree without .git, and may have no git at all: --commit is recorded,
    and wins over git's answer where it is given (a copy inside another repository names that one's commit)."""
    assert gpu_suite.environment("abc1234")["commit"] == "abc1234"  # this checkout has git
    assert gpu_suite.environment()["commit"]
    monkeypatch.setattr(gpu_suite, "ROOT", tmp_path)  # a tree without git history
    assert gpu_suite.environment("abc1234")["commit"] == "abc1234"
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the machine
    assert gpu_suite.environment("abc1234")["commit"] == "abc1234"
    assert gpu_suite.environment()["commit"] is None


def test_a_variant_is_compared_with_its_own_reference(tmp_path: Path) -> None:
    """The LM's cudnn case is compared with the LM's fused run, not with the ViT's baseline that ran first: its
    losses agree with the one and are far from the other."""
    args = argparse.Namespace(smoke=True, cases="")
    record = gpu_suite.Part("variants-bf16", tmp_path, ENV, True, False)
    run = gpu_suite.PartRun("variants-bf16", args, tmp_path, tmp_path / "w", gpu_suite.Sizes(True), record)
    cases = {c.name: c for c in gpu_suite.cases_for("variants-bf16", gpu_suite.Sizes(True), args, tmp_path,
                                                     tmp_path / "w")}
    rows = {}
    for name, losses in (("baseline", [2.3, 2.2]), (gpu_suite.LM_FUSED, [6.2, 6.1]),
                         (gpu_suite.LM_CUDNN, [6.2, 6.1 * (1 + 1e-3)])):
        folder = tmp_path / name.replace(" ", "_")
        (folder / "tensorboard").mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"measurements": {"platform": "cpu"}}))
        (folder / "tensorboard" / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": i + 1, "train/loss": v}) + "\n" for i, v in enumerate(losses)))
        rows[name] = {"name": name, "status": "ok"}
        gpu_suite.finish(run, cases[name], rows[name], folder, 0)
    assert "losses_agree" not in rows["baseline"] and "losses_agree" not in rows[gpu_suite.LM_FUSED]
    assert rows[gpu_suite.LM_CUDNN]["losses_agree"] is True
    assert rows[gpu_suite.LM_CUDNN]["loss_rel_diff"] == pytest.approx(1e-3)


def test_the_profile_part_takes_the_fastest_switch_of_the_baselines_model(tmp_path: Path) -> None:
    """The LM's pair steps faster than the ViT by its size: the profile part must not take it for the fastest
    variant (it would profile the baseline under the LM's name)."""
    rows = [{"name": "baseline", "step_ms": 31.4, "same_model": True},
            {"name": "attention fused", "step_ms": 34.3, "same_model": True, "losses_agree": True},
            {"name": "qkv split", "step_ms": 30.9, "same_model": True, "losses_agree": False},
            {"name": "pool mean", "step_ms": 30.0, "same_model": False},
            {"name": gpu_suite.LM_FUSED, "step_ms": 5.0, "same_model": True},
            {"name": gpu_suite.LM_CUDNN, "step_ms": 4.0, "same_model": True, "losses_agree": True}]
    (tmp_path / "variants-bf16.json").write_text(json.dumps({"cases": rows}))
    assert gpu_suite.best_variant(tmp_path / "variants-bf16.json") == "baseline"
    rows[1]["step_ms"] = 30.5
    (tmp_path / "variants-bf16.json").write_text(json.dumps({"cases": rows}))
    assert gpu_suite.best_variant(tmp_path / "variants-bf16.json") == "attention fused"


def test_a_stopped_suite_stops_its_case_and_marks_the_part_cut_off(tmp_path: Path) -> None:
    """SIGTERM while a case runs (a `timeout` on the GPU machine): the case's processes end with the suite (none
    is left to share the GPU with the next part), the exit status is 143, and the part's page says it was cut
    off, which case was stopped and which never started."""
    work = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, str(SUITE), "--smoke", "--part", "compile", "--out", str(tmp_path / "r"),
                             "--work", str(work)], env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the first case has started its process
        if line.startswith("[compile] vit-seed float32 b128 cold ..."):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "gpu_suite: the suite was stopped (SIGTERM) during --part compile" in err
    left = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True).stdout.split()
    assert not left, left  # no shardbench process of the suite's left running
    record = json.loads((tmp_path / "r" / "compile.json").read_text())
    statuses = [c["status"] for c in record["cases"]]
    assert record["finished"] is False and statuses[0].startswith("stopped: the suite was stopped (SIGTERM)")
    assert statuses[1:] == 3 * ["not run: the suite was stopped (SIGTERM)"], statuses
    assert "**Cut off: this part did not run to its end" in (tmp_path / "r" / "compile.md").read_text()


def test_a_case_not_run_leaves_nothing_of_an_earlier_run(tmp_path: Path) -> None:
    """A case that is not run this time (the budget) keeps no earlier run's section or published files: bench's
    tables and bench-raw.json, plan's validation, a recipe's curve."""
    out, work = tmp_path / "r", tmp_path / "w"
    out.mkdir()
    for name in ("bench-raw.json", "plan-validation.json", "accuracy-recipe-vit-cifar.png"):
        (out / name).write_text("an earlier run's")
    (out / "bench.json").write_text(json.dumps({"part": "bench", "smoke": True, "cases": [
        {"name": "bench step group", "status": "ok"}], "sections": {"bench step group": "## TABLE A"}}))
    for part in ("bench", "plan", "accuracy"):
        assert gpu_suite.main(["--smoke", "--part", part, "--out", str(out), "--work", str(work),
                               "--budget-s", "0"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.suffix not in (".json", ".md") or "-" in p.stem) == []
    assert "TABLE A" not in (out / "bench.md").read_text()
    assert gpu_suite.main(["--smoke", "--part", "bench", "--cases", "bench step group", "--out", str(out),
                           "--work", str(work), "--budget-s", "0"]) == 0  # so too with --cases
    assert "TABLE A" not in (out / "bench.md").read_text()


def test_rerun_commands_run_as_printed_and_replace_only_their_rows(tmp_path: Path) -> None:
    """The accuracy part's rerun command keeps the other recipes' rows (--recipe all --cases), and every rerun
    command carries the flags the run needs: --smoke, --data-path, --commit."""
    args = argparse.Namespace(smoke=True, recipe="all", data_path="", commit="")
    every = gpu_suite.cases_for("accuracy", gpu_suite.Sizes(True), args, tmp_path, tmp_path / "w")
    flags = gpu_suite.rerun_command("accuracy", ["recipe vit-cifar-spt"], every, args)
    assert flags == "--part accuracy --smoke --recipe all --cases 'recipe vit-cifar-spt'"
    # Run as printed (with the same --out), it keeps the row of the recipe that ran before.
    out = tmp_path / "r"
    out.mkdir()
    (out / "accuracy.json").write_text(json.dumps({"part": "accuracy", "smoke": True, "date": "d0", "cases": [
        {"name": "recipe vit-cifar", "status": "ok"}, {"name": "recipe vit-cifar-spt", "status": "not run"}]}))
    assert gpu_suite.main([*shlex.split(flags), "--out", str(out), "--work", str(tmp_path / "w"),
                           "--budget-s", "0"]) == 0
    rows = {c["name"]: c["status"] for c in _cases_any(out / "accuracy.json")}
    assert rows["recipe vit-cifar"] == "ok" and rows["recipe vit-cifar-spt"].startswith("not run: budget")
    gpu = argparse.Namespace(smoke=False, recipe="vit-cifar", data_path="data/cifar.tar.gz", commit="abc1234")
    assert gpu_suite.rerun_command("accuracy", ["recipe vit-cifar"], (), gpu) == (
        "--part accuracy --recipe all --data-path data/cifar.tar.gz --cases 'recipe vit-cifar' --commit abc1234")


def test_smoke_accuracy_batches_fit_every_recipe() -> None:
    """--smoke --recipe all: the smoke batch is a multiple of each recipe's --data.repeat-augment (vit-cifar-spt
    repeats each image 3 times and refuses a batch of 16)."""
    from shardbench.presets import get_preset

    cases = gpu_suite.accuracy_cases(gpu_suite.Sizes(True), argparse.Namespace(recipe="all"))
    assert len(cases) == len(gpu_suite.recipes()) >= 3
    for case in cases:
        batch = int(case.argv[case.argv.index("--batch-size") + 1])
        repeats = get_preset(case.name.removeprefix("recipe ")).data.repeat_augment
        assert batch % repeats == 0, (case.name, batch, repeats)
        assert case.argv[case.argv.index("--train.compile-cache") + 1] == "off"  # no user's cache read or filled


def test_earlier_rows_of_the_other_kind_of_run_are_not_kept(tmp_path: Path) -> None:
    """A GPU --cases rerun into a folder of smoke results does not keep the CPU rows under a GPU header, and a
    failure among rows kept from an earlier run is not this run's."""
    (tmp_path / "compile.json").write_text(json.dumps({"part": "compile", "smoke": True, "date": "d0", "cases": [
        {"name": "the same program again", "status": "ok"}]}))
    gpu = gpu_suite.Part("compile", tmp_path, ENV, False, True)
    assert gpu.record["cases"] == [] and "were not kept: this run is a GPU run" in gpu.record["notes"][0]
    (tmp_path / "compile.json").write_text(json.dumps({"part": "compile", "smoke": True, "date": "d0", "cases": [
        {"name": "a", "status": "failed (1): boom"}, {"name": "b", "status": "ok"}]}))
    smoke = gpu_suite.Part("compile", tmp_path, ENV, True, True)
    assert len(smoke.record["cases"]) == 2
    smoke.add({"name": "b", "status": "ok"})
    assert smoke.failures() == []  # a's row is the earlier run's
    smoke.add({"name": "a", "status": "failed (1): boom again"})
    assert smoke.failures() == ["compile/a: failed (1): boom again"]


def test_the_earlier_run_is_named_while_one_of_its_rows_is_on_the_page(tmp_path: Path) -> None:
    """A --cases rerun names the earlier run whose rows it keeps, and stops naming it once it replaced them all."""
    (tmp_path / "plan.json").write_text(json.dumps({"part": "plan", "smoke": True, "date": "d0", "commit": "c0",
                                                    "cases": [{"name": "sweep", "status": "not run: budget"}]}))
    part = gpu_suite.Part("plan", tmp_path, ENV, True, True)
    part.write()
    assert "are from the run of d0, commit c0" in (tmp_path / "plan.md").read_text()
    part.add({"name": "sweep", "status": "ok"})
    assert "from the run of" not in (tmp_path / "plan.md").read_text()
    assert not any("from the run of" in n for n in json.loads((tmp_path / "plan.json").read_text())["notes"])


def test_sections_keep_the_rows_order_and_bench_headings_sit_below_the_part() -> None:
    record = {"part": "profile", "smoke": True, "date": "d", "commit": "c", "device": "cpu", "notes": [],
              "cases": [{"name": "baseline", "status": "ok"}, {"name": "qkv split", "status": "ok"}],
              "sections": {"qkv split": "### Kernels: qkv split", "baseline": "### Kernels: baseline"}}
    page = gpu_suite.render_part(record)
    assert page.index("### Kernels: baseline") < page.index("### Kernels: qkv split")
    assert gpu_suite.demoted("# bench\n## Train step\n```\n# a comment\n```\ntext") == (
        "### bench\n#### Train step\n```\n# a comment\n```\ntext")


def test_the_plan_part_reruns_in_the_same_work_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its sweep starts from an empty folder (a second run failed: "already holds a sweep", then validated the old
    one), the validation waits on the sweep, and a `plan --validate` that did not finish publishes nothing."""
    out, work = tmp_path / "r", tmp_path / "w"
    out.mkdir()
    args = argparse.Namespace(smoke=True, cases="")
    sweep, validate = gpu_suite.cases_for("plan", gpu_suite.Sizes(True), args, out, work)
    assert validate.needs == sweep.name
    record = gpu_suite.Part("plan", out, ENV, True, False)
    run = gpu_suite.PartRun("plan", args, out, work, gpu_suite.Sizes(True), record)
    run.logs.mkdir(parents=True)
    earlier = work / "plan-sweep"
    (earlier / "runs").mkdir(parents=True)
    (earlier / "plan-validation.json").write_text('{"an": "earlier sweep"}')

    def fake_run_process(argv: list[str], log: Path, timeout: float, smoke: bool) -> tuple[int, float, str]:
        log.write_text("plan: error\n")
        return 1, 1.0, "plan: error"

    monkeypatch.setattr(gpu_suite, "run_process", fake_run_process)
    gpu_suite.run_case(run, sweep, {"name": sweep.name}, 10.0)
    assert not earlier.exists()  # cleared before the sweep ran
    earlier.mkdir()
    (earlier / "plan-validation.json").write_text('{"a": "validation"}')
    (run.logs / f"{gpu_suite.slug(validate.name)}.log").write_text("its output\n")
    gpu_suite.finish(run, validate, {"name": validate.name, "status": "failed (1): x"}, tmp_path / "none", 1)
    assert not (out / "plan-validation.json").exists()
    gpu_suite.finish(run, validate, {"name": validate.name, "status": "ok"}, tmp_path / "none", 0)
    assert (out / "plan-validation.json").read_text() == '{"a": "validation"}'
