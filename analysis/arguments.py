"""Command-line pieces the analysis commands share.

The arguments naming the runs, the output folder and the returns, the options of the comparison
tables and their tests, and the report of skipped run directories.
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections.abc import Sequence
from pathlib import Path

from morlfed.analysis.comparison import TABLE_ORDER
from morlfed.analysis.stats import LEVEL, REFERENCE
from morlfed.metrics import METRICS, RETURN_KINDS


def add_run_arguments(parser: argparse.ArgumentParser, returns_help: str) -> None:
    """Add the arguments every analysis command takes.

    They are ``RUN_DIR ...`` (``runs``), ``--out`` (:func:`default_out`) and ``--returns`` (default
    ``discounted``).

    :param parser: the command's parser
    :param returns_help: what the command does with the returns, ``--returns``' help before its
        default (``"returns plotted against the front"``)
    """
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories, folders holding them (e.g. a hydra multirun folder) or globs",
    )
    parser.add_argument(
        "--out", type=Path, help="output directory (default: RUN_DIR when exactly one directory is given)"
    )
    parser.add_argument(
        "--returns",
        choices=RETURN_KINDS,
        default="discounted",
        help=f"{returns_help} (default: discounted)",
    )


def add_table_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``comparison.md`` and ``stats.csv``.

    They are ``--metrics``, ``--decimals``, ``--reference`` and ``--level`` (checked by
    :func:`check_table_arguments`).

    :param parser: the command's parser
    """
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=list(METRICS),
        metavar="METRIC",
        help=f"metrics of comparison.md, in order (default: {' '.join(TABLE_ORDER)})",
    )
    parser.add_argument("--decimals", type=int, default=2, help="decimals shown in comparison.md (default: 2)")
    parser.add_argument(
        "--reference",
        default=REFERENCE,
        help=f"the variant every other is tested against, a glob over labels (default: {REFERENCE})",
    )
    parser.add_argument(
        "--level", type=float, default=LEVEL, help=f"significance level of the paired tests (default: {LEVEL})"
    )


def check_table_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Report a usage error for a negative ``--decimals`` or a ``--level`` outside (0, 1).

    :param parser: the command's parser (reports the usage error)
    :param args: its parsed arguments
    """
    if args.decimals < 0:
        parser.error(f"--decimals must be >= 0, got {args.decimals}")
    if not 0.0 < args.level < 1.0:
        parser.error(f"--level must be in (0, 1), got {args.level}")


def default_out(parser: argparse.ArgumentParser, runs: Sequence[str], out: Path | None) -> Path:
    """``--out``, else the single directory argument; a usage error otherwise.

    A ``RUN_DIR`` argument that is no glob and does not exist is a usage error that names it.

    :param parser: the command's parser (reports the usage error)
    :param runs: the ``RUN_DIR`` arguments
    :param out: the ``--out`` argument, if given
    """
    missing = [r for r in runs if not glob.has_magic(r) and not Path(r).exists()]
    if missing:
        parser.error(f"{', '.join(missing)}: no such file or directory")
    if out is not None:
        return out
    if len(runs) == 1 and Path(runs[0]).is_dir():
        return Path(runs[0])
    parser.error("--out is required unless exactly one RUN_DIR directory is given")


def report_skipped(skipped: Sequence[tuple[str, str]], prog: str) -> None:
    """One stderr line per skipped path.

    :param skipped: ``(path, reason)`` of every run directory left out
    :param prog: the command's name, the prefix of each line
    """
    for path, reason in skipped:
        print(f"{prog}: skipped {path}: {reason}", file=sys.stderr)
