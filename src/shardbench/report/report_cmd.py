"""`shardbench report DIR`: write the Markdown, HTML and chart report of a sweep (or of any folder of runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from shardbench.config import SPECS

PRICES = "train.prices"


def add_parser(subparsers: Any) -> None:
    """Add the `report` sub-command to an argparse sub-parsers object."""
    parser = subparsers.add_parser(
        "report", help="write a Markdown + HTML report with charts for a sweep or a folder of runs",
        description="Read DIR/sweep.db (or, without one, every run directory below DIR: those with a summary.json, "
                    "and those without one listed as failed beside them; a folder of none but those is refused, "
                    "naming them) and write report.md, a self-contained report.html and "
                    "PNG charts into DIR/report.",
    )
    parser.add_argument("dir", metavar="DIR", type=Path, help="sweep directory (or any folder of run directories)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: DIR/report)")
    # The same flag as train's and plan's --prices, with the help its declaration gives (config.TrainConfig.prices).
    parser.add_argument(SPECS[PRICES].short, default=None, metavar="FILE",
                        help=f"{SPECS[PRICES].help}; given, every run is priced again with it")


def run(args: argparse.Namespace) -> int:
    """Write the report and print its files, the HTML page last (the one to open)."""
    # Imported here so that building the CLI parser does not load matplotlib.
    from shardbench.prices import prices_from_flag
    from shardbench.report.write import write_report

    prices = prices_from_flag(args.prices) if args.prices else None  # a bad table: one line, before any reading
    paths = write_report(args.dir, args.out, prices)
    if paths.incomplete:
        print(f"report: {len(paths.incomplete)} run folder(s) without summary.json (did not finish), listed as "
              f"failed: {', '.join(paths.incomplete)}", file=sys.stderr)
    if paths.skipped:
        print(f"report: left out {len(paths.skipped)} folder(s) whose config.json is not a shardbench run's: "
              f"{', '.join(paths.skipped)}", file=sys.stderr)
    if paths.pending:
        print(f"report: the sweep is unfinished: {len(paths.pending)} planned run(s) not recorded yet (report.md "
              f"says how to finish it)", file=sys.stderr)
    for path in (paths.markdown, paths.csv, *paths.charts.values(), paths.html):
        print(path)
    return 0
