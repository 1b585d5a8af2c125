"""The metrics of a run, for both tasks: what ``metrics.json`` holds and what the analysis recomputes.

They are defined in docs/analysis.md#the-metrics.

* :mod:`morlfed.metrics.inputs` -- checking points, weights and tolerances (every objective is
  maximised; a points array is ``[n, m]``, one row per solution, one column per objective);
* :mod:`morlfed.metrics.indicators` -- front indicators on pymoo: non-dominated set, hypervolume,
  IGD / IGD+, sparsity, cardinality, known-front points reached, the campaign front;
* :mod:`morlfed.metrics.scalarised` -- linear preferences: scalarised returns, regret, expected
  utility over equally spaced weights;
* :mod:`morlfed.metrics.simplex` -- the Das-Dennis lattice of those weights (no pymoo, no RNG);
* :mod:`morlfed.metrics.registry` -- an RL run's metrics (:func:`compute_metrics`), their
  directions (:data:`METRICS`) and the returns they are computed on (:data:`RETURN_KINDS`);
* :mod:`morlfed.metrics.accuracy` -- a vision run's L-acc, S-acc and G-acc statistics over clients.

The package depends on numpy and pymoo only (no torch, gymnasium or other morlfed module).
"""

from morlfed.metrics.accuracy import ACCURACIES, ACCURACY_METRICS, STATISTICS, accuracy_summary
from morlfed.metrics.indicators import (
    ReferencePointWarning,
    campaign_front,
    cardinality,
    check_reference_point,
    front_points_reached,
    hypervolume,
    igd,
    igd_plus,
    non_dominated,
    sparsity,
)
from morlfed.metrics.inputs import DEDUP_TOL, FRONT_TOL
from morlfed.metrics.registry import METRICS, RETURN_KINDS, MetricInfo, compute_metrics, return_columns
from morlfed.metrics.scalarised import (
    EU_WEIGHTS,
    equally_spaced_weights,
    eu_weights,
    expected_utility,
    regret,
    scalarised_stats,
    zero_regret_count,
)

__all__ = [
    "ACCURACIES",
    "ACCURACY_METRICS",
    "DEDUP_TOL",
    "EU_WEIGHTS",
    "FRONT_TOL",
    "METRICS",
    "RETURN_KINDS",
    "STATISTICS",
    "MetricInfo",
    "ReferencePointWarning",
    "accuracy_summary",
    "campaign_front",
    "cardinality",
    "check_reference_point",
    "compute_metrics",
    "equally_spaced_weights",
    "eu_weights",
    "expected_utility",
    "front_points_reached",
    "hypervolume",
    "igd",
    "igd_plus",
    "non_dominated",
    "regret",
    "return_columns",
    "scalarised_stats",
    "sparsity",
    "zero_regret_count",
]

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 0
