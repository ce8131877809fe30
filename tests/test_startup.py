"""A program's imports run with the collector quiet, and what they made is frozen; a Python caller's collector is
left as it was. Each check runs in a process of its own: freezing the test worker's objects would keep them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # processes of their own


def _run(code: str, platforms: str | None = "cpu") -> str:
    """`code`'s output, run in a Python process of its own with JAX_PLATFORMS=`platforms` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env if platforms is None else {**env, "JAX_PLATFORMS": platforms}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_quiet_imports_waits_and_freezes_only_in_a_program() -> None:
    out = _run("""
        import gc
        from shardbench import startup

        with startup.quiet_imports():  # not a program: nothing changes
            print("caller", gc.isenabled(), gc.get_freeze_count())
        startup.begin_program()
        with startup.quiet_imports():
            print("inside", gc.isenabled())
            with startup.quiet_imports():  # nested: the outer block's
                print("nested", gc.isenabled())
            print("after nested", gc.isenabled(), gc.get_freeze_count())
            import json.decoder  # noqa: F401
        print("after", gc.isenabled(), gc.get_freeze_count() > 0)
        gc.unfreeze()
        try:
            with startup.quiet_imports():
                raise ValueError
        except ValueError:
            print("raised", gc.isenabled(), gc.get_freeze_count() > 0)
        gc.disable()  # a program whose collector is off keeps it off
        with startup.quiet_imports():
            pass
        print("off", gc.isenabled())
    """)
    assert out.split("\n") == ["caller True 0", "inside False", "nested False", "after nested False 0",
                               "after True True", "raised True True", "off False", ""]


def test_the_command_line_imports_with_the_collector_quiet_and_a_python_caller_does_not() -> None:
    out = _run("""
        import gc, sys
        from shardbench.cli import main

        main(["presets"])  # called from Python: the caller's collector
        print("gc:", gc.isenabled(), gc.get_freeze_count())
        sys.argv = ["shardbench", "presets"]
        main()  # as the `shardbench` program runs it
        print("gc:", gc.isenabled(), gc.get_freeze_count() > 10000)
    """)
    assert [line for line in out.split("\n") if line.startswith("gc:")] == ["gc: True 0", "gc: True True"], out[-2000:]


def test_a_worker_started_through_startup_imports_its_module_quiet_then_runs_its_main(tmp_path: Path) -> None:
    """`python -m shardbench.startup MODULE` (how shardbench starts a sweep's configuration check and the plan's
    compile workers): MODULE is imported with the collector off, its main runs with it on and the imports frozen,
    and main's return is the exit status."""
    (tmp_path / "a_worker.py").write_text(textwrap.dedent("""
        import gc
        print("importing", gc.isenabled())

        def main():
            print("main", gc.isenabled(), gc.get_freeze_count() > 0)
            return 3
    """))
    done = subprocess.run([sys.executable, "-m", "shardbench.startup", "a_worker"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
                          timeout=300)
    assert (done.returncode, done.stdout) == (3, "importing False\nmain True True\n"), done.stderr[-2000:]


def test_a_configuration_check_leaves_the_input_pipelines_libraries_unimported() -> None:
    """What a sweep's pre-flight child imports and asks of each configuration (`check_runnable`, the batch
    against the data; the planner and tune ask the same) imports neither grain nor orbax, which grain imports;
    the input pipeline, which makes the batches, imports grain."""
    out = _run("""
        import sys
        from shardbench.parsing import override
        from shardbench.presets import get_preset
        from shardbench.sweep import preflight  # the child's own module, and what its check imports:
        from shardbench.capacity import check_fits  # noqa: F401
        from shardbench.data.sources import known_train_rows  # noqa: F401
        from shardbench.errors import ShardbenchError  # noqa: F401
        from shardbench.flags import setup_devices  # noqa: F401
        from shardbench.parallel.checks import layout_notes  # noqa: F401
        from shardbench.preflight import check_batch_fits_data, check_runnable

        cfg = override(get_preset("mlp-small"), {"parallel.devices": 1})
        check_runnable(cfg)
        print("steps", check_batch_fits_data(cfg, 10_000, "regression"))
        print("checked:", sorted(m for m in ("grain", "orbax") if m in sys.modules))
        import shardbench.data.pipeline  # noqa: F401
        print("pipeline:", "grain" in sys.modules)
    """)
    assert [line for line in out.split("\n") if ":" in line] == ["checked: []", "pipeline: True"], out


HEAVY = ("jax", "flax", "optax", "orbax", "grain", "numpy")


@pytest.mark.parametrize("platforms", ["cpu", None])
def test_the_command_line_reads_and_refuses_its_arguments_before_importing_jax(platforms: str | None,
                                                                              tmp_path: Path) -> None:
    """Building the parser (every command's flags and help, the strategies' table) and refusing a value by its
    declaration or by a rule between fields import none of JAX's libraries, nor numpy: such a command ends in a
    fraction of the seconds they take to import (benchmarks/data/cli-startup/). A configuration that passes those
    checks goes on to the models' own rules, which import them. So also without JAX_PLATFORMS, where the `tpu`
    extra (which `make test` installs) has the command line ask whether the host has a TPU: only where JAX will
    start."""
    out = _run(f"""
        import sys
        from shardbench.cli import build_parser, main

        build_parser()
        print("> parser", [m for m in {HEAVY} if m in sys.modules])
        print("> presets", main(["presets"]), [m for m in {HEAVY} if m in sys.modules])
        for argv in (["train", "--steps", "-1"], ["train", "--model.kind", "cnn"],
                     ["train", "--preset", "mlp-small", "--data.cutmix", "1"], ["inspect", "--strategy", "xp"],
                     ["plan", "--preset", "mlp-small", "--target", "8xh900", "--out", "{tmp_path / 'p'}"],
                     ["plan", "--preset", "mlp-small", "--target", "8xh100", "--candidates", "dp,fsdp",
                      "--batch-size", "12", "--out", "{tmp_path / 'p'}"]):
            print("> refused", main(argv), [m for m in {HEAVY} if m in sys.modules])
        # cuDNN's attention in float32: the model's own rule, which its module (flax, JAX) holds
        print("> model", main(["train", "--preset", "vit-tiny", "--model.attention", "cudnn", "--dtype", "float32"]),
              "flax" in sys.modules)
    """, platforms)
    assert [line[2:] for line in out.split("\n") if line.startswith("> ")] == [
        "parser []", "presets 0 []", *6 * ["refused 2 []"], "model 2 True"], out[-2000:]


def test_a_train_its_fields_refuse_is_not_started_again_for_the_allocator() -> None:
    """`shardbench train` starts itself again for the tuned allocator (`malloc.maybe_reexec`) only for a run that
    will train: one refused by its fields is refused at once, in the first process."""
    from shardbench.cli import _train_steps, build_parser, parse

    parser = build_parser()
    assert _train_steps(parse(parser, ["train", "--steps", "30"])) == 30
    assert _train_steps(parse(parser, ["train", "--epochs", "2"])) == 0
    assert _train_steps(parse(parser, ["train", "--steps", "-1"])) is None
    assert _train_steps(parse(parser, ["train", "--steps", "30", "--data.cutmix", "1"])) is None  # needs --data.mixup
    assert _train_steps(parse(parser, ["sweep", "--preset", "strategies"])) is None
