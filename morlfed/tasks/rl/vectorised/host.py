"""The vectorised engine's host: the clients of one worker, fitted as one batch.

The clients are held in one :class:`~morlfed.tasks.rl.vectorised.engine.VectorisedClients`.

The executors build it through
:meth:`~morlfed.tasks.rl.vectorised.factory.VectorisedClientFactory.make_host` (see
:mod:`morlfed.runtime.executors.base` for what a host owes its executor).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from morlfed.core.params import ParamLayout
from morlfed.core.progress import StepReporter
from morlfed.core.protocol import ClientFailure, FitTask, check_fit_task
from morlfed.runtime.executors.base import ClientHost, FitOutcome, StepSink, describe, guarded_fit
from morlfed.tasks.rl.vectorised.engine import VectorisedClients


class VectorisedHost(ClientHost):
    """Hosts the clients of one :class:`VectorisedClients` engine.

    **Faults.** A task that does not fit its client (:func:`~morlfed.core.protocol.check_fit_task`)
    fails that client alone. The others are fitted as one batch under one time limit, ``timeout``
    times the number of clients in the batch (the time the default host would allow them one after
    another); each client's state is snapshotted first (:func:`~morlfed.runtime.executors.base.guarded_fit`). If the batch raises or runs out of time,
    every client of the batch gets a :class:`~morlfed.core.protocol.ClientFailure` and is rolled back;
    a client whose result is not finite fails alone and is rolled back (a NaN never crosses
    clients inside the engine, so the others' results stand).

    :param engine: the engine owning this host's clients
    :param timeout: ``client_timeout`` in seconds per client (``None`` or 0: unlimited)
    """

    #: it answers once its whole batch is done: a ``process`` worker gets the batch's time
    batched = True

    def __init__(self, engine: VectorisedClients, timeout: float | None) -> None:
        self.engine = engine
        self.cids = list(engine.cids)
        self.timeout = timeout
        # one Client object for every id: the default host's evaluation, state and initial model
        self.clients = dict.fromkeys(self.cids, engine)

    def initial_of(self, cid: int) -> tuple[torch.Tensor, ParamLayout]:
        """The initial network(s) of client ``cid``'s run and the layout (the engine's :meth:`~VectorisedClients.initial_of`).

        :param cid: one of this host's client ids
        """
        return self.engine.initial_of(cid), self.engine.layout

    def fit_many(
        self, tasks: Sequence[tuple[int, FitTask]], on_steps: StepSink | None = None
    ) -> Iterator[tuple[int, FitOutcome]]:
        """Fit every task as one batch (see the class docstring).

        Yields ``(cid, outcome)`` in the tasks' order once the batch is done.

        :param tasks: ``(cid, task)`` pairs of this host's clients, one per client
        :param on_steps: called with the env steps the batch took, in about
            :data:`~morlfed.core.progress.REPORTS_PER_BATCH` chunks, while it trains
        """
        outcomes: dict[int, FitOutcome] = {}
        batch: dict[int, FitTask] = {}
        for cid, task in tasks:
            try:
                check_fit_task(task, self.engine.layout.dim)
            except ValueError as exc:
                outcomes[cid] = ClientFailure(describe(exc))
            else:
                batch[cid] = task
        if batch:
            budget = self.engine.local_steps * len(batch)
            self.engine.lockstep.on_steps = StepReporter(on_steps, budget) if on_steps is not None else None
            try:
                limit = self.timeout * len(batch) if self.timeout else None
                outcomes |= guarded_fit(self.engine, batch, limit)
            finally:
                self.engine.lockstep.on_steps = None
        for cid, _ in tasks:
            yield cid, outcomes[cid]
