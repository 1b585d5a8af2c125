"""``comparison.md`` of an evaluated campaign, and the paired tests beside it.

``comparison.md`` opens with a header (the returns evaluated, the reference fronts of IGD / IGD+,
the skipped run directories and the runs whose strategy stayed inert: :func:`run_notes`), then the
budget (:func:`morlfed.analysis.tables.budget_table`) and, per preference distribution, one table
per metric (:func:`morlfed.analysis.tables.metric_table`) in :data:`TABLE_ORDER`; the vision part
has one table per partition and accuracy statistic.

* :func:`comparison_markdown` / :func:`vision_comparison_markdown`: the RL and the vision part;
* :func:`write_comparison`: ``stats.csv`` / ``vision_stats.csv`` and ``comparison.md`` of an
  evaluated campaign (``analysis.evaluate``) or of a committed summary (``analysis.rebuild``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from morlfed.analysis.campaign import VISION_METRICS, Campaign
from morlfed.analysis.stats import LEVEL, REFERENCE, campaign_stats
from morlfed.analysis.tables import INERT_MARK, budget_table, inert_runs, metric_table
from morlfed.metrics import METRICS
from morlfed.storage.rundir import atomic_write_text

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
    :func:`~morlfed.analysis.tables.budget_table`; the tables are
    :func:`~morlfed.analysis.tables.metric_table`'s, each with the note on its paired tests.

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
    table per accuracy statistic (:func:`~morlfed.analysis.tables.metric_table` with rows algorithm
    variants, columns datasets).

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
