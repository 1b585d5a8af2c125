"""Fault injection for chaos testing: make chosen clients fail in chosen rounds.

Configured with ``faults=[{client: 1, round: 2, kind: raise}, ...]`` (hydra override syntax:
``'faults=[{client:1,round:2,kind:hang}]'``). The client factory is wrapped so that its host
(:class:`FaultyHost`) makes the named client misbehave during its fit in that round; everything
else is the real client.

Kinds:

* ``raise``: the fit trains, then raises :class:`InjectedFault`.
* ``hang``: the fit trains, then sleeps forever (in Python, so ``client_timeout`` interrupts it
  in every executor).
* ``freeze``: the fit blocks while ignoring ``SIGALRM``, like a hang inside native code that no
  in-process timeout can interrupt; only the ``process``/``ray`` executors end it, by killing the
  worker after ``client_timeout + kill_grace`` (refused with ``sequential``).
* ``nan``: the client trains normally, then reports parameters full of NaN, like a diverged
  model (exercises the rollback of the round's training).
* ``kill_worker``: the process hosting the client kills itself with ``SIGKILL`` (refused with
  ``sequential``, where that process is the run itself).
* ``kill_saving``, ``kill_evaluating``: the same, once the round's fits are done, while it saves
  its clients for the round's checkpoint or evaluates them (after the last round: the final
  evaluation); the executor restarts it and retries the step.

A failed fit is excluded from the round's aggregation and recorded in ``rounds.csv``; see
:mod:`morlfed.runtime.executors.base` for the rollback and restart rules.

Faults are injected into per-client hosts only (the default
:class:`~morlfed.runtime.executors.base.ClientHost`, which builds each client with the factory): when the
wrapped factory builds its own host (a :class:`~morlfed.runtime.executors.base.HostFactory`, an engine),
that host is used as is and its clients do not misbehave.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from morlfed.core.protocol import Evaluation, FitResult, FitTask
from morlfed.runtime.client import Client
from morlfed.runtime.executors.base import ClientFactory, ClientHost, HostFactory

KINDS = ("raise", "hang", "freeze", "nan", "kill_worker", "kill_saving", "kill_evaluating")
#: Kinds that only an executor with separate worker processes can survive.
REMOTE_ONLY = ("freeze", "kill_worker", "kill_saving", "kill_evaluating")


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault throws."""


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    :param client: the client id that misbehaves
    :param round: the round (1-based) in which it misbehaves
    :param kind: one of :data:`KINDS`
    """

    client: int
    round: int
    kind: str


def parse_faults(raw: Iterable[object] | None, n_clients: int, rounds: int, executor: str) -> list[Fault]:
    """Validate the ``faults`` config entries.

    :raises ValueError: an entry that is not ``{client, round, kind}``, an unknown kind, a client
        or round out of range, or a kind the executor cannot survive
    """
    faults = []
    for i, entry in enumerate(raw or []):
        if not isinstance(entry, Mapping) or set(entry) != {"client", "round", "kind"}:
            raise ValueError(f"faults[{i}] must be a mapping with exactly client, round and kind, got {entry!r}")
        client, rnd, kind = entry["client"], entry["round"], entry["kind"]
        if isinstance(kind, float) and math.isnan(kind):
            kind = "nan"  # hydra's override grammar reads an unquoted nan as the float NaN
        if isinstance(client, bool) or not isinstance(client, int) or not 0 <= client < n_clients:
            raise ValueError(f"faults[{i}].client must be a client id in [0, {n_clients - 1}], got {client!r}")
        if isinstance(rnd, bool) or not isinstance(rnd, int) or not 1 <= rnd <= rounds:
            raise ValueError(f"faults[{i}].round must be a round in [1, {rounds}], got {rnd!r}")
        if kind not in KINDS:
            raise ValueError(f"faults[{i}].kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if kind in REMOTE_ONLY and executor == "sequential":
            raise ValueError(
                f"faults[{i}].kind={kind} needs executor=process or ray (the sequential executor "
                "runs clients in the main process, which this fault would stop)"
            )
        faults.append(Fault(client, rnd, kind))
    return faults


class FaultyHost(ClientHost):
    """A per-client host whose clients misbehave as told in the given rounds and are the real clients otherwise.

    :param factory: builds the real clients
    :param cids: the client ids this host owns
    :param timeout: ``client_timeout`` in seconds (``None`` or 0: unlimited)
    :param faults: the faults to inject (those of other clients are ignored)
    """

    def __init__(
        self, factory: Callable[[int], Client], cids: Sequence[int], timeout: float | None, faults: Sequence[Fault]
    ) -> None:
        super().__init__(factory, cids, timeout)
        self.faults = {(f.client, f.round): f.kind for f in faults}
        #: the round of the latest fit this host ran (0: none since it started)
        self.round = 0

    def _strike(self, kind: str) -> None:
        """Kill this process if one of its clients has a ``kind`` fault in the round of its latest fit."""
        if any(self.faults.get((cid, self.round)) == kind for cid in self.cids):
            os.kill(os.getpid(), signal.SIGKILL)

    def save(self, directory: Path) -> None:
        """Save the clients (a ``kill_saving`` fault of this round strikes first).

        :param directory: a checkpoint's ``clients`` directory
        """
        self._strike("kill_saving")
        super().save(directory)

    def states(self) -> dict[int, bytes]:
        """Every client's serialised state (a ``kill_saving`` fault of this round strikes first)."""
        self._strike("kill_saving")
        return super().states()

    def evaluate_many(self, requests: Sequence[tuple[int, torch.Tensor | None, int]]) -> dict[int, Evaluation]:
        """Evaluate models on this host's clients (a ``kill_evaluating`` fault of this round strikes first).

        :param requests: ``(cid, params, seed)`` triples
        """
        self._strike("kill_evaluating")
        return super().evaluate_many(requests)

    def _fit(self, tasks: Mapping[int, FitTask]) -> Mapping[int, FitResult]:
        """Run the real fit and misbehave as this round's fault says.

        ``raise``, ``hang`` and ``nan`` strike after training, so the client's state has really
        changed and must be rolled back; ``freeze`` and ``kill_worker`` strike before.
        """
        ((cid, task),) = tasks.items()
        self.round = task.round
        kind = self.faults.get((cid, task.round))
        if kind == "freeze":
            signal.signal(signal.SIGALRM, signal.SIG_IGN)  # deaf to the in-process timeout
            while True:
                time.sleep(1.0)
        if kind == "kill_worker":
            os.kill(os.getpid(), signal.SIGKILL)
        result = self.clients[cid].fit(task)
        if kind == "raise":
            raise InjectedFault(f"injected fault: client {cid} raises in round {task.round}")
        if kind == "hang":
            while True:
                time.sleep(1.0)
        if kind == "nan":
            result = replace(result, params=torch.full_like(result.params, float("nan")))
        return {cid: result}


@dataclass
class FaultyClientFactory:
    """Wraps a client factory so that clients named in ``faults`` misbehave; picklable.

    :param factory: the real factory
    :param faults: the faults to inject
    """

    factory: ClientFactory
    faults: Sequence[Fault]

    def make_host(self, cids: list[int], timeout: float | None) -> ClientHost:
        """The wrapped factory's own host if it builds one, else a :class:`FaultyHost` of its clients.

        The wrapped factory's host gets no faults: fault injection applies to per-client hosts.

        :param cids: the client ids the host owns
        :param timeout: ``client_timeout`` in seconds (``None`` or 0: unlimited)
        """
        if isinstance(self.factory, HostFactory):
            return self.factory.make_host(cids, timeout)
        return FaultyHost(self.factory, cids, timeout, self.faults)
