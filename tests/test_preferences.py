"""Tests of morlfed.tasks.rl.preferences: simplex rows, shapes, determinism, each distribution, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from morlfed.tasks.rl.preferences import (
    DISTRIBUTIONS,
    dirichlet,
    equidistant,
    gaussian,
    groups,
    groups_with_labels,
    sample_preferences,
)

PARAMS: dict[str, dict[str, float]] = {
    "dirichlet": {"alpha": 1.0},
    "equidistant": {},
    "gaussian": {"sigma": 0.1},
    "groups": {"n_groups": 3},
}
#: The generated distributions (``fixed`` takes its rows from the user; tested on its own).
GENERATED = [d for d in DISTRIBUTIONS if d != "fixed"]


def _assert_on_simplex(w: np.ndarray, n: int, m: int) -> None:
    assert w.shape == (n, m)
    assert w.dtype == np.float64
    assert np.all(w >= 0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("dist", GENERATED)
@pytest.mark.parametrize("n, m", [(10, 2), (7, 3), (5, 4), (3, 6)])
def test_rows_on_simplex_and_shape(dist: str, n: int, m: int) -> None:
    w = sample_preferences(dist, n, m, np.random.default_rng(0), **PARAMS[dist])
    _assert_on_simplex(w, n, m)


@pytest.mark.parametrize("dist", GENERATED)
def test_single_client(dist: str) -> None:
    params = {"n_groups": 1} if dist == "groups" else PARAMS[dist]
    _assert_on_simplex(sample_preferences(dist, 1, 3, np.random.default_rng(0), **params), 1, 3)


@pytest.mark.parametrize("dist", GENERATED)
def test_seed_determinism(dist: str) -> None:
    a = sample_preferences(dist, 9, 3, np.random.default_rng(42), **PARAMS[dist])
    b = sample_preferences(dist, 9, 3, np.random.default_rng(42), **PARAMS[dist])
    np.testing.assert_array_equal(a, b)
    if dist != "equidistant":
        c = sample_preferences(dist, 9, 3, np.random.default_rng(43), **PARAMS[dist])
        assert not np.array_equal(a, c)


# ------------------------------------------------------------------------------------------
# equidistant
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 10, 11])
def test_equidistant_2d_exact_spacing(n: int) -> None:
    w = equidistant(n, 2)
    np.testing.assert_array_equal(w[0], [0.0, 1.0])
    np.testing.assert_array_equal(w[-1], [1.0, 0.0])
    np.testing.assert_allclose(w[:, 0], np.linspace(0, 1, n), atol=0, rtol=0)
    np.testing.assert_allclose(np.diff(w[:, 0]), 1.0 / (n - 1), atol=1e-15)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-15)


def test_equidistant_single_point_is_the_centre() -> None:
    np.testing.assert_array_equal(equidistant(1, 4), np.full((1, 4), 0.25))


@pytest.mark.parametrize("n, m", [(10, 3), (7, 3), (12, 3), (15, 3), (6, 4), (9, 4)])
def test_equidistant_m_objectives_gives_n_distinct_points(n: int, m: int) -> None:
    w = equidistant(n, m)
    _assert_on_simplex(w, n, m)
    assert len(np.unique(np.round(w, 9), axis=0)) == n
    np.testing.assert_array_equal(w, equidistant(n, m))  # deterministic


def test_equidistant_das_dennis_when_n_matches() -> None:
    # C(3 + 2, 2) = 10 points: the 3-partition Das-Dennis lattice, corners included
    w = equidistant(10, 3)
    np.testing.assert_allclose(np.sort(np.round(w * 3)).sum(axis=1), 3)
    np.testing.assert_allclose(w * 3, np.round(w * 3), atol=1e-12)
    for corner in np.eye(3):
        assert np.any(np.all(np.isclose(w, corner), axis=1))


def test_equidistant_energy_points_are_spread() -> None:
    w = equidistant(7, 3)  # not a Das-Dennis count: Riesz-energy set
    d = np.linalg.norm(w[:, None] - w[None], axis=2)
    np.fill_diagonal(d, np.inf)
    assert d.min() > 0.2  # well separated (random points would often be much closer)


def test_equidistant_ignores_rng_through_sample_preferences() -> None:
    a = sample_preferences("equidistant", 6, 3, np.random.default_rng(0))
    b = sample_preferences("equidistant", 6, 3, np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------
# dirichlet and gaussian
# ------------------------------------------------------------------------------------------
def test_dirichlet_alpha_controls_concentration() -> None:
    rng = np.random.default_rng(0)
    spread = dirichlet(2000, 3, rng, alpha=0.2).std(axis=0).mean()
    tight = dirichlet(2000, 3, rng, alpha=50.0).std(axis=0).mean()
    assert tight < 0.05 < spread
    np.testing.assert_allclose(dirichlet(4000, 3, rng).mean(axis=0), 1 / 3, atol=0.02)


def test_dirichlet_tiny_alpha_never_gives_nan() -> None:
    w = dirichlet(200, 3, np.random.default_rng(0), alpha=1e-3)
    _assert_on_simplex(w, 200, 3)


def test_gaussian_concentrated_near_centre() -> None:
    w = gaussian(500, 3, np.random.default_rng(0), sigma=0.05)
    np.testing.assert_allclose(w.mean(axis=0), 1 / 3, atol=0.01)
    assert np.abs(w - 1 / 3).max() < 0.35
    assert np.median(np.abs(w - 1 / 3)) < 0.06


def test_gaussian_custom_centre_and_zero_sigma() -> None:
    w = gaussian(50, 2, np.random.default_rng(0), centre=[0.8, 0.2], sigma=0.02)
    np.testing.assert_allclose(w.mean(axis=0), [0.8, 0.2], atol=0.01)
    exact = gaussian(4, 3, np.random.default_rng(0), centre=[2.0, 1.0, 1.0], sigma=0.0)
    np.testing.assert_allclose(exact, np.tile([0.5, 0.25, 0.25], (4, 1)))


def test_gaussian_all_zero_rows_are_redrawn() -> None:
    # a corner centre with a large sigma: many rows are clipped to all zeros and must be redrawn
    w = gaussian(300, 3, np.random.default_rng(0), centre=[1, 0, 0], sigma=2.0)
    _assert_on_simplex(w, 300, 3)


def test_gaussian_accepts_omegaconf_centre() -> None:
    from omegaconf import OmegaConf

    centre = OmegaConf.create({"c": [0.5, 0.5]}).c
    _assert_on_simplex(gaussian(3, 2, np.random.default_rng(0), centre=centre), 3, 2)


# ------------------------------------------------------------------------------------------
# groups
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["dirichlet", "equidistant", "gaussian"])
def test_groups_balanced(base: str) -> None:
    w, labels = groups_with_labels(10, 3, np.random.default_rng(0), n_groups=3, base=base)
    _assert_on_simplex(w, 10, 3)
    distinct, counts = np.unique(w, axis=0, return_counts=True)
    assert len(distinct) == 3
    assert sorted(counts.tolist()) == [3, 3, 4]
    assert labels.dtype == np.int64 and sorted(np.bincount(labels).tolist()) == [3, 3, 4]
    for g in range(3):  # labels are the ground truth: one weight per label
        assert len(np.unique(w[labels == g], axis=0)) == 1


def test_groups_given_sizes_and_label_order() -> None:
    w, labels = groups_with_labels(10, 2, np.random.default_rng(1), n_groups=3, sizes=[5, 3, 2])
    np.testing.assert_array_equal(labels, [0] * 5 + [1] * 3 + [2] * 2)
    assert np.bincount(labels).tolist() == [5, 3, 2]
    assert len(np.unique(w, axis=0)) == 3
    np.testing.assert_array_equal(w, groups(10, 2, np.random.default_rng(1), n_groups=3, sizes=[5, 3, 2]))


def test_groups_shuffle_permutes_membership() -> None:
    _, plain = groups_with_labels(12, 2, np.random.default_rng(0), n_groups=3)
    _, mixed = groups_with_labels(12, 2, np.random.default_rng(0), n_groups=3, shuffle=True)
    assert sorted(mixed.tolist()) == sorted(plain.tolist())
    assert not np.array_equal(mixed, plain)


def test_groups_base_params_are_passed_on() -> None:
    w = sample_preferences(
        "groups", 8, 2, np.random.default_rng(0), n_groups=2, base="gaussian", centre=[0.9, 0.1], sigma=0.01
    )
    assert np.all(np.abs(w[:, 0] - 0.9) < 0.05)


def test_groups_n_equals_n_groups() -> None:
    w, labels = groups_with_labels(4, 3, np.random.default_rng(0), n_groups=4)
    assert len(np.unique(w, axis=0)) == 4 and labels.tolist() == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------
def test_unknown_distribution_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        sample_preferences("uniform", 3, 2, np.random.default_rng(0))
    for name in DISTRIBUTIONS:
        assert name in str(err.value)


@pytest.mark.parametrize("dist", GENERATED)
def test_bad_n_and_m(dist: str) -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"n \(number of clients\) must be >= 1, got 0"):
        sample_preferences(dist, 0, 2, rng, **PARAMS[dist])
    with pytest.raises(ValueError, match=r"m \(number of objectives\) must be >= 2, got 1"):
        sample_preferences(dist, 3, 1, rng, **PARAMS[dist])


@pytest.mark.parametrize("alpha", [0.0, -1.0, math.nan])
def test_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="dirichlet alpha must be a finite number > 0"):
        dirichlet(3, 2, np.random.default_rng(0), alpha=alpha)


def test_bad_sigma_and_centre() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="gaussian sigma must be a finite number >= 0"):
        gaussian(3, 2, rng, sigma=-0.1)
    with pytest.raises(ValueError, match="gaussian centre has 3 entries but m = 2"):
        gaussian(3, 2, rng, centre=[0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="non-negative with a positive sum"):
        gaussian(3, 2, rng, centre=[-0.5, 1.5])


def test_bad_group_settings() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"sizes \[3, 3\] sum to 6, but n = 7 clients"):
        groups(7, 2, rng, n_groups=2, sizes=[3, 3])
    with pytest.raises(ValueError, match="n_groups = 5 exceeds the number of clients n = 4"):
        groups(4, 2, rng, n_groups=5)
    with pytest.raises(ValueError, match="n_groups must be >= 1"):
        groups(4, 2, rng, n_groups=0)
    with pytest.raises(ValueError, match="sizes has 3 entries but n_groups = 2"):
        groups(6, 2, rng, n_groups=2, sizes=[2, 2, 2])
    with pytest.raises(ValueError, match="sizes must all be >= 1"):
        groups(6, 2, rng, n_groups=2, sizes=[6, 0])
    with pytest.raises(ValueError, match="unknown groups base distribution 'uniform'"):
        groups(6, 2, rng, n_groups=2, base="uniform")
    with pytest.raises(ValueError, match="cannot itself be 'groups'"):
        groups(6, 2, rng, n_groups=2, base="groups")
    with pytest.raises(ValueError, match="did not produce 3 distinct weights"):
        groups(6, 2, rng, n_groups=3, base="gaussian", sigma=0.0)


def test_rng_must_be_a_generator() -> None:
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        dirichlet(3, 2, np.random.RandomState(0))  # type: ignore[arg-type]


def test_fixed_weights_broadcast_and_validation():
    from morlfed.tasks.rl.preferences import fixed

    np.testing.assert_array_equal(fixed(3, 2, [[0.2, 0.8]]), [[0.2, 0.8]] * 3)
    np.testing.assert_array_equal(fixed(2, 2, [[1, 0], [0, 1]]), [[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="3 entries but the environment has 2 objectives"):
        fixed(2, 2, [[0.2, 0.3, 0.5]])
    with pytest.raises(ValueError, match="1 row or one per client"):
        fixed(3, 2, [[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="sum to 1"):
        fixed(1, 2, [[0.5, 0.6]])
