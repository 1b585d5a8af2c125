"""Regenerate the tables of a results document from committed CSV summaries.

``python -m morlfed.analysis.results docs/results.md`` rewrites every generated block of the document in
place; ``--check`` writes nothing and exits 1 if a block differs from what its CSVs give, so a test
proves that the published tables are the committed data's. The blocks, their kinds and arguments
are described in :mod:`morlfed.analysis.published`, which parses and rebuilds them; this module is the
command line only.

Exit status: 0 ok, 1 out of date with ``--check``, 2 a missing document or a malformed block.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from morlfed.analysis.published import ResultsError, parse_blocks, regenerate
from morlfed.commands import python
from morlfed.rundir import atomic_write_text

PROG = "analysis.results"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=python("-m", f"morlfed.{PROG}"),
        description="Rebuild the generated tables of a results document from its committed CSV summaries.",
    )
    p.add_argument("document", type=Path, help="markdown file with <!-- results:KIND ... --> blocks")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if any generated block is out of date")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 ok, 1 out of date with ``--check``, 2 error).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    args = _parser().parse_args(argv)
    doc: Path = args.document
    if not doc.is_file():
        print(f"{PROG}: error: no such document {doc}", file=sys.stderr)
        return 2
    text = doc.read_text()
    try:
        new = regenerate(text, doc.parent)
    except ResultsError as exc:
        print(f"{PROG}: error: {doc}:{str(exc).removeprefix('line ')}", file=sys.stderr)
        return 2
    n = len(parse_blocks(text.splitlines()))
    if args.check:
        if new != text:
            print(
                f"{PROG}: {doc} is out of date with its CSVs; run {python('-m', f'morlfed.{PROG}', str(doc))}",
                file=sys.stderr,
            )
            return 1
        print(f"{doc}: {n} generated blocks up to date")
        return 0
    atomic_write_text(doc, new)
    print(f"{doc}: regenerated {n} blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
