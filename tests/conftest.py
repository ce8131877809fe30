"""Test setup: 8 simulated CPU devices, set before JAX starts, and small configurations to train quickly."""

from __future__ import annotations

import os

# XLA:CPU's quickest code generation for the programs these tests compile, in this process and in those it starts
# with XLA_FLAGS of their own: LLVM at -O0, and fusions emitted by the older elemental emitters rather than the
# MLIR fusion emitters: the in-process files of compiled runs take about half the time (docs/development.md). What
# the tests check is not code generation's to change: the SPMD partitioning, the shardings and the collectives come
# before it; buffer sizes differ by a few bytes in a megabyte, within every bound the tests hold; and equalities
# are between runs compiled alike. Steps run slower: a test whose time is its steps trains in a process of its own.
# And LLVM's module compiled as one piece, not split for parallel code generation: with one test worker per core
# there is no idle core for the pieces, and each piece costs passes of its own (two in-process files took 0.87x
# their CPU seconds; benchmarks/test-suite-cpu.md).
QUICK_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                       "--xla_cpu_parallel_codegen_split_count=1")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 "
                           + QUICK_COMPILE_FLAGS).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Hermetic: a run given no --data.cache-dir caches under $SHARDBENCH_CACHE, else ~/.cache/shardbench, the user's
# own. The tests' runs (and the processes they start, which inherit it) use a folder of this test process's,
# removed at its end: they neither fill the user's cache nor read what an earlier run left there (the host's
# peak, decoded images, compiled programs). A SHARDBENCH_CACHE set by the caller is kept.
if "SHARDBENCH_CACHE" not in os.environ:
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    os.environ["SHARDBENCH_CACHE"] = tempfile.mkdtemp(prefix="shardbench-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["SHARDBENCH_CACHE"], ignore_errors=True)

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NoReturn  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from shardbench import config as config_lib  # noqa: E402
from shardbench.parsing import override  # noqa: E402
from shardbench.presets import get_preset  # noqa: E402

assert len(jax.devices()) == 8, "tests need 8 simulated CPU devices; XLA_FLAGS was set too late"


# The slowest test files first, longest first: `make test` hands whole files to its workers in collection order, so
# the long ones start early and the short ones fill in at the end, and the workers finish together rather than one
# waiting on a long file that started last. CPU seconds of the heaviest, each file alone with -n 1 on the 2-core
# machine (2026-11-25): processes ~160, the GPU suite's smoke run ~140, equivalence ~125, pipeline equivalence ~55;
# speed options ~155 and SLURM ~120 (mostly waiting on jobs), seconds in the full suite as measured before; the
# README's commands ~30.
SLOWEST_FIRST = ("test_processes.py", "test_gpu_suite.py", "test_equivalence.py", "test_speed_options.py",
                 "test_pipeline_equivalence.py",
                 "test_context_equivalence.py", "test_moe.py", "test_tune.py",
                 "test_slurm.py", "test_models_spmd.py", "test_sweep.py", "test_custom_model_state.py",
                 "test_recipe.py", "test_custom_model.py", "test_plan.py",
                 "test_recipe_policies.py", "test_resume.py", "test_speed_switches.py", "test_readme_commands.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FIRST)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def host_peak_measured_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The host's float32 matmul peak measured once per test process and handed to every run, in-process or
    started from here, through SHARDBENCH_PEAK_FILE, as a sweep hands its figure to its runs
    (`shardbench.measure.peak`). Each run's fresh --data.cache-dir would otherwise measure it again: a compile
    and six 1536^3 matmuls per run, a tenth of a small run's time. tests/test_measure.py checks a lone run's own
    measuring and host cache without it."""
    from shardbench.measure.peak import PEAK_FILE_ENV, measure

    if os.environ.get(PEAK_FILE_ENV):  # handed in from outside: leave it
        yield
        return
    path = tmp_path_factory.mktemp("host-peak") / "peak.json"
    peak = measure("float32")
    path.write_text(json.dumps({"float32": {k: v for k, v in peak.to_dict().items() if k != "origin"}}))
    os.environ[PEAK_FILE_ENV] = str(path)
    try:
        yield
    finally:
        os.environ.pop(PEAK_FILE_ENV, None)


def logged_losses(out: Path) -> list[float]:
    """The training losses a run logged, one per logged step, from its metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]


def lowered_train_step(cfg: config_lib.Config):
    """`cfg`'s train step lowered on abstract state and batch, as the planner compiles it (nothing is run)."""
    from shardbench.optim import build_optimizer
    from shardbench.plan.compile import abstract_batch
    from shardbench.preflight import check_run
    from shardbench.tasks import get_task
    from shardbench.train.spmd import make_steps
    from shardbench.train.state import abstract_train_state

    checked = check_run(cfg)
    tx = build_optimizer(cfg.optim, 10)
    batch = abstract_batch(cfg, checked.layout)
    steps = make_steps(cfg, get_task(cfg), checked.spec, checked.layout, tx, tuple(k for k in batch if k != "mask"))
    return steps.train.lower(abstract_train_state(checked.spec, checked.layout, tx), batch)


@contextlib.contextmanager
def held_by_another_process(folder: Path) -> Iterator[None]:
    """`folder` locked as a running sweep locks it, by a real process of its own until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from shardbench.store import lock_runs; held = lock_runs(Path(sys.argv[1]), 'sweep'); "
                               "print('held', flush=True); time.sleep(60)", str(folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def micro_config(tmp_path: Path, **overrides: object) -> config_lib.Config:
    """A ViT small enough to compile and step in a second or two, on small synthetic data."""
    cfg = get_preset("vit-tiny")
    cfg = dataclasses.replace(
        cfg,
        model=config_lib.ModelConfig(patch_size=8, embed_dim=32, num_layers=2, num_heads=4, mlp_dim=64, dropout=0.0),
        data=dataclasses.replace(cfg.data, dataset="synthetic", synthetic_train=512, synthetic_test=128,
                                 cache_dir=str(tmp_path / "cache")),
        train=dataclasses.replace(cfg.train, batch_size=32, steps=4, epochs=1, progress=False, eval=False,
                                  log_every=1, checkpoint_every=0, out=str(tmp_path / "run")),
    )
    return override(cfg, {k: v for k, v in overrides.items()})


@pytest.fixture
def micro(tmp_path: Path):
    def make(**overrides: object) -> config_lib.Config:
        return micro_config(tmp_path, **overrides)

    return make


# Tools some tests need that `make test` installs. A missing one fails those tests, so that CI cannot go green
# without them; only its variable set to 1 skips them, and the run's summary says so.
SKIP_VARIABLES = {"SHARDBENCH_SKIP_SLURM": "the SLURM executor's cluster tests",
                  "SHARDBENCH_SKIP_BROWSER": "the report's browser test",
                  "SHARDBENCH_SKIP_TORCH": "the PyTorch baseline tests"}


def skipped_on_request(variable: str) -> bool:
    return os.environ.get(variable, "") == "1"


def skip_if_requested(variable: str) -> None:
    if skipped_on_request(variable):
        pytest.skip(f"{variable}=1: {SKIP_VARIABLES[variable]} skipped on request")


def missing(variable: str, problem: str) -> NoReturn:
    """Fail a test whose tool is missing, saying how to install it or to skip it on purpose."""
    pytest.fail(f"{problem}; `make test` installs it, or set {variable}=1 to skip {SKIP_VARIABLES[variable]}",
                pytrace=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Beside the short summary's skip reasons (-ra), one line per tool left out on purpose."""
    for variable, what in SKIP_VARIABLES.items():
        if skipped_on_request(variable):
            terminalreporter.write_line(f"skipped on request: {variable}=1 ({what})", yellow=True)


def as_from_a_terminal() -> None:
    """In a child before it starts (`preexec_fn`): Ctrl-C delivered and handled as from a user's shell. A suite
    started in the background by a shell (`&`) runs with SIGINT ignored, and a child keeps that (the driver of a
    SLURM sweep, a launch: they never saw the test's SIGINT and ran on to their end or time limit), while the same
    test alone got it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
