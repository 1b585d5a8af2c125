"""Several federations run as one batch: :class:`Coordinator`.

Each run keeps its own :class:`~morlfed.federation.loop.Federation` (its strategy, round, recorder
and run directory); their clients share one host (:mod:`morlfed.runtime.executors.shared`), each run
seeing it through its own :class:`~morlfed.runtime.executors.shared.RunView`. The coordinator
drives them round by round: every run's :meth:`~morlfed.federation.loop.Federation.begin`, one fit
of all their tasks (:func:`~morlfed.runtime.executors.shared.fit_together`), then each run's
:meth:`~morlfed.federation.loop.Federation.end`; at the end each run's final evaluation and
results. Runs may be at different rounds (a resumed batch): each goes on from its own.

A run whose server side raises (its strategy, its recorder) fails alone: the coordinator keeps the
exception as that run's result and drives the others on, which never see it. A signal stops them
all (:class:`~morlfed.core.interrupt.RunStopped`), each keeping its last checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

from morlfed.core.interrupt import StopSignals
from morlfed.core.progress import BatchProgress
from morlfed.core.protocol import FitTask
from morlfed.federation.config import FederationOutcome
from morlfed.federation.loop import Federation
from morlfed.runtime.executors.shared import RunView, fit_together

#: A run's result: its outcome, or the exception that failed it
RunResult = FederationOutcome | Exception


class Coordinator:
    """Runs several federations whose clients share one host, round by round, with one fit per round.

    :param federations: the runs' federations, each on a :class:`RunView` of the same host
    :param stop: the signal handling for the whole batch (the callers' own, entered by them)
    :param scope: the context each run's phases run in, by the run's index (its log lines go to its
        own ``run.log``: :func:`morlfed.core.logscope.run_scope`); by default none
    :param progress: the batch's progress bar, which the rounds move (by default none)
    :raises ValueError: a federation whose executor is not a view of the shared host
    """

    def __init__(
        self,
        federations: Sequence[Federation],
        stop: StopSignals,
        scope: Callable[[int], AbstractContextManager[None]] | None = None,
        progress: BatchProgress | None = None,
    ) -> None:
        self.federations = list(federations)
        #: each run's view onto the shared host
        self.views = [f.executor for f in self.federations if isinstance(f.executor, RunView)]
        if len(self.views) < len(self.federations) or len({id(v.host) for v in self.views}) > 1:
            raise ValueError("a coordinator runs federations whose executors are views of one shared host")
        self.stop = stop
        self.scope = scope or (lambda _run: contextlib.nullcontext())
        self.progress = progress
        #: each run's result once it has one
        self.results: dict[int, RunResult] = {}
        self._next = [f.start_round for f in self.federations]

    def run(self) -> list[RunResult]:
        """Run every federation's remaining rounds and final evaluation; each run's outcome or exception.

        :raises RunStopped: a signal stopped the batch (each run keeps its last checkpoint)
        """
        for federation in self.federations:
            federation.begin_run()
        while True:
            self.stop.check()
            active = [
                i for i, f in enumerate(self.federations) if i not in self.results and self._next[i] <= f.cfg.rounds
            ]
            if not active:
                break
            self._round(active)
        for index, federation in enumerate(self.federations):
            if index in self.results:
                continue
            self.stop.check()
            with self._phase(index):
                evaluations, events = federation.final_evaluation()
                self.results[index] = federation.conclude(evaluations, events)
        return [self.results[i] for i in range(len(self.federations))]

    def _round(self, active: list[int]) -> None:
        """One round of every active run (each at its own round number): begin, one shared fit, end.

        :param active: the indices of the runs with rounds left and no failure
        """
        tasks: dict[int, dict[int, FitTask]] = {}
        for index in active:
            with self._phase(index):
                tasks[index] = self.federations[index].begin(self._next[index])
        if self.progress is not None:
            self.progress.begin_round(list(tasks))
        on_steps = None if self.progress is None else self.progress.steps
        with self.stop.interruptible():
            outcomes = fit_together([(self.views[i], tasks[i]) for i in tasks], on_steps)
        for index, outcome in zip(list(tasks), outcomes, strict=True):
            with self._phase(index):
                self.federations[index].end(self._next[index], outcome)
            self._next[index] += 1
        if self.progress is not None:
            self.progress.round_done({i for i in active if isinstance(self.results.get(i), Exception)})

    @contextlib.contextmanager
    def _phase(self, index: int) -> Iterator[None]:
        """One phase of run ``index``, in its scope; an exception becomes that run's result and ends it alone.

        :param index: the run's index
        """
        with self.scope(index):
            try:
                yield
            except Exception as exc:
                self.results[index] = exc
