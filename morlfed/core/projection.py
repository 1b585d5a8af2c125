"""A run's size projected before it starts: the memory its rounds' records take, and a floor on its time.

The records of every round (its ``rounds.csv`` row and ``clusters.jsonl`` line, in memory and in
each checkpoint) take about :data:`BYTES_PER_ROUND`; a run whose rounds would take more than the
machine's memory is refused before anything is built. Its time is at least its budget at the
task's :attr:`~morlfed.tasks.base.Task.budget_rate` (faster than any run measured) plus
:data:`SECONDS_PER_ROUND` of bookkeeping per round; a run that would take more than a day even so
is started with a warning. Neither needs a loop over the rounds, so no budget, however large,
holds up the start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from morlfed.core.progress import duration

#: Memory a run holds per round: its records in memory and their text in the latest checkpoint.
BYTES_PER_ROUND = 2048
#: The least bookkeeping a round takes (logs, checkpoint), in seconds.
SECONDS_PER_ROUND = 1e-3
#: A run projected to take longer than this is started with a warning.
DAY = 86400.0


def physical_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Projection:
    """A run's projected size.

    :param rounds: its rounds
    :param budget: its whole local budget (every round's participants x local steps)
    :param unit: what the budget counts (``env steps``, ``epochs``)
    :param rate: budget units per second that no run beats (:attr:`~morlfed.tasks.base.Task.budget_rate`)
    """

    rounds: int
    budget: int
    unit: str
    rate: float

    @property
    def memory_bytes(self) -> int:
        """The memory the rounds' records take."""
        return self.rounds * BYTES_PER_ROUND

    @property
    def seconds(self) -> float:
        """The least time the run can take."""
        return self.budget / self.rate + self.rounds * SECONDS_PER_ROUND

    def check(self, memory: int) -> str | None:
        """Refuse a run that cannot fit in ``memory`` bytes; a warning for one that takes over a day, else ``None``.

        :param memory: the memory available (:func:`physical_memory`)
        :raises ValueError: the rounds' records alone would not fit
        """
        if self.memory_bytes > memory:
            raise ValueError(
                f"rounds={self.rounds:,} cannot fit: their records alone take about {self.memory_bytes / 2**30:,.0f} GiB "
                f"({BYTES_PER_ROUND} bytes a round), and this machine has {memory / 2**30:,.0f} GiB"
            )
        if self.seconds > DAY:
            return (
                f"this run takes at least {duration(self.seconds)} ({self.budget:,} {self.unit} at no more than "
                f"{self.rate:,.0f} a second, and {self.rounds:,} rounds): more than a day"
            )
        return None
