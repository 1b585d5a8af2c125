"""Metrics of linear preferences: per-client scalarised returns, regret and expected utility.

The regret is measured against a known front, the expected utility over equally spaced
(Das-Dennis) weights.

Every objective is maximised and preferences are non-negative weights (see
:mod:`morlfed.metrics.inputs`); client ``i`` is scored with its own weights ``w_i`` as ``w_i . r``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

from morlfed.metrics.inputs import FRONT_TOL, as_points, as_weights, weights_and_returns
from morlfed.metrics.simplex import das_dennis, fewest_partitions

#: The fewest weight vectors of the expected utility of ``compute_metrics``
#: (:func:`eu_weights`: 100 for 2 objectives, 105 for 3, 120 for 4).
EU_WEIGHTS = 100


@lru_cache(maxsize=32)
def _weights_cached(m: int, n: int) -> np.ndarray:
    if n == 1:
        return np.full((1, m), 1.0 / m)
    return das_dennis(m, fewest_partitions(n, m))


def equally_spaced_weights(m: int, n: int) -> np.ndarray:
    """At least ``n`` weight vectors evenly spaced on the ``m``-simplex, ``[k, m]``.

    They are the Das-Dennis lattice with the fewest partitions ``p`` that gives ``n`` or more
    (every weight with coordinates that are multiples of ``1/p``; :mod:`morlfed.metrics.simplex`,
    this project's own construction, so the same weights with every pymoo and numpy version).

    Rows are non-negative and sum to 1. Two objectives: exactly ``n``, ``w_0`` ascending over
    ``linspace(0, 1, n)`` and ``w_1 = 1 - w_0``. More objectives: exactly ``n`` when ``n`` is a
    lattice size (``C(p + m - 1, m - 1)``: 3, 6, 10, 15, ... for 3 objectives), else the next
    lattice size up (105 for ``n = 100`` and 3 objectives, 120 for 4). ``n == 1`` gives the centre
    ``[1/m, ..., 1/m]``.

    :param m: number of objectives (>= 2)
    :param n: the fewest weight vectors (>= 1)
    """
    if int(m) != m or m < 2:
        raise ValueError(f"m (number of objectives) must be an integer >= 2; got {m}")
    if int(n) != n or n < 1:
        raise ValueError(f"n (number of weight vectors) must be an integer >= 1; got {n}")
    return _weights_cached(int(m), int(n)).copy()


def eu_weights(m: int) -> np.ndarray:
    """The weights of the expected utility that ``compute_metrics`` reports for ``m`` objectives.

    That is ``equally_spaced_weights(m, EU_WEIGHTS)``.

    :param m: number of objectives (>= 2)
    """
    return equally_spaced_weights(m, EU_WEIGHTS)


def expected_utility(points: ArrayLike, weights: ArrayLike) -> float:
    """Expected utility (maximisation, higher is better): ``mean_w max_p w . p``.

    :param points: ``[n, m]`` solutions
    :param weights: ``[n_w, m]`` weight vectors; each picks its best point in ``points``
    """
    p = as_points(points, "points")
    w = as_weights(weights, "weights", m=p.shape[1], other="points")
    return float(np.mean(np.max(w @ p.T, axis=1)))


def scalarised_stats(weights: ArrayLike, returns: ArrayLike) -> dict[str, float]:
    """Mean / min / max of per-client scalarised returns ``w_i . return_i`` (higher is better).

    Row ``i`` of ``weights`` scores row ``i`` of ``returns`` only (each client is judged by
    its own preference). Returns ``{"mean": ..., "min": ..., "max": ...}``.

    :param weights: ``[n_clients, m]`` preferences
    :param returns: ``[n_clients, m]`` vector returns
    """
    w, r = weights_and_returns(weights, returns)
    s = np.einsum("ij,ij->i", w, r)
    return {"mean": float(s.mean()), "min": float(s.min()), "max": float(s.max())}


def regret(weights: ArrayLike, returns: ArrayLike, front: ArrayLike) -> np.ndarray:
    """Per-client regret ``max_{f in front} w_i . f - w_i . return_i``, shape ``[n_clients]``.

    0 means client ``i`` reached the optimum for its own preference; higher is worse. Not
    clipped: a negative value means the client beat ``front`` (an approximate front).

    :param weights: ``[n_clients, m]`` preferences
    :param returns: ``[n_clients, m]`` vector returns
    :param front: ``[k, m]`` known front
    """
    w, r = weights_and_returns(weights, returns)
    f = as_points(front, "front", m=r.shape[1], other="returns")
    return np.max(w @ f.T, axis=1) - np.einsum("ij,ij->i", w, r)


def zero_regret_count(regrets: ArrayLike, tol: float | ArrayLike = FRONT_TOL) -> int:
    """Number of clients whose regret is ``<= tol``.

    :param regrets: one regret per client
    :param tol: absolute tolerance, a scalar or one per client
    """
    g = np.asarray(regrets, dtype=float)
    t = np.asarray(tol, dtype=float)
    if g.ndim != 1 or not np.isfinite(g).all():
        raise ValueError(f"regrets must be a finite 1-D array (one per client); got shape {g.shape}")
    if t.ndim > 1 or (t.ndim == 1 and t.shape != g.shape) or not (np.isfinite(t).all() and (t >= 0).all()):
        raise ValueError(
            f"tol must be a finite number >= 0 or one such value per client (shape {g.shape}); got {t.tolist()}"
        )
    return int(np.sum(g <= t))
