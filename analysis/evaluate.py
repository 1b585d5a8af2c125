"""Evaluate a campaign of runs: ``python -m morlfed.analysis.evaluate RUN_DIR [RUN_DIR ...]``.

Every metric is recomputed from the clients' stored returns (``final.csv``) and the environment
spec of each run (``config.yaml``: reference point, gamma, known front). Front metrics use the
discounted returns unless ``--returns undiscounted``. IGD and IGD+ use the environment's known
front (``pareto_front(gamma)``; gamma 1 for undiscounted returns) or, where it has none, the
*campaign front*: the non-dominated union of the returns of every run being evaluated on that
environment. Writes to ``--out``:

* ``summary.csv``: one row per run (its directory, relative to the current one when below it;
  its identity, budget and wall time; the reference front used; every metric);
* ``eu_weights.csv``: the weights its expected utility was computed with, for each number of
  objectives evaluated (:func:`morlfed.analysis.campaign.eu_weights_table`);
* ``comparison.md``: the budget (env steps per client of each group of variants), then one table
  per preference distribution and metric, rows algorithm (with "+FT" variants) and seeds n,
  columns environment, cells mean +- std over seeds, marked where significantly better or worse
  than the ``--reference`` variant (default ``fedpref``) in a paired test over seeds at ``--level``
  (default 0.05; :mod:`morlfed.analysis.stats`: the exact sign-flip permutation test of the mean
  difference; cells with too few pairs to reach the level are said to be so, not marked), the
  test stated under each table;
* ``stats.csv``: those tests, one row per distribution, environment, metric and variant (pairs,
  mean difference, test, p-value, the smallest p-value the pairs allow, significance, direction);
* with ``--keep-logs``, ``runs/<run name>/``: a copy of each evaluated run's logs
  (:data:`morlfed.analysis.runs.LOG_FILES`: config, preferences, per-round ``rounds.csv`` and
  ``clusters.jsonl``, ``final.csv``, ``metrics.json``, ``run.log``; no checkpoints). The copies
  are run directories: evaluating them again gives the same metrics, and the per-round claims
  of a study (clusters, collapses) can be checked from them once the originals are gone.

Vision runs (``task=vision``) are evaluated apart: every accuracy statistic
(:data:`morlfed.analysis.campaign.VISION_METRICS`: mean / std / min / max over clients of L-acc, S-acc and G-acc) is
recomputed from ``final.csv`` and written to ``vision_summary.csv`` (one row per run), and
``comparison.md`` gets one table per partition and statistic (rows algorithm, columns dataset),
tested as above into ``vision_stats.csv``.

Incomplete (no ``metrics.json``) and malformed run directories are reported by name on stderr
and skipped; the exit status is 1 when no valid run is left. Recomputed metrics that differ from
a run's stored ``metrics.json`` are reported as warnings (the metrics code changed since?).

This module is the command line only: the evaluation is :mod:`morlfed.analysis.campaign` (variant labels
and duplicates :mod:`morlfed.analysis.variants`), the tables :mod:`morlfed.analysis.tables`, ``comparison.md``
:mod:`morlfed.analysis.comparison`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from morlfed.analysis.arguments import (
    add_run_arguments,
    add_table_arguments,
    check_table_arguments,
    default_out,
    report_skipped,
)
from morlfed.analysis.campaign import eu_weights_table, evaluate_runs, evaluate_vision_runs, select_runs
from morlfed.analysis.comparison import write_comparison
from morlfed.analysis.runs import TASKS, Run, VisionRun, archive_runs, load_runs
from morlfed.analysis.variants import split_duplicates
from morlfed.core.commands import python
from morlfed.core.console import one_line_warnings
from morlfed.core.progress import counted
from morlfed.storage.rundir import atomic_write_text

PROG = "analysis.evaluate"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=python("-m", f"morlfed.{PROG}"),
        description="Recompute every metric of a set of runs, build the campaign front and write "
        "summary.csv, stats.csv (paired tests against a reference variant) and comparison.md.",
    )
    add_run_arguments(p, "returns the metrics are computed on")
    add_table_arguments(p)
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="also copy every evaluated run's logs (no checkpoints) into OUT/runs/<run name>/, "
        "replacing OUT/runs: run directories small enough to commit, which this command re-evaluates",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 ok, 1 no valid run, 2 usage error).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    one_line_warnings(PROG)  # Python's warnings as one line each, no source
    parser = _parser()
    args = parser.parse_args(argv)
    check_table_arguments(parser, args)
    out = default_out(parser, args.runs, args.out)
    runs, skipped = load_runs(args.runs, tasks=TASKS)
    valid, dropped = select_runs([r for r in runs if isinstance(r, Run)], args.returns)
    vision, vision_dropped = split_duplicates([r for r in runs if isinstance(r, VisionRun)])
    skipped += dropped + vision_dropped
    report_skipped(skipped, PROG)
    if not valid and not vision:
        print(f"{PROG}: error: no valid run directory in {' '.join(args.runs)}", file=sys.stderr)
        return 1
    written, mismatches = [], []
    out.mkdir(parents=True, exist_ok=True)
    campaign, vision_summary = None, None
    if valid:
        campaign = evaluate_runs(valid, args.returns)
        campaign.skipped = skipped
        mismatches += campaign.mismatches
        atomic_write_text(out / "summary.csv", campaign.summary.to_csv(index=False))
        weights = eu_weights_table([len(run.spec.objectives) for run in valid])
        atomic_write_text(out / "eu_weights.csv", weights.to_csv(index=False))
        written += [out / "summary.csv", out / "eu_weights.csv"]
    if vision:
        vision_summary, vision_mismatches = evaluate_vision_runs(vision)
        mismatches += vision_mismatches
        atomic_write_text(out / "vision_summary.csv", vision_summary.to_csv(index=False))
        written.append(out / "vision_summary.csv")
    written += write_comparison(
        out, campaign, vision_summary, skipped, args.metrics, args.decimals, args.reference, args.level
    )
    for line in mismatches:
        print(f"{PROG}: warning: {line}", file=sys.stderr)
    if args.keep_logs:
        archive_runs([*valid, *vision], out / "runs")
        written.append(out / "runs")
    kinds = " and ".join(
        ([counted(len(valid), "run")] if valid else []) + ([counted(len(vision), "vision run")] if vision else [])
    )
    returns = f", {args.returns} returns" if valid else ""
    print(
        f"evaluated {kinds} ({len(skipped)} skipped{returns}): wrote {', '.join(map(str, written[:-1]))} and {written[-1]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
