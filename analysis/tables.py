"""Comparison tables of evaluated campaigns (markdown).

Rows are algorithm variants with their number of seeds ``n``, cells mean ± std over seeds, each cell
marked when it differs significantly from the reference variant (FedPref by default) in a paired
test over seeds (:mod:`morlfed.analysis.stats`): ▲ in bold when better, ▼ when worse (higher or lower is
better as :data:`morlfed.metrics.METRICS` says). A note under every table states the test and its
level. A row some of whose runs reported their strategy inert (``inert_warning``) has its label
marked ``⚠ k/m`` (k of its m runs) and ``comparison.md`` lists those runs with their warnings
(:func:`morlfed.analysis.comparison.run_notes`). A row whose strategy ran its defaults where the
others had their settings selected for the study can be marked ``†`` (``untuned``).

* :func:`metric_table`: one metric under one preference distribution, columns environments (or
  datasets for vision runs);
* :func:`metrics_table`: one environment under one preference distribution, columns metrics;
* :func:`budget_table`: the env steps each client took and the wall time, per group of variants.

:mod:`morlfed.analysis.comparison` assembles them into ``comparison.md``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import numpy as np
import pandas as pd

from morlfed.analysis.clustering import DESCRIPTIVE, TABLE_METRICS
from morlfed.analysis.stats import (
    LEVEL,
    REFERENCE,
    check_one_run_per_seed,
    compare_to_reference,
    marker_note,
    reference_variant,
)
from morlfed.metrics import METRICS, MetricInfo


def aggregate_over_seeds(summary: pd.DataFrame, metric: str, column: str = "env") -> pd.DataFrame:
    """Mean, sample std (ddof 1; NaN for one seed) and count over seeds of ``metric``.

    Per ``(dist, variant, <column>)`` (``column``: ``env``, or ``data`` for vision runs); missing
    values (a metric an environment lacks) are left out.

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param metric: the column to aggregate
    :param column: the column the environments (or datasets) are in
    """
    check_one_run_per_seed(summary, column)
    values = pd.to_numeric(summary[metric], errors="coerce")
    frame = summary[["dist", "variant", column]].assign(value=values)
    return frame.groupby(["dist", "variant", column], sort=False)["value"].agg(["mean", "std", "count"])


def _row_order(summary: pd.DataFrame) -> list[str]:
    order = summary.sort_values(["algo", "finetune", "variant"], kind="stable")["variant"]
    return list(dict.fromkeys(order))


def _counts(summary: pd.DataFrame, column: str) -> pd.Series:
    """The number of runs (seeds) per ``(dist, variant, <column>)``."""
    return summary.groupby(["dist", "variant", column], sort=False)["seed"].nunique()


def _n_text(counts: Sequence[int]) -> str:
    """A row's seed count: "3", or "2–3" when the cells of a row have different numbers of seeds."""
    return "" if not counts else f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"


#: The mark of a row label with inert runs, and what it means (the note under the table).
INERT_MARK = "⚠"
INERT_NOTE = (
    f"{INERT_MARK} k/m: k of the row's m runs (over every column) reported after training that their strategy stayed inert "
    "(`inert_warning`), so the row measures less than its method."
)


def inert_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``summary`` whose run reported its strategy inert.

    That is, a non-empty ``inert_warning``; none for a summary without the column, written before
    runs recorded it.

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    """
    if "inert_warning" not in summary:
        return summary.iloc[:0]
    text = summary["inert_warning"].fillna("").astype(str).str.strip()
    return summary[text != ""]


#: The mark of an untuned row's label, and what it means (the note under the table).
UNTUNED_MARK = "†"
UNTUNED_NOTE = (
    f"{UNTUNED_MARK}: untuned: the strategy ran its default settings, not settings selected for this "
    "environment as the unmarked rows' were (where they have any)."
)


def _labels(part: pd.DataFrame, untuned: Sequence[str] = ()) -> tuple[dict[str, str], str]:
    """Each variant's row label, in row order, and the sentences the note under the table gains.

    The row order is :func:`_row_order`'s; a label has ``⚠ k/m`` after it when k of its m runs in
    ``part`` were inert, and ``†`` when it matches one of the globs ``untuned``. The sentences are
    empty when no row is marked.

    :param part: the table's rows of ``summary.csv``
    :param untuned: globs over variant labels naming the rows whose settings were not tuned
    """
    inert = inert_runs(part)["variant"].value_counts()
    runs = part["variant"].value_counts()
    labels, notes = {}, ""
    for v in _row_order(part):
        label = v
        if any(fnmatch.fnmatchcase(v, glob) for glob in untuned):
            label = f"{label} {UNTUNED_MARK}"
            notes = f" {UNTUNED_NOTE}"
        if v in inert.index:
            label = f"{label} {INERT_MARK} {int(inert[v])}/{int(runs[v])}"
        labels[v] = label
    return labels, notes + (f" {INERT_NOTE}" if len(inert) else "")


def _marks(
    part: pd.DataFrame,
    metrics: Sequence[str],
    registry: dict[str, MetricInfo],
    reference: str,
    level: float,
    column: str,
) -> tuple[dict[tuple[str, str, str], str], str]:
    """The significant directions per ``(variant, <column> value, metric)``, and the note under the table.

    The directions are against the reference (:func:`morlfed.analysis.stats.compare_to_reference`).
    """
    directions: dict[tuple[str, str, str], str] = {}
    tested: list[int] = []  # the pairs of every tested cell
    for metric in metrics:
        if metric in DESCRIPTIVE:
            continue
        stats = compare_to_reference(part, metric, registry[metric], reference, level, column)
        tested += [int(n) for n, test in zip(stats["n"], stats["test"]) if test]
        directions |= {
            (str(v), str(e), metric): str(d) for v, e, d in zip(stats["variant"], stats[column], stats["direction"])
        }
    found = reference_variant(sorted(part["variant"].unique()), reference)
    note = f"n: seeds per row; (n=k): a cell with fewer defined values. {marker_note(tested, found, level)}"
    return directions, note


def _cell(stats: pd.DataFrame, key: tuple, decimals: int, n: int, undefined: str, direction: str) -> str:
    """One cell: mean ± std over seeds at ``key`` of ``stats``, marked by ``direction``.

    ``(n=k)`` when fewer than the row's ``n`` seeds have a value; ``undefined`` when none has.
    """
    if key not in stats.index:
        return ""
    mean, std, count = stats.loc[key]
    if count == 0 or not np.isfinite(mean):
        return undefined
    text = f"{mean:.{decimals}f}" if count < 2 else f"{mean:.{decimals}f} ± {std:.{decimals}f}"
    text += f" (n={int(count)})" if count < n else ""
    return f"**{text}** ▲" if direction == "better" else f"{text} ▼" if direction == "worse" else text


def _undefined(info: MetricInfo) -> str:
    """How a missing value reads.

    "—" where the environment lacks what the metric needs (a known front), "n/a" where the run's
    value is not defined (e.g. sparsity of one point).
    """
    return "—" if info.needs_front else "n/a"


def metric_table(
    summary: pd.DataFrame,
    dist: str,
    metric: str,
    decimals: int = 2,
    registry: dict[str, MetricInfo] = METRICS,
    column: str = "env",
    reference: str = REFERENCE,
    level: float = LEVEL,
    untuned: Sequence[str] = (),
) -> str | None:
    """The markdown table of ``metric`` under preference distribution ``dist`` and the note under it.

    Or ``None`` if no run has a value. Rows: algorithm variants and their seeds ``n``; columns:
    environments (the ``column`` of ``summary``: ``data`` for vision runs, with
    ``registry=VISION_METRICS``); cells mean ± std over seeds, marked ▲ (bold) / ▼ where
    significantly better / worse than the variant matching the glob ``reference``, paired by seed
    (:func:`morlfed.analysis.stats.compare_to_reference`).

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param dist: the preference distribution (or partition)
    :param metric: a key of ``registry``
    :param decimals: decimals shown
    :param registry: the metrics and their directions
    :param column: the column the environments (or datasets) are in
    :param reference: a glob over variant labels naming the reference variant
    :param level: the significance level of the paired tests
    :param untuned: globs over variant labels naming the rows marked untuned (``†``)
    """
    if metric not in registry:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(registry)}")
    part = summary[summary["dist"] == dist]
    stats = aggregate_over_seeds(part, metric, column)
    if not stats["count"].any():
        return None
    envs = sorted(part[column].unique())
    counts = _counts(part, column)
    directions, note = _marks(part, [metric], registry, reference, level, column)
    undefined = _undefined(registry[metric])
    labels, inert_note = _labels(part, untuned)
    lines = ["| algorithm | n | " + " | ".join(envs) + " |", "|---|---|" + "---|" * len(envs)]
    for variant, label in labels.items():
        n = {env: int(counts.get((dist, variant, env), 0)) for env in envs}
        cells = [
            _cell(stats, (dist, variant, env), decimals, n[env], undefined, directions.get((variant, env, metric), ""))
            for env in envs
        ]
        lines.append(f"| {label} | {_n_text([c for c in n.values() if c])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{note}{inert_note}"


def metrics_table(
    summary: pd.DataFrame,
    env: str,
    dist: str,
    metrics: Sequence[str],
    decimals: int = 2,
    reference: str = REFERENCE,
    level: float = LEVEL,
    untuned: Sequence[str] = (),
) -> str | None:
    """The markdown table of one environment under one preference distribution and the note under it.

    Or ``None`` if it has no runs. Rows: algorithm variants and their seeds ``n``; columns:
    ``metrics``; cells mean ± std over seeds, marked as in :func:`metric_table`.

    :param summary: ``summary.csv`` rows
    :param env: the environment
    :param dist: the preference distribution
    :param metrics: keys of :data:`morlfed.analysis.clustering.TABLE_METRICS` (the front metrics and the
        cluster values), one column each
    :param decimals: decimals shown
    :param reference: a glob over variant labels naming the reference variant
    :param level: the significance level of the paired tests
    :param untuned: globs over variant labels naming the rows marked untuned (``†``)
    """
    unknown = [m for m in metrics if m not in TABLE_METRICS]
    if unknown:
        raise ValueError(f"unknown metric {', '.join(map(repr, unknown))}; valid: {', '.join(TABLE_METRICS)}")
    part = summary[(summary["env"] == env) & (summary["dist"] == dist)]
    if part.empty:
        return None
    stats = {m: aggregate_over_seeds(part, m) for m in metrics}
    counts = _counts(part, "env")
    directions, note = _marks(part, metrics, TABLE_METRICS, reference, level, "env")
    lines = [
        "| algorithm | n | " + " | ".join(TABLE_METRICS[m].title for m in metrics) + " |",
        "|---|---|" + "---|" * len(metrics),
    ]
    labels, inert_note = _labels(part, untuned)
    for variant, label in labels.items():
        n = int(counts.get((dist, variant, env), 0))
        cells = [
            _cell(
                stats[m],
                (dist, variant, env),
                decimals,
                n,
                _undefined(TABLE_METRICS[m]),
                directions.get((variant, env, m), ""),
            )
            for m in metrics
        ]
        lines.append(f"| {label} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{note}{inert_note}"


def _steps_column(summary: pd.DataFrame, column: str) -> pd.Series:
    """A summary's env-steps column as numbers (all NaN when the summary predates it)."""
    return pd.to_numeric(summary.get(column, pd.Series(np.nan, summary.index)), errors="coerce")


def _loss_steps_cell(loss: pd.Series) -> str:
    """The loss-evaluation env steps per client of a group of runs, as a table cell.

    Their mean over the runs, with the range when the runs differ (their episodes' lengths do), or
    "not recorded".
    """
    if not np.isfinite(loss).all():
        return "not recorded"
    if loss.min() == loss.max():
        return f"{loss.mean():.0f}"
    return f"{loss.mean():.0f} (min {loss.min():.0f}, max {loss.max():.0f})"


def budget_table(summary: pd.DataFrame) -> str:
    """What each group of runs cost, as a markdown table.

    One row per environment, preference distribution and number of training env steps per client
    (the variants that share it listed): clients, rounds, local steps, env steps per client and per
    run, runs, wall time of the federation loop ("all" when every variant of the environment and
    distribution took the same). Runs that did not record their env steps (``env_steps_per_client``
    empty) form a group of their own.

    When the summary records the env steps spent measuring losses (``loss_env_steps_per_client``,
    runs made since they are counted), the table has them in a column of their own (0 for the
    strategies that measure none) beside the training env steps, and the env steps per run count
    both; every variant that measured losses has a row of its own, so each method's interaction
    beyond the training budget is in the table. Otherwise ``env_steps_per_client`` is the training's.

    :param summary: ``summary.csv`` rows (with ``wall_time_s``)
    """
    total, loss = _steps_column(summary, "env_steps_per_client"), _steps_column(summary, "loss_env_steps_per_client")
    by_purpose = bool(loss.notna().any())
    training = (total - loss).where(loss.notna(), total)  # summaries that predate the count: all training
    frame = summary.assign(per_client=training.round(), loss=loss, total=total)
    measured = frame.groupby(["env", "dist", "variant"])["loss"].transform(lambda x: bool((x > 0).any()))
    frame["loss_row"] = frame["variant"].where(measured, "")  # a row per variant that measured losses
    variants = frame.groupby(["env", "dist"])["variant"].nunique()
    steps_header = (
        "training env steps per client | loss-evaluation env steps per client" if by_purpose else "env steps per client"
    )
    lines = [
        "| environment | preferences | algorithms | clients | rounds | local steps | "
        f"{steps_header} | env steps per run | runs | wall time per run (s) | total (min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if by_purpose else ""),
    ]
    for (env, dist, steps, _), part in frame.groupby(
        ["env", "dist", "per_client", "loss_row"], sort=True, dropna=False
    ):
        budget = " | ".join(
            ", ".join(map(str, sorted(part[c].unique()))) for c in ("n_clients", "rounds", "local_steps")
        )
        recorded = np.isfinite(steps)
        per_client = f"{int(steps)}" if recorded else "not recorded"
        if by_purpose:
            per_client += f" | {_loss_steps_cell(part['loss'])}"
        every = part["total"].mean() if np.isfinite(part["total"]).all() else np.nan
        per_run = (
            ", ".join(f"{every * n:.0f}" for n in sorted(part["n_clients"].unique())) if np.isfinite(every) else "—"
        )
        names = "all" if part["variant"].nunique() == variants[env, dist] else ", ".join(_row_order(part))
        wall = pd.to_numeric(part["wall_time_s"], errors="coerce")
        times = f"{wall.mean():.0f} (min {wall.min():.0f}, max {wall.max():.0f}) | {wall.sum() / 60:.0f}"
        lines.append(
            f"| {env} | {dist} | {names} | {budget} | {per_client} "
            f"| {per_run} | {len(part)} | {times if wall.notna().all() else '— | —'} |"
        )
    return "\n".join(lines)
