"""Preference (linear weight) distributions for federated MORL clients.

Every client ``i`` holds a private linear preference ``w_i`` on the probability simplex
(non-negative entries summing to 1). This module draws the ``[n, m]`` matrix of client
preferences for ``n`` clients and ``m`` objectives (docs/algorithms.md#preferences):

* ``dirichlet``   -- ``rng.dirichlet(alpha * ones(m))``; ``alpha = 1`` is uniform on the simplex.
* ``equidistant`` -- evenly spaced, deterministic (2 objectives: a linspace; more: Das-Dennis when
  ``n`` is a Das-Dennis count, otherwise a Riesz s-energy set of exactly ``n`` points).
* ``gaussian``    -- ``N(centre, sigma)`` per component, clipped at 0 and L1-normalised: clients
  with similar preferences.
* ``groups``      -- ``g`` distinct weights drawn by a base distribution, each held by several
  clients (balanced or given sizes): the clustering-validation setting.
  :func:`groups_with_labels` also returns the ground-truth group of each client.

All functions return ``float64`` arrays whose rows are on the simplex. Randomness comes only from
the ``numpy.random.Generator`` passed in (no global RNG).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from morlfed.metrics.simplex import das_dennis, das_dennis_partitions, fewest_partitions

__all__ = [
    "DISTRIBUTIONS",
    "dirichlet",
    "equidistant",
    "fixed",
    "gaussian",
    "groups",
    "groups_with_labels",
    "sample_preferences",
]

#: Names accepted by :func:`sample_preferences` (``dist=``).
DISTRIBUTIONS: tuple[str, ...] = ("dirichlet", "equidistant", "gaussian", "groups", "fixed")

# How many times ``gaussian`` redraws a row that was clipped to all zeros before falling back.
_GAUSSIAN_MAX_REDRAWS = 100
# How many times ``groups`` redraws its g base weights when two of them coincide.
_GROUPS_MAX_REDRAWS = 100
# Two group weights closer than this (max-abs difference) count as the same weight.
_DISTINCT_TOL = 1e-9


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _check_n_m(n: int, m: int) -> tuple[int, int]:
    """Validate the number of clients ``n`` (>= 1) and objectives ``m`` (>= 2)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"n (number of clients) must be an integer, got {n!r}")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
        raise ValueError(f"m (number of objectives) must be an integer, got {m!r}")
    if n < 1:
        raise ValueError(f"n (number of clients) must be >= 1, got {n}")
    if m < 2:
        raise ValueError(f"m (number of objectives) must be >= 2, got {m}")
    return int(n), int(m)


def _check_rng(rng: Any) -> np.random.Generator:
    """Require a ``numpy.random.Generator`` (no global RNG, no legacy ``RandomState``)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator (e.g. np.random.default_rng(seed)), got {type(rng).__name__}"
        )
    return rng


def _normalise_rows(w: np.ndarray) -> np.ndarray:
    """Clip tiny negative round-off to 0 and L1-normalise every row (rows must have mass)."""
    w = np.clip(np.asarray(w, dtype=np.float64), 0.0, None)
    return w / w.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------------------------
# distributions
# --------------------------------------------------------------------------------------------
def dirichlet(n: int, m: int, rng: np.random.Generator, alpha: float = 1.0) -> np.ndarray:
    """Draw ``n`` preferences from a symmetric Dirichlet distribution.

    :param n: number of clients (rows), >= 1
    :param m: number of objectives (columns), >= 2
    :param rng: the generator to draw from
    :param alpha: concentration (> 0). ``1`` is uniform on the simplex; larger values concentrate
        around the centre ``1/m``, smaller values push mass to the corners
    :return: ``float64`` array ``[n, m]``, rows on the simplex
    """
    n, m = _check_n_m(n, m)
    rng = _check_rng(rng)
    alpha = float(alpha)
    if not alpha > 0 or not math.isfinite(alpha):
        raise ValueError(f"dirichlet alpha must be a finite number > 0, got {alpha}")
    w = rng.dirichlet(alpha * np.ones(m), size=n)
    # With a very small alpha a row can underflow to all zeros; give it a one-hot corner instead.
    dead = ~(w.sum(axis=1) > 0)
    if dead.any():
        w[dead] = np.eye(m)[rng.integers(m, size=int(dead.sum()))]
    return _normalise_rows(w)


def _farthest_point_init(n: int, m: int) -> np.ndarray:
    """Deterministic, well-spread start for the energy optimisation: ``n`` lattice points.

    Takes the smallest Das-Dennis lattice with at least ``5 n`` points and greedily selects ``n``
    of them, starting from the point closest to the centre and then always adding the lattice
    point farthest from those already chosen.
    """
    lattice = das_dennis(m, fewest_partitions(5 * n, m))
    first = int(np.argmin(np.linalg.norm(lattice - 1.0 / m, axis=1)))
    chosen = [first]
    dist = np.linalg.norm(lattice - lattice[first], axis=1)
    while len(chosen) < n:
        nxt = int(np.argmax(dist))
        chosen.append(nxt)
        dist = np.minimum(dist, np.linalg.norm(lattice - lattice[nxt], axis=1))
    return lattice[chosen].copy()


def equidistant(n: int, m: int) -> np.ndarray:
    """Return ``n`` evenly spaced preferences on the simplex (deterministic, no RNG).

    * ``m == 2``: row ``i`` is ``[t_i, 1 - t_i]`` with ``t = linspace(0, 1, n)``, i.e. from
      ``[0, 1]`` to ``[1, 0]`` with exactly equal spacing.
    * ``m > 2``: if ``n`` is a Das-Dennis count ``C(p + m - 1, m - 1)`` (e.g. 3, 6, 10, 15, 21 for
      m = 3), the Das-Dennis lattice with ``p`` partitions (includes the corners;
      :func:`morlfed.metrics.simplex.das_dennis`); otherwise a
      Riesz s-energy set of exactly ``n`` points (pymoo's ``get_reference_directions("energy",
      m, n, X=start)``) optimised from a deterministic farthest-point start on a finer lattice.
      The start replaces pymoo's default sampling, which builds a 10000 x 10000 distance matrix
      (~0.8 GB, seconds per call) and fails for ``n < m``; the result is as well spread.
    * ``n == 1``: the single point is the centre ``1/m`` (a linspace of one point would be an
      arbitrary corner).

    :param n: number of clients (rows), >= 1
    :param m: number of objectives (columns), >= 2
    :return: ``float64`` array ``[n, m]``, rows on the simplex, all rows distinct when ``n > 1``
    """
    n, m = _check_n_m(n, m)
    if n == 1:
        return np.full((1, m), 1.0 / m)
    if m == 2:
        t = np.linspace(0.0, 1.0, n)
        return np.stack([t, 1.0 - t], axis=1)
    p = das_dennis_partitions(n, m)
    if p is not None:
        w = das_dennis(m, p)
    else:
        from pymoo.util.ref_dirs import get_reference_directions

        w = get_reference_directions("energy", m, n, X=_farthest_point_init(n, m))
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (n, m):  # pragma: no cover - guards against a pymoo behaviour change
        raise RuntimeError(f"pymoo returned {w.shape[0]} reference directions, expected {n}")
    return _normalise_rows(w)


def gaussian(
    n: int,
    m: int,
    rng: np.random.Generator,
    centre: Sequence[float] | np.ndarray | None = None,
    sigma: float = 0.1,
) -> np.ndarray:
    """Draw ``n`` preferences scattered around a centre: similar clients.

    Each component is ``N(centre_j, sigma)``; the row is clipped at 0 and L1-normalised. A row
    whose components are all clipped to 0 (only likely when ``sigma`` is large compared with the
    centre) has no direction: it is redrawn, up to 100 times, and if it is still all zeros it
    falls back to the (normalised) centre. With ``sigma == 0`` every row is the centre.

    :param n: number of clients (rows), >= 1
    :param m: number of objectives (columns), >= 2
    :param rng: the generator to draw from
    :param centre: length-``m`` non-negative vector with positive sum (normalised to the simplex);
        default ``1/m`` each
    :param sigma: standard deviation per component, >= 0
    :return: ``float64`` array ``[n, m]``, rows on the simplex
    """
    n, m = _check_n_m(n, m)
    rng = _check_rng(rng)
    sigma = float(sigma)
    if not sigma >= 0 or not math.isfinite(sigma):
        raise ValueError(f"gaussian sigma must be a finite number >= 0, got {sigma}")
    if centre is None:
        c = np.full(m, 1.0 / m)
    else:
        # list() first so that an omegaconf ListConfig from the hydra config converts cleanly
        c = np.asarray(list(np.ravel(centre) if isinstance(centre, np.ndarray) else centre), float)
        if c.shape != (m,):
            raise ValueError(f"gaussian centre has {c.size} entries but m = {m} objectives")
        if not np.all(np.isfinite(c)) or np.any(c < 0) or not c.sum() > 0:
            raise ValueError(f"gaussian centre must be non-negative with a positive sum, got {c.tolist()}")
        c = c / c.sum()

    w = np.clip(rng.normal(c, sigma, size=(n, m)), 0.0, None)
    for _ in range(_GAUSSIAN_MAX_REDRAWS):
        dead = ~(w.sum(axis=1) > 0)
        if not dead.any():
            break
        w[dead] = np.clip(rng.normal(c, sigma, size=(int(dead.sum()), m)), 0.0, None)
    else:
        dead = ~(w.sum(axis=1) > 0)
        w[dead] = c
    return _normalise_rows(w)


def _group_sizes(n: int, n_groups: int, sizes: Sequence[int] | None) -> list[int]:
    """Validate ``n_groups`` / ``sizes`` and return the number of clients in each group."""
    if isinstance(n_groups, bool) or not isinstance(n_groups, (int, np.integer)):
        raise ValueError(f"groups n_groups must be an integer, got {n_groups!r}")
    n_groups = int(n_groups)
    if n_groups < 1:
        raise ValueError(f"groups n_groups must be >= 1, got {n_groups}")
    if n_groups > n:
        raise ValueError(
            f"groups n_groups = {n_groups} exceeds the number of clients n = {n} "
            f"(every group needs at least one client)"
        )
    if sizes is None:
        base, extra = divmod(n, n_groups)
        return [base + (1 if g < extra else 0) for g in range(n_groups)]
    sizes = [int(s) for s in sizes]
    if len(sizes) != n_groups:
        raise ValueError(f"groups sizes has {len(sizes)} entries but n_groups = {n_groups}")
    if any(s < 1 for s in sizes):
        raise ValueError(f"groups sizes must all be >= 1, got {sizes}")
    if sum(sizes) != n:
        raise ValueError(f"groups sizes {sizes} sum to {sum(sizes)}, but n = {n} clients")
    return sizes


def groups_with_labels(
    n: int,
    m: int,
    rng: np.random.Generator,
    n_groups: int,
    sizes: Sequence[int] | None = None,
    base: str = "dirichlet",
    shuffle: bool = False,
    **base_params: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n_groups`` distinct weights and assign each to a group of clients.

    The ``g = n_groups`` group weights are drawn by ``base`` (``"dirichlet"``, ``"equidistant"``
    or ``"gaussian"``, with ``base_params`` passed on, e.g. ``alpha`` or ``sigma``) as a
    ``[g, m]`` sample. If two of them coincide (e.g. gaussian with ``sigma = 0``) they are redrawn;
    a base that cannot produce ``g`` distinct weights raises ``ValueError``.

    Group ``k`` is held by ``sizes[k]`` clients. By default the groups are balanced (sizes differ
    by at most one, the first ``n % g`` groups get the extra client). Clients are assigned in
    contiguous blocks (clients ``0..sizes[0]-1`` form group 0, ...) unless ``shuffle`` is true, in
    which case the assignment is permuted with ``rng``.

    :param n: number of clients, >= 1
    :param m: number of objectives, >= 2
    :param rng: the generator to draw from
    :param n_groups: number of distinct weights, ``1 <= n_groups <= n``
    :param sizes: clients per group (length ``n_groups``, each >= 1, summing to ``n``); balanced if
        omitted
    :param base: distribution of the group weights
    :param shuffle: permute which clients belong to which group
    :param base_params: keyword parameters of the base distribution
    :return: ``(weights, labels)``: ``float64 [n, m]`` rows on the simplex, and ``int64 [n]`` group
        label of every client (``weights[i] == group_weights[labels[i]]``)
    """
    n, m = _check_n_m(n, m)
    rng = _check_rng(rng)
    counts = _group_sizes(n, n_groups, sizes)
    g = len(counts)
    if base == "groups":
        raise ValueError("groups base cannot itself be 'groups'")
    if base not in DISTRIBUTIONS:
        raise ValueError(
            f"unknown groups base distribution {base!r}; valid: {', '.join(d for d in DISTRIBUTIONS if d != 'groups')}"
        )

    def _all_distinct(w: np.ndarray) -> bool:
        if g == 1:
            return True
        diff = np.abs(w[:, None, :] - w[None, :, :]).max(axis=2)
        np.fill_diagonal(diff, np.inf)
        return bool(diff.min() > _DISTINCT_TOL)

    # equidistant is deterministic: one draw is all there is.
    attempts = 1 if base == "equidistant" else _GROUPS_MAX_REDRAWS
    for _ in range(attempts):
        centres = sample_preferences(base, g, m, rng, **base_params)
        if _all_distinct(centres):
            break
    else:
        raise ValueError(
            f"groups base {base!r} with {base_params} did not produce {g} distinct weights "
            f"(e.g. gaussian with sigma = 0 always returns the centre)"
        )

    labels = np.repeat(np.arange(g, dtype=np.int64), counts)
    if shuffle:
        labels = rng.permutation(labels)
    return centres[labels].copy(), labels


def groups(
    n: int,
    m: int,
    rng: np.random.Generator,
    n_groups: int,
    sizes: Sequence[int] | None = None,
    base: str = "dirichlet",
    shuffle: bool = False,
    **base_params: Any,
) -> np.ndarray:
    """Like :func:`groups_with_labels` but return only the ``[n, m]`` weights.

    :param n: number of clients, >= 1
    :param m: number of objectives, >= 2
    :param rng: the generator to draw from
    :param n_groups: number of distinct weights, ``1 <= n_groups <= n``
    :param sizes: clients per group (summing to ``n``); balanced if omitted
    :param base: distribution of the group weights (``dirichlet``, ``equidistant``, ``gaussian``)
    :param shuffle: permute which clients belong to which group
    :param base_params: keyword parameters of the base distribution
    :return: ``float64 [n, m]``, rows on the simplex, exactly ``n_groups`` distinct rows
    """
    weights, _ = groups_with_labels(n, m, rng, n_groups, sizes=sizes, base=base, shuffle=shuffle, **base_params)
    return weights


def fixed(n: int, m: int, weights: Sequence[Sequence[float]]) -> np.ndarray:
    """Preferences given explicitly: one row per client, or a single row shared by all.

    :param n: number of clients, >= 1
    :param m: number of objectives, >= 2
    :param weights: ``n`` rows (or 1 row) of ``m`` non-negative numbers summing to 1
    :return: ``float64 [n, m]``
    """
    n, m = _check_n_m(n, m)
    rows = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    if rows.ndim != 2 or rows.size == 0:
        raise ValueError(f"weights must be a list of rows of {m} numbers, got {weights!r}")
    if rows.shape[1] != m:
        raise ValueError(f"weights have {rows.shape[1]} entries but the environment has {m} objectives")
    if rows.shape[0] not in (1, n):
        raise ValueError(f"weights must have 1 row or one per client ({n}), got {rows.shape[0]} rows")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0) or not np.allclose(rows.sum(axis=1), 1.0, atol=1e-6):
        raise ValueError(f"every weight row must be non-negative and sum to 1, got {rows.tolist()}")
    return np.repeat(rows, n, axis=0) if rows.shape[0] == 1 else rows.copy()


def sample_preferences(dist: str, n: int, m: int, rng: np.random.Generator, **params: Any) -> np.ndarray:
    """Draw the ``[n, m]`` preference matrix of ``n`` clients from the distribution ``dist``.

    :param dist: one of :data:`DISTRIBUTIONS` (``dirichlet``, ``equidistant``, ``gaussian``,
        ``groups``, ``fixed``)
    :param n: number of clients, >= 1
    :param m: number of objectives, >= 2
    :param rng: the generator to draw from (ignored by ``equidistant``, which is deterministic)
    :param params: the distribution's own parameters (``alpha``; ``centre``, ``sigma``;
        ``n_groups``, ``sizes``, ``base``, ``shuffle`` and the base's parameters)
    :return: ``float64 [n, m]``, rows on the simplex
    :raises ValueError: unknown ``dist`` (the message lists the valid names), invalid ``n``/``m`` or
        invalid distribution parameters
    """
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown preference distribution {dist!r}; valid: {', '.join(DISTRIBUTIONS)}")
    if dist == "dirichlet":
        return dirichlet(n, m, rng, **params)
    if dist == "equidistant":
        return equidistant(n, m, **params)
    if dist == "gaussian":
        return gaussian(n, m, rng, **params)
    if dist == "fixed":
        return fixed(n, m, **params)
    return groups(n, m, rng, **params)
