"""Tests for morlfed.metrics: hand-computed answers, brute-force references, DST known front."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from morlfed.envs import get_spec
from morlfed.metrics import (
    EU_WEIGHTS,
    ReferencePointWarning,
    cardinality,
    compute_metrics,
    equally_spaced_weights,
    eu_weights,
    expected_utility,
    front_points_reached,
    hypervolume,
    igd,
    igd_plus,
    non_dominated,
    regret,
    scalarised,
    scalarised_stats,
    sparsity,
    zero_regret_count,
)

# Three mutually non-dominated points, plus a dominated one and an exact duplicate.
STAIRS = np.array([[0.0, 3.0], [1.0, 1.0], [3.0, 0.0]])
STAIRS_NOISY = np.vstack([STAIRS, [[0.5, 0.5], [1.0, 1.0]]])


@pytest.fixture(scope="module")
def dst_front() -> np.ndarray:
    mo_gym = pytest.importorskip("mo_gymnasium")
    env = mo_gym.make("deep-sea-treasure-v0")
    front = np.array(env.unwrapped.pareto_front(gamma=0.99), dtype=float)
    env.close()
    assert front.shape == (10, 2)
    return front


def sweep_hv_2d(points: np.ndarray, ref: np.ndarray) -> float:
    """Independent 2-D hypervolume (maximisation): sweep from the largest first objective."""
    pts = points[np.all(points > ref, axis=1)]
    hv, best_y = 0.0, ref[1]
    for x, y in pts[np.argsort(-pts[:, 0], kind="stable")]:
        if y > best_y:
            hv += (x - ref[0]) * (y - best_y)
            best_y = y
    return hv


# --------------------------------------------------------------------------- non-dominated


def test_non_dominated_removes_dominated_and_duplicates_sorted():
    shuffled = STAIRS_NOISY[[4, 2, 3, 0, 1]]
    np.testing.assert_array_equal(non_dominated(shuffled), STAIRS)


def test_non_dominated_duplicate_tolerance():
    # (1, 1) and (1 + 1e-9, 1 - 1e-9) do not dominate each other but are the same within 1e-8.
    pts = np.vstack([STAIRS, [[1.0 + 1e-9, 1.0 - 1e-9]]])
    assert cardinality(pts) == 3
    assert cardinality(pts, tol=0.0) == 4
    assert non_dominated(np.empty((0, 2))).shape == (0, 2)


def test_non_dominated_is_maximisation():
    # Under minimisation (a forgotten negation) (0, 0) would be the only survivor.
    np.testing.assert_array_equal(non_dominated([[0.0, 0.0], [2.0, 2.0]]), [[2.0, 2.0]])


# --------------------------------------------------------------------------- hypervolume


def test_hypervolume_2d_by_hand():
    # ref (0, 0), staircase (0,3) (1,1) (3,0): (0,3) and (3,0) do not strictly dominate the ref
    # and are dropped with a warning; (1,1) covers 1x1 = 1.
    with pytest.warns(ReferencePointWarning, match="2 of 3 points"):
        assert hypervolume(STAIRS, [0.0, 0.0]) == pytest.approx(1.0)
    # ref (-1, -1): x in [-1,0] height 3-(-1)=4 -> 4; x in [0,1] height 1-(-1)=2 -> 2;
    # x in [1,3] height 0-(-1)=1 -> 2. Total 8. Dominated point and duplicate add nothing.
    assert hypervolume(STAIRS, [-1.0, -1.0]) == pytest.approx(8.0)
    assert hypervolume(STAIRS_NOISY, [-1.0, -1.0]) == pytest.approx(8.0)
    # (1,3) (2,2) (3,1) over ref (0,0): strips of width 1 with heights 3, 2, 1 -> 6.
    assert hypervolume([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]], [0.0, 0.0]) == pytest.approx(6.0)


def test_hypervolume_3d_by_hand():
    # Boxes from the origin: a=(2,1,1), b=(1,2,1), c=(1,1,2), each of volume 2; every pairwise
    # and the triple intersection is the unit cube. Inclusion-exclusion: 6 - 3 + 1 = 4.
    pts = np.array([[2.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 2.0]])
    assert hypervolume(pts, [0.0, 0.0, 0.0]) == pytest.approx(4.0)
    # a and b only: 2 + 2 - 1 = 3; shifted ref (-1,-1,-1) with a alone: 3*2*2 = 12.
    assert hypervolume(pts[:2], [0.0, 0.0, 0.0]) == pytest.approx(3.0)
    assert hypervolume(pts[:1], [-1.0, -1.0, -1.0]) == pytest.approx(12.0)


@pytest.mark.parametrize("seed", range(5))
def test_hypervolume_matches_sweep_on_random_sets(seed):
    rng = np.random.default_rng(seed)
    # Points on a concave front plus dominated interior points, all above the ref.
    theta = rng.uniform(0, np.pi / 2, size=20)
    front = np.stack([np.cos(theta), np.sin(theta)], axis=1) * 10
    interior = front * rng.uniform(0.2, 0.9, size=(20, 1))
    pts = rng.permutation(np.vstack([front, interior]))
    ref = np.array([-1.0, -0.5])
    expected = sweep_hv_2d(pts, ref)
    assert expected > 0
    assert hypervolume(pts, ref) == pytest.approx(expected, rel=1e-12)


def test_hypervolume_points_below_ref_warn_and_give_zero():
    # Every point is worse than the ref: a minimisation-convention mix-up would look like this.
    with pytest.warns(ReferencePointWarning, match="2 of 2 points"):
        assert hypervolume([[-1.0, -2.0], [-3.0, -0.5]], [0.0, 0.0]) == 0.0
    # One inside, one outside: only the inside point counts.
    with pytest.warns(ReferencePointWarning, match="1 of 2 points"):
        assert hypervolume([[2.0, 3.0], [-1.0, 5.0]], [0.0, 0.0]) == pytest.approx(6.0)


def test_hypervolume_empty_and_no_warning_when_all_inside():
    assert hypervolume(np.empty((0, 2)), [0.0, 0.0]) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hypervolume([[1.0, 1.0]], [0.0, 0.0])


# --------------------------------------------------------------------------- IGD / IGD+


@pytest.mark.parametrize("seed", range(3))
def test_igd_and_igd_plus_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    pts, front = rng.normal(size=(20, 3)), rng.normal(size=(15, 3))
    diff = front[:, None, :] - pts[None, :, :]  # [front, points, m]: z - a
    brute_igd = np.sqrt((diff**2).sum(-1)).min(axis=1).mean()
    # IGD+ (maximisation): only shortfalls of the obtained point a below front point z count.
    brute_plus = np.sqrt((np.maximum(diff, 0) ** 2).sum(-1)).min(axis=1).mean()
    assert igd(pts, front) == pytest.approx(brute_igd, rel=1e-12)
    assert igd_plus(pts, front) == pytest.approx(brute_plus, rel=1e-12)
    assert igd(front, front) == pytest.approx(0.0, abs=1e-12)
    assert igd_plus(front, front) == pytest.approx(0.0, abs=1e-12)


def test_igd_plus_is_maximisation():
    front = STAIRS
    # A set that dominates the front has IGD+ 0 but positive IGD; a dominated one is penalised.
    assert igd_plus(front + 1.0, front) == pytest.approx(0.0)
    assert igd(front + 1.0, front) == pytest.approx(np.sqrt(2))
    assert igd_plus(front - 1.0, front) == pytest.approx(np.sqrt(2))


# --------------------------------------------------------------------------- sparsity etc.


def test_sparsity_by_hand():
    # Non-dominated set (0,3) (1,1) (3,0): per objective sorted 0,1,3 -> gaps 1,2 -> 1+4 = 5;
    # both objectives: 10; divided by n-1 = 2 -> 5. Dominated/duplicate points do not count.
    assert sparsity(STAIRS) == pytest.approx(5.0)
    assert sparsity(STAIRS_NOISY) == pytest.approx(5.0)
    # Two points (0,2) (2,0): (4 + 4) / 1 = 8. A single point (after filtering): not defined.
    assert sparsity([[0.0, 2.0], [2.0, 0.0]]) == pytest.approx(8.0)
    assert np.isnan(sparsity([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))


def test_sparsity_of_a_collapsed_set_is_not_defined_in_the_metrics():
    # every client on one point (a collapsed federation): None, never the "densest" 0
    out = compute_metrics([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]], [[2.0, 1.0]] * 3, [0.0, 0.0])
    assert out["sparsity"] is None and out["cardinality"] == 1
    json.dumps(out)


def test_cardinality_by_hand():
    assert cardinality(STAIRS_NOISY) == 3
    assert cardinality([[1.0, 1.0]] * 4) == 1


def test_expected_utility_by_hand():
    # w=(1,0): best 3; w=(0,1): best 3; w=(.5,.5): max(1.5, 1, 1.5) = 1.5 -> mean 7.5/3 = 2.5.
    w = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    assert expected_utility(STAIRS, w) == pytest.approx(2.5)


def test_scalarised_stats_use_each_clients_own_weights():
    # Client 0 scores 1*2 + 0*5 = 2, client 1 scores 0*3 + 1*4 = 4 (cross terms would give 5, 3).
    s = scalarised_stats([[1.0, 0.0], [0.0, 1.0]], [[2.0, 5.0], [3.0, 4.0]])
    assert s == pytest.approx({"mean": 3.0, "min": 2.0, "max": 4.0})


def test_equally_spaced_weights():
    w = equally_spaced_weights(2, 10)
    np.testing.assert_allclose(w[:, 0], np.linspace(0, 1, 10))
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    w3 = equally_spaced_weights(3, 10)  # a lattice size: exactly 10, the lattice of 3 partitions
    assert w3.shape == (10, 3) and (w3 >= 0).all()
    np.testing.assert_allclose(w3 * 3, np.round(w3 * 3))  # every coordinate a multiple of 1/3
    assert len(np.unique(w3.round(6), axis=0)) == 10
    assert equally_spaced_weights(3, 12).shape == (15, 3)  # the next lattice up: 4 partitions
    np.testing.assert_allclose(equally_spaced_weights(3, 1), [[1 / 3] * 3])
    w3[0] = -1  # the cached set is not exposed
    assert (equally_spaced_weights(3, 10) >= 0).all()


def test_expected_utility_weights_are_pinned_and_need_no_pymoo(monkeypatch):
    # 4 objectives: the Das-Dennis lattice of 7 partitions, 120 weights, in lattice order
    w = eu_weights(4)
    assert w.shape == (120, 4) and EU_WEIGHTS == 100
    np.testing.assert_array_equal(
        w[:5],
        [
            [0.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, 1 / 7, 6 / 7],
            [0.0, 0.0, 2 / 7, 5 / 7],
            [0.0, 0.0, 3 / 7, 4 / 7],
            [0.0, 0.0, 4 / 7, 3 / 7],
        ],
    )
    assert w[:5, 2].tolist() == [0.0, 0.14285714285714285, 0.2857142857142857, 0.42857142857142855, 0.5714285714285714]
    np.testing.assert_array_equal(w[-1], [1.0, 0.0, 0.0, 0.0])
    assert eu_weights(3).shape == (105, 3) and eu_weights(2).shape == (100, 2)
    # no pymoo construction behind them: the expected utility of a 4-objective front is the same
    # number whatever pymoo's reference directions (here: none at all) would give
    front = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 4.0]])
    before = expected_utility(front, eu_weights(4))
    import pymoo.util.ref_dirs

    def refuse(*args, **kwargs):
        raise AssertionError("pymoo reference directions used")

    monkeypatch.setattr(pymoo.util.ref_dirs, "get_reference_directions", refuse)
    scalarised._weights_cached.cache_clear()
    assert expected_utility(front, eu_weights(4)) == before
    # by hand: weight w picks max_k (k + 1) w_k; the lattice mean of that, over the 120 weights
    assert before == pytest.approx(np.mean([max((k + 1) * x for k, x in enumerate(row)) for row in w]))


def test_regret_and_zero_regret_count_by_hand():
    front = STAIRS
    weights = [[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]
    returns = [[3.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    # optima 3, 1.5, 3; scores 3, 1, 1 -> regrets 0, 0.5, 2.
    g = regret(weights, returns, front)
    np.testing.assert_allclose(g, [0.0, 0.5, 2.0])
    assert zero_regret_count(g, tol=1e-9) == 1
    assert zero_regret_count(g, tol=0.5) == 2
    assert zero_regret_count(g, tol=[0.0, 0.4, 2.0]) == 2
    # Beating an approximate front gives negative regret, which counts as zero regret.
    beat = regret([[1.0, 0.0]], [[4.0, 0.0]], front)
    np.testing.assert_allclose(beat, [-1.0])
    assert zero_regret_count(beat, tol=0.0) == 1


# --------------------------------------------------------------------------- DST known answer


def test_dst_front_known_answers(dst_front):
    rng = np.random.default_rng(0)
    pts = rng.permutation(np.vstack([dst_front, dst_front[:3] - 1.0]))  # + dominated points
    assert cardinality(pts) == 10
    assert igd(pts, dst_front) == pytest.approx(0.0, abs=1e-12)
    assert igd_plus(pts, dst_front) == pytest.approx(0.0, abs=1e-12)
    assert front_points_reached(pts, dst_front) == 10
    np.testing.assert_allclose(non_dominated(pts), dst_front[np.argsort(dst_front[:, 0])])


def test_dst_front_points_reached_tolerance(dst_front):
    # tol is relative to the front's range per objective (~19.1 treasure, ~16.4 time).
    scale = np.ptp(dst_front, axis=0)
    assert front_points_reached(dst_front + 0.9e-3 * scale, dst_front) == 10
    assert front_points_reached(dst_front + 1.1e-3 * scale, dst_front) == 0
    off = dst_front.copy()
    off[0, 1] -= 0.1  # one client one step short of treasure 0.7's return: not reached
    assert front_points_reached(off, dst_front) == 9
    assert front_points_reached(np.empty((0, 2)), dst_front) == 0


def test_dst_regret_with_equidistant_weights(dst_front):
    weights = equally_spaced_weights(2, 10)
    best = np.argmax(weights @ dst_front.T, axis=1)
    # Only 6 of the 10 front points are optimal for some of 10 equidistant weights (docs/analysis.md#the-metrics).
    np.testing.assert_array_equal(best, [0, 0, 1, 1, 2, 5, 7, 9, 9, 9])
    assert len(set(best.tolist())) == 6
    optimal = dst_front[best]
    np.testing.assert_allclose(regret(weights, optimal, dst_front), 0.0, atol=1e-12)
    assert zero_regret_count(regret(weights, optimal, dst_front), tol=1e-9) == 10
    # Everyone at the first treasure: zero regret exactly for the two weights it is best for.
    g = regret(weights, np.repeat(dst_front[:1], 10, axis=0), dst_front)
    assert zero_regret_count(g, tol=1e-9) == 2
    assert (g[2:] > 0.09).all()  # smallest: w = (2/9, 7/9), 0.098 behind treasure 8.2


def test_compute_metrics_dst(dst_front):
    weights = equally_spaced_weights(2, 10)
    returns = dst_front[np.argmax(weights @ dst_front.T, axis=1)]
    ref = np.array([0.0, -25.0])
    out = compute_metrics(weights, returns, ref, front=dst_front)
    assert list(out) == [
        "mean_scalarised",
        "min_scalarised",
        "max_scalarised",
        "hypervolume",
        "igd",
        "igd_plus",
        "sparsity",
        "cardinality",
        "front_points_reached",
        "mean_regret",
        "zero_regret_clients",
        "expected_utility",
    ]
    json.dumps(out)
    assert all(type(v) in (float, int) for v in out.values())
    assert out["cardinality"] == 6 and out["front_points_reached"] == 6
    assert out["zero_regret_clients"] == 10
    assert out["mean_regret"] == pytest.approx(0.0, abs=1e-12)
    assert out["igd"] > 0 and out["igd_plus"] > 0
    assert out["hypervolume"] == pytest.approx(sweep_hv_2d(returns, ref))
    assert out["hypervolume"] < hypervolume(dst_front, ref)
    s = np.einsum("ij,ij->i", weights, returns)
    assert out["mean_scalarised"] == pytest.approx(s.mean())
    assert out["min_scalarised"] == pytest.approx(s.min())
    assert out["max_scalarised"] == pytest.approx(s.max())
    assert out["sparsity"] == pytest.approx(sparsity(returns))
    assert out["expected_utility"] == pytest.approx(expected_utility(returns, equally_spaced_weights(2, 100)))
    # tol (1e-3) is relative to the front's range: a shortfall of 0.5e-3 * range in every
    # objective still reaches the point with zero regret; 2e-3 * range does neither.
    scale = np.ptp(dst_front, axis=0)
    near = compute_metrics(weights, returns - 0.5e-3 * scale, ref, front=dst_front)
    assert near["front_points_reached"] == 6 and near["zero_regret_clients"] == 10
    far = compute_metrics(weights, returns - 2e-3 * scale, ref, front=dst_front)
    assert far["front_points_reached"] == 0 and far["zero_regret_clients"] == 0


def test_hypervolume_with_the_reference_point_of_each_kind_of_returns():
    """Each kind of returns is measured against its own reference point.

    mo-halfcheetah's 1000-step undiscounted returns are ~10x its discounted ones. The expected
    values are hand-computed: two rectangles less their overlap.
    """
    spec = get_spec("mo-halfcheetah")
    disc_ref, undisc_ref = spec.reference_point("discounted"), spec.reference_point("undiscounted")
    assert (disc_ref, undisc_ref) == ((-100.0, -600.0), (-1000.0, -6001.0))
    assert get_spec("deep-sea-treasure").reference_point("undiscounted") == (0.0, -25.0)  # one point serves both
    w = [[0.5, 0.5], [0.5, 0.5]]
    disc = np.array([[50.0, -200.0], [10.0, -100.0]])
    # (50 + 100) * (600 - 200) + (10 + 100) * (600 - 100) - (10 + 100) * (600 - 200)
    assert compute_metrics(w, disc, disc_ref)["hypervolume"] == pytest.approx(60000 + 55000 - 44000)
    undisc = 10 * disc
    # (500 + 1000) * (6001 - 2000) + (100 + 1000) * (6001 - 1000) - (100 + 1000) * (6001 - 2000)
    assert compute_metrics(w, undisc, undisc_ref)["hypervolume"] == pytest.approx(6001500 + 5501100 - 4401100)
    with pytest.warns(ReferencePointWarning, match="2 of 2 points"):  # the discounted point: every return outside
        assert compute_metrics(w, undisc, disc_ref)["hypervolume"] == 0.0
    with pytest.raises(ValueError, match="returns must be discounted or undiscounted"):
        spec.reference_point("scalarised")


def test_compute_metrics_without_front():
    out = compute_metrics([[1.0, 0.0], [0.0, 1.0]], [[3.0, 1.0], [1.0, 2.0]], [0.0, 0.0])
    for key in ("igd", "igd_plus", "front_points_reached", "mean_regret", "zero_regret_clients"):
        assert out[key] is None
    assert out["hypervolume"] == pytest.approx(4.0)  # 3*1 + 1*(2-1)
    assert out["cardinality"] == 2 and out["mean_scalarised"] == pytest.approx(2.5)
    json.dumps(out)


# --------------------------------------------------------------------------- bad input


def test_bad_input_messages():
    with pytest.raises(ValueError, match=r"ref must be a 1-D array of length 2"):
        hypervolume(STAIRS, [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"points must contain only finite values; rows \[1\]"):
        hypervolume([[1.0, 1.0], [np.nan, 1.0]], [0.0, 0.0])
    with pytest.raises(ValueError, match=r"ref must contain only finite values"):
        hypervolume(STAIRS, [0.0, np.inf])
    with pytest.raises(ValueError, match=r"points must be a 2-D array .* got 1-D shape \(3,\)"):
        sparsity([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"points has 3 objectives but front has 2"):
        igd(np.ones((4, 3)), STAIRS)
    with pytest.raises(ValueError, match=r"front must contain at least one row"):
        igd_plus(STAIRS, np.empty((0, 2)))
    with pytest.raises(ValueError, match=r"weights has 3 rows but returns has 2"):
        scalarised_stats(np.ones((3, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"weights has 3 objectives but returns has 2"):
        compute_metrics(np.ones((2, 3)), np.ones((2, 2)), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"tol must be a finite number >= 0"):
        non_dominated(STAIRS, tol=-1.0)
    with pytest.raises(ValueError, match=r"numeric 2-D array"):
        cardinality([["a", "b"]])
    with pytest.raises(ValueError, match=r"m \(number of objectives\) must be an integer >= 2"):
        equally_spaced_weights(1, 5)
    with pytest.raises(ValueError, match=r"n \(number of weight vectors\) must be an integer >= 1"):
        equally_spaced_weights(4, 0)


def test_module_imports_no_torch_gymnasium_or_morlfed():
    # The package morlfed itself imports torch (its protocols), so it is stood in for by an empty
    # package: what importing morlfed.metrics pulls in is then its own doing.
    code = (
        "import sys, types; pkg = types.ModuleType('morlfed'); pkg.__path__ = ['morlfed']; "
        "sys.modules['morlfed'] = pkg; import morlfed.metrics; "
        "print([m for m in sys.modules if m in ('torch', 'gymnasium') "
        "or (m.startswith('morlfed.') and not m.startswith('morlfed.metrics'))])"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(root)},
    )
    assert out.stdout.strip() == "[]"
