"""The federation: one round that every front-end runs, morlfed's own loop, and the run's record.

* :mod:`morlfed.federation.round`: :class:`FederatedRound`, the round itself: participant
  sampling, ``strategy.configure``, splitting the outcomes (failures, non-finite results), step
  counts, aggregation or the "+FT" models, the deployed models, evaluation seeds, checkpoint state;
* :mod:`morlfed.federation.loop`: :class:`Federation`, morlfed's own front-end: the rounds on an
  executor's clients, resumable from a checkpoint;
* :mod:`morlfed.federation.recorder`: :class:`Recorder`, the run directory as an observer of the
  rounds: ``rounds.csv``, ``clusters.jsonl``, ``evaluations.csv``, ``models/``, checkpoints, the
  task's results, ``run.log``'s round lines, the tracker;
* :mod:`morlfed.federation.config`: :class:`FederationConfig` and :class:`FederationOutcome`.

Flower's front-end (:class:`morlfed.flower.FlowerStrategy`) runs the same round and recorder.
"""

from morlfed.federation.config import FederationConfig, FederationOutcome
from morlfed.federation.loop import Federation
from morlfed.federation.recorder import Recorder, ResultsWriter
from morlfed.federation.round import (
    FederatedRound,
    RoundReport,
    mean_metric,
    mean_scalarised,
    participants_for,
    round_budgets,
    split_results,
)

__all__ = [
    "FederatedRound",
    "Federation",
    "FederationConfig",
    "FederationOutcome",
    "Recorder",
    "ResultsWriter",
    "RoundReport",
    "mean_metric",
    "mean_scalarised",
    "participants_for",
    "round_budgets",
    "split_results",
]

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 3
