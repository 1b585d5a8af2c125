"""Indicators of a solution set, from non-dominated filtering to the campaign front.

Non-dominated filtering, hypervolume, IGD / IGD+, sparsity, cardinality, known-front points
reached and the campaign front.

Convention: **every objective is maximised** (see :mod:`morlfed.metrics.inputs`). pymoo
minimises, so every pymoo indicator is fed negated arrays (``-points``, ``-ref``, ``-front``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike
from pymoo.indicators.hv import HV
from pymoo.indicators.igd import IGD
from pymoo.indicators.igd_plus import IGDPlus
from pymoo.util.nds.non_dominated_sorting import find_non_dominated

from morlfed.metrics.inputs import DEDUP_TOL, FRONT_TOL, as_points, as_vector, check_tol, front_scale


class ReferencePointWarning(UserWarning):
    """Some points do not strictly dominate the hypervolume reference point."""


def non_dominated(points: ArrayLike, tol: float = DEDUP_TOL) -> np.ndarray:
    """Non-dominated subset of ``points`` (maximisation), duplicates removed.

    A point is dropped if another is >= in every objective and > in one. Of several points
    within ``tol`` of each other in every coordinate, only the lexicographically first is
    kept. The result is sorted lexicographically (first objective ascending, then the
    second, ...); an empty ``[0, m]`` input gives an empty ``[0, m]`` output.

    :param points: ``[n, m]`` solutions
    :param tol: absolute per-coordinate tolerance below which two points are one solution
    """
    p = as_points(points, "points", allow_empty=True)
    tol = check_tol(tol)
    nd = p[find_non_dominated(-p)] if len(p) else p  # pymoo minimises; keeps exact duplicates
    nd = nd[np.lexsort(nd.T[::-1])]
    kept: list[np.ndarray] = []
    for q in nd:
        if not any(np.max(np.abs(q - k)) <= tol for k in kept):
            kept.append(q)
    return np.array(kept).reshape(-1, p.shape[1])


def cardinality(points: ArrayLike, tol: float = DEDUP_TOL) -> int:
    """Number of distinct non-dominated solutions (maximisation; distinct beyond ``tol``).

    :param points: ``[n, m]`` solutions
    :param tol: absolute per-coordinate tolerance below which two points are one solution
    """
    return len(non_dominated(points, tol))


def sparsity(points: ArrayLike) -> float:
    """PGMORL sparsity of the non-dominated set of ``points`` (lower is denser).

    Per objective, sort the non-dominated values and sum the squared consecutive gaps; sum
    over objectives and divide by ``n - 1``. NaN (not defined) for fewer than 2 non-dominated
    points: a set collapsed to one point has no gaps, and 0 would read as the densest front.
    Sign-free: it depends only on gaps, but the set is filtered for maximisation.

    :param points: ``[n, m]`` solutions
    """
    nd = non_dominated(points)
    if len(nd) < 2:
        return float("nan")
    gaps = np.diff(np.sort(nd, axis=0), axis=0)
    return float(np.sum(gaps**2) / (len(nd) - 1))


def hypervolume(points: ArrayLike, ref: ArrayLike) -> float:
    """Hypervolume dominated by ``points`` and bounded below by ``ref`` (maximisation).

    Sign convention: both ``points`` and ``ref`` are in maximisation form (do not negate
    them); ``ref`` lies below every sensible solution (e.g. ``[0, -25]`` for Deep Sea
    Treasure). Computed as pymoo ``HV(ref_point=-ref)(-points)``. Only points strictly greater
    than ``ref`` in every objective contribute; if any point fails that, a
    ``ReferencePointWarning`` says how many (when none does, the message also points at the
    likely sign mix-up). Returns 0.0 for an empty set or when no point dominates ``ref``. A
    ``ref`` of the wrong length is a ``ValueError``; :func:`check_reference_point` rejects a
    ``ref`` that a known front does not dominate.

    :param points: ``[n, m]`` solutions
    :param ref: the reference point, length ``m``
    """
    p = as_points(points, "points", allow_empty=True)
    r = as_vector(ref, "ref", p.shape[1], "points")
    if len(p) == 0:
        return 0.0
    inside = np.all(p > r, axis=1)
    n_out = int(np.sum(~inside))
    if n_out:
        hint = (
            "; none does: the hypervolume is 0. If the points or the reference point were "
            "negated for a minimising convention, pass them un-negated"
            if n_out == len(p)
            else ""
        )
        warnings.warn(
            f"{n_out} of {len(p)} points do not strictly dominate the reference point "
            f"{r.tolist()} (maximisation: every objective must exceed it) and add "
            f"nothing to the hypervolume{hint}",
            ReferencePointWarning,
            stacklevel=2,
        )
    if not inside.any():
        return 0.0
    return float(HV(ref_point=-r)(-p[inside]))


def check_reference_point(ref: ArrayLike, front: ArrayLike) -> np.ndarray:
    """Validate a hypervolume reference point against a known ``front``; return it as a vector.

    Maximisation: every point of a true front should strictly dominate ``ref``. A ``ref`` of
    the wrong length or with non-finite entries, or one that *no* front point dominates (a
    negated reference point or front, i.e. a sign error: the front's hypervolume would be 0),
    is a ``ValueError``. Some front points failing to dominate ``ref`` is only a
    ``ReferencePointWarning`` (a reference point chosen too high).

    :param ref: the reference point, length ``m``
    :param front: ``[k, m]`` known-front points
    """
    f = as_points(front, "front")
    r = as_vector(ref, "ref", f.shape[1], "front")
    inside = np.all(f > r, axis=1)
    if not inside.any():
        ideal = f.max(axis=0)
        raise ValueError(
            f"reference point {r.tolist()} is not dominated by any point of the known "
            f"front (its best value per objective is {ideal.tolist()}): under "
            "maximisation the reference point must be below the front in every "
            "objective. Was the reference point or the front negated (minimisation "
            "convention)?"
        )
    if not inside.all():
        warnings.warn(
            f"{int(np.sum(~inside))} of {len(f)} known-front points do not strictly "
            f"dominate the reference point {r.tolist()}; they add nothing to the "
            "hypervolume (is the reference point too high?)",
            ReferencePointWarning,
            stacklevel=2,
        )
    return r


def campaign_front(point_sets: Iterable[ArrayLike], tol: float = DEDUP_TOL) -> np.ndarray:
    """The campaign front: the non-dominated union of several solution sets (maximisation).

    ``point_sets`` are ``[n_j, m]`` arrays with the same ``m`` (e.g. the client returns of every
    run being compared on one environment). Used as the reference front of IGD / IGD+ where the
    environment has no known front. Sorted and de-duplicated as :func:`non_dominated`.

    :param point_sets: the solution sets, one per run
    :param tol: absolute per-coordinate tolerance below which two points are one solution
    """
    sets = [as_points(p, f"point set {j}", allow_empty=True) for j, p in enumerate(point_sets)]
    if not sets:
        raise ValueError("campaign_front needs at least one point set")
    m = sets[0].shape[1]
    for j, p in enumerate(sets):
        if p.shape[1] != m:
            raise ValueError(
                f"point set {j} has {p.shape[1]} objectives but point set 0 has {m}; "
                "a campaign front is built per environment"
            )
    return non_dominated(np.vstack(sets), tol)


def igd(points: ArrayLike, front: ArrayLike) -> float:
    """Inverted generational distance of ``points`` to the reference ``front`` (lower is better).

    Mean, over front points, of the Euclidean distance to the nearest obtained point;
    0 iff every front point was obtained. Symmetric in sign; computed on negated arrays
    for consistency with ``igd_plus``.

    :param points: ``[n, m]`` obtained solutions
    :param front: ``[k, m]`` reference front
    """
    f = as_points(front, "front")
    p = as_points(points, "points", m=f.shape[1], other="front")
    return float(IGD(-f)(-p))


def igd_plus(points: ArrayLike, front: ArrayLike) -> float:
    """IGD+ of ``points`` to ``front`` for maximisation (lower is better, Pareto-compliant).

    Mean, over front points ``z``, of ``min_a sqrt(sum_k max(z_k - a_k, 0)^2)`` over obtained
    points ``a``: only the objectives where ``a`` falls short of ``z`` count, so a set that
    weakly dominates the front scores 0. pymoo's ``IGDPlus`` minimises, hence the negation.

    :param points: ``[n, m]`` obtained solutions
    :param front: ``[k, m]`` reference front
    """
    f = as_points(front, "front")
    p = as_points(points, "points", m=f.shape[1], other="front")
    return float(IGDPlus(-f)(-p))


def front_points_reached(points: ArrayLike, front: ArrayLike, tol: float = FRONT_TOL) -> int:
    """Number of ``front`` points matched by some obtained point.

    Front point ``f`` is reached when some point ``p`` has ``|p_k - f_k| <= tol * scale_k``
    for every objective ``k`` (Chebyshev distance in units of the front's per-objective
    range ``scale_k``; see :mod:`morlfed.metrics.inputs`). Sign-free.

    :param points: ``[n, m]`` obtained solutions
    :param front: ``[k, m]`` known front
    :param tol: relative tolerance, a share of the front's per-objective range
    """
    f = as_points(front, "front")
    p = as_points(points, "points", m=f.shape[1], other="front", allow_empty=True)
    tol = check_tol(tol)
    dist = np.max(np.abs(p[:, None, :] - f[None, :, :]) / front_scale(f), axis=2)  # [n, k]
    return int(np.sum(np.any(dist <= tol, axis=0)))
