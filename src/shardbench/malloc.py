"""glibc allocator settings that keep XLA's CPU buffers off the page-fault path.

XLA's CPU runtime takes every step's temporaries and outputs from `malloc`. glibc serves large
blocks with fresh `mmap`s, so each step touches hundreds of megabytes of new 4 KiB pages: one
`x + 1` on a 51 MB array spends two thirds of its 45 ms in 12,500 page faults on a 2-core EPYC.
Asking glibc to back large blocks with transparent huge pages (`glibc.malloc.hugetlb=1`, glibc
>= 2.35) cuts the faults 26x (13 ms for the same op), and raising the mmap and trim thresholds lets
freed blocks be reused instead of returned to the kernel.

glibc reads `GLIBC_TUNABLES` only when a process starts, so the `shardbench` command re-executes
itself once with the variable set (`maybe_reexec`), before JAX is imported. Processes it starts
(sweep runs) inherit it. `SHARDBENCH_MALLOC=default` turns all of this off.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

TUNABLES: dict[str, str] = {
    "glibc.malloc.hugetlb": "1",  # madvise(MADV_HUGEPAGE) on mmap'd blocks: 2 MiB pages
    "glibc.malloc.mmap_threshold": str(1 << 30),  # serve blocks up to 1 GiB from the reusable heap
    "glibc.malloc.trim_threshold": str(1 << 34),  # and do not hand freed heap back to the kernel
}
OPT_OUT = "SHARDBENCH_MALLOC"
_MARKER = "SHARDBENCH_MALLOC_TUNED"


def applies(environ: Mapping[str, str]) -> bool:
    """Linux with glibc, and not turned off."""
    if environ.get(OPT_OUT, "").lower() == "default":
        return False
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def tuned_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with our tunables added to GLIBC_TUNABLES; tunables the user set already win."""
    env = dict(environ)
    given = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    names = {t.split("=", 1)[0] for t in given}
    added = [f"{k}={v}" for k, v in TUNABLES.items() if k not in names]
    env["GLIBC_TUNABLES"] = ":".join(given + added)
    env[_MARKER] = "1"
    return env


def maybe_reexec() -> None:
    """Re-run this very command line once with the tuned allocator; returns only if already tuned
    (or not applicable). Call before importing JAX: nothing is lost by replacing the process."""
    if os.environ.get(_MARKER) or not applies(os.environ):
        return
    argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *argv[1:]], tuned_environ(os.environ))
    except OSError:
        return  # cannot re-exec (unusual interpreter setup): run with the default allocator
