"""What travels between the server and a client.

The server only ever sees parameter vectors and the scalars a client chooses to report (losses,
sample counts, training metrics). A client's preference, replay buffer or data, optimiser state,
RNG and local budget never leave it. What a client must do with a :class:`FitTask` is the
:class:`~morlfed.runtime.client.Client` class's contract.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class FitTask:
    """One round's instructions for one client.

    Every field but ``round`` is the strategy's to set; the local budget is not one of them (a
    client trains for the run's ``local_steps``, which its factory gave it).

    :param params: the model to start from, ``[d]``, or ``[K, d]`` for multi-model strategies
    :param round: the round index (1-based), filled in by the federation loop; clients derive
        their per-round random generators from it
    :param train_best: with ``[K, d]`` params, the client evaluates its loss on each model, trains
        the one with the lowest loss, returns ``[d]`` and says which in ``FitResult.model_index``
        (IFCA, FedMHC's head choice)
    :param train_all: with ``[K, d]`` params, train each of the K models and return ``[K, d]``
    :param report_losses: report the loss of each received model (``[K]``, or ``[1]`` for a
        single model), measured before training; ``train_best`` measures and reports them too
    :param prox_mu: proximal coefficient; the client adds ``prox_mu * (theta - prox_centre)``
        to its gradients (FedProx); 0 disables it
    :param prox_centre: the proximal centre, ``[d]`` (for every trained model) or the shape of
        ``params`` (row k for model k); defaults to the starting model
    :param personal_lambda: when set, the client also trains its private personal model with the
        regulariser ``lambda/2 ||theta_personal - w||^2`` towards the model it just trained
        (pFedMe/Ditto style, FedMHC); the personal model never leaves the client
    :param split_budget: divide ``local_steps`` equally among the fit's trainings (the K models of
        ``train_all``, or the shared and the personal model): each gets ``max(1, local_steps // n)``,
        so the fit costs what a one-model fit costs (FedFew's and FedMHC's ``equal_budget``)
    """

    params: torch.Tensor
    round: int = 0
    train_best: bool = False
    train_all: bool = False
    report_losses: bool = False
    prox_mu: float = 0.0
    prox_centre: torch.Tensor | None = None
    personal_lambda: float | None = None
    split_budget: bool = False


@dataclass
class FitResult:
    """What a client reports after local training.

    :param params: the trained model(s), ``[d]`` or ``[K, d]``
    :param num_samples: the amount of local data used (env steps for RL, examples for vision)
    :param losses: per-model losses ``[K]`` when the task asked for them
    :param model_index: which of the K received models was trained (``train_best``)
    :param metrics: training metrics, e.g. ``train_reward`` (mean scalarised episode return)
    :param learner_stats: the learner's own training scalars, for experiment tracking only (SB3:
        ``loss`` or ``actor_loss``/``critic_loss``, ``exploration_rate``); strategies never read
        them, and an engine that keeps none leaves them empty
    :param steps_spent: the local budget the fit actually spent over all its trainings, the
        personal model's included (RL: env steps, from the agent's counter; vision: epochs);
        ``None`` when the client does not say
    :param loss_steps_spent: the env steps the fit spent measuring the losses of the received
        models (``report_losses``, ``train_best``: RL's evaluation episodes), 0 when it measured
        none; ``None`` when the client does not count them (vision: a loss is a pass over data,
        no env step)
    """

    params: torch.Tensor
    num_samples: int
    losses: torch.Tensor | None = None
    model_index: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    learner_stats: dict[str, float] = field(default_factory=dict)
    steps_spent: int | None = None
    loss_steps_spent: int | None = None

    def is_finite(self) -> bool:
        """True when every parameter (and loss) is a finite number."""
        ok = bool(torch.isfinite(self.params).all())
        return ok and (self.losses is None or bool(torch.isfinite(self.losses).all()))


@dataclass
class ClientFailure:
    """A client's fit that produced no usable result this round.

    :param reason: short human-readable cause (``"exception: ..."``, ``"non-finite parameters"``)
    """

    reason: str


@dataclass
class Evaluation:
    """A client's evaluation of one model.

    For RL: ``vector_return`` is the mean undiscounted vector return over the evaluation
    episodes, ``discounted_return`` the mean discounted one (env spec gamma), ``scalarised`` and
    ``scalarised_discounted`` the client's own ``w_i . return``, ``env_steps`` the env steps the
    episodes took. Vision clients report accuracies in ``metrics``, leave the vector returns
    empty and ``env_steps`` ``None``.
    """

    vector_return: np.ndarray
    discounted_return: np.ndarray
    scalarised: float
    scalarised_discounted: float
    metrics: dict[str, float] = field(default_factory=dict)
    env_steps: int | None = None


def check_fit_task(task: FitTask, dim: int) -> None:
    """Raise ``ValueError`` saying what is wrong when ``task`` does not fit a client with ``dim`` parameters.

    The faults it finds: params not ``[d]`` or ``[K, d]`` or not finite, conflicting or missing model
    options, a bad proximal term or personal lambda, a non-boolean ``split_budget``.
    """
    params = task.params
    if (
        not isinstance(params, torch.Tensor)
        or params.ndim not in (1, 2)
        or params.shape[-1] != dim
        or params.numel() == 0
    ):
        shape = tuple(params.shape) if isinstance(params, torch.Tensor) else type(params).__name__
        raise ValueError(f"task params must be a tensor of shape [{dim}] or [K, {dim}] with K >= 1, got {shape}")
    if not bool(torch.isfinite(params).all()):
        raise ValueError("task params contain NaN or Inf")
    chosen = [name for name in ("train_best", "train_all") if getattr(task, name)]
    if len(chosen) > 1:
        raise ValueError("at most one of train_best and train_all may be set, got both")
    if params.ndim == 1 and chosen:
        raise ValueError(f"{chosen[0]} needs [K, {dim}] params, got a single [{dim}] model")
    if params.ndim == 2 and not chosen:
        raise ValueError(f"[K, d] params (K = {len(params)}) need one of train_best or train_all")
    if not (math.isfinite(task.prox_mu) and task.prox_mu >= 0):
        raise ValueError(f"prox_mu must be a finite number >= 0, got {task.prox_mu}")
    centre = task.prox_centre
    if centre is not None and (
        not isinstance(centre, torch.Tensor) or tuple(centre.shape) not in {(dim,), tuple(params.shape)}
    ):
        got = tuple(centre.shape) if isinstance(centre, torch.Tensor) else type(centre).__name__
        raise ValueError(
            f"prox_centre must be a tensor of shape [{dim}] or the params' shape {tuple(params.shape)}, got {got}"
        )
    if not isinstance(task.split_budget, (bool, np.bool_)):
        raise ValueError(f"split_budget must be true or false, got {task.split_budget!r}")
    if task.personal_lambda is not None:
        if not (math.isfinite(task.personal_lambda) and task.personal_lambda >= 0):
            raise ValueError(f"personal_lambda must be a finite number >= 0 or None, got {task.personal_lambda}")
        if task.train_all:
            raise ValueError(
                "personal_lambda needs one trained model to regularise towards; it cannot be combined with train_all"
            )
