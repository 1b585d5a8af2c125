"""What a run tells the person who started it while it goes: its progress bar and time estimate.

:class:`RoundProgress` is the run's tqdm bar. It counts the budget (env steps, or epochs for
vision) and advances as each client's fit comes back, so a long round visibly moves; its label
says the rounds done (``4/20 rounds``), also for a resumed run, which starts at its rounds done.
After the first round of this process it prints, once, an estimate of the time all its rounds take
(also in ``run.log``). :class:`BatchProgress` is the same for several runs trained as one batch:
one bar over all their budgets, labelled with the runs done (``3/12 runs trained``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from tqdm.auto import tqdm

log = logging.getLogger(__name__)
_Bar = TypeVar("_Bar", bound="_StepBar")


def counted(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``: a count with its noun in the right number.

    :param n: the count
    :param noun: the noun in the singular
    """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def duration(seconds: float) -> str:
    """A duration for people: ``2.5 s``, ``42 s``, ``7 min``, ``1.3 h``, ``12 days``, ``3,171 years``.

    :param seconds: the duration in seconds
    """
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds < 2 * 365 * 86400:
        return f"{seconds / 86400:.0f} days"
    return f"{seconds / (365 * 86400):,.0f} years"


@dataclass(frozen=True)
class RoundBudgets:
    """Each round's budget (participants x local steps), without a list: the same in every round but the last.

    :param per_round: the budget of every round but the last
    :param rounds: the number of rounds
    :param last: the last round's budget (a "+FT" run's last round has every client)
    """

    per_round: int
    rounds: int
    last: int

    def __len__(self) -> int:
        """The number of rounds."""
        return self.rounds

    def of(self, rnd: int) -> int:
        """Round ``rnd``'s budget (1-based; 0 past the last round).

        :param rnd: the round
        """
        return 0 if not 1 <= rnd <= self.rounds else self.last if rnd == self.rounds else self.per_round

    def total(self, first: int = 1, last: int | None = None) -> int:
        """The budget of rounds ``first`` to ``last`` (both included; ``None``: the last round).

        :param first: the first round
        :param last: the last round
        """
        first, last = max(first, 1), self.rounds if last is None else min(last, self.rounds)
        if last < first:
            return 0
        return (last - first + 1) * self.per_round + (self.last - self.per_round if last == self.rounds else 0)


#: How many reports a batch of clients sends while it trains (:class:`StepReporter`).
REPORTS_PER_BATCH = 20


class StepReporter:
    """Counts the env steps a batch of clients takes while it trains and passes them on in chunks.

    A chunk is at least ``every`` steps; its size is fixed by the batch's budget, not by the clock,
    so the same batch always sends the same reports.

    :param sink: called with the steps taken since its last call
    :param budget: the batch's env steps, all its clients together
    :param reports: about how many calls of ``sink`` the batch's budget makes
    """

    def __init__(self, sink: Callable[[int], None], budget: int, reports: int = REPORTS_PER_BATCH) -> None:
        self.sink = sink
        self.every = max(1, budget // max(1, reports))
        self.pending = 0

    def __call__(self, steps: int) -> None:
        """``steps`` more env steps were taken.

        :param steps: env steps taken since the last call, all clients of the batch together
        """
        self.pending += steps
        if self.pending >= self.every:
            self.sink(self.pending)
            self.pending = 0


class _StepBar:
    """A tqdm bar over round budgets that a training batch moves before its results come back.

    The shared part of :class:`RoundProgress` and :class:`BatchProgress` (a context manager that
    closes the bar): :meth:`steps` shows the env steps a batch reports while it trains, never past
    the running round's budget (``_left``), and counts them in ``_provisional`` so that the round's
    results later move the bar only by the rest.
    """

    bar: tqdm
    #: the running round's budget not yet accounted for, and the part of it :meth:`steps` showed
    _left: int
    _provisional: int

    def steps(self, amount: int) -> None:
        """A batch still training reported ``amount`` more env steps: move the bar, never past the round's budget.

        :param amount: env steps taken since the batch's last report, all its clients together
        """
        amount = max(0, min(amount, self._left - self._provisional))
        self._provisional += amount
        self._show(amount)

    def _show(self, amount: int) -> None:
        self.bar.update(amount)

    def __enter__(self: _Bar) -> _Bar:
        """Return the progress bar itself; the bar was opened by the constructor."""
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Close the bar, whether or not the training ended with an exception (which propagates)."""
        self.bar.close()


class RoundProgress(_StepBar):
    """The progress bar of a run's rounds (a context manager that closes it).

    :param budgets: each round's budget (participants x local steps), rounds 1..R
    :param start_round: the first round this process runs (a resumed run: the one after its checkpoint)
    :param unit: what the budget counts (``env steps``, ``epochs``)
    :param enabled: show the bar (``progress=``); the estimate is printed either way
    """

    def __init__(self, budgets: RoundBudgets, start_round: int, unit: str, enabled: bool = True) -> None:
        self.budgets, self.start_round, self.unit = budgets, start_round, unit
        self.rounds = len(budgets)
        done = start_round - 1
        self.bar = tqdm(
            total=budgets.total(),
            initial=budgets.total(1, done),
            desc=self._label(done),
            unit=f" {unit}",
            unit_scale=True,
            disable=not enabled,
            file=sys.stderr,
        )
        self._started = time.perf_counter()
        #: env steps of the running round that :meth:`steps` showed before their clients came back
        self._provisional = 0
        #: the running round's budget not yet shown
        self._left = budgets.of(done + 1)

    def _label(self, done: int) -> str:
        return f"{done}/{self.rounds} rounds"

    def advance(self, amount: int) -> None:
        """A client's fit came back: move the bar by its budget, less the steps :meth:`steps` already showed.

        :param amount: the fit's local budget
        """
        shown = min(self._provisional, amount)
        self._provisional -= shown
        self._left -= amount
        self.bar.update(amount - shown)

    def round_done(self, rnd: int, **postfix: str) -> None:
        """Round ``rnd`` is complete: relabel the bar and show ``postfix`` beside it.

        After the first round of this process (unless it is the run's last), also print and log the
        estimate of the time the rest takes.

        :param rnd: the round
        :param postfix: short facts about the round (training reward, failed clients)
        """
        self._provisional = 0
        self._left = self.budgets.of(rnd + 1)
        self.bar.set_description_str(self._label(rnd), refresh=False)
        self.bar.set_postfix(postfix)
        if rnd == self.start_round and rnd < self.rounds:
            seconds = time.perf_counter() - self._started
            rest = self.budgets.total(rnd + 1) / max(1, self.budgets.of(rnd)) * seconds
            line = (
                f"round {rnd}/{self.rounds} took {duration(seconds)}; estimated time of rounds "
                f"{rnd}-{self.rounds}: about {duration(seconds + rest)} ({duration(rest)} more)"
            )
            log.info(line)
            self.bar.write(f"morlfed: {line}", file=sys.stderr)


class BatchProgress(_StepBar):
    """The progress bar of several runs trained as one batch (a context manager that closes it).

    One bar counts the budgets of every run's remaining rounds together. It moves while the batch
    trains (the engine's step reports) and by the rest of each round's budget when the round ends;
    its label says how many runs have trained all their rounds (or failed). After the batch's first
    round it prints, once, an estimate of the time the batch's rounds take. A run that fails drops
    its remaining rounds from the bar.

    :param budgets: each run's round budgets (participants x local steps), rounds 1..R
    :param start_rounds: each run's first round in this process (a resumed run: after its checkpoint)
    :param unit: what the budgets count (the runs' ``budget_unit``)
    :param enabled: show the bar; the estimate is printed either way
    """

    def __init__(self, budgets: list[RoundBudgets], start_rounds: list[int], unit: str, enabled: bool = True) -> None:
        if len(budgets) != len(start_rounds):
            raise ValueError(f"{len(budgets)} runs' budgets but {len(start_rounds)} start rounds")
        self.budgets, self.next = budgets, list(start_rounds)
        #: the budget the bar counts (less the rounds of failed runs) and the part of it shown
        self.total, self.shown = sum(b.total(start) for b, start in zip(budgets, start_rounds, strict=True)), 0
        self.bar = tqdm(
            total=self.total,
            desc=self._label(),
            unit=f" {unit}",
            unit_scale=True,
            disable=not enabled,
            file=sys.stderr,
        )
        self._started = time.perf_counter()
        self._estimated = False
        self._running: list[int] = []
        #: the running round's budget, all its runs together, and the part of it already shown
        self._left = self._provisional = 0

    def _label(self) -> str:
        done = sum(start > b.rounds for b, start in zip(self.budgets, self.next, strict=True))
        return f"{done}/{counted(len(self.budgets), 'run')} trained"

    def begin_round(self, runs: list[int]) -> None:
        """The batch starts a round of ``runs`` (each at its own next round).

        :param runs: the indices of the runs in the round
        """
        self._running = list(runs)
        self._left = sum(self.budgets[i].of(self.next[i]) for i in runs)
        self._provisional = 0

    def _show(self, amount: int) -> None:
        self.shown += amount
        self.bar.update(amount)

    def round_done(self, failed: set[int] | frozenset[int] = frozenset()) -> None:
        """The round has ended: show the rest of its budget, advance its runs and relabel the bar.

        After the batch's first round (unless no round is left) also print the estimate.

        :param failed: the indices of the runs that failed (their remaining rounds leave the bar)
        """
        self._show(self._left - self._provisional)
        for index in self._running:
            self.next[index] += 1
        dropped = 0
        for index in failed:
            budget = self.budgets[index]
            dropped += budget.total(self.next[index])
            self.next[index] = budget.rounds + 1
        if dropped:
            self.total -= dropped
            self.bar.total = self.total
        self.bar.set_description_str(self._label(), refresh=True)
        left = self.total - self.shown
        if not self._estimated and left > 0:
            self._estimated = True
            seconds = time.perf_counter() - self._started
            rest = left / max(1, self._left) * seconds
            self.bar.write(
                f"morlfed: the batch's first round took {duration(seconds)}; estimated time of its rounds: "
                f"about {duration(seconds + rest)} ({duration(rest)} more)",
                file=sys.stderr,
            )
        self._running, self._left, self._provisional = [], 0, 0
