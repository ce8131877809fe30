"""The lines `shardbench sweep` prints: one per finished run as it ends, and the summary table at the end,
in the report's own columns and formats."""

from __future__ import annotations

from shardbench.report.content import COLUMNS, fixed, number, reported, shown
from shardbench.store import RunRow

TERMINAL_KEYS = ("run", "status", "epoch_s", "step_ms_median", "img_s", "tokens_s", "examples_s", "mfu_pct",
                 "mem_mib", "comms_mib", "test_acc_pct", "test_loss")


def status_text(row: RunRow) -> str:
    return row.status if row.status == "complete" else f"FAILED ({row.error_kind})"


def progress_line(index: int, total: int, row: RunRow) -> str:
    """`[3/9] mesh_4_2_batch_1024  complete  41.2s  1066 img/s  step 0.120s  mem 512.0 MiB (compiled) ...`"""
    head = f"[{index}/{total}] {row.name}"
    if row.status != "complete":
        return f"{head}  {status_text(row)}: {row.error}"
    run = reported(row)
    memory, source = run.memory
    step = run.step_median
    step_text = f"step {step:.3f}s" if step is not None else f"step time {run.why_not('step_time_s')}"
    return (f"{head}  complete  {fixed(number(run.rec.time_s), '.1f')}s  "
            f"{run.rate_text}  {step_text}  "
            f"mem {fixed(memory, '.1f')} MiB ({source})  comms {fixed(run.comms_mib, '.1f')} MiB")


def summary_table(rows: list[RunRow]) -> str:
    """The report's main columns at fixed width, names left-aligned and numbers right-aligned."""
    runs = [reported(row) for row in rows]
    columns = [c for c in shown(COLUMNS, runs) if c.key in TERMINAL_KEYS]
    body = [[status_text(row) if c.key == "status" else c.text(run) for c in columns]
            for row, run in zip(rows, runs, strict=True)]
    header = [c.label for c in columns]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if col.numeric else c.ljust(w)
                         for c, w, col in zip(cells, widths, columns, strict=True)).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(b) for b in body)])
