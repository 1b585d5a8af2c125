"""The end-of-run metrics of an RL run (:func:`compute_metrics`) and their directions (:data:`METRICS`).

For every key :func:`compute_metrics` returns, :data:`METRICS` says whether higher or lower is
better.

Which returns: a run stores each client's discounted (env spec gamma) and undiscounted vector
return. Front metrics use the discounted returns by default (MORL convention; known fronts come
from ``pareto_front(gamma)``); :data:`RETURN_KINDS` names the two choices and
:func:`return_columns` the ``final.csv`` columns of each. Each kind has its own hypervolume
reference point (``EnvSpec.reference_point(kind)``): undiscounted returns can be an order of
magnitude larger. Without a known front, IGD and IGD+ are
measured against the *campaign front*: the non-dominated union of every run being compared
(:func:`morlfed.metrics.indicators.campaign_front`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from numpy.typing import ArrayLike

from morlfed.metrics.indicators import (
    cardinality,
    check_reference_point,
    front_points_reached,
    hypervolume,
    igd,
    igd_plus,
    sparsity,
)
from morlfed.metrics.inputs import FRONT_TOL, as_points, front_scale, weights_and_returns
from morlfed.metrics.scalarised import (
    EU_WEIGHTS,
    eu_weights,
    expected_utility,
    regret,
    scalarised_stats,
    zero_regret_count,
)

#: The two kinds of stored returns; front metrics use the first by default.
RETURN_KINDS: tuple[str, ...] = ("discounted", "undiscounted")


@dataclass(frozen=True)
class MetricInfo:
    """How to read one metric of :func:`compute_metrics`.

    :param title: human-readable name (table headings, plot labels)
    :param higher_is_better: ``True`` if the metric is maximised, ``False`` if minimised
    :param needs_front: computed only against a reference front (known, or campaign for IGD)
    :param definition: one-sentence definition
    """

    title: str
    higher_is_better: bool
    needs_front: bool
    definition: str

    @property
    def direction(self) -> str:
        """``"max"`` or ``"min"``: which way is better."""
        return "max" if self.higher_is_better else "min"


#: Every key of :func:`compute_metrics`, in its order, with its direction and definition.
METRICS: dict[str, MetricInfo] = {
    "mean_scalarised": MetricInfo(
        "Mean scalarised reward",
        True,
        False,
        "mean over clients of w_i . return_i (each client scored with its own preference)",
    ),
    "min_scalarised": MetricInfo("Min scalarised reward", True, False, "worst client's w_i . return_i"),
    "max_scalarised": MetricInfo("Max scalarised reward", True, False, "best client's w_i . return_i"),
    "hypervolume": MetricInfo(
        "Hypervolume",
        True,
        False,
        "volume dominated by the clients' returns and bounded below by the env's reference point",
    ),
    "igd": MetricInfo("IGD", False, True, "mean distance from each reference-front point to the nearest client return"),
    "igd_plus": MetricInfo(
        "IGD+", False, True, "IGD counting only the objectives where the client return falls short of the front point"
    ),
    "sparsity": MetricInfo(
        "Sparsity",
        False,
        False,
        "PGMORL: per objective, sum of squared gaps of the sorted non-dominated returns, summed, over n - 1 "
        "(n/a below 2 non-dominated returns)",
    ),
    "cardinality": MetricInfo("Cardinality", True, False, "number of distinct non-dominated client returns"),
    "front_points_reached": MetricInfo(
        "Known-front points reached", True, True, "known-front points matched by some client return within tolerance"
    ),
    "mean_regret": MetricInfo(
        "Mean regret", False, True, "mean over clients of max_f w_i . f - w_i . return_i over the known front"
    ),
    "zero_regret_clients": MetricInfo(
        "Clients at zero regret",
        True,
        True,
        "clients whose regret is zero within tolerance (optimal for their own preference)",
    ),
    "expected_utility": MetricInfo(
        "Expected utility",
        True,
        False,
        f"mean over the Das-Dennis weights w (at least {EU_WEIGHTS}: 100 for 2 objectives, 105 for 3, 120 for 4) "
        "of max over client returns of w . return",
    ),
}


def return_columns(m: int, kind: str = "discounted") -> list[str]:
    """The ``final.csv`` columns holding the ``m``-objective returns of ``kind``.

    ``"discounted"``: ``disc_return_0 .. disc_return_{m-1}``; ``"undiscounted"``:
    ``return_0 .. return_{m-1}`` (see :data:`RETURN_KINDS`).

    :param m: number of objectives
    :param kind: one of :data:`RETURN_KINDS`
    """
    if kind not in RETURN_KINDS:
        raise ValueError(f"returns kind must be one of {', '.join(RETURN_KINDS)}; got {kind!r}")
    prefix = "disc_return" if kind == "discounted" else "return"
    return [f"{prefix}_{k}" for k in range(int(m))]


def compute_metrics(
    weights: ArrayLike,
    returns: ArrayLike,
    ref_point: ArrayLike,
    front: ArrayLike | None = None,
    tol: float = FRONT_TOL,
    campaign: ArrayLike | None = None,
) -> dict[str, float | int | None]:
    """All end-of-run metrics for one run, as JSON-serialisable plain Python numbers.

    ``weights`` and ``returns`` are ``[n_clients, m]`` (client ``i``'s preference and its
    vector return, maximised); the solution set is the clients' returns. ``front`` is the
    environment's known front (checked against ``ref_point`` by :func:`check_reference_point`);
    ``campaign`` (used only when ``front`` is ``None``) is the campaign front, the reference of
    IGD / IGD+ without a known front. :data:`METRICS` gives each key's direction. Keys:

    * ``mean_scalarised``, ``min_scalarised``, ``max_scalarised``: ``scalarised_stats``.
    * ``hypervolume`` w.r.t. ``ref_point`` (the one of the kind of ``returns``:
      ``EnvSpec.reference_point``); ``sparsity`` (``None`` below 2 non-dominated returns);
      ``cardinality`` (dedup at 1e-8).
    * ``expected_utility`` over :func:`~morlfed.metrics.scalarised.eu_weights` (the Das-Dennis
      lattice with at least 100 weights).
    * With a known ``front`` (else ``None``): ``igd``, ``igd_plus``, ``front_points_reached``
      (relative ``tol``), ``mean_regret`` and ``zero_regret_clients`` (regret of client ``i``
      counts as zero when ``<= tol * (w_i . scale)``, ``scale`` the front's per-objective range).
    * Without one but with a ``campaign`` front: ``igd`` and ``igd_plus`` against it.

    :param weights: ``[n_clients, m]`` preferences
    :param returns: ``[n_clients, m]`` vector returns
    :param ref_point: the hypervolume reference point, length ``m``
    :param front: the environment's known front, if it has one
    :param tol: relative tolerance of front points reached and zero regret
    :param campaign: the campaign front (IGD / IGD+ reference without a known front)
    """
    w, r = weights_and_returns(weights, returns)
    m = r.shape[1]
    if front is not None:
        check_reference_point(ref_point, as_points(front, "front", m=m, other="returns"))
    stats = scalarised_stats(w, r)
    out: dict[str, float | int | None] = {
        "mean_scalarised": stats["mean"],
        "min_scalarised": stats["min"],
        "max_scalarised": stats["max"],
        "hypervolume": hypervolume(r, ref_point),
        "igd": None,
        "igd_plus": None,
        "sparsity": None if math.isnan(spread := sparsity(r)) else spread,
        "cardinality": cardinality(r),
        "front_points_reached": None,
        "mean_regret": None,
        "zero_regret_clients": None,
        "expected_utility": expected_utility(r, eu_weights(m)),
    }
    if front is not None:
        f = as_points(front, "front", m=m, other="returns")
        g = regret(w, r, f)
        out.update(
            igd=igd(r, f),
            igd_plus=igd_plus(r, f),
            front_points_reached=front_points_reached(r, f, tol),
            mean_regret=float(g.mean()),
            zero_regret_clients=zero_regret_count(g, tol * (w @ front_scale(f))),
        )
    elif campaign is not None:
        c = as_points(campaign, "campaign", m=m, other="returns")
        out.update(igd=igd(r, c), igd_plus=igd_plus(r, c))
    return out
