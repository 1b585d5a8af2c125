"""Rebuild the tests and tables of evaluated folders from their summaries alone.

The command: ``python -m morlfed.analysis.rebuild DIR [DIR ...]``.

``python -m morlfed.analysis.evaluate`` writes a folder's ``summary.csv`` (one row per run, every
metric) from run directories, then ``stats.csv`` and ``comparison.md`` from that summary. A
committed study keeps the summary but not always its run directories; this command rewrites each
``DIR``'s ``stats.csv`` and ``comparison.md`` (``vision_stats.csv`` too, from a
``vision_summary.csv``) from the summary alone, as ``analysis.evaluate`` would with the same
``--metrics``, ``--decimals``, ``--reference`` and ``--level``, e.g. after the paired tests
changed. The summaries themselves are never written. A rebuilt ``comparison.md`` lists no skipped
run directories: a summary does not know them.

Exit status: 0 ok, 1 a ``DIR`` without a summary, 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from morlfed.analysis.arguments import add_table_arguments, check_table_arguments
from morlfed.analysis.campaign import Campaign
from morlfed.analysis.comparison import write_comparison
from morlfed.core.commands import python
from morlfed.core.console import one_line_warnings

PROG = "analysis.rebuild"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=python("-m", f"morlfed.{PROG}"),
        description="Rewrite stats.csv and comparison.md of folders written by analysis.evaluate from their "
        "summary.csv (and vision_summary.csv) alone.",
    )
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="folders holding a summary.csv")
    add_table_arguments(p)
    return p


def summary_campaign(summary: pd.DataFrame) -> Campaign:
    """The :class:`~morlfed.analysis.campaign.Campaign` that ``comparison.md`` needs, from a committed summary.

    Its rows are those of the ``summary.csv``, with the returns they were evaluated on (the tables
    read the reference fronts from the summary's columns, so none is rebuilt).

    :param summary: ``summary.csv`` rows, all of one kind of returns
    """
    kinds = sorted(summary["returns"].unique())
    if len(kinds) != 1:
        raise ValueError(f"a summary evaluates one kind of returns, this one has {', '.join(kinds)}")
    return Campaign(summary, {}, kinds[0])


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 ok, 1 a folder without a summary, 2 usage error).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    one_line_warnings(PROG)  # Python's warnings as one line each, no source
    parser = _parser()
    args = parser.parse_args(argv)
    check_table_arguments(parser, args)
    status = 0
    for folder in args.dirs:
        rl, vision = folder / "summary.csv", folder / "vision_summary.csv"
        if not rl.is_file() and not vision.is_file():
            print(f"{PROG}: error: {folder} holds no summary.csv or vision_summary.csv", file=sys.stderr)
            status = 1
            continue
        campaign = summary_campaign(pd.read_csv(rl)) if rl.is_file() else None
        vision_summary = pd.read_csv(vision) if vision.is_file() else None
        written = write_comparison(
            folder, campaign, vision_summary, (), args.metrics, args.decimals, args.reference, args.level
        )
        print(f"{folder}: wrote {', '.join(p.name for p in written)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
