"""What the vectorised engine needs from an algorithm: N clients' networks stacked and updated as one.

The networks are stacked along a first client dimension, with one batched forward for action
selection and one batched gradient step.

A learner keeps every network of the SB3 agent it mirrors (DQN: ``q_net`` and ``q_net_target``;
DDPG: ``actor``, ``actor_target``, ``critic``, ``critic_target``) as ``[N, d]`` rows, one per
client, and evaluates and differentiates them with :class:`~morlfed.tasks.rl.vectorised.mlp.StackedMLP`
(batched matrix products and a backward pass written out, checked against SB3's autograd). Its
flat vectors use exactly the SB3 client's layout (:class:`~morlfed.core.params.ParamLayout` over the
online networks, e.g. ``q_net.q_net.0.weight``), so a model trained by one engine loads in the
other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from morlfed.core.params import ParamLayout


@dataclass
class Batch:
    """A minibatch per client, every tensor ``[N, B, ...]``.

    It is SB3's ``ReplayBufferSamples`` stacked over clients. ``dones`` is 1 only for true
    terminations (SB3's ``handle_timeout_termination``); actions are stored as SB3 stores them (DQN:
    indices ``[N, B, 1]``; DDPG: actions scaled to [-1, 1]).
    """

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor


class StackedLearner(ABC):
    """N clients' SB3-style networks and optimisers, updated in one batched computation.

    :param n: number of clients
    """

    n: int
    #: whether the algorithm's ``_on_step`` counts ``_n_calls`` (DQN: its target-update clock)
    counts_calls: bool = False

    @property
    @abstractmethod
    def layout(self) -> ParamLayout:
        """The flat layout of a client's online network(s), identical to the SB3 client's."""

    @abstractmethod
    def read(self, i: int) -> torch.Tensor:
        """Client ``i``'s online network(s) as a ``[d]`` vector."""

    @abstractmethod
    def load(self, i: int, flat: torch.Tensor) -> None:
        """Load a ``[d]`` vector into client ``i``'s online network(s) and copy it into the target network(s).

        The SB3 client does the same when it receives a model.
        """

    @abstractmethod
    def act(self, observations: torch.Tensor) -> torch.Tensor:
        """Every client's deterministic action for its observation (``[N, obs_dim]``), one batched forward.

        DQN: argmax of Q; DDPG: the actor's action, scaled to [-1, 1].
        """

    @abstractmethod
    def gradient_step(
        self, batch: Batch, mask: torch.Tensor, prox_mu: torch.Tensor, prox_centre: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One SB3 gradient step (``train(gradient_steps=1)``) for the clients where ``mask`` is true.

        The others are left exactly as they are. ``prox_mu`` (``[N]``) and ``prox_centre``
        (``[N, d]``) add FedProx's ``mu * (theta - centre)`` to the online gradients (0: none).
        Returns per-client training scalars (e.g. ``loss``, ``[N]``).
        """

    @abstractmethod
    def optimiser_state(self, i: int) -> dict[str, Any]:
        """Client ``i``'s optimiser state(s) (an independent copy), for optimiser slots and checkpoints."""

    @abstractmethod
    def load_optimiser_state(self, i: int, state: Mapping[str, Any] | None) -> None:
        """Restore client ``i``'s optimiser state(s); ``None``: a fresh optimiser."""

    def after_env_step(self, n_calls: torch.Tensor, mask: torch.Tensor) -> None:
        """Called after every lockstep env step of a learner that :attr:`counts_calls`.

        It gets each client's SB3 ``_n_calls`` counter (``[N]``, already incremented) and the
        clients that stepped (``mask``): DQN's target update every ``target_update_interval`` calls
        (Polyak with ``tau``, a hard copy when ``tau`` is 1) lives here. Default: nothing.
        """
