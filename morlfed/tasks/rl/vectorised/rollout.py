"""The lockstep loop: several clients' off-policy trainings (SB3 ``learn``) run side by side.

Each client follows SB3's ``OffPolicyAlgorithm.learn`` exactly: rollouts of ``train_freq``
steps (or episodes) until its step counter reaches the training's target (the last rollout is
finished, so a training can overshoot its budget, by up to an episode with ``(1, "episode")``),
and after every rollout, once past ``learning_starts``, ``gradient_steps`` gradient steps
(``-1``: as many as the rollout's env steps). Actions come from the algorithm's exploration hook
(:mod:`.explore`). At every lockstep step, every client that is still training and owes no
gradient steps steps its env. A client whose rollout ended owes its gradient steps and waits; once
every client still training waits, the owed steps run as batched steps of the learner, masked to
the clients that still have one to do. A client's own sequence of env steps and gradient steps is
SB3's whatever the others do; waiting only lets clients whose rollouts end at different steps
(episodic ``train_freq``) share batched gradient steps.

Randomness: exploration draws from the hook's streams, every gradient step takes ``batch_size``
uniforms from the client's ``generator(seed, "replay")`` stream, so a client's draws never depend
on the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.type_aliases import TrainFrequencyUnit

from morlfed.core.seeding import generator
from morlfed.tasks.rl.vectorised.explore import Exploration, Streams
from morlfed.tasks.rl.vectorised.learner import StackedLearner
from morlfed.tasks.rl.vectorised.replay import StackedReplay


@contextlib.contextmanager
def flushed_denormals() -> Iterator[None]:
    """Run the block with denormal floats flushed to zero on this thread, then restore the previous mode.

    Flushing uses x86 FTZ/DAZ, where supported. Adam's moments of parameters whose gradient is
    exactly zero (dead units) decay into denormals, which make every CPU operation on them many
    times slower; flushing changes results by less than 1e-38.
    """
    if float(torch.tensor(1e-39) * 2.0) == 0.0:  # already flushing
        yield
        return
    try:
        # set inside the try: a client's timeout (SIGALRM) can strike as the call returns, and the
        # mode must not stay on for the later clients of this process (their bits would change)
        torch.set_flush_denormal(True)
        yield
    finally:
        torch.set_flush_denormal(False)  # it was off on entry (a no-op where it is unsupported)


@dataclass(frozen=True)
class LoopSettings:
    """The SB3 ``learn`` settings the lockstep loop follows.

    :param learning_starts: env steps before the first gradient step
    :param batch_size: minibatch size
    :param train_freq: rollout length, in steps or (``per_episode``) episodes
    :param per_episode: whether ``train_freq`` counts episodes
    :param gradient_steps: gradient steps after each rollout (``-1``: the rollout's env steps)
    """

    learning_starts: int
    batch_size: int
    train_freq: int
    per_episode: bool
    gradient_steps: int

    @classmethod
    def of(cls, agent: OffPolicyAlgorithm) -> LoopSettings:
        """The settings of an SB3 off-policy agent (DQN, DDPG).

        :param agent: the template agent
        """
        return cls(
            learning_starts=int(agent.learning_starts),
            batch_size=int(agent.batch_size),
            train_freq=int(agent.train_freq.frequency),  # type: ignore[union-attr]
            per_episode=agent.train_freq.unit == TrainFrequencyUnit.EPISODE,  # type: ignore[union-attr]
            gradient_steps=int(agent.gradient_steps),
        )


@dataclass
class Counters:
    """Per-client SB3 counters, ``[N]`` each: ``num_timesteps``, ``_n_calls``, the budget clock's ``offset``.

    :param num_timesteps: env steps taken by the client's agent
    :param n_calls: ``_on_step`` calls counted by the algorithm (DQN's target-update clock;
        DDPG counts none)
    :param offset: env steps that do not advance the budget clock (read by DQN's epsilon schedule)
    """

    num_timesteps: np.ndarray
    n_calls: np.ndarray
    offset: np.ndarray

    @classmethod
    def zeros(cls, n: int) -> Counters:
        """Fresh counters for ``n`` clients."""
        return cls(*(np.zeros(n, dtype=np.int64) for _ in range(3)))


class Lockstep:
    """Runs trainings of several clients together (see the module docstring).

    :param settings: the ``learn`` settings
    :param exploration: the algorithm's exploration hook
    :param learner: the clients' stacked networks
    :param replay: the clients' replay buffers
    :param envs: each client's training env (SB3 ``Monitor`` outermost)
    :param counters: the clients' counters (advanced in place)
    """

    def __init__(
        self,
        settings: LoopSettings,
        exploration: Exploration,
        learner: StackedLearner,
        replay: StackedReplay,
        envs: list,
        counters: Counters,
    ) -> None:
        self.settings, self.exploration, self.learner = settings, exploration, learner
        self.replay, self.envs, self.counters = replay, envs, counters
        self.n = len(envs)
        #: every client's current observation
        self.obs = np.zeros((self.n, replay.obs_dim), dtype=np.float32)
        self._step = replay.transitions()
        #: per loss (``loss``; ``actor_loss``, ``critic_loss``): each client's sum since its last
        #: :meth:`take_losses` (float64, on the learner's device: no synchronisation per gradient
        #: step), and the number of gradient steps summed
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._loss_counts = np.zeros(self.n, dtype=np.int64)
        #: called with the env steps of each lockstep iteration (every client that stepped), while
        #: :meth:`run` goes: the progress bar of a batch that answers only once it is done
        self.on_steps: Callable[[int], None] | None = None

    def take_losses(self, i: int) -> dict[str, float]:
        """Client ``i``'s mean of each training loss since the last call, then forget the losses.

        Each mean is over the client's gradient steps since the last call; with none there is no key,
        as SB3 records no loss without a training phase.
        """
        count = int(self._loss_counts[i])
        means = {key: float(sums[i]) / count for key, sums in self._loss_sums.items()} if count else {}
        self._loss_counts[i] = 0
        for sums in self._loss_sums.values():
            sums[i] = 0.0
        return means

    def run(
        self, rows: np.ndarray, seeds: list[int], steps: np.ndarray, prox_mu: torch.Tensor, centre: torch.Tensor
    ) -> None:
        """One training per client in ``rows``: a fresh episode (reset with its seed), then ``learn(steps)``.

        SB3's ``learn(steps)`` takes at least ``steps`` env steps: whole rollouts.

        :param rows: the training clients' indices
        :param seeds: each training's seed (env reset; exploration and replay streams)
        :param steps: ``[N]`` env steps per client (0 outside ``rows``)
        :param prox_mu: ``[N]`` proximal coefficients (0: none)
        :param centre: ``[N, d]`` proximal centres
        """
        s, c, n = self.settings, self.counters, self.n
        sampling: list[np.random.Generator | None] = [None] * n
        for i, seed in zip(rows, seeds, strict=True):
            self.obs[i] = self.envs[i].reset(seed=seed)[0]
            sampling[i] = generator(seed, "replay")
        self.exploration.start(n, rows, seeds)
        minibatches = Streams(sampling, s.batch_size)
        active = np.zeros(n, dtype=bool)
        active[rows] = True
        target = c.num_timesteps + steps
        rollout_steps = np.zeros(n, dtype=np.int64)
        rollout_episodes = np.zeros(n, dtype=np.int64)
        owed = np.zeros(n, dtype=np.int64)
        step, counts_calls = self._step, self.learner.counts_calls
        obs_t, n_calls_t = torch.from_numpy(self.obs), torch.from_numpy(c.n_calls)
        while active.any():
            stepping = active & (owed == 0)
            if not stepping.any():  # every client still training waits for its gradient steps
                self._gradient_steps(owed, minibatches, prox_mu, centre)
                owed[:] = 0
                continue
            idx = np.flatnonzero(stepping)
            actions, stored = self.exploration.actions(stepping, obs_t, c.num_timesteps, c.offset)
            np.copyto(step.obs, self.obs)
            step.actions[:] = stored
            for i in idx:
                env = self.envs[i]
                obs, step.rewards[i], terminated, truncated, _ = env.step(actions[i])
                step.next_obs[i] = obs
                step.dones[i] = terminated
                if terminated or truncated:
                    rollout_episodes[i] += 1
                    obs = env.reset()[0]
                self.obs[i] = obs
            self.replay.add(idx, step.rows[idx])
            c.num_timesteps += stepping
            rollout_steps += stepping
            if self.on_steps is not None:
                self.on_steps(len(idx))
            if counts_calls:
                c.n_calls += stepping
                self.learner.after_env_step(n_calls_t, torch.from_numpy(stepping))
            ended = stepping & ((rollout_episodes if s.per_episode else rollout_steps) >= s.train_freq)
            if ended.any():
                learn = ended & (c.num_timesteps > s.learning_starts)
                owed = np.where(learn, s.gradient_steps if s.gradient_steps >= 0 else rollout_steps, owed)
                rollout_steps[ended] = 0
                rollout_episodes[ended] = 0
                active &= ~(ended & (c.num_timesteps >= target))
        self._gradient_steps(owed, minibatches, prox_mu, centre)

    def _gradient_steps(
        self, owed: np.ndarray, minibatches: Streams, prox_mu: torch.Tensor, centre: torch.Tensor
    ) -> None:
        """``owed[i]`` gradient steps for client ``i``, batched over the clients that still have one to do.

        Denormals are flushed meanwhile (:func:`flushed_denormals`).
        """
        with flushed_denormals():
            for step in range(int(owed.max(initial=0))):
                mask = owed > step
                batch = self.replay.sample(minibatches.take(mask))
                stepping = torch.from_numpy(mask)
                losses = self.learner.gradient_step(batch, stepping, prox_mu, centre)
                self._loss_counts += mask
                for key, value in losses.items():
                    value = value.detach().double()
                    sums = self._loss_sums.setdefault(key, torch.zeros_like(value))
                    sums += torch.where(stepping.to(value.device), value, 0.0)
