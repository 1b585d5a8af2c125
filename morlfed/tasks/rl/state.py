"""What an RL client carries from one round to the next besides its learner, in either engine.

The module also holds the bookkeeping both engines do with that state.

The learner's own state (networks, the active optimiser state, replay buffer, step counters)
differs between the engines; the rest is the same: one optimiser state per model slot
(:func:`use_slot`), the training Monitor's episode records and how many of its episodes a fit has
already reported (:func:`finished_returns`), the personal model and the exploration clock's offset
(:mod:`morlfed.tasks.rl.clock`). :class:`CarriedState` is that part of a client's state, with the
same keys in both engines' ``get_state``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from stable_baselines3.common.monitor import Monitor

#: The SB3 Monitor's episode records, part of a client's state.
MONITOR_RECORDS = ("episode_returns", "episode_lengths", "episode_times", "total_steps")

#: A client's optimiser state, as its engine reads and loads it.
OptimiserState = TypeVar("OptimiserState")


def use_slot(
    slots: dict[str, OptimiserState],
    active: str,
    slot: str,
    save: Callable[[], OptimiserState],
    load: Callable[[OptimiserState | None], None],
) -> str:
    """Make ``slot`` a client's active optimiser slot; return it.

    A client keeps one optimiser state per model slot (``"model-<k>"`` for server model k,
    ``"model-0"`` for a ``[d]`` model, ``"personal"``), so Adam's moments for model k are never
    polluted by model j's gradients. The active slot's state lives in the optimiser; swapping saves
    it under its slot and loads ``slot``'s (a slot trained for the first time starts from a fresh
    optimiser). A client that only ever trains ``[d]`` models never swaps.

    :param slots: the saved states of the inactive slots (updated in place)
    :param active: the slot whose state the optimiser holds now
    :param slot: the slot to train next
    :param save: reads the optimiser's state (an independent copy)
    :param load: loads a saved state into the optimiser; ``None``: a fresh optimiser
    """
    if slot == active:
        return active
    slots[active] = save()
    load(slots.get(slot))
    return slot


def finished_returns(env: Monitor, seen: int) -> list[float]:
    """The scalarised returns of the training episodes that finished after the first ``seen``.

    :param env: the client's training env (SB3 ``Monitor`` outermost)
    :param seen: how many of its episodes were reported already
    """
    return [float(r) for r in env.get_episode_rewards()[seen:]]


@dataclass
class CarriedState:
    """The part of an RL client's state that both engines carry alike.

    ``get_state`` holds these keys next to the engine's own learner state.

    :param monitor: the training Monitor's episode records (:data:`MONITOR_RECORDS`)
    :param episodes_seen: training episodes already reported in a fit's metrics
    :param optimiser_slots: the saved optimiser states of the inactive slots (:func:`use_slot`)
    :param active_slot: the slot whose state the optimiser holds
    :param personal: the personal model (``None``: never trained one)
    :param schedule_offset: the exploration clock's offset (:mod:`morlfed.tasks.rl.clock`)
    """

    monitor: dict[str, Any]
    episodes_seen: int
    optimiser_slots: dict[str, Any]
    active_slot: str
    personal: torch.Tensor | None
    schedule_offset: int

    @classmethod
    def capture(
        cls,
        env: Monitor,
        episodes_seen: int,
        optimiser_slots: dict[str, Any],
        active_slot: str,
        personal: torch.Tensor | None,
        schedule_offset: int,
    ) -> CarriedState:
        """An independent copy of a client's carried state.

        :param env: the client's training env (its Monitor's records are copied)
        :param episodes_seen: training episodes already reported
        :param optimiser_slots: the saved optimiser states of the inactive slots
        :param active_slot: the slot whose state the optimiser holds
        :param personal: the personal model (``None``: never trained one)
        :param schedule_offset: the exploration clock's offset
        """
        return cls(
            monitor=copy.deepcopy({name: getattr(env, name) for name in MONITOR_RECORDS}),
            episodes_seen=int(episodes_seen),
            optimiser_slots=copy.deepcopy(optimiser_slots),
            active_slot=active_slot,
            personal=None if personal is None else personal.clone(),
            schedule_offset=int(schedule_offset),
        )

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys a client's state holds for these fields."""
        return [f.name for f in fields(cls)]

    @classmethod
    def of(cls, state: dict[str, Any]) -> CarriedState:
        """The carried part of a client's state (taking ownership of its values).

        :param state: a state from an engine's ``get_state``
        """
        return cls(**{key: state[key] for key in cls.field_names()})

    def as_dict(self) -> dict[str, Any]:
        """The fields as entries of a client's state."""
        return {key: getattr(self, key) for key in self.field_names()}

    def restore_monitor(self, env: Monitor) -> None:
        """Put the episode records back into the client's training env.

        :param env: the client's training env
        """
        for name, value in self.monitor.items():
            setattr(env, name, value)
