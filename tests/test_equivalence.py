"""The paired equivalence test (TOST) of the engine-agreement study: known intervals and verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from morlfed.analysis.equivalence import paired_equivalence, standardised_margin

REFERENCE = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
# paired differences 1, 2, 3, 4, 5: mean 3, sd sqrt(2.5), se sqrt(0.5), t(0.95, 4) = 2.131847
CANDIDATE = REFERENCE + np.array([1.0, 2.0, 3.0, 4.0, 5.0])
HALF = 2.131847 * np.sqrt(0.5)


def test_the_interval_is_the_students_t_interval_of_the_mean_difference() -> None:
    result = paired_equivalence(REFERENCE, CANDIDATE, margin=5.0)
    assert result.n == 5
    assert result.mean_difference == pytest.approx(3.0)
    assert (result.low, result.high) == pytest.approx((3.0 - HALF, 3.0 + HALF), abs=1e-5)


@pytest.mark.parametrize(
    ("margin", "verdict"),
    [
        (5.0, "equivalent"),  # [1.49, 4.51] inside +-5
        (2.0, "inconclusive"),  # reaches past +2 but not entirely beyond it
        (1.0, "different"),  # entirely above +1
    ],
)
def test_the_verdict_compares_the_interval_with_the_margin(margin: float, verdict: str) -> None:
    assert paired_equivalence(REFERENCE, CANDIDATE, margin).verdict == verdict


def test_equivalence_is_a_tost_p_value_below_the_level() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        reference = rng.normal(size=12)
        candidate = reference + rng.normal(0.1, 0.5, size=12)
        margin = float(rng.uniform(0.2, 1.0))
        result = paired_equivalence(reference, candidate, margin)
        assert (result.verdict == "equivalent") == (result.p_tost < 0.05)


def test_equal_differences_say_nothing_about_the_spread() -> None:
    result = paired_equivalence(REFERENCE, REFERENCE + 0.1, margin=1.0)
    assert result.verdict == "inconclusive"
    assert np.isnan(result.p_tost)


def test_the_margin_is_a_fraction_of_the_references_spread() -> None:
    assert standardised_margin(np.array([1.0, 2.0, 3.0])) == pytest.approx(0.5)
    assert standardised_margin(np.array([1.0, 2.0, 3.0]), fraction=0.25) == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: paired_equivalence(REFERENCE, CANDIDATE[:4], 1.0), "equal 1-d shapes"),
        (lambda: paired_equivalence(REFERENCE, CANDIDATE, 0.0), "margin must be > 0"),
        (lambda: paired_equivalence(REFERENCE, CANDIDATE, 1.0, alpha=0.5), "alpha must lie in"),
        (lambda: paired_equivalence(REFERENCE[:1], CANDIDATE[:1], 1.0), "at least 2 pairs"),
        (lambda: standardised_margin(np.array([1.0])), "at least 2 outcomes"),
        (lambda: standardised_margin(REFERENCE, fraction=0.0), "fraction must be > 0"),
    ],
)
def test_bad_input_is_refused(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
