"""Regenerate the tables of results documents from committed CSV summaries.

``python -m morlfed.analysis.results docs/results.md docs/results/*.md`` rewrites every generated
block of each document in place; ``--check`` writes nothing and exits 1 if a block differs from
what its CSVs give, so a test proves that the published tables are the committed data's. A
block's CSV paths are relative to its document's folder. The blocks, their kinds and arguments
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
from morlfed.core.commands import python
from morlfed.storage.rundir import atomic_write_text

PROG = "analysis.results"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=python("-m", f"morlfed.{PROG}"),
        description="Rebuild the generated tables of results documents from their committed CSV summaries.",
    )
    p.add_argument("documents", type=Path, nargs="+", help="markdown files with <!-- results:KIND ... --> blocks")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if any generated block is out of date")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 ok, 1 out of date with ``--check``, 2 error).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    args = _parser().parse_args(argv)
    docs: list[Path] = args.documents
    missing = [str(doc) for doc in docs if not doc.is_file()]
    if missing:
        print(f"{PROG}: error: no such document {', '.join(missing)}", file=sys.stderr)
        return 2
    texts, new = {}, {}
    for doc in docs:  # every document is rebuilt before any is written: a bad block writes nothing
        texts[doc] = doc.read_text()
        try:
            new[doc] = regenerate(texts[doc], doc.parent)
        except ResultsError as exc:
            print(f"{PROG}: error: {doc}:{str(exc).removeprefix('line ')}", file=sys.stderr)
            return 2
    stale = [doc for doc in docs if new[doc] != texts[doc]]
    for doc in docs:
        n = len(parse_blocks(texts[doc].splitlines()))
        if args.check:
            if doc in stale:
                print(
                    f"{PROG}: {doc} is out of date with its CSVs; run {python('-m', f'morlfed.{PROG}', str(doc))}",
                    file=sys.stderr,
                )
            else:
                print(f"{doc}: {n} generated blocks up to date")
        else:
            atomic_write_text(doc, new[doc])
            print(f"{doc}: regenerated {n} blocks")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
