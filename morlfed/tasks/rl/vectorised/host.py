"""The vectorised engine's host: the clients of one worker, fitted as one batch.

The clients are held in one :class:`~morlfed.tasks.rl.vectorised.engine.VectorisedClients`.

The executors build it through
:meth:`~morlfed.tasks.rl.vectorised.factory.VectorisedClientFactory.make_host` (see
:mod:`morlfed.executors.base` for what a host owes its executor).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from morlfed.executors.base import ClientHost, ClientTimeout, FitOutcome, StepSink, alarm, describe
from morlfed.params import ParamLayout
from morlfed.progress import StepReporter
from morlfed.protocol import ClientFailure, Evaluation, FitTask, check_fit_task
from morlfed.tasks.rl.vectorised.engine import VectorisedClients


class VectorisedHost(ClientHost):
    """Hosts the clients of one :class:`VectorisedClients` engine.

    **Faults.** A task that does not fit its client (:func:`~morlfed.protocol.check_fit_task`)
    fails that client alone. The others are fitted as one batch under one time limit, ``timeout``
    times the number of clients in the batch (the time the default host would allow them one after
    another); each client's state is snapshotted first. If the batch raises or runs out of time,
    every client of the batch gets a :class:`~morlfed.protocol.ClientFailure` and is rolled back;
    a client whose result is not finite fails alone and is rolled back (a NaN never crosses
    clients inside the engine, so the others' results stand).

    :param engine: the engine owning this host's clients
    :param timeout: ``client_timeout`` in seconds per client (``None`` or 0: unlimited)
    """

    def __init__(self, engine: VectorisedClients, timeout: float | None) -> None:
        self.engine = engine
        self.cids = list(engine.cids)
        self.timeout = timeout

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The shared initial model and its layout."""
        return self.engine.initial_params(), self.engine.layout

    def fit_many(
        self, tasks: Sequence[tuple[int, FitTask]], on_steps: StepSink | None = None
    ) -> Iterator[tuple[int, FitOutcome]]:
        """Fit every task as one batch (see the class docstring).

        Yields ``(cid, outcome)`` in the tasks' order once the batch is done.

        :param tasks: ``(cid, task)`` pairs of this host's clients, one per client
        :param on_steps: called with the env steps the batch took, in about
            :data:`~morlfed.progress.REPORTS_PER_BATCH` chunks, while it trains
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
            budget = sum(task.local_steps or 0 for task in batch.values())
            self.engine.lockstep.on_steps = StepReporter(on_steps, budget) if on_steps is not None else None
            try:
                outcomes |= self._fit_batch(batch)
            finally:
                self.engine.lockstep.on_steps = None
        for cid, _ in tasks:
            yield cid, outcomes[cid]

    def _fit_batch(self, batch: dict[int, FitTask]) -> dict[int, FitOutcome]:
        """One guarded ``fit_many`` of the engine over ``batch``."""
        snapshots = {cid: self.engine.get_state(cid) for cid in batch}
        limit = self.timeout * len(batch) if self.timeout else None
        try:
            with alarm(limit):
                results = self.engine.fit_many(batch)
        except ClientTimeout as exc:
            reason = str(exc)
        except Exception as exc:
            reason = describe(exc)
        else:
            outcomes: dict[int, FitOutcome] = {}
            for cid, result in results.items():
                if result.is_finite():
                    outcomes[cid] = result
                else:
                    self.engine.set_state(cid, snapshots[cid])
                    outcomes[cid] = ClientFailure("non-finite parameters")
            return outcomes
        for cid, snapshot in snapshots.items():
            self.engine.set_state(cid, snapshot)
        return {cid: ClientFailure(reason) for cid in batch}

    def evaluate_many(self, requests: Sequence[tuple[int, torch.Tensor | None, int]]) -> dict[int, Evaluation]:
        """Evaluate models on this host's clients.

        :param requests: ``(cid, params, seed)`` triples; ``params`` ``None``: the client's personal model
        """
        return self.engine.evaluate_many(requests)

    def get_state(self, cid: int) -> dict[str, Any]:
        """Client ``cid``'s state (what a checkpoint stores for it).

        :param cid: one of this host's client ids
        """
        return self.engine.get_state(cid)

    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        """Restore client ``cid`` from a state returned by :meth:`get_state`.

        :param cid: one of this host's client ids
        :param state: its state
        """
        self.engine.set_state(cid, state)
