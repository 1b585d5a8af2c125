"""Timers (and profiler labels) inside the vectorised engine's lockstep loop, for ``bench/gpu.py``.

:class:`LockstepProbe` wraps, for as long as it is entered, the methods the lockstep loop
(:class:`~morlfed.tasks.rl.vectorised.rollout.Lockstep`) calls at every step, on their classes:
the exploration hook's ``actions`` (observations to the device, the batched forward, the actions
back to the host), the training envs' ``step`` and ``reset`` (SB3's ``Monitor``, the outermost
wrapper), ``StackedReplay.add`` (the step's transitions to the device), the DQN target update
(``after_env_step``) and the owed gradient steps (``Lockstep._gradient_steps``, with
``StackedReplay.sample`` and the learner's ``gradient_step`` inside it). Each call inside
``Lockstep.run`` adds its wall time to its section; calls elsewhere (evaluation episodes) are not
counted.

A *lockstep step* is one iteration that steps the envs, from one ``actions`` call to the next (the
gradient steps owed at a rollout's end fall in the step that ended it), so a step's wall time is
the sum of its sections and the loop's own Python (``other``). Each step belongs to a *phase*
named by a schedule ``(round, step of the round) -> name``; a callback hears every change of phase
(and ``outside`` when a round's training ends), which is where a caller starts and stops
``torch.profiler``. While :attr:`LockstepProbe.labelled` is set, every section also runs inside a
``torch.profiler.record_function("lockstep.<section>")`` range.

The timers cost about a microsecond per call (some 30 calls per step of 10 clients).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from stable_baselines3.common.monitor import Monitor

from morlfed.tasks.rl.vectorised.ddpg import StackedDDPG
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.explore import ActionNoise, EpsilonGreedy
from morlfed.tasks.rl.vectorised.replay import StackedReplay
from morlfed.tasks.rl.vectorised.rollout import Lockstep

#: (section, class, method): what the probe times. The sections nested in ``gradient_steps`` are
#: listed in :data:`NESTED`; the others do not overlap.
SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("actions", EpsilonGreedy, "actions"),
    ("actions", ActionNoise, "actions"),
    ("env.step", Monitor, "step"),
    ("env.reset", Monitor, "reset"),
    ("replay.add", StackedReplay, "add"),
    ("after_env_step", StackedDQN, "after_env_step"),
    ("gradient_steps", Lockstep, "_gradient_steps"),
    ("replay.sample", StackedReplay, "sample"),
    ("gradient_step", StackedDQN, "gradient_step"),
    ("gradient_step", StackedDDPG, "gradient_step"),
)
#: Sections timed inside another section (``gradient_steps``): not added to a step's sum.
NESTED = frozenset({"replay.sample", "gradient_step"})
#: The phase of the time between rounds' trainings.
OUTSIDE = "outside"


@dataclass
class PhaseTotals:
    """The lockstep steps of one phase: their number, their wall time and each section's share.

    :param steps: lockstep steps
    :param seconds: their wall time
    :param sections: per section, ``[seconds, calls]``
    """

    steps: int = 0
    seconds: float = 0.0
    sections: dict[str, list[float]] = field(default_factory=dict)

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per lockstep step: ``wall``, each section, and ``other`` (the wall less the top-level sections)."""
        if not self.steps:
            return {}
        ms = {name: 1e3 * seconds / self.steps for name, (seconds, _) in sorted(self.sections.items())}
        top = sum(value for name, value in ms.items() if name not in NESTED)
        return {"wall": 1e3 * self.seconds / self.steps, **ms, "other": 1e3 * self.seconds / self.steps - top}


@dataclass
class RoundTotals:
    """One call of ``Lockstep.run`` (a round's training of the batch).

    :param seconds: its wall time
    :param steps: its lockstep steps
    :param start_seconds: the part before the first step (env resets, random streams)
    :param started_at: when it started (``time.perf_counter``)
    """

    seconds: float
    steps: int
    start_seconds: float
    started_at: float


class LockstepProbe:
    """Times the lockstep loop's sections while entered (see the module docstring).

    :param schedule: the phase of a lockstep step, from its round (1-based, counted by this probe's
        ``Lockstep.run`` calls) and its index in the round (0-based)
    :param on_phase: called with ``(old, new)`` at every change of phase, before the new phase's
        first step is timed, and with ``new == "outside"`` when a round's training ends
    """

    def __init__(
        self,
        schedule: Callable[[int, int], str],
        on_phase: Callable[[str, str], None] | None = None,
    ) -> None:
        self.schedule, self.on_phase = schedule, on_phase
        #: totals by phase
        self.phases: dict[str, PhaseTotals] = {}
        #: one entry per round's training
        self.rounds: list[RoundTotals] = []
        #: whether sections are also ``record_function`` ranges (set it while a profiler records)
        self.labelled = False
        self._phase = OUTSIDE
        self._inside = False
        self._step_started: float | None = None
        self._steps_in_round = 0
        #: when the round's first step started, once it has
        self._first_step_at: float | None = None
        #: (class, method, its own attribute or None where it inherited the method)
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> LockstepProbe:
        """Wrap the sections' methods and ``Lockstep.run`` on their classes."""
        self._patch(Lockstep, "run", self._timed_run)
        for name, owner, method in SECTIONS:
            self._patch(owner, method, functools.partial(self._timed_section, name))
        return self

    def __exit__(self, *exc: object) -> None:
        """Put every wrapped method back."""
        for owner, method, original in reversed(self._saved):
            if original is None:
                delattr(owner, method)
            else:
                setattr(owner, method, original)
        self._saved.clear()

    def _patch(self, owner: type, method: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace ``owner.method`` by ``make(original)``, remembering what to put back."""
        original = getattr(owner, method)
        self._saved.append((owner, method, owner.__dict__.get(method)))
        setattr(owner, method, functools.wraps(original)(make(original)))

    def _timed_run(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Lockstep.run`` counting a round: its steps, its wall time, its start."""

        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            self._inside, self._steps_in_round, self._step_started, self._first_step_at = True, 0, None, None
            try:
                return original(*args, **kwargs)
            finally:
                ended = time.perf_counter()
                self._close_step(ended)
                self._inside = False
                self._change_phase(OUTSIDE)
                start = (ended if self._first_step_at is None else self._first_step_at) - started
                self.rounds.append(RoundTotals(ended - started, self._steps_in_round, start, started))

        return run

    def _timed_section(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """A section's method timed into the current phase (``actions`` also opens a lockstep step)."""

        def section(*args: Any, **kwargs: Any) -> Any:
            if not self._inside:
                return original(*args, **kwargs)
            if name == "actions":
                self._open_step()
            phase = self.phases.setdefault(self._phase, PhaseTotals())
            started = time.perf_counter()
            try:
                if self.labelled:
                    with torch.profiler.record_function(f"lockstep.{name}"):
                        return original(*args, **kwargs)
                return original(*args, **kwargs)
            finally:
                spent = phase.sections.setdefault(name, [0.0, 0])
                spent[0] += time.perf_counter() - started
                spent[1] += 1

        return section

    def _open_step(self) -> None:
        """Close the step in progress and open the next, changing phase first if the schedule says so."""
        self._close_step(time.perf_counter())
        self._change_phase(self.schedule(len(self.rounds) + 1, self._steps_in_round))
        now = time.perf_counter()
        if self._first_step_at is None:
            self._first_step_at = now
        self._step_started = now
        self._steps_in_round += 1

    def _close_step(self, now: float) -> None:
        """Add the step in progress (if any) to its phase."""
        if self._step_started is None:
            return
        totals = self.phases.setdefault(self._phase, PhaseTotals())
        totals.steps += 1
        totals.seconds += now - self._step_started
        self._step_started = None

    def _change_phase(self, new: str) -> None:
        """Tell ``on_phase`` of a change of phase and make ``new`` current."""
        old, self._phase = self._phase, new
        if old != new and self.on_phase is not None:
            self.on_phase(old, new)
