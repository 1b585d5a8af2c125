"""Look at what a client learned: ``python -m morlfed.analysis.rollout RUN_DIR --client C``.

Runs client C's deployed policy (``RUN_DIR/models/``, :mod:`morlfed.analysis.policies`) greedily
for ``--episodes`` episodes on its evaluation env, seeded as the run's final evaluation, and prints
each episode's vector return and scalarised score, then their mean (with the default episodes, the
client's row of ``final.csv``). ``--video DIR`` records each episode (gymnasium's ``RecordVideo``;
``pip install "morlfed[video]"``); ``--all`` does it for every client; ``--contact-sheet FILE``
writes frames of every client's first episode into one image.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from morlfed.analysis.policies import contact_sheet, read_deployment, rl_run, rollout
from morlfed.analysis.run_files import RunDirError
from morlfed.core.commands import python
from morlfed.core.console import one_line_warnings

PROG = "analysis.rollout"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=python("-m", f"morlfed.{PROG}"),
        description="Roll out clients' deployed policies: vector returns and scalarised scores per episode, "
        "optionally videos and a contact sheet of every client.",
    )
    p.add_argument("run", metavar="RUN_DIR", help="a finished run directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--client", type=int, default=0, metavar="C", help="the client (default: 0)")
    which.add_argument("--all", action="store_true", help="every client")
    p.add_argument("--episodes", type=int, metavar="N", help="episodes per client (default: the spec's eval_episodes)")
    p.add_argument("--video", type=Path, metavar="DIR", help="record each episode into DIR (the video extra)")
    p.add_argument("--contact-sheet", type=Path, metavar="FILE", help="frames of every client's policy in one image")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 ok, 2 usage error or a run that cannot be rolled out).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    one_line_warnings(PROG)  # Python's warnings as one line each, no source
    parser = _parser()
    args = parser.parse_args(argv)
    if args.episodes is not None and args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    try:
        run = rl_run(args.run)
        deployment = read_deployment(run)
        n = len(deployment.client_model)
        if not 0 <= args.client < n:
            parser.error(f"--client must be a client of the run, 0-{n - 1}; got {args.client}")
        for cid in range(n) if args.all else [args.client]:
            video = None if args.video is None else args.video / f"client_{cid}"
            for line in rollout(run, cid, args.episodes, video, deployment).lines():
                print(line)
            if video is not None:
                print(f"client {cid}: videos in {video}")
        if args.contact_sheet is not None:
            contact_sheet(run, deployment=deployment).savefig(args.contact_sheet)
            print(f"wrote {args.contact_sheet}")
    except (RunDirError, ImportError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
