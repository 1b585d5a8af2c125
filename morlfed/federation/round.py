"""One federated round, whichever front-end carries its messages: :class:`FederatedRound`.

Both front-ends, morlfed's own loop (:class:`~morlfed.federation.loop.Federation`, the clients on
an executor) and Flower's (:class:`~morlfed.flower.strategy.FlowerStrategy`, one client per
Flower node), run the same round object, in two halves:

* :meth:`FederatedRound.begin`: choose the participants (seeded, :func:`participants_for`) and let
  the strategy configure a :class:`~morlfed.core.protocol.FitTask` for each, stamped with the round;
* the front-end has the clients fit their tasks;
* :meth:`FederatedRound.end`: leave out the failed and non-finite results (:func:`split_results`),
  count the clients' steps, aggregate the usable results (``strategy.aggregate``) or, in a "+FT"
  run's last round, keep each client's fine-tuned model instead, and report the round
  (:class:`RoundReport`).

The round object also knows which model each client deploys (:meth:`FederatedRound.deployed`),
when and with which seeds they are evaluated, what the run produced
(:meth:`FederatedRound.outcome`), and its state for checkpoints.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.progress import RoundBudgets
from morlfed.core.protocol import ClientFailure, Evaluation, FitResult, FitTask
from morlfed.core.seeding import derive_seed, generator
from morlfed.federation.checkpoint import global_rng_state, set_global_rng_state
from morlfed.federation.config import FederationConfig, FederationOutcome
from morlfed.federation.deployment import Deployment, PersonalModels, deployed_weights
from morlfed.strategies.base import InertSettingWarning, Strategy


def participants_for(cfg: FederationConfig, round: int) -> list[int]:
    """The clients that take part in ``round`` (all of them in a "+FT" run's last round).

    :param cfg: the federation's settings
    :param round: the round (1-based)
    """
    if cfg.participation >= 1.0 or (cfg.finetune and round == cfg.rounds):
        return list(range(cfg.n_clients))
    m = max(1, int(np.floor(cfg.participation * cfg.n_clients + 0.5)))  # halves round up
    chosen = generator(cfg.seed, "participation", round).choice(cfg.n_clients, size=m, replace=False)
    return sorted(int(c) for c in chosen)


def round_budgets(cfg: FederationConfig) -> RoundBudgets:
    """Each round's budget (participants x local steps), in closed form: no loop over the rounds.

    :param cfg: the federation's settings
    """
    per_round, last = (len(participants_for(cfg, r)) * cfg.local_steps for r in (1, cfg.rounds))
    return RoundBudgets(per_round, cfg.rounds, last)


def split_results(results: Mapping[int, FitResult | ClientFailure]) -> tuple[dict[int, FitResult], dict[int, str]]:
    """Separate usable results from failures; a result with NaN/Inf parameters is a failure.

    :param results: each participant's outcome
    :return: the usable results and, for the others, why they are left out
    """
    ok, failed = {}, {}
    for cid, res in results.items():
        if isinstance(res, ClientFailure):
            failed[cid] = res.reason
        elif not res.is_finite():
            failed[cid] = "non-finite parameters"
        else:
            ok[cid] = res
    return ok, failed


def mean_scalarised(evaluations: Mapping[int, Evaluation]) -> float:
    """Mean over clients of their scalarised evaluation (RL: ``w . return``; vision: accuracy).

    :param evaluations: each client's evaluation
    """
    return float(np.mean([ev.scalarised for ev in evaluations.values()]))


def mean_metric(results: Mapping[int, FitResult], key: str) -> float:
    """Mean over clients of the training metric ``key`` they reported (NaN if none did).

    :param results: the usable results
    :param key: a ``FitResult.metrics`` key
    """
    values = [r.metrics.get(key, float("nan")) for r in results.values()]
    values = [v for v in values if np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


@dataclass
class RoundReport:
    """What one round did, for whoever records it (:class:`~morlfed.federation.recorder.Recorder`).

    :param round: the round
    :param participants: the clients asked to train
    :param ok: the usable results, by client
    :param failed: the clients left out and why (a failure, no reply, non-finite parameters)
    :param aggregated: whether the results were aggregated (``False``: a "+FT" run's last round)
    :param diagnostics: the strategy's diagnostics after aggregating (clusters, ...; empty when not aggregated)
    :param similarity: the similarity blocks the strategy computed this round (``save_similarity`` only)
    :param events: what the front-end saw happen during the round (a worker restarted, ...)
    :param seconds: the round's wall time
    :param evaluated: the deployed models' mean scalarised evaluation after the round, if due
    :param elapsed: the run's seconds so far, the rounds before a resume included (``None``: unknown)
    """

    round: int
    participants: int
    ok: dict[int, FitResult]
    failed: dict[int, str]
    aggregated: bool
    diagnostics: dict[str, Any] = field(default_factory=dict)
    similarity: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    seconds: float = 0.0
    evaluated: float | None = None
    elapsed: float | None = None

    @property
    def train_reward(self) -> float:
        """The usable results' mean scalarised training reward (NaN: none reported it)."""
        return mean_metric(self.ok, "train_reward")

    @property
    def n_clusters(self) -> int:
        """The strategy's clusters after the round (0: it does not cluster, or did not aggregate).

        A cluster is a non-empty group of clients: IFCA lists a model no client deploys as an empty one.
        """
        return sum(1 for cluster in self.diagnostics.get("clusters", []) if cluster)


class FederatedRound:
    """The federated round that every front-end runs: sampling, configuring, splitting, aggregating.

    Duties: set the strategy up; per round, choose the participants and configure their tasks
    (:meth:`begin`), then take their outcomes apart and aggregate them, or keep the "+FT" models
    (:meth:`end`); count each client's steps; say which model each client deploys
    (:meth:`deployed`, :meth:`deployment`) and when and with which seeds they are evaluated
    (:meth:`eval_due`, :meth:`eval_seeds`); build the run's :class:`FederationOutcome`; save and
    restore all of it for checkpoints (:meth:`state_dict`, :meth:`load_state_dict`).

    :param strategy: the server strategy, not yet set up
    :param cfg: the federation's settings
    :param initial: the shared initial model, ``[d]``
    :param layout: its layout
    """

    def __init__(self, strategy: Strategy, cfg: FederationConfig, initial: torch.Tensor, layout: ParamLayout) -> None:
        self.strategy, self.cfg, self.initial = strategy, cfg, initial
        strategy.setup(cfg.n_clients, initial, layout, generator(cfg.seed, "strategy"))
        #: the last round completed (0: none yet)
        self.completed = 0
        #: "+FT": the fine-tuned models the clients keep after the last round
        self.finetuned: dict[int, torch.Tensor] = {}
        #: each client's local budget spent training (``None``: not counted)
        self.steps_spent: dict[int, int | None] = dict.fromkeys(range(cfg.n_clients), 0)
        #: each client's env steps spent measuring losses of received models (``None``: not counted)
        self.loss_steps_spent: dict[int, int | None] = dict.fromkeys(range(cfg.n_clients), 0)
        self._sent: set[int] = set()
        self._started = time.perf_counter()
        if (inert := self.finetune_inert()) is not None:
            warnings.warn(inert, InertSettingWarning, stacklevel=2)

    def finetune_inert(self) -> str | None:
        """Why this "+FT" run deploys what its plain run deploys, or ``None`` (not "+FT", or it differs).

        A strategy whose clients deploy their private personal models (FedMHC) trains them in the
        last round before any aggregation, so skipping that aggregation changes nothing deployed.
        """
        if not (self.cfg.finetune and self.strategy.deploys_personal):
            return None
        name = type(self.strategy).__name__
        return (
            f"{name} with finetune=true: its clients deploy their personal models, which the last round's "
            "aggregation never reaches, so this +FT run deploys the models its plain run deploys"
        )

    def participants(self, rnd: int) -> list[int]:
        """The clients that take part in round ``rnd`` (:func:`participants_for`).

        :param rnd: the round
        """
        return participants_for(self.cfg, rnd)

    def begin(self, rnd: int) -> dict[int, FitTask]:
        """The first half of round ``rnd``: each participant's task, stamped with the round.

        :param rnd: the round (1-based)
        """
        self._started = time.perf_counter()
        tasks = self.strategy.configure(rnd, self.participants(rnd))
        self._sent = set(tasks)
        return {cid: replace(task, round=rnd) for cid, task in tasks.items()}

    def end(
        self, rnd: int, outcomes: Mapping[int, FitResult | ClientFailure], events: Iterable[str] = ()
    ) -> RoundReport:
        """The second half of round ``rnd``: split the outcomes, count steps, aggregate or keep the "+FT" models.

        A participant of :meth:`begin` without an outcome counts as failed (no reply).

        :param rnd: the round
        :param outcomes: the participants' outcomes, by client
        :param events: what the front-end saw happen during the round, for the report
        """
        outcomes = dict(outcomes)
        for cid in sorted(self._sent - set(outcomes)):
            outcomes[cid] = ClientFailure("no reply")
        ok, failed = split_results(outcomes)
        self._count_steps(ok)
        last_ft = self.cfg.finetune and rnd == self.cfg.rounds
        if last_ft:
            if not self.strategy.deploys_personal:  # such a client deploys its personal model (finetune_inert)
                self.finetuned = {cid: self.strategy.finetuned_model(cid, r) for cid, r in ok.items()}
        else:
            self.strategy.aggregate(rnd, ok)
        self.completed = rnd
        similar = self.strategy.similarity() if self.cfg.save_similarity and not last_ft else {}
        return RoundReport(
            rnd,
            len(self._sent),
            ok,
            failed,
            aggregated=not last_ft,
            diagnostics=self.strategy.diagnostics() if not last_ft else {},
            similarity=dict(similar or {}),
            events=list(events),
            seconds=time.perf_counter() - self._started,
        )

    def _count_steps(self, ok: Mapping[int, FitResult]) -> None:
        """Add the usable fits' ``steps_spent`` and ``loss_steps_spent`` to their clients' totals.

        Unknown stays unknown: a ``None`` total or count leaves the total ``None``.
        """
        for cid, result in ok.items():
            for totals, spent in (
                (self.steps_spent, result.steps_spent),
                (self.loss_steps_spent, result.loss_steps_spent),
            ):
                total = totals[cid]
                totals[cid] = None if total is None or spent is None else total + spent

    def since_begin(self) -> float:
        """Seconds since the current round began (:meth:`begin`)."""
        return time.perf_counter() - self._started

    # ------------------------------------------------------------------------------------------
    # evaluation and deployment
    def eval_due(self, rnd: int) -> bool:
        """Whether round ``rnd`` adds a point to the learning curve (``eval_every``; the last round's is the final one).

        :param rnd: the round
        """
        return self.cfg.eval_every > 0 and (rnd % self.cfg.eval_every == 0 or rnd == self.cfg.rounds)

    def eval_seeds(self) -> dict[int, int]:
        """Each client's evaluation seed: the same every round, so the curve's last point is the final evaluation."""
        return {cid: derive_seed(self.cfg.seed, "final-eval", cid) for cid in range(self.cfg.n_clients)}

    def deployed(self) -> dict[int, torch.Tensor | None]:
        """The model each client deploys now: its "+FT" model, else the strategy's (``None``: its private personal model)."""
        if self.strategy.deploys_personal:  # each client evaluates its private personal model
            return dict.fromkeys(range(self.cfg.n_clients))
        return {cid: self.finetuned.get(cid, self.strategy.model_for(cid)) for cid in range(self.cfg.n_clients)}

    def model_ids(self) -> tuple[dict[int, int], str]:
        """Each client's deployed model id (-1: its own "+FT" model) and what the ids mean."""
        ids = {c: -1 if c in self.finetuned else self.strategy.model_id(c) for c in range(self.cfg.n_clients)}
        note = self.strategy.model_id_note + ("; -1: its own fine-tuned model (+FT)" if self.finetuned else "")
        return ids, note

    def deployment(self, personal: PersonalModels) -> Deployment:
        """Every client's deployed model after the last completed round, for the run's files.

        :param personal: where the clients' private personal models are fetched from
        """
        ids, note = self.model_ids()
        weights = deployed_weights(self.deployed(), personal, self.initial)
        return Deployment.of(self.completed, self.strategy.layout, weights, ids, note)

    def outcome(
        self,
        evaluations: dict[int, Evaluation],
        seconds: float,
        resumed_after: int | None = None,
        seconds_before: float | None = None,
    ) -> FederationOutcome:
        """What the run produced, its final evaluations given.

        :param evaluations: each client's evaluation of its deployed model
        :param seconds: the run's wall time
        :param resumed_after: the checkpoint's round a run resumed in place continued after
        :param seconds_before: the run's seconds up to that checkpoint
        """
        ids, note = self.model_ids()
        inert = [text for text in (self.strategy.inert_warning(), self.finetune_inert()) if text is not None]
        return FederationOutcome(
            evaluations,
            ids,
            seconds,
            dict(self.steps_spent),
            "; ".join(inert) or None,
            dict(self.loss_steps_spent),
            self.strategy.split_events(),
            resumed_after,
            seconds_before,
            f"model: what the client deploys: {note}",
        )

    # ------------------------------------------------------------------------------------------
    # checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The round's state after the last completed round: the strategy, "+FT" models, step counts, global RNGs."""
        return {
            "round": self.completed,
            "strategy": self.strategy.state_dict(),
            "finetuned": self.finetuned,
            "steps_spent": dict(self.steps_spent),
            "loss_steps_spent": dict(self.loss_steps_spent),
            "global_rng": global_rng_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state (a checkpoint's server state); the next round is ``state["round"] + 1``.

        :param state: the state; a checkpoint that predates the step counts leaves them unknown
        """
        self.strategy.load_state_dict(state["strategy"])
        self.finetuned = dict(state["finetuned"])
        unknown = dict.fromkeys(range(self.cfg.n_clients))
        self.steps_spent = dict(state.get("steps_spent", unknown))
        self.loss_steps_spent = dict(state.get("loss_steps_spent", unknown))
        set_global_rng_state(state["global_rng"])
        self.completed = int(state["round"])
