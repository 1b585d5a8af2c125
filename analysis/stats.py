"""Paired tests of every algorithm variant against a reference variant (FedPref by default), over
the seeds of a campaign: what the comparison tables mark and ``stats.csv`` holds.

A variant and the reference are paired by seed within one preference distribution and one
environment (or dataset): the runs of a seed share the preference draw and the initial model, so
the per-seed difference removes that variation. With ``n`` pairs (seeds where both have a value):

* ``n >= 6``: the two-sided **Wilcoxon signed-rank test** (:func:`scipy.stats.wilcoxon`) on the
  differences; significant when ``p < level``.
* ``2 <= n <= 5``: the two-sided **paired t-test**, reported as its ``1 - level`` confidence
  interval of the mean difference; significant when the interval excludes 0. A rank test cannot
  reach ``p < 0.05`` here (the smallest two-sided Wilcoxon p-value is ``2 / 2^n``: 0.25 for 3
  seeds, 0.0625 for 5), and a percentile bootstrap of 3 differences is no better: its interval is
  about ``[min, max]``, "significant" whenever the three share a sign, which happens by chance a
  quarter of the time. The t-test assumes roughly normal differences.
* ``n < 2``: no test.
"""

from __future__ import annotations

import fnmatch
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from morlfed.metrics import MetricInfo

#: Default significance level of the tests.
LEVEL = 0.05
#: Default reference variant (a glob over variant labels that must match one label per table).
REFERENCE = "fedpref"
#: Fewest pairs for the Wilcoxon signed-rank test; below, the paired t-test.
WILCOXON_MIN_PAIRS = 6
#: Columns of ``stats.csv`` (the first is ``env``, or ``data`` for vision runs).
STATS_COLUMNS: tuple[str, ...] = (
    "dist",
    "metric",
    "variant",
    "reference",
    "n",
    "mean",
    "reference_mean",
    "mean_diff",
    "test",
    "p_value",
    "ci_low",
    "ci_high",
    "level",
    "significant",
    "direction",
)


@dataclass(frozen=True)
class PairedTest:
    """The test of one set of paired differences (variant minus reference).

    :param n: number of pairs
    :param mean_diff: mean of the differences (NaN without pairs)
    :param test: ``"wilcoxon"``, ``"paired t"`` or ``""`` (fewer than 2 pairs)
    :param p_value: two-sided p-value (NaN without a test)
    :param ci_low: lower end of the t-test's confidence interval of the mean difference (NaN for
        Wilcoxon or no test)
    :param ci_high: its upper end
    :param significant: the difference is significant at the level
    """

    n: int
    mean_diff: float
    test: str
    p_value: float
    ci_low: float
    ci_high: float
    significant: bool


def paired_test(diffs: np.ndarray, level: float = LEVEL) -> PairedTest:
    """Test whether paired differences are centred on 0 (see the module docstring for the test).

    :param diffs: the per-seed differences, variant minus reference
    :param level: the significance level, in (0, 1)
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    d = np.asarray(diffs, dtype=float)
    n, nan = len(d), float("nan")
    mean = float(d.mean()) if n else nan
    if n < 2:
        return PairedTest(n, mean, "", nan, nan, nan, False)
    if n >= WILCOXON_MIN_PAIRS:
        if not d.any():  # every pair equal: no difference at all (scipy divides by zero here)
            return PairedTest(n, mean, "wilcoxon", 1.0, nan, nan, False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(stats.wilcoxon(d).pvalue)
        return PairedTest(n, mean, "wilcoxon", p, nan, nan, p < level)
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(1 - level / 2, n - 1)) * sd / np.sqrt(n)
    # every difference the same: no spread to test against, the difference is certain
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if sd > 0 else float(mean == 0)
    low, high = mean - half, mean + half
    return PairedTest(n, mean, "paired t", p, low, high, bool(low > 0 or high < 0))


def check_one_run_per_seed(summary: pd.DataFrame, column: str = "env") -> None:
    """Raise ``ValueError`` if a variant has two runs of one seed in one ``(dist, <column>)``: a
    seed is one pair in a paired test and one value in a mean, and two runs of it (two summaries
    joined, the same runs evaluated twice) would count it twice.

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param column: the column the environments (or datasets) are in
    """
    keys = ["dist", column, "variant", "seed"]
    repeated = summary[summary.duplicated(keys, keep=False)]
    if len(repeated):
        first = repeated.iloc[0]
        where = ", ".join(f"{k}={first[k]}" for k in keys)
        raise ValueError(
            f"{len(repeated)} runs share a (dist, {column}, variant, seed), e.g. {where}: "
            "each variant may have one run per seed (evaluate each run once)"
        )


def reference_variant(variants: list[str], reference: str) -> str | None:
    """The one variant label matching the glob ``reference``, else ``None``.

    :param variants: the variant labels of one table (or of one distribution and environment)
    :param reference: a glob over labels
    """
    matches = [v for v in variants if fnmatch.fnmatchcase(v, reference)]
    return matches[0] if len(matches) == 1 else None


def compare_to_reference(
    summary: pd.DataFrame,
    metric: str,
    info: MetricInfo,
    reference: str = REFERENCE,
    level: float = LEVEL,
    column: str = "env",
) -> pd.DataFrame:
    """Every variant against the reference on ``metric``, per ``(dist, <column>)``: one row per
    other variant with :data:`STATS_COLUMNS` (``<column>`` first), paired by seed; ``direction`` is
    ``better`` or ``worse`` for a significant difference (as ``info`` says which way is better).
    Groups without exactly one reference variant give no rows.

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param metric: the column compared
    :param info: the metric's direction
    :param reference: a glob over variant labels naming the reference
    :param level: the significance level
    :param column: the column the environments (or datasets) are in
    """
    check_one_run_per_seed(summary, column)
    values = summary.assign(value=pd.to_numeric(summary[metric], errors="coerce"))
    rows = []
    for (dist, env), part in values.groupby(["dist", column], sort=True):
        ref = reference_variant(sorted(part["variant"].unique()), reference)
        if ref is None:
            continue
        base = part[part["variant"] == ref].set_index("seed")["value"].dropna()
        for variant, runs in part[part["variant"] != ref].groupby("variant", sort=True):
            mine = runs.set_index("seed")["value"].dropna()
            seeds = sorted(set(mine.index) & set(base.index))
            diffs = (mine[seeds] - base[seeds]).to_numpy()
            test = paired_test(diffs, level)
            # the side the test found: the mean's for the t-test, the median's for the rank test
            shift = float(np.median(diffs)) if test.test == "wilcoxon" else test.mean_diff
            better = (shift > 0) == info.higher_is_better
            direction = ("better" if better else "worse") if test.significant else ""
            rows.append(
                {
                    column: env,
                    "dist": dist,
                    "metric": metric,
                    "variant": variant,
                    "reference": ref,
                    **{k: v for k, v in asdict(test).items() if k != "significant"},
                    "mean": float(mine.mean()) if len(mine) else float("nan"),
                    "reference_mean": float(base.mean()) if len(base) else float("nan"),
                    "level": level,
                    "significant": test.significant,
                    "direction": direction,
                }
            )
    return pd.DataFrame(rows, columns=[column, *STATS_COLUMNS])


def campaign_stats(
    summary: pd.DataFrame,
    metrics: dict[str, MetricInfo],
    reference: str = REFERENCE,
    level: float = LEVEL,
    column: str = "env",
) -> pd.DataFrame:
    """``stats.csv``: :func:`compare_to_reference` for every metric, one row per preference
    distribution, environment (``column``), metric and variant.

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param metrics: the metrics compared, with their directions
    :param reference: a glob over variant labels naming the reference
    :param level: the significance level
    :param column: the column the environments (or datasets) are in
    """
    frames = [compare_to_reference(summary, m, info, reference, level, column) for m, info in metrics.items()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[column, *STATS_COLUMNS])


def marker_note(tests: set[str], reference: str | None, level: float) -> str:
    """The note under a table: which test decided its markers, at which level.

    :param tests: the tests used in the table (``"wilcoxon"``, ``"paired t"``; ``""`` ignored)
    :param reference: the reference variant, ``None`` when the table has none
    :param level: the significance level
    """
    if reference is None:
        return "No reference row in this table: no paired test, nothing marked."
    used = []
    if "wilcoxon" in tests:
        used.append(f"Wilcoxon signed-rank test, p < {level:g} ({WILCOXON_MIN_PAIRS} or more pairs)")
    if "paired t" in tests:
        used.append(
            f"paired t-test, the {1 - level:.0%} confidence interval of the mean difference excluding 0 "
            f"(2 to {WILCOXON_MIN_PAIRS - 1} pairs, where no rank test can reach p < 0.05)"
        )
    how = "; ".join(used) if used else "no variant shares 2 or more seeds with it, so none is tested"
    return (
        f"▲ (bold) / ▼: significantly better / worse than {reference}, paired by seed at level {level:g}: {how}; "
        "each cell tested on its own (no correction for multiple comparisons). Unmarked: no significant difference."
    )
