"""Command-line pieces the analysis commands share: the arguments naming the runs, the output
folder and the returns, and the report of skipped run directories."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from morlfed.metrics import RETURN_KINDS


def add_run_arguments(parser: argparse.ArgumentParser, returns_help: str) -> None:
    """Add the arguments every analysis command takes: ``RUN_DIR ...`` (``runs``), ``--out``
    (:func:`default_out`) and ``--returns`` (default ``discounted``).

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


def default_out(parser: argparse.ArgumentParser, runs: Sequence[str], out: Path | None) -> Path:
    """``--out``, else the single directory argument; a usage error otherwise.

    :param parser: the command's parser (reports the usage error)
    :param runs: the ``RUN_DIR`` arguments
    :param out: the ``--out`` argument, if given
    """
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
