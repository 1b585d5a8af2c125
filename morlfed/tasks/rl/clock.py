"""The RL engines' shared exploration clock: a client's place on its federated budget and DQN's epsilon there.

A client's budget clock reads ``num_timesteps - offset``: its env steps minus the ``offset``, the
steps that did not advance the federated budget (the second and later models trained in one
round, the personal model), so that every model trained in a round sees the epsilon of that
round (:class:`FitClock`). Under ``split_budget`` every training advances it (they share one
round's budget), so epsilon follows the env steps the client took. DQN's epsilon decays linearly
over the client's whole budget on this clock (:class:`EpsilonDecay`); the SB3 client hands it to
SB3 as :class:`BudgetExplorationSchedule`, the vectorised engine evaluates it for all its clients
at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from stable_baselines3 import DQN
from stable_baselines3.common.base_class import BaseAlgorithm


@dataclass(frozen=True)
class EpsilonDecay:
    """DQN's linear epsilon decay, ``initial`` to ``final`` over ``fraction`` of a client's whole budget.

    The decay is read on the budget clock.

    Not SB3's ``LinearSchedule``: that one reads the progress of the current ``learn`` call, which a
    client makes once per round, and fed the budget's progress as ``progress_remaining = 1 -
    progress`` it would compute with ``1 - (1 - progress)``, which rounds differently from the
    epsilon every published run explored with.

    :param fraction: fraction of the budget over which epsilon decays
    :param initial: epsilon at the budget's start
    :param final: epsilon after the decay
    :param total_steps: the client's whole budget (rounds x local steps; at least 1), or each
        client's, ``[N]`` (clients of several runs in one batch), read element-wise
    """

    fraction: float
    initial: float
    final: float
    total_steps: int | np.ndarray

    @classmethod
    def of(cls, agent: DQN, total_steps: int | np.ndarray) -> EpsilonDecay:
        """The decay of an SB3 DQN's ``exploration_*`` settings over a budget of ``total_steps``.

        :param agent: the DQN whose settings are read
        :param total_steps: the client's whole budget (rounds x local steps), or each client's (``[N]``)
        """
        if isinstance(total_steps, np.ndarray):
            budget: int | np.ndarray = np.maximum(1, total_steps.astype(np.int64))
        else:
            budget = max(1, int(total_steps))
        return cls(
            float(agent.exploration_fraction),
            float(agent.exploration_initial_eps),
            float(agent.exploration_final_eps),
            budget,
        )

    def __call__(self, num_timesteps: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """Epsilon at each budget clock ``num_timesteps - offset`` (element-wise).

        :param num_timesteps: env step counters
        :param offset: the clocks' offsets
        """
        progress = (num_timesteps - offset) / self.total_steps
        if self.fraction <= 0:
            return np.full(np.shape(progress), self.final)
        decay = self.initial + (self.final - self.initial) * progress / self.fraction
        return np.where(progress >= self.fraction, self.final, decay)


class BudgetExplorationSchedule:
    """:class:`EpsilonDecay` as an SB3 DQN's ``exploration_schedule``, on the agent's own clock.

    SB3 computes its schedules from the progress of the current ``learn`` call; a client calls
    ``learn(local_steps, reset_num_timesteps=False)`` once per round, which would restart the
    decay every round. This schedule ignores that progress and reads the agent's step counter
    instead, minus :attr:`offset` (set by :class:`FitClock` before every training).

    :param agent: the DQN agent whose ``num_timesteps`` is read
    :param decay: the budget-wide decay
    """

    def __init__(self, agent: BaseAlgorithm, decay: EpsilonDecay) -> None:
        self.agent, self.decay = agent, decay
        #: env steps of the agent that do not advance the budget clock
        self.offset = 0

    def __call__(self, _progress_remaining: float) -> float:
        """Epsilon now (SB3 passes the ``learn`` call's progress, which is ignored)."""
        return float(self.decay(np.asarray(self.agent.num_timesteps), np.asarray(self.offset)))


@dataclass
class FitClock:
    """Where one client's current fit started on the budget clock.

    Every training of a fit sees the exploration rate of the fit's start, so only a fit's first
    training (and, under ``split_budget``, each of them: :attr:`morlfed.runtime.client.TrainJob.first`)
    advances the clock.

    :param start: ``(num_timesteps, offset)`` when the last first training started
    """

    start: tuple[int, int] = (0, 0)

    def offset(self, num_timesteps: int, offset: int, first: bool) -> int:
        """The clock offset for a training that starts now.

        It is the offset at the fit's start plus the env steps taken since, so the clock stands
        where it stood then.

        :param num_timesteps: the client's env steps now
        :param offset: the clock's offset now
        :param first: the training reads the clock at its start (a new fit's first training, or
            any training under ``split_budget``): the clock restarts from now
        """
        if first:
            self.start = (num_timesteps, offset)
        t0, offset0 = self.start
        return offset0 + num_timesteps - t0
