"""The one client abstraction, :class:`Client`, which interprets a :class:`~morlfed.core.protocol.FitTask` for every task and engine.

A :class:`Client` object trains a fixed set of clients (:attr:`Client.cids`): one for the SB3
engine's and the vision task's clients, every client of a worker for the vectorised engine, which
trains them as one batched computation. An implementation fills in what is its own: train one
model per client (:meth:`Client._train`), measure the loss of a received model
(:meth:`Client._loss`), summarise the trainings of a fit into training metrics, evaluate a model,
and capture and restore a client's state. Everything else (checking the task, which of ``[K, d]``
models to train, the proximal centres, the personal model, the shape of the
:class:`~morlfed.core.protocol.FitResult`) is decided here, once.

A fit becomes *training jobs* (:class:`TrainJob`): one per model the client trains, then one for
its personal model. :meth:`Client.fit_many` runs the jobs of several clients in *waves*: wave
``j`` holds the ``j``-th job of every client that has one, so an engine that trains its clients
as one batch receives each wave as a single call.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation, FitResult, FitTask, check_fit_task
from morlfed.core.seeding import generator

#: Optimiser slot of the personal model (shared models use ``"model-<k>"``).
PERSONAL_SLOT = "personal"


@dataclass
class TrainJob:
    """One local training of one model of one client.

    :param start: the model to start from, ``[d]``
    :param slot: ``"model-<k>"`` for server model k (``"model-0"`` for a ``[d]`` model) or
        :data:`PERSONAL_SLOT`; a client may keep per-slot state (e.g. optimiser moments)
    :param keys: ``(round,)`` for a ``[d]`` model or the personal model, ``(round, k)`` for
        model k of ``[K, d]`` models: with the client id, the keys of the job's random stream
    :param steps: the job's local budget (env steps for RL, epochs for vision)
    :param prox_mu: proximal coefficient (FedProx's mu; the personal model's lambda); 0: none
    :param centre: the proximal centre, ``[d]``
    :param first: the job reads a budget clock at its start (RL: the exploration schedule), so its
        steps advance the clock; a job that is not first trains as of the last first job's start
        (its steps do not advance the budget). The first job of a fit is first; under
        ``split_budget`` every job is, since together they are one round's budget
    """

    start: torch.Tensor
    slot: str
    keys: tuple[int, ...]
    steps: int
    prox_mu: float
    centre: torch.Tensor
    first: bool = True

    @property
    def personal(self) -> bool:
        """Whether this job trains the client's personal model."""
        return self.slot == PERSONAL_SLOT


@dataclass
class TrainOutput:
    """What one training job produced.

    :param params: the trained model, ``[d]``
    :param stats: the task's own record of the training (RL: the finished episodes' scalarised
        returns; vision: the running loss and accuracy), summarised by the client's
        :meth:`Client._fit_metrics`; its key ``"steps"``, when present, is the budget the
        training actually spent (RL: SB3 completes its last rollout), else the job's ``steps`` counts
    :param learner: the learner's own training scalars (SB3: mean loss, exploration rate), averaged
        over a fit's shared-model trainings into ``FitResult.learner_stats``
    """

    params: torch.Tensor
    stats: dict[str, Any] = field(default_factory=dict)
    learner: dict[str, float] = field(default_factory=dict)


def break_ties(losses: torch.Tensor, rng: np.random.Generator) -> int:
    """Index of the lowest loss; among exactly equal lowest losses, one drawn from ``rng``.

    Exact ties are common while the K received models are still identical, and a fixed choice
    (the first) would starve the other models.
    """
    best = torch.nonzero(losses == losses.min()).flatten()
    return int(best[int(rng.integers(len(best)))])


def models_to_train(task: FitTask, losses: torch.Tensor | None, rng: np.random.Generator) -> list[int]:
    """Which rows of a (checked) task's ``[K, d]`` params a client trains.

    ``[0]`` for a single model, all K for ``train_all``, else (``train_best``) the lowest-loss one
    (ties drawn from ``rng``).
    """
    if task.params.ndim == 1:
        return [0]
    if task.train_all:
        return list(range(len(task.params)))
    if losses is None:
        raise ValueError("train_best needs the losses of the received models")
    return [break_ties(losses, rng)]


@dataclass
class _Plan:
    """One client's fit, decided before any training."""

    task: FitTask
    models: torch.Tensor
    losses: torch.Tensor | None
    indices: list[int]
    jobs: list[TrainJob]
    steps: int
    loss_steps: int | None
    outputs: list[TrainOutput] = field(default_factory=list)


class Client(ABC):
    """The clients one object trains, and how they carry out a :class:`~morlfed.core.protocol.FitTask`.

    It knows nothing about strategies. Executors hold clients through a host
    (:class:`~morlfed.runtime.executors.base.ClientHost`), which guards every fit; a client's private state
    (preference, replay buffer or data, optimiser state, personal model, local budget) stays in it
    across rounds and leaves it only as a checkpoint (:meth:`get_state`).

    **Budget.** Each fit trains for :attr:`local_steps` (env steps for RL, epochs for vision), the
    run's per-round budget, given at construction.

    **Fit options.** A ``[d]`` model is trained. With ``[K, d]`` models exactly one of
    ``train_best`` (train the model with the lowest loss, return ``[d]``; ``model_index`` says
    which; exact ties are broken by ``generator(seed, "tie", cid, round)``) or ``train_all`` (train
    each model in turn, return ``[K, d]``) must be set. ``report_losses`` returns the losses of the
    *received* models, measured before any training (``[K]``; ``[1]`` for a ``[d]`` model);
    ``train_best`` measures and reports them too, and ``loss_steps_spent`` counts the env steps
    measuring them took (0 when none were measured). Any task that does not fit (shape, options,
    values) raises ``ValueError`` saying what is wrong (:func:`~morlfed.core.protocol.check_fit_task`).

    **FedProx** (``prox_mu > 0``): every training job of the fit carries ``prox_mu`` and its
    centre, ``task.prox_centre`` (``[d]``, or row k for model k) or else the starting model.

    **Personal model** (``personal_lambda``, FedMHC): a private ``[d]`` vector per client,
    initialised from the starting model of its first such task, trained after the shared model(s)
    for the same budget with ``lambda/2 ||theta - w||^2`` towards ``w`` = the (first) model just
    trained. Evaluating ``None`` evaluates it (the shared initial model if the client never trained
    one); it never leaves the client.

    **Equal budget** (``split_budget``): the n trainings of the fit (the trained model(s), plus the
    personal model) each get ``max(1, local_steps // n)`` instead of ``local_steps``, and every one
    of them advances the budget clock (:attr:`TrainJob.first`). ``num_samples`` counts the steps
    that trained the returned model(s); ``steps_spent`` every training's, the personal model's too.

    An implementation calls ``super().__init__(cids, seed, local_steps)`` and implements
    :meth:`_train`, :meth:`_loss`, :meth:`_fit_metrics`, :meth:`_personal_metrics`,
    :meth:`_num_samples`, :meth:`evaluate_client`, :meth:`get_state`, :meth:`set_state`,
    :attr:`layout` and :meth:`initial_params`.

    :param cids: the ids of the clients this object trains
    :param seed: the run's root seed; every draw derives from (seed, purpose, client, round)
    :param local_steps: the local budget of one fit (env steps for RL, epochs for vision)
    :raises ValueError: ``local_steps`` is not an integer >= 1
    """

    def __init__(self, cids: Sequence[int], seed: int, local_steps: int) -> None:
        if isinstance(local_steps, bool) or local_steps != int(local_steps) or int(local_steps) < 1:
            raise ValueError(f"local_steps must be an integer >= 1, got {local_steps!r}")
        self.cids = [int(c) for c in cids]
        self.seed = seed
        self.local_steps = int(local_steps)
        #: each client's personal model (FedMHC), absent until its first ``personal_lambda`` task
        self.personal_models: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------------------------------------
    # what a task or an engine provides
    @property
    @abstractmethod
    def layout(self) -> ParamLayout:
        """The layout of the federated parameter vector."""

    @abstractmethod
    def initial_params(self) -> torch.Tensor:
        """The shared initial model as a ``[d]`` vector."""

    @abstractmethod
    def _train(self, jobs: Mapping[int, TrainJob]) -> dict[int, TrainOutput]:
        """Run one training job per client (keyed by client id); one wave of a fit."""

    @abstractmethod
    def _loss(self, cid: int, params: torch.Tensor, keys: tuple[int, int]) -> tuple[float, int | None]:
        """Client ``cid``'s loss of the ``[d]`` model ``params`` and the env steps measuring it took.

        ``keys`` is ``(round, k)``; the steps are ``None`` when not counted (e.g. a pass over data).
        """

    @abstractmethod
    def _fit_metrics(self, cid: int, outputs: list[TrainOutput], serving: int) -> dict[str, float]:
        """The training metrics of a fit's shared-model trainings.

        ``outputs[serving]`` trained the model that serves the client: the lowest-loss one under
        ``train_all`` with losses.
        """

    @abstractmethod
    def _personal_metrics(self, cid: int, output: TrainOutput) -> dict[str, float]:
        """The training metrics of a fit's personal-model training (``personal_*`` keys)."""

    @abstractmethod
    def _num_samples(self, cid: int, steps: int, trained: int) -> int:
        """``FitResult.num_samples`` of a fit that trained ``trained`` models for ``steps``."""

    @abstractmethod
    def evaluate_client(self, cid: int, params: torch.Tensor | None, seed: int) -> Evaluation:
        """Evaluate a ``[d]`` model on client ``cid`` with randomness from ``seed`` (``None``: its personal model)."""

    @abstractmethod
    def get_state(self, cid: int) -> dict[str, Any]:
        """Everything client ``cid`` carries from one round to the next (checkpoints, rollback of a failed fit).

        The state is an independent copy (later training does not change it) made of data only:
        dicts, lists, tuples, numbers, strings, tensors and numpy arrays, which a state file holds
        (:mod:`morlfed.storage.safestate`; a checkpoint never pickles objects).
        """

    @abstractmethod
    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        """Restore client ``cid`` from a state returned by :meth:`get_state` (taking ownership of it)."""

    def evaluate_many(self, requests: Sequence[tuple[int, torch.Tensor | None, int]]) -> dict[int, Evaluation]:
        """Evaluate models on this object's clients; an engine may evaluate them as one batch.

        :param requests: ``(cid, params, seed)`` triples; ``params`` ``None``: the client's personal model
        """
        return {cid: self.evaluate_client(cid, params, seed) for cid, params, seed in requests}

    def personal_model(self, cid: int) -> torch.Tensor | None:
        """Client ``cid``'s private personal model (``None`` until its first ``personal_lambda`` task).

        :param cid: the client id
        """
        return self.personal_models.get(cid)

    def set_personal_model(self, cid: int, params: torch.Tensor | None) -> None:
        """Set client ``cid``'s personal model (restoring a state); ``None``: it has none.

        :param cid: the client id
        :param params: the personal model, ``[d]``
        """
        if params is None:
            self.personal_models.pop(cid, None)
        else:
            self.personal_models[cid] = params

    def stream_key(self, cid: int) -> tuple[int, int]:
        """The root seed and client id that key client ``cid``'s random streams: ``(seed, cid)``.

        An engine whose clients belong to several runs (:mod:`morlfed.runtime.executors.shared`)
        answers with the run's root seed and the client's id in that run, so every draw is the one
        the client makes in a run of its own.

        :param cid: one of this object's client ids
        """
        return self.seed, cid

    def _begin_fit(self, tasks: Mapping[int, FitTask]) -> None:
        """Called once before the jobs of a :meth:`fit_many` run (e.g. to read a budget clock)."""

    # ------------------------------------------------------------------------------------------
    def fit_many(self, tasks: Mapping[int, FitTask]) -> dict[int, FitResult]:
        """Carry out every client's task (see the class docstring) and report the results."""
        dim = self.layout.dim
        for task in tasks.values():
            check_fit_task(task, dim)
        self._begin_fit(tasks)
        plans = {cid: self._plan(cid, task) for cid, task in tasks.items()}
        for wave in range(max((len(p.jobs) for p in plans.values()), default=0)):
            jobs = {cid: p.jobs[wave] for cid, p in plans.items() if wave < len(p.jobs)}
            for cid, out in self._train(jobs).items():
                plans[cid].outputs.append(out)
        personal_jobs = {}
        for cid, p in plans.items():
            if p.task.personal_lambda is not None:
                start = self.personal_models.get(cid, p.models[p.indices[0]].clone())
                keys = (p.task.round,)
                centre = p.outputs[0].params
                lam = float(p.task.personal_lambda)
                first = p.task.split_budget  # a split round's personal share advances the budget clock too
                personal_jobs[cid] = TrainJob(start, PERSONAL_SLOT, keys, p.steps, lam, centre, first=first)
        personal = self._train(personal_jobs) if personal_jobs else {}
        return {cid: self._result(cid, plans[cid], personal.get(cid)) for cid in tasks}

    def fit(self, task: FitTask) -> FitResult:
        """Carry out ``task`` on this object's only client.

        :param task: the round's task
        :raises TypeError: this object trains several clients (use :meth:`fit_many`)
        """
        cid = self._only("fit", "fit_many")
        return self.fit_many({cid: task})[cid]

    def evaluate(self, params: torch.Tensor | None, seed: int) -> Evaluation:
        """Evaluate a ``[d]`` model on this object's only client (``None``: its personal model).

        :param params: the model
        :param seed: the evaluation seed
        :raises TypeError: this object trains several clients (use :meth:`evaluate_client`)
        """
        return self.evaluate_client(self._only("evaluate", "evaluate_client"), params, seed)

    def _check_cid(self, cid: int) -> None:
        """Raise ``ValueError`` when ``cid`` is not one of this object's clients."""
        if cid not in self.cids:
            raise ValueError(f"client {cid} is not trained by this object, whose clients are {self.cids}")

    def _only(self, method: str, instead: str) -> int:
        """The id of this object's only client, for the one-client conveniences."""
        if len(self.cids) != 1:
            raise TypeError(f"{method}() serves a single client; this object trains {len(self.cids)}: use {instead}()")
        return self.cids[0]

    def _plan(self, cid: int, task: FitTask) -> _Plan:
        """The losses to report and the training jobs of one client's fit."""
        single = task.params.ndim == 1
        models = task.params.detach().float().reshape(-1, self.layout.dim)
        losses: torch.Tensor | None = None
        loss_steps: int | None = 0  # the env steps measuring the losses took; None: not counted
        if task.report_losses or task.train_best:
            measured = [self._loss(cid, m, (task.round, k)) for k, m in enumerate(models)]
            losses = torch.tensor([loss for loss, _ in measured])
            counts = [steps for _, steps in measured]
            loss_steps = None if None in counts else sum(c for c in counts if c is not None)
        root, key = self.stream_key(cid)
        indices = models_to_train(task, losses, generator(root, "tie", key, task.round))
        centres = models if task.prox_centre is None else task.prox_centre.detach().float().reshape(-1, self.layout.dim)
        steps = self.local_steps
        if task.split_budget:  # every training gets an equal share of the budget (at least 1)
            steps = max(1, steps // (len(indices) + int(task.personal_lambda is not None)))
        jobs = [
            TrainJob(
                start=models[k],
                slot=f"model-{k}",
                keys=(task.round,) if single else (task.round, k),
                steps=steps,
                prox_mu=task.prox_mu,
                centre=centres[k] if len(centres) > 1 else centres[0],
                first=j == 0 or task.split_budget,
            )
            for j, k in enumerate(indices)
        ]
        return _Plan(task, models, losses, indices, jobs, steps, loss_steps)

    def _result(self, cid: int, plan: _Plan, personal: TrainOutput | None) -> FitResult:
        task, losses, trained = plan.task, plan.losses, [o.params for o in plan.outputs]
        serving = int(torch.argmin(losses)) if task.train_all and losses is not None else 0
        metrics = self._fit_metrics(cid, plan.outputs, serving)
        trainings = plan.outputs
        if personal is not None:
            self.personal_models[cid] = personal.params
            metrics |= self._personal_metrics(cid, personal)
            trainings = [*trainings, personal]
        return FitResult(
            params=trained[0] if len(trained) == 1 and not task.train_all else torch.stack(trained),
            num_samples=self._num_samples(cid, plan.steps, len(trained)),
            losses=losses,
            model_index=None if task.params.ndim == 1 or task.train_all else plan.indices[0],
            metrics=metrics,
            learner_stats=mean_learner_stats(plan.outputs),
            steps_spent=sum(int(o.stats.get("steps", plan.steps)) for o in trainings),
            loss_steps_spent=plan.loss_steps,
        )


def mean_learner_stats(outputs: list[TrainOutput]) -> dict[str, float]:
    """Per key, the mean of the trainings' finite :attr:`TrainOutput.learner` values.

    Keys without a finite value are left out.

    :param outputs: the trainings of one fit
    """
    values: dict[str, list[float]] = {}
    for out in outputs:
        for key, value in out.learner.items():
            if math.isfinite(value):
                values.setdefault(key, []).append(value)
    return {key: float(np.mean(v)) for key, v in values.items()}


def mean_or_nan(values: list[float]) -> float:
    """The mean of ``values``, NaN when there are none."""
    return float(np.mean(values)) if values else math.nan
