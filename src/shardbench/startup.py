"""A program's start: the collector waits while it imports.

Importing what a command needs (JAX, flax, optax, orbax, grain and shardbench's own modules) makes hundreds of
thousands of objects that live as long as the process. Python's cyclic garbage collector walks them again and again
while they are being made, and again at each of its later full collections: 0.5 to 0.7 CPU seconds of a short
command on a 2-core host (benchmarks/startup-cpu.md). Inside `quiet_imports` the collector waits; at its end, what the
imports made goes to the permanent generation (`gc.freeze`) and the collector runs again, walking only what the
run itself makes from then on.

Only a program does this (`shardbench ...`, and the worker processes shardbench starts as `python -m
shardbench.startup MODULE`, after `begin_program`): a Python process that calls `shardbench.cli.main` keeps its
collector as it was, as its own objects are not ours to freeze.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Iterator

_program = False


def begin_program() -> None:
    """This process is a shardbench program: later `quiet_imports` blocks quiet the collector."""
    global _program
    _program = True


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """In a program whose collector runs: no collection while the block imports, and what it made frozen at its
    end (also when it raises). Elsewhere, or nested in another, nothing changes."""
    if not (_program and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def main(argv: list[str]) -> int:
    """`python -m shardbench.startup MODULE`: MODULE's `main()` as this program, MODULE imported with the collector
    quiet. The worker processes shardbench starts for itself (a sweep's configuration check, the plan's compile
    workers) run so."""
    begin_program()
    with quiet_imports():
        module = importlib.import_module(argv[0])
    return module.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
