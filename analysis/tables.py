"""Comparison tables of evaluated campaigns (markdown).

Rows are algorithm variants with their number of seeds ``n``, cells mean ± std over seeds, each cell
marked when it differs significantly from the reference variant (FedPref by default) in a paired
test over seeds (:mod:`analysis.stats`): ▲ in bold when better, ▼ when worse (higher or lower is
better as :data:`morlfed.metrics.METRICS` says). A note under every table states the test and its
level. A row some of whose runs reported their strategy inert (``inert_warning``) has its label
marked ``⚠ k/m`` (k of its m runs) and ``comparison.md`` lists those runs with their warnings.

* :func:`metric_table`: one metric under one preference distribution, columns environments (or
  datasets for vision runs);
* :func:`metrics_table`: one environment under one preference distribution, columns metrics;
* :func:`budget_table`: the env steps each client took and the wall time, per group of variants;
* :func:`comparison_markdown` / :func:`vision_comparison_markdown`: ``comparison.md``;
* :func:`write_comparison`: ``stats.csv`` / ``vision_stats.csv`` and ``comparison.md`` of an
  evaluated campaign (``analysis.evaluate``) or of a committed summary (``analysis.rebuild``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from morlfed.analysis.campaign import VISION_METRICS, Campaign
from morlfed.analysis.clustering import DESCRIPTIVE, TABLE_METRICS
from morlfed.analysis.stats import (
    LEVEL,
    REFERENCE,
    campaign_stats,
    check_one_run_per_seed,
    compare_to_reference,
    marker_note,
    reference_variant,
)
from morlfed.metrics import METRICS, MetricInfo
from morlfed.rundir import atomic_write_text

#: Metric order of ``comparison.md`` (the paper's Tables 3-6 first).
TABLE_ORDER: tuple[str, ...] = (
    "hypervolume",
    "sparsity",
    "igd",
    "igd_plus",
    "cardinality",
    "front_points_reached",
    "zero_regret_clients",
    "mean_regret",
    "expected_utility",
    "mean_scalarised",
    "min_scalarised",
    "max_scalarised",
)


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


def _labels(part: pd.DataFrame) -> tuple[dict[str, str], str]:
    """Each variant's row label, in row order, and the sentence the note under the table gains.

    The row order is :func:`_row_order`'s; a label has ``⚠ k/m`` after it when k of its m runs in
    ``part`` were inert. The sentence is empty when no row is marked.
    """
    inert = inert_runs(part)["variant"].value_counts()
    runs = part["variant"].value_counts()
    labels = {
        v: f"{v} {INERT_MARK} {int(inert[v])}/{int(runs[v])}" if v in inert.index else v for v in _row_order(part)
    }
    return labels, f" {INERT_NOTE}" if len(inert) else ""


def run_notes(summary: pd.DataFrame, skipped: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The lines of ``comparison.md`` that list the skipped run directories and the inert runs.

    They list the run directories left out (``skipped``) and the runs whose strategy reported itself
    inert, with their warnings; none when there are neither.

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param skipped: ``(path, reason)`` of run directories left out
    """
    lines: list[str] = []
    if skipped:
        lines += ["", "Skipped run directories (not averaged in):", ""]
        lines += [f"- `{path}`: {reason}" for path, reason in skipped]
    inert = inert_runs(summary)
    if not inert.empty:
        lines += ["", f"Runs whose strategy stayed inert ({INERT_MARK} in the tables; still averaged in):", ""]
        lines += [
            f"- `{row['name']}` ({row['variant']}, {row['dist']}, seed {row['seed']}): {row['inert_warning']}"
            for _, row in inert.iterrows()
        ]
    return lines


def _marks(
    part: pd.DataFrame,
    metrics: Sequence[str],
    registry: dict[str, MetricInfo],
    reference: str,
    level: float,
    column: str,
) -> tuple[dict[tuple[str, str, str], str], str]:
    """The significant directions per ``(variant, <column> value, metric)``, and the note under the table.

    The directions are against the reference (:func:`analysis.stats.compare_to_reference`).
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
) -> str | None:
    """The markdown table of ``metric`` under preference distribution ``dist`` and the note under it.

    Or ``None`` if no run has a value. Rows: algorithm variants and their seeds ``n``; columns:
    environments (the ``column`` of ``summary``: ``data`` for vision runs, with
    ``registry=VISION_METRICS``); cells mean ± std over seeds, marked ▲ (bold) / ▼ where
    significantly better / worse than the variant matching the glob ``reference``, paired by seed
    (:func:`analysis.stats.compare_to_reference`).

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param dist: the preference distribution (or partition)
    :param metric: a key of ``registry``
    :param decimals: decimals shown
    :param registry: the metrics and their directions
    :param column: the column the environments (or datasets) are in
    :param reference: a glob over variant labels naming the reference variant
    :param level: the significance level of the paired tests
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
    labels, inert_note = _labels(part)
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
) -> str | None:
    """The markdown table of one environment under one preference distribution and the note under it.

    Or ``None`` if it has no runs. Rows: algorithm variants and their seeds ``n``; columns:
    ``metrics``; cells mean ± std over seeds, marked as in :func:`metric_table`.

    :param summary: ``summary.csv`` rows
    :param env: the environment
    :param dist: the preference distribution
    :param metrics: keys of :data:`analysis.clustering.TABLE_METRICS` (the front metrics and the
        cluster values), one column each
    :param decimals: decimals shown
    :param reference: a glob over variant labels naming the reference variant
    :param level: the significance level of the paired tests
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
    labels, inert_note = _labels(part)
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


def reference_front_lines(summary: pd.DataFrame) -> list[str]:
    """The lines of ``comparison.md`` naming the reference front of IGD / IGD+ per environment and gamma.

    They are read from the summary's ``gamma``, ``front`` and ``front_size`` columns (a campaign
    front is the non-dominated union of every run evaluated on that environment, so its run count is
    the summary's), so that the header can be rebuilt from a committed summary alone.

    :param summary: ``summary.csv`` rows
    """
    lines = []
    for (env, _), part in summary.groupby(["env", "gamma"], sort=True):
        first = part.iloc[0]  # every run of an (env, gamma) shares its reference front
        what = (
            "known front" if first["front"] == "known" else f"campaign front (non-dominated union of {len(part)} runs)"
        )
        lines.append(f"- {env} (gamma {float(first['gamma']):g}): {what}, {int(first['front_size'])} points")
    return lines


def comparison_markdown(
    campaign: Campaign,
    metrics: Sequence[str] | None = None,
    decimals: int = 2,
    reference: str = REFERENCE,
    level: float = LEVEL,
) -> str:
    """``comparison.md``: a header, the budget, then per preference distribution one table per metric.

    The header names the returns, reference fronts, skipped runs and inert runs; the budget is
    :func:`budget_table`; the tables are :func:`metric_table`'s, each with the note on its paired
    tests.

    :param campaign: the evaluated campaign
    :param metrics: keys of :data:`morlfed.metrics.METRICS`, in order (default :data:`TABLE_ORDER`)
    :param decimals: decimals shown
    :param reference: a glob over variant labels naming the reference variant of the tests
    :param level: the significance level of the paired tests
    """
    summary = campaign.summary
    metrics = list(metrics) if metrics is not None else list(TABLE_ORDER)
    lines = [
        "# Comparison",
        "",
        f"{len(summary)} runs; **{campaign.returns}** returns. Cells: mean ± sample std over the n seeds of "
        f"the row (one seed shows no ±). ▲ (bold) / ▼: significantly better / worse than the reference variant "
        f"(`{reference}`), paired by seed at level {level:g} (the test is named under each table; ↑ higher is "
        "better, ↓ lower is better). — : not defined for that environment; n/a: not defined for those runs.",
        "",
        "Reference fronts for IGD / IGD+:",
        "",
    ]
    lines += reference_front_lines(summary)
    lines += run_notes(summary, campaign.skipped)
    lines += ["", "## Budget", "", budget_table(summary)]
    for dist in sorted(summary["dist"].unique()):
        lines += ["", f"## Preference distribution: {dist}"]
        for metric in metrics:
            table = metric_table(summary, dist, metric, decimals, reference=reference, level=level)
            if table is None:
                continue
            info = METRICS[metric]
            arrow = "↑" if info.higher_is_better else "↓"
            lines += [
                "",
                f"### {info.title} ({arrow} {'higher' if info.higher_is_better else 'lower'} is better)",
                "",
                table,
            ]
    return "\n".join(lines) + "\n"


def vision_comparison_markdown(
    summary: pd.DataFrame,
    decimals: int = 2,
    skipped: Sequence[tuple[str, str]] = (),
    reference: str = REFERENCE,
    level: float = LEVEL,
) -> str:
    """The vision part of ``comparison.md``.

    The ``skipped`` run directories and the inert runs (:func:`run_notes`), then per partition one
    table per accuracy statistic (:func:`metric_table` with rows algorithm variants, columns
    datasets).

    :param summary: ``vision_summary.csv`` rows
    :param decimals: decimals shown
    :param skipped: ``(path, reason)`` of run directories left out
    :param reference: a glob over variant labels naming the reference variant of the tests
    :param level: the significance level of the paired tests
    """
    lines = [
        "# Vision comparison",
        "",
        f"{len(summary)} vision runs. Accuracies in percent of each client's deployed model: L-acc on its own "
        "test data, S-acc on its own and a share c of the other clients' test data, G-acc on all clients' test "
        "data. Cells: mean ± sample std over the n seeds of the row of a statistic over clients; ▲ (bold) / ▼: "
        f"significantly better / worse than {reference}, paired by seed at level {level:g}.",
    ]
    lines += run_notes(summary, skipped)
    for dist in sorted(summary["dist"].unique()):
        lines += ["", f"## Partition: {dist}"]
        for metric, info in VISION_METRICS.items():
            table = metric_table(
                summary, dist, metric, decimals, VISION_METRICS, "data", reference=reference, level=level
            )
            if table is not None:
                arrow = "↑ higher" if info.higher_is_better else "↓ lower"
                lines += ["", f"### {info.title} ({arrow} is better)", "", table]
    return "\n".join(lines) + "\n"


def write_comparison(
    out: Path,
    campaign: Campaign | None,
    vision_summary: pd.DataFrame | None = None,
    skipped: Sequence[tuple[str, str]] = (),
    metrics: Sequence[str] | None = None,
    decimals: int = 2,
    reference: str = REFERENCE,
    level: float = LEVEL,
) -> list[Path]:
    """Write the paired tests and ``comparison.md`` (both parts, RL first) into ``out``; return the paths.

    The paired tests are ``stats.csv`` for ``campaign`` and ``vision_stats.csv`` for
    ``vision_summary``.

    :param out: the output folder (it exists)
    :param campaign: the evaluated RL runs, or ``None``
    :param vision_summary: ``vision_summary.csv`` rows, or ``None``
    :param skipped: ``(path, reason)`` of run directories left out, listed by the vision part when
        there is no RL part (the RL part lists ``campaign.skipped``)
    :param metrics: keys of :data:`morlfed.metrics.METRICS` tested and tabulated, in order
        (default :data:`TABLE_ORDER`)
    :param decimals: decimals shown
    :param reference: a glob over variant labels naming the reference variant of the tests
    :param level: the significance level of the paired tests
    """
    parts, written = [], []
    if campaign is not None:
        tested = {m: METRICS[m] for m in metrics or TABLE_ORDER}
        stats = campaign_stats(campaign.summary, tested, reference, level)
        atomic_write_text(out / "stats.csv", stats.to_csv(index=False))
        parts.append(comparison_markdown(campaign, metrics, decimals, reference, level))
        written.append(out / "stats.csv")
    if vision_summary is not None:
        vision_stats = campaign_stats(vision_summary, VISION_METRICS, reference, level, "data")
        atomic_write_text(out / "vision_stats.csv", vision_stats.to_csv(index=False))
        shown = () if campaign is not None else skipped
        parts.append(vision_comparison_markdown(vision_summary, decimals, shown, reference, level))
        written.append(out / "vision_stats.csv")
    atomic_write_text(out / "comparison.md", "\n".join(parts))
    return [*written, out / "comparison.md"]
