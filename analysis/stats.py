"""Paired tests of every algorithm variant against a reference variant (FedPref by default), over seeds.

The tests run over the seeds of a campaign: they are what the comparison tables mark and
``stats.csv`` holds.

A variant and the reference are paired by seed within one preference distribution and one
environment (or dataset): the runs of a seed share the preference draw and the initial model, so
the per-seed difference removes that variation. With ``n`` pairs (seeds where both have a value)
the test is the two-sided **exact sign-flip permutation test** of the mean difference
(:func:`scipy.stats.permutation_test`, one sample, ``permutation_type="samples"``): under the null
hypothesis each difference is as likely to have either sign, so the p-value is the share of the
``2^n`` sign assignments whose mean is at least as far from 0 as the observed one. It is exact for
any ``n``, assumes no normality, and never returns a p-value from zero spread: equal differences
give ``2 / 2^n`` (0.25 for 3 pairs), identical runs (all differences 0) give 1.

Because the observed assignment always counts, no exact two-sided paired test of ``n`` pairs can
go below ``2 / 2^n`` (:func:`smallest_p`): at level 0.05 a cell needs 6 pairs or more
(:func:`fewest_pairs`), and a cell with fewer is reported as "n too small" rather than tested
against a level it cannot reach. Fewer than 2 pairs: no test.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from morlfed.metrics import MetricInfo

#: Default significance level of the tests.
LEVEL = 0.05
#: Default reference variant (a glob over variant labels that must match one label per table).
REFERENCE = "fedpref"
#: The test's name in ``stats.csv`` and the notes under the tables.
SIGN_FLIP = "sign-flip"
#: Up to this many pairs the sign flips are enumerated (``2^n`` of them, exact; 0.2 s at 16);
#: above, the test draws :data:`RESAMPLES` of them from a generator seeded 0, so a p-value is
#: still the same on every run (no committed study has more than 5 seeds).
EXACT_MAX_PAIRS = 16
#: Sign assignments drawn above :data:`EXACT_MAX_PAIRS` pairs (p-values resolved to about 1e-5).
RESAMPLES = 99_999
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
    "smallest_p",
    "level",
    "significant",
    "direction",
)


def smallest_p(n: int) -> float:
    """The smallest two-sided p-value an exact paired test of ``n`` pairs can give, ``2 / 2^n``.

    It is 1 below 2 pairs. The observed sign assignment and its mirror image always count.

    :param n: number of pairs
    """
    return 1.0 if n < 2 else 2.0 / 2.0**n


def fewest_pairs(level: float) -> int:
    """The fewest pairs with which an exact two-sided paired test can reach ``p < level``.

    That is 6 at 0.05, 7 at 0.02 and 8 at 0.01.

    :param level: the significance level, in (0, 1)
    """
    n = 2
    while smallest_p(n) >= level:
        n += 1
    return n


@dataclass(frozen=True)
class PairedTest:
    """The test of one set of paired differences (variant minus reference).

    :param n: number of pairs
    :param mean_diff: mean of the differences (NaN without pairs)
    :param test: :data:`SIGN_FLIP`, or ``""`` below 2 pairs
    :param p_value: two-sided p-value (NaN without a test)
    :param smallest_p: the smallest p-value ``n`` pairs can give (:func:`smallest_p`); a cell with
        ``smallest_p >= level`` cannot be significant whatever its differences ("n too small")
    :param significant: ``p_value < level``
    """

    n: int
    mean_diff: float
    test: str
    p_value: float
    smallest_p: float
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
        return PairedTest(n, mean, "", nan, smallest_p(n), False)
    exact = n <= EXACT_MAX_PAIRS
    result = stats.permutation_test(
        (d,),
        np.mean,
        permutation_type="samples",  # one sample: the null distribution flips the signs
        vectorized=True,
        n_resamples=np.inf if exact else RESAMPLES,
        alternative="two-sided",
        rng=None if exact else np.random.default_rng(0),
    )
    p = float(result.pvalue)
    return PairedTest(n, mean, SIGN_FLIP, p, smallest_p(n), p < level)


def check_one_run_per_seed(summary: pd.DataFrame, column: str = "env") -> None:
    """Raise ``ValueError`` if a variant has two runs of one seed in one ``(dist, <column>)``.

    A seed is one pair in a paired test and one value in a mean, and two runs of it (two summaries
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
    """Every variant against the reference on ``metric``, per ``(dist, <column>)``, paired by seed.

    One row per other variant with :data:`STATS_COLUMNS` (``<column>`` first); ``direction`` is
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
            better = (test.mean_diff > 0) == info.higher_is_better  # the test is of the mean difference
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
    """``stats.csv``: :func:`compare_to_reference` for every metric.

    One row per preference distribution, environment (``column``), metric and variant.

    :param summary: ``summary.csv`` (or ``vision_summary.csv``) rows
    :param metrics: the metrics compared, with their directions
    :param reference: a glob over variant labels naming the reference
    :param level: the significance level
    :param column: the column the environments (or datasets) are in
    """
    frames = [compare_to_reference(summary, m, info, reference, level, column) for m, info in metrics.items()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[column, *STATS_COLUMNS])


def marker_note(tested: list[int], reference: str | None, level: float) -> str:
    """The note under a table: the test that decided its marks, and at which level.

    It also says whether the table's cells have pairs enough to reach that level at all.

    :param tested: the number of pairs of every tested cell of the table (2 or more each)
    :param reference: the reference variant, ``None`` when the table has none
    :param level: the significance level
    """
    if reference is None:
        return "No reference row in this table: no paired test, nothing marked."
    if not tested:
        return f"No variant shares 2 or more seeds with {reference}, so none is tested and nothing is marked."
    need = fewest_pairs(level)
    test = (
        f"▲ (bold) / ▼: significantly better / worse than {reference}, paired by seed: exact two-sided sign-flip "
        f"permutation test of the mean difference, p < {level:g}; each cell tested on its own (no correction for "
        "multiple comparisons)."
    )
    most = max(tested)
    if most < need:
        few = f"{most} pairs" if min(tested) == most else f"{min(tested)} to {most} pairs"
        return (
            f"{test} **n too small for {level:g}: no cell can be marked.** Every cell here is tested over {few}, "
            f"and with n pairs no exact two-sided test can go below p = 2/2^n ({smallest_p(most):.4g} at {most}); "
            f"{need} pairs are the fewest that can reach {level:g}. An unmarked cell is not shown to differ from "
            f"{reference}, nor shown to equal it."
        )
    if min(tested) < need:
        return (
            f"{test} Cells tested over fewer than {need} pairs (their p cannot go below 2/2^n) are n too small for "
            f"{level:g} and left unmarked. Otherwise unmarked: no significant difference."
        )
    return f"{test} Unmarked: no significant difference."
