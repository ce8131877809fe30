"""The GPU suite's every part runs on a CPU at tiny sizes (`--smoke`), writing what a GPU run would write;
a part whose budget runs out lists what it skipped with the command that runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_suite  # noqa: E402

pytestmark = pytest.mark.slow  # every test here starts processes or trains for tens of seconds


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("suite")
    done = subprocess.run([sys.executable, str(SUITE), "--smoke", "--out", str(out / "results"),
                           "--work", str(out / "work")], env=dict(os.environ), capture_output=True, text=True,
                          timeout=900)
    # The suite exits 1 when any case failed or timed out: 0 here means every case of every part ran or was refused.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "results"


def _cases(results: Path, part: str) -> dict[str, dict]:
    record = json.loads((results / f"{part}.json").read_text())
    assert record["part"] == part and record["smoke"] and record["commit"] and record["device"]
    return {c["name"]: c for c in record["cases"]}


def test_every_part_writes_its_files(smoke: Path) -> None:
    for part in gpu_suite.PARTS:
        text = (smoke / f"{part}.md").read_text()
        assert text.startswith(f"## {part} (smoke run") and "commit" in text
        cases = _cases(smoke, part)
        assert cases, part
        # Every case ran: only cuDNN's attention, which a CPU cannot run, is refused; nothing failed, timed out
        # or was skipped.
        for name, c in cases.items():
            ran = c["status"].startswith("refused: ") if name == "attention cudnn" else c["status"] == "ok"
            assert ran, (part, name, c["status"])
    # the results folder stays small: runs, logs and caches went to --work
    assert not list(smoke.rglob("*.xplane.pb")) and not list(smoke.rglob("checkpoints"))


def test_variants_compare_with_the_baseline(smoke: Path) -> None:
    for part in ("variants-bf16", "variants-f32"):
        cases = _cases(smoke, part)
        assert cases["baseline"]["status"] == "ok" and len(cases["baseline"]["losses"]) >= 3
        if part == "variants-bf16":  # variants-f32's smoke run repeats only the refusal, which differs
            assert cases["qkv split"]["losses_agree"] is True  # the same arithmetic, another layout
            assert cases["cudnn layernorm"]["status"] == "ok"
            assert "--xla_gpu_enable_cudnn_layer_norm=true" in cases["cudnn layernorm"]["xla_flags"]
        else:
            assert set(cases) == {"baseline", "attention cudnn"}
        # cuDNN's attention cannot run on a CPU: refused in one line, before compiling
        assert cases["attention cudnn"]["status"].startswith("refused: ")
        assert "cudnn" in cases["attention cudnn"]["status"].lower()
        ok = [c for c in cases.values() if c["status"] == "ok"]
        for c in ok:  # throughput is the batch over the median step
            batch = int(c["command"].split("--batch-size ")[1].split()[0])
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
    assert json.loads((smoke / "plan-validation.json").read_text())
    assert "mean absolute error" in (smoke / "plan.md").read_text()
    accuracy = _cases(smoke, "accuracy")["recipe vit-cifar"]
    assert 0.0 <= accuracy["test_accuracy"] <= 1.0
    assert (smoke / "accuracy-recipe-vit-cifar.png").stat().st_size > 1000
    assert "shardbench bench" in (smoke / "bench.md").read_text()
    page = gpu_suite.collect(smoke)
    assert all(f"## {part} (smoke run" in page for part in gpu_suite.PARTS)


def test_a_part_out_of_budget_lists_what_it_skipped(tmp_path: Path) -> None:
    assert gpu_suite.main(["--part", "compile", "--out", str(tmp_path / "r"), "--work", str(tmp_path / "w"),
                           "--budget-s", "0"]) == 0
    cases = _cases_any(tmp_path / "r" / "compile.json")
    assert len(cases) == 12 and all(c["status"].startswith("skipped:") for c in cases)
    assert "--part compile --cases 'lm-seed float32 cold'" in (tmp_path / "r" / "compile.md").read_text()


def test_a_case_that_fails_or_times_out_makes_the_suite_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    case = "mlp-small float32 cold"

    def suite(name: str) -> int:
        return gpu_suite.main(["--part", "compile", "--cases", case, "--out", str(tmp_path / name / "r"),
                               "--work", str(tmp_path / name / "w"), "--case-timeout-s", "0.5"])

    # A real process past its timeout: shardbench cannot even import JAX in half a second.
    assert suite("timeout") == 1
    err = capsys.readouterr().err
    assert f"compile/{case}: timed out after" in err
    assert _cases_any(tmp_path / "timeout" / "r" / "compile.json")[0]["status"].startswith("timed out")

    def exits(code: int) -> Callable[..., tuple[int, float, str]]:
        def run(argv: list[str], log: Path, timeout: float, smoke: bool) -> tuple[int, float, str]:
            log.write_text("shardbench: internal error: ...\n")
            return code, 0.1, "shardbench: internal error: ..."
        return run

    monkeypatch.setattr(gpu_suite, "run_process", exits(70))  # a bug in shardbench, without spending a process
    assert suite("failed") == 1
    assert f"compile/{case}: failed (70): shardbench: internal error" in capsys.readouterr().err
    monkeypatch.setattr(gpu_suite, "run_process", exits(2))  # a refusal is an answer: the suite still succeeds
    assert suite("refused") == 0 and capsys.readouterr().err == ""


def _cases_any(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cases"]
