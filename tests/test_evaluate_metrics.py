"""The metric additions that analysis.evaluate relies on (morlfed.metrics).

The campaign front, sign and reference-point checks, metric directions, the ``final.csv`` return
columns.

test_evaluate.py evaluates planted run directories with them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from morlfed.metrics import (
    METRICS,
    ReferencePointWarning,
    campaign_front,
    check_reference_point,
    compute_metrics,
    equally_spaced_weights,
    expected_utility,
    hypervolume,
    igd,
    igd_plus,
    return_columns,
    scalarised_stats,
)

FRONT = np.array([[1.0, 5.0], [3.0, 3.0], [5.0, 1.0]])


def test_metric_directions_cover_every_computed_metric():
    out = compute_metrics([[1.0, 0.0], [0.0, 1.0]], [[3.0, 1.0], [1.0, 2.0]], [0.0, 0.0], front=FRONT)
    assert list(METRICS) == list(out)
    assert METRICS["hypervolume"].direction == "max" and METRICS["igd"].direction == "min"
    assert METRICS["sparsity"].direction == "min" and METRICS["cardinality"].direction == "max"
    assert {k for k, m in METRICS.items() if m.needs_front} == {
        "igd",
        "igd_plus",
        "front_points_reached",
        "mean_regret",
        "zero_regret_clients",
    }


def test_sign_errors_are_rejected_with_clear_messages():
    # A negated reference point (minimisation convention) is dominated by no front point.
    with pytest.raises(ValueError, match=r"not dominated by any point of the known front.*negated"):
        check_reference_point([0.0, 25.0], [[0.7, -1.0], [8.2, -3.0]])
    # A negated front against the right reference point: the same error, through compute_metrics.
    with pytest.raises(ValueError, match=r"reference point \[0.0, 0.0\] is not dominated"):
        compute_metrics([[1.0, 0.0]], [[3.0, 1.0]], [0.0, 0.0], front=-FRONT)
    # Negative preference weights (negated for a minimising library).
    with pytest.raises(ValueError, match=r"weights must be non-negative.*rows \[1\]"):
        scalarised_stats([[1.0, 0.0], [-0.5, -0.5]], [[1.0, 1.0], [2.0, 2.0]])
    with pytest.raises(ValueError, match=r"weights must be non-negative"):
        expected_utility(FRONT, -equally_spaced_weights(2, 5))
    with pytest.raises(ValueError, match=r"rows \[0\] are all zero"):
        scalarised_stats([[0.0, 0.0]], [[1.0, 1.0]])
    # Pre-negated points and ref (pymoo's convention): nothing dominates the ref, the warning says why.
    with pytest.warns(ReferencePointWarning, match=r"none does: the hypervolume is 0.*negated"):
        assert hypervolume(-FRONT, [0.0, 0.0]) == 0.0


def test_reference_point_errors_are_rejected():
    with pytest.raises(ValueError, match=r"ref must be a 1-D array of length 2"):
        check_reference_point([0.0, 0.0, 0.0], FRONT)
    with pytest.raises(ValueError, match=r"ref must contain only finite values"):
        check_reference_point([0.0, np.nan], FRONT)
    with pytest.raises(ValueError, match=r"ref must be a 1-D array of length 2"):
        compute_metrics([[1.0, 0.0]], [[3.0, 1.0]], [0.0], front=FRONT)
    # Some front points on the boundary: a warning, the reference point is returned.
    with pytest.warns(ReferencePointWarning, match=r"1 of 3 known-front points"):
        np.testing.assert_array_equal(check_reference_point([1.0, 0.0], FRONT), [1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_reference_point([0.0, 0.0], FRONT)


def test_campaign_front_is_the_non_dominated_union():
    a = [[0.0, 3.0], [1.0, 1.0]]
    b = [[2.0, 2.0], [3.0, 0.0], [0.5, 0.5], [0.0, 3.0]]
    # (1,1) and (0.5,0.5) are dominated by (2,2); (0,3) appears twice.
    np.testing.assert_array_equal(campaign_front([a, b]), [[0.0, 3.0], [2.0, 2.0], [3.0, 0.0]])
    np.testing.assert_array_equal(campaign_front([np.empty((0, 2)), a]), [[0.0, 3.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match=r"point set 1 has 3 objectives but point set 0 has 2"):
        campaign_front([a, np.ones((2, 3))])
    with pytest.raises(ValueError, match=r"at least one point set"):
        campaign_front([])


def test_compute_metrics_uses_the_campaign_front_only_without_a_known_front():
    w, r = [[1.0, 0.0], [0.0, 1.0]], [[3.0, 3.0], [1.0, 5.0]]
    out = compute_metrics(w, r, [0.0, 0.0], campaign=FRONT)
    assert out["igd"] == pytest.approx(igd(r, FRONT)) and out["igd"] == pytest.approx(2 * np.sqrt(2) / 3)
    assert out["igd_plus"] == pytest.approx(igd_plus(r, FRONT))
    assert out["mean_regret"] is None and out["front_points_reached"] is None
    known = compute_metrics(w, r, [0.0, 0.0], front=FRONT, campaign=FRONT * 10)
    assert known["igd"] == pytest.approx(igd(r, FRONT))  # the known front wins


def test_return_columns():
    assert return_columns(2) == ["disc_return_0", "disc_return_1"]
    assert return_columns(3, "undiscounted") == ["return_0", "return_1", "return_2"]
    with pytest.raises(ValueError, match=r"one of discounted, undiscounted; got 'raw'"):
        return_columns(2, "raw")
