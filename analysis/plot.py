"""Figures of a campaign: ``python -m morlfed.analysis.plot RUN_DIR [RUN_DIR ...] --out DIR``.

Loads run directories as :mod:`morlfed.analysis.evaluate` does (directories or globs; malformed ones are
reported on stderr and skipped) and writes, as PNG and PDF (``--formats``), with ``<run>`` =
``<env>_<variant>_<dist>_seed<seed>``:

* ``front_<run>``: each run's client returns against the known front (or the campaign front);
* ``fronts_<env>_<dist>``: all algorithms of one environment and preference distribution, a
  panel each in a grid, seeds as marker shapes;
* ``learning_<env>_<dist>``: mean scalarised training reward per round (``rounds.csv``; or per
  training env steps per client, ``--x-axis env_steps``), one line per algorithm with a labelled
  +- std band over seeds (past three algorithms, a panel each);
* ``evaluation_<env>_<dist>``: the same for the deployed models' evaluation, and
  ``hypervolume_<env>_<dist>`` for the hypervolume of their discounted returns
  (``evaluations.csv``), for runs made with ``eval_every=k``;
* ``similarity_<run>``: client-similarity heatmaps ordered by cluster at ``--rounds`` (default:
  first, middle and last saved round), for runs made with ``save_similarity=true``;
* ``clusters_<run>``: cluster evolution over rounds, for strategies that log clusters.

An unfinished run (no ``metrics.json``: still running, stopped or failed) is a *partial run*
(:mod:`morlfed.analysis.partial`): it gets ``learning_<run>`` (and ``evaluation_<run>``) and
``clusters_<run>`` from the rounds it logged, titled with its rounds done of those configured,
and a line on stdout says so; fronts and metrics need the finished run. ``<run>`` names the
variant by the settings that set it apart (``fedpref_engine=vectorised``); runs that would share a
name, finished or partial, get their directory's name after it, so every file written is one on
disk.

This module is the command line only: the figures are drawn by :mod:`morlfed.analysis.campaign_figures`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from morlfed.analysis.arguments import add_run_arguments, default_out, report_skipped
from morlfed.analysis.campaign import select_runs
from morlfed.analysis.campaign_figures import FIGURE_KINDS, write_figures
from morlfed.analysis.curves import CURVE_AXES
from morlfed.analysis.partial import partial_runs
from morlfed.analysis.runs import Run, load_runs
from morlfed.core.commands import python
from morlfed.core.console import one_line_warnings
from morlfed.core.progress import counted
from morlfed.metrics.figures import FORMATS

PROG = "analysis.plot"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=python("-m", f"morlfed.{PROG}"),
        description="Write the fronts, similarity heatmaps, cluster evolution "
        "and learning-curve figures of a set of runs.",
    )
    add_run_arguments(p, "returns plotted against the front")
    p.add_argument(
        "--rounds",
        type=int,
        nargs="+",
        metavar="ROUND",
        help="rounds of the similarity heatmaps (default: first, middle and last saved)",
    )
    p.add_argument(
        "--formats",
        nargs="+",
        choices=("png", "pdf", "svg"),
        default=list(FORMATS),
        help="file formats (default: png pdf)",
    )
    p.add_argument(
        "--x-axis",
        choices=list(CURVE_AXES),
        default="round",
        help="the learning curves' x axis: round, or env_steps (training env steps per client) (default: round)",
    )
    p.add_argument(
        "--figures",
        nargs="+",
        choices=FIGURE_KINDS,
        default=list(FIGURE_KINDS),
        metavar="KIND",
        help="kinds of figure, by file name prefix: per run front, similarity, clusters; per environment "
        f"and distribution fronts, learning, evaluation, hypervolume, agreement, separability (default: all; choices: {' '.join(FIGURE_KINDS)})",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 ok, 1 no valid run, 2 usage error).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    one_line_warnings(PROG)  # Python's warnings as one line each, no source
    parser = _parser()
    args = parser.parse_args(argv)
    out = default_out(parser, args.runs, args.out)
    loaded, skipped = load_runs(args.runs)  # task=rl runs only: all Run
    partial, skipped = partial_runs(skipped)
    runs, dropped = select_runs([r for r in loaded if isinstance(r, Run)], args.returns)
    report_skipped(skipped + dropped, PROG)
    if not runs and not partial:
        print(f"{PROG}: error: no valid run directory in {' '.join(args.runs)}", file=sys.stderr)
        return 1
    for run in partial:
        print(f"{run.path}: {run.status} (no metrics.json yet): learning curves and clusters only")
    written = write_figures(runs, out, args.returns, args.rounds, args.formats, args.figures, partial, args.x_axis)
    what = counted(len(runs), "run") + (f" and {counted(len(partial), 'partial run')}" if partial else "")
    print(f"wrote {counted(len(written), 'file')} for {what} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
