"""Exploration hooks of the lockstep loop: how every stepping client picks its action.

Each hook is SB3's ``_sample_action`` of one algorithm.

* :class:`EpsilonGreedy` (DQN): a uniform random action before ``learning_starts``, then
  epsilon-greedy with the budget-wide epsilon of :class:`~morlfed.tasks.rl.clock.EpsilonDecay`
  (the SB3 client's schedule).
* :class:`ActionNoise` (DDPG): a uniform sample of the action space before ``learning_starts``,
  then the actor's action; at every step ``NormalActionNoise(0, std)`` is added to the action
  scaled to ``[-1, 1]`` and the sum clipped (:func:`~morlfed.tasks.rl.vectorised.ddpg.explore_actions`).

All randomness comes from each training's own generators (``generator(seed, purpose)``), read in
blocks by :class:`Streams`, so a client's draws never depend on the other clients of its batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3 import DDPG, DQN

from morlfed.core.seeding import generator
from morlfed.tasks.rl.clock import EpsilonDecay
from morlfed.tasks.rl.vectorised.ddpg import explore_actions, unscale_action
from morlfed.tasks.rl.vectorised.learner import StackedLearner

#: Draws taken at once from a client's generator.
_BLOCK = 128


class Streams:
    """Each client's own stream of random numbers, ``width`` per draw, taken from its generator in blocks.

    One generator call per client every ``_BLOCK`` draws; the numbers are uniforms in ``[0, 1)``, or
    standard normals with ``normal``.

    :param rngs: each client's generator (``None``: a client that draws nothing)
    :param width: numbers per draw
    :param normal: draw standard normals instead of uniforms
    """

    def __init__(self, rngs: list[np.random.Generator | None], width: int, normal: bool = False) -> None:
        self.rngs, self.width, self.normal = rngs, width, normal
        n = len(rngs)
        self.block = np.zeros((n, _BLOCK, width))
        self.cursor = np.array([_BLOCK if rng is not None else 0 for rng in rngs], dtype=np.int64)
        self.clients = np.arange(n)

    def take(self, mask: np.ndarray) -> np.ndarray:
        """The next draw (``[N, width]``) of every client in ``mask`` (placeholders for the others).

        :param mask: ``[N]`` bool, the clients that draw
        """
        for i in np.flatnonzero(mask & (self.cursor >= _BLOCK)):
            rng: np.random.Generator = self.rngs[i]  # type: ignore[assignment]
            shape = (_BLOCK, self.width)
            self.block[i] = rng.standard_normal(shape) if self.normal else rng.random(shape)
            self.cursor[i] = 0
        draw = self.block[self.clients, np.minimum(self.cursor, _BLOCK - 1)]  # spent streams outside mask: placeholders
        self.cursor += mask
        return draw


def _streams(n: int, rows: np.ndarray, seeds: list[int], purpose: str, width: int, normal: bool = False) -> Streams:
    """Streams of ``width`` numbers per draw from ``generator(seed, purpose)`` for the clients in ``rows``.

    Each client in ``rows`` has one seed; the other clients draw nothing.
    """
    rngs: list[np.random.Generator | None] = [None] * n
    for i, seed in zip(rows, seeds, strict=True):
        rngs[i] = generator(seed, purpose)
    return Streams(rngs, width, normal)


class Exploration(ABC):
    """Chooses the actions of the stepping clients at one lockstep step (SB3's ``_sample_action``).

    :param learner: the clients' stacked networks (their deterministic actions)
    :param learning_starts: env steps of random actions before the policy acts
    """

    #: size of an action as the replay stores it
    action_dim: int
    #: whether the replay stores action indices
    discrete: bool

    def __init__(self, learner: StackedLearner, learning_starts: int) -> None:
        self.learner, self.learning_starts = learner, learning_starts

    @abstractmethod
    def start(self, n: int, rows: np.ndarray, seeds: list[int]) -> None:
        """Open the random streams of a training of every client in ``rows``.

        :param n: number of clients
        :param rows: the training clients' indices
        :param seeds: each training's seed
        """

    @abstractmethod
    def actions(
        self, stepping: np.ndarray, obs: torch.Tensor, num_timesteps: np.ndarray, offset: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every stepping client's action (rows of the others are placeholders).

        :param stepping: ``[N]`` bool, the clients that step their env now
        :param obs: ``[N, obs_dim]`` every client's current observation
        :param num_timesteps: ``[N]`` the clients' env step counters
        :param offset: ``[N]`` the budget clocks' offsets (``num_timesteps - offset``: budget spent)
        :return: the actions for the envs (``[N]`` indices or ``[N, act_dim]``) and as the replay
            stores them (``[N, action_dim]``)
        """


class EpsilonGreedy(Exploration):
    """SB3 DQN's exploration with the budget-wide epsilon.

    Every env step of a client takes two uniforms from ``generator(seed, "explore")`` (the epsilon
    test and a random action).

    :param learner: the clients' stacked Q-networks
    :param learning_starts: env steps of uniform random actions
    :param n_actions: number of discrete actions
    :param fraction: fraction of the whole budget over which epsilon decays
    :param initial: epsilon at the budget's start
    :param final: epsilon after the decay
    :param total_steps: each client's whole budget (the exploration clock's length, at least 1): one
        for all clients, or one per client (``[N]``)
    """

    action_dim, discrete = 1, True

    def __init__(
        self,
        learner: StackedLearner,
        learning_starts: int,
        n_actions: int,
        fraction: float,
        initial: float,
        final: float,
        total_steps: int | np.ndarray,
    ) -> None:
        super().__init__(learner, learning_starts)
        self.n_actions = n_actions
        #: the budget-wide epsilon decay, the one the SB3 client's exploration schedule reads
        self.schedule = EpsilonDecay(fraction, initial, final, total_steps)
        self._draws = Streams([], 2)

    @classmethod
    def of(cls, agent: DQN, learner: StackedLearner, total_steps: int | np.ndarray) -> EpsilonGreedy:
        """The exploration of an SB3 DQN agent, with the budget-wide exploration clock.

        :param agent: the template agent
        :param learner: the clients' stacked Q-networks
        :param total_steps: each client's whole budget (rounds x local steps): one for all, or ``[N]``
        """
        n_actions = int(agent.action_space.n)  # type: ignore[attr-defined]
        s = EpsilonDecay.of(agent, total_steps)
        return cls(learner, int(agent.learning_starts), n_actions, s.fraction, s.initial, s.final, s.total_steps)

    def epsilon(self, num_timesteps: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """Each client's exploration rate at its budget clock ``num_timesteps - offset``.

        :param num_timesteps: the clients' env step counters
        :param offset: the clients' clock offsets
        """
        return self.schedule(num_timesteps, offset)

    def start(self, n: int, rows: np.ndarray, seeds: list[int]) -> None:
        """Open each training client's ``generator(seed, "explore")`` stream, two uniforms per draw."""
        self._draws = _streams(n, rows, seeds, "explore", 2)

    def actions(
        self, stepping: np.ndarray, obs: torch.Tensor, num_timesteps: np.ndarray, offset: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every stepping client's epsilon-greedy action, from its next two uniforms.

        A client acts at random (the second uniform picks the action) before ``learning_starts`` or
        when the first uniform falls below its epsilon; otherwise it takes the greedy action of its
        Q-network (the batched forward runs only when some client acts greedily).

        :return: the action indices for the envs (``[N]``) and as the replay stores them (``[N, 1]``)
        """
        uniform = self._draws.take(stepping)
        actions = np.minimum((uniform[:, 1] * self.n_actions).astype(np.int64), self.n_actions - 1)
        explore_now = (num_timesteps < self.learning_starts) | (uniform[:, 0] < self.epsilon(num_timesteps, offset))
        greedy = stepping & ~explore_now
        if greedy.any():
            actions = np.where(greedy, self.learner.act(obs).cpu().numpy(), actions)
        return actions, actions[:, None]


class ActionNoise(Exploration):
    """SB3 DDPG's exploration (``_sample_action`` with ``NormalActionNoise(0, std)``).

    Before ``learning_starts`` a uniform sample of the (bounded) action space from
    ``generator(seed, "explore")``, afterwards ``unscale_action(actor(obs))``; then, at every step,
    the action scaled to ``[-1, 1]`` plus ``std`` times standard normals from
    ``generator(seed, "noise")``, clipped to ``[-1, 1]`` (stored so in the replay) and unscaled for
    the env. Computed in float32, as SB3 does.

    :param learner: the clients' stacked actors (:meth:`~StackedLearner.act`: actions in ``[-1, 1]``)
    :param learning_starts: env steps of uniform random actions
    :param space: the action space (a bounded ``Box``)
    :param std: the noise's standard deviation (``None``: no noise)
    """

    discrete = False

    def __init__(self, learner: StackedLearner, learning_starts: int, space: spaces.Box, std: float | None) -> None:
        super().__init__(learner, learning_starts)
        if not (isinstance(space, spaces.Box) and space.is_bounded() and len(space.shape) == 1):
            raise ValueError(f"the vectorised DDPG needs a bounded 1-d Box action space, got {space}")
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        self.action_dim = int(space.shape[0])
        self.std = std
        self._uniforms = Streams([], self.action_dim)
        self._normals = Streams([], self.action_dim, normal=True)

    @classmethod
    def of(cls, agent: DDPG, learner: StackedLearner, std: float | None) -> ActionNoise:
        """The exploration of an SB3 DDPG agent with the spec's ``action_noise_std``.

        :param agent: the template agent
        :param learner: the clients' stacked actors
        :param std: the spec's ``action_noise_std`` (``None``: no noise)
        """
        return cls(learner, int(agent.learning_starts), agent.action_space, std)  # type: ignore[arg-type]

    def start(self, n: int, rows: np.ndarray, seeds: list[int]) -> None:
        """Open each training client's two streams, ``action_dim`` numbers per draw.

        Uniforms from ``generator(seed, "explore")`` (the warm-up samples) and standard normals from
        ``generator(seed, "noise")`` (the exploration noise).
        """
        self._uniforms = _streams(n, rows, seeds, "explore", self.action_dim)
        self._normals = _streams(n, rows, seeds, "noise", self.action_dim, normal=True)

    def actions(
        self, stepping: np.ndarray, obs: torch.Tensor, num_timesteps: np.ndarray, offset: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every stepping client's action: a warm-up sample or its actor's action, plus clipped noise.

        A stepping client samples the action space uniformly before ``learning_starts``, else takes
        its actor's action unscaled to the space's bounds; with a ``std``, every stepping client then
        draws noise, which :func:`~morlfed.tasks.rl.vectorised.ddpg.explore_actions` adds in
        ``[-1, 1]`` before clipping.

        :return: the actions for the envs (``[N, act_dim]``) and, scaled to ``[-1, 1]``, as the replay
            stores them
        """
        warm = num_timesteps < self.learning_starts
        # Box.sample: low + u (high - low), cast to the space's float32
        sample = (self.low + self._uniforms.take(stepping & warm) * (self.high - self.low)).astype(np.float32)
        policy = stepping & ~warm
        if policy.any():
            acting = unscale_action(self.learner.act(obs).cpu().numpy(), self.low, self.high)
            sample = np.where(policy[:, None], acting, sample)
        noise = None
        if self.std is not None:
            noise = (self.std * self._normals.take(stepping)).astype(np.float32)
        return explore_actions(sample, noise, self.low, self.high)
