"""Equivalence of two paired samples: whether two implementations agree within a margin fixed in advance.

"No significant difference" cannot show that two implementations agree: with few seeds a real
difference goes undetected. An equivalence test turns the question around. With paired outcomes
(one per seed and implementation, the seeds shared), it computes the two one-sided tests (TOST)
of Schuirmann (1987) in their interval form: the implementations are *equivalent* at level
``alpha`` when the ``1 - 2 alpha`` confidence interval of the mean paired difference (Student's t)
lies inside ``(-margin, +margin)``; *different* when that interval lies entirely beyond one end of
the margin (the difference exceeds the margin, one-sided at ``alpha``); otherwise the sample is too
small or too noisy to say (*inconclusive*).

The margin must be fixed before the data are seen. :func:`standardised_margin` states the usual
rule: a fraction of the reference implementation's seed-to-seed standard deviation (0.5: a
difference smaller than half the spread that seeds alone produce).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

#: The verdicts of :func:`paired_equivalence`.
VERDICTS = ("equivalent", "different", "inconclusive")


@dataclass(frozen=True)
class Equivalence:
    """The outcome of :func:`paired_equivalence`.

    :param n: number of pairs
    :param mean_difference: mean of ``candidate - reference``
    :param low: lower end of the ``1 - 2 alpha`` confidence interval of the mean difference
    :param high: upper end of that interval
    :param margin: the equivalence margin
    :param p_tost: the TOST p-value (the larger of the two one-sided tests' p-values)
    :param verdict: ``equivalent``, ``different`` or ``inconclusive`` (see the module docstring)
    """

    n: int
    mean_difference: float
    low: float
    high: float
    margin: float
    p_tost: float
    verdict: str


def standardised_margin(reference: np.ndarray, fraction: float = 0.5) -> float:
    """``fraction`` times the sample standard deviation (``ddof=1``) of the reference outcomes.

    :param reference: the reference implementation's outcomes, one per seed
    :param fraction: the stated fraction of the seed-to-seed spread (> 0)
    """
    reference = np.asarray(reference, dtype=float)
    if fraction <= 0:
        raise ValueError(f"fraction must be > 0, got {fraction}")
    if reference.size < 2:
        raise ValueError(f"a standard deviation needs at least 2 outcomes, got {reference.size}")
    return fraction * float(np.std(reference, ddof=1))


def paired_equivalence(reference: np.ndarray, candidate: np.ndarray, margin: float, alpha: float = 0.05) -> Equivalence:
    """TOST on the paired differences ``candidate - reference`` (see the module docstring).

    :param reference: the reference's outcome per seed
    :param candidate: the candidate's outcome per seed, in the same order
    :param margin: the equivalence margin (> 0), in the outcome's units
    :param alpha: the level of each one-sided test (0.05: a 90% interval)
    """
    reference, candidate = np.asarray(reference, dtype=float), np.asarray(candidate, dtype=float)
    if reference.shape != candidate.shape or reference.ndim != 1:
        raise ValueError(f"paired samples need equal 1-d shapes, got {reference.shape} and {candidate.shape}")
    if not margin > 0:
        raise ValueError(f"the margin must be > 0, got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha}")
    n = reference.size
    if n < 2:
        raise ValueError(f"an equivalence test needs at least 2 pairs, got {n}")
    diff = candidate - reference
    mean, se = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(n))
    dof = n - 1
    if np.allclose(diff, diff[0], rtol=1e-9, atol=1e-12):
        # every pair differs by the same amount (up to float rounding): the t interval shrinks to
        # that point, but n equal differences are no evidence of a spread of 0, so say nothing
        return Equivalence(n, mean, mean, mean, margin, float("nan"), "inconclusive")
    half = float(stats.t.ppf(1 - alpha, dof)) * se
    low, high = mean - half, mean + half
    p_lower = float(stats.t.sf((mean + margin) / se, dof))  # H0: difference <= -margin
    p_upper = float(stats.t.cdf((mean - margin) / se, dof))  # H0: difference >= +margin
    p_tost = max(p_lower, p_upper)
    if -margin < low and high < margin:
        verdict = "equivalent"
    elif low >= margin or high <= -margin:
        verdict = "different"
    else:
        verdict = "inconclusive"
    return Equivalence(n, mean, low, high, margin, p_tost, verdict)
