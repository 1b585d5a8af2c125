"""What a federation runs with and what it produces: :class:`FederationConfig`, :class:`FederationOutcome`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from morlfed.core.protocol import Evaluation


@dataclass
class FederationConfig:
    """The loop's settings.

    :param n_clients: number of clients
    :param rounds: communication rounds
    :param local_steps: local budget per round (env steps or epochs)
    :param seed: the root seed
    :param participation: fraction of clients in (0, 1] sampled each round
    :param finetune: "+FT": skip the last aggregation, every client keeps its own last model
    :param save_similarity: write ``similarity_<round>.npy`` each round (NaN outside the blocks
        the strategy computed)
    :param progress: show a progress bar
    :param eval_every: evaluate every client's deployed model after every ``eval_every``-th round
        and log the clients' mean ``Evaluation.scalarised`` in ``rounds.csv`` as
        ``mean_eval_scalarised`` (0: only the final evaluation); evaluation never changes training
    :param round_metrics: client training metrics (``FitResult.metrics`` keys) whose mean over the
        round's usable results is logged in ``rounds.csv`` as ``mean_<key>``, after
        ``mean_train_reward`` (vision runs: ``train_loss``)
    :param budget_unit: what ``local_steps`` counts, as the progress bar names it (``env steps``)
    """

    n_clients: int
    rounds: int
    local_steps: int
    seed: int = 0
    participation: float = 1.0
    finetune: bool = False
    save_similarity: bool = False
    progress: bool = True
    eval_every: int = 0
    round_metrics: tuple[str, ...] = ()
    budget_unit: str = "steps"


@dataclass
class FederationOutcome:
    """What a finished run produced.

    :param evaluations: each client's evaluation of its deployed model
    :param model_ids: each client's deployed model id or cluster (:attr:`Strategy.model_id_note`), -1
        for a client that keeps its own fine-tuned model ("+FT")
    :param seconds: wall time of the loop; in a run resumed in place, from its start: the
        seconds its checkpoint recorded (the rounds before it) plus this process's (``seconds_before``)
    :param steps_spent: each client's local budget spent training over the run (RL: env steps),
        the sum of its usable fits' ``FitResult.steps_spent``; ``None`` for a client that did not
        report it (or in a run resumed from a checkpoint that predates the count)
    :param loss_steps_spent: each client's env steps spent measuring the losses of received
        models over the run (IFCA, FedFew, FedMHC, FedPG), the sum of its usable fits'
        ``FitResult.loss_steps_spent``; ``None`` when not counted (vision, or a checkpoint that
        predates the count)
    :param inert_warning: how the run left its strategy inert (:meth:`Strategy.inert_warning`), or
        ``None``; logged as a warning and stored in ``metrics.json``
    :param split_events: every cluster split of the run (:meth:`Strategy.split_events`), ``None``
        for a strategy that does not split clusters
    :param resumed_after: the round of the checkpoint a run resumed in place continued from;
        ``None``: it ran from its start (or branched: a new run)
    :param seconds_before: the loop's seconds up to that checkpoint (``None``: a checkpoint that
        predates the record, so ``seconds`` counts this process's rounds only)
    :param model_id_note: what ``model_ids`` mean, the footnote of the console table's ``model`` column
    """

    evaluations: dict[int, Evaluation]
    model_ids: dict[int, int]
    seconds: float
    steps_spent: dict[int, int | None] = field(default_factory=dict)
    inert_warning: str | None = None
    loss_steps_spent: dict[int, int | None] = field(default_factory=dict)
    split_events: list[dict[str, Any]] | None = None
    resumed_after: int | None = None
    seconds_before: float | None = None
    model_id_note: str = ""

    def time_record(self) -> dict[str, Any]:
        """What ``metrics.json`` keeps of the run's time.

        ``wall_time_s``, and for a run resumed in place the round it continued after
        (``resumed_after_round``) and the seconds recorded before it (``wall_time_before_resume_s``).
        """
        record: dict[str, Any] = {"wall_time_s": round(self.seconds, 2)}
        if self.resumed_after is not None:
            before = None if self.seconds_before is None else round(self.seconds_before, 2)
            record |= {"resumed_after_round": self.resumed_after, "wall_time_before_resume_s": before}
        return record

    def strategy_record(self) -> dict[str, Any]:
        """What ``metrics.json`` keeps of the strategy's account: ``inert_warning``, ``split_events`` if it splits."""
        record: dict[str, Any] = {"inert_warning": self.inert_warning}
        if self.split_events is not None:
            record["split_events"] = self.split_events
        return record
