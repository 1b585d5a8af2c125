"""The remote executors' shared fit loop (``process``, ``ray``) and the packing of tensors for the wire.

The remote executors are those whose hosts live elsewhere. Client ``c`` lives on host
``c % n_hosts``. Each round every host gets its share of the tasks at once and runs them in
ascending client order. A host must give its next answer within a deadline, counted from when it
got its tasks or gave its last answer (:meth:`_RemoteExecutor._deadline`):

* a host that streams one answer per client (a ``process`` worker with a per-client host) gets
  ``client_timeout + kill_grace`` per client;
* a host that answers once for its whole share, a batch (a Ray actor; a ``process`` worker whose
  host is ``batched``, an engine's), gets ``client_timeout x (number of its tasks) + kill_grace``
  for the batch.

A host that misses its deadline, or dies, is killed and restarted (clients restored from the
latest checkpoint, or rebuilt fresh). A streaming host's first unanswered client is reported as the
failed one and the others it still owed as not run; every client of a failed batch is reported as
failed with it (the batch's results are lost).
"""

from __future__ import annotations

import os
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from typing import Any

import numpy as np
import torch

from morlfed.core.protocol import ClientFailure, FitTask
from morlfed.runtime.executors.base import (
    DEFAULT_CLIENT_TIMEOUT,
    DEFAULT_KILL_GRACE,
    ClientFactory,
    Executor,
    FitOutcome,
    StepSink,
)


class _RemoteExecutor(Executor):
    """Clients spread over persistent hosts (processes or actors), client ``c`` on host ``c % n_hosts``.

    Implements the fit loop with per-host deadlines and host restarts.

    :param workers: number of hosts (``None``: the available CPUs), at most the number of clients
    :param client_timeout: seconds a fit may take (``None``/0: no limit)
    :param kill_grace: extra seconds before a host that does not answer is killed
    """

    kind = "worker"

    def __init__(
        self,
        workers: int | None = None,
        client_timeout: float | None = DEFAULT_CLIENT_TIMEOUT,
        kill_grace: float = DEFAULT_KILL_GRACE,
    ) -> None:
        super().__init__(client_timeout)
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer or null (one per CPU), got {workers!r}")
        if isinstance(kill_grace, bool) or kill_grace < 0:
            raise ValueError(f"kill_grace must be a number of seconds >= 0, got {kill_grace!r}")
        self.workers, self.kill_grace = workers, float(kill_grace)
        self.assignment: list[list[int]] = []
        #: a command (fit, evaluate, ...) went out and not every answer came back: a stop
        #: interrupted it, the hosts are still at work, and :meth:`close` must not wait for them
        self.busy = False

    def _default_workers(self) -> int:
        return os.cpu_count() or 1

    def start(self, factory: ClientFactory, n_clients: int) -> None:
        self.factory = factory
        n_hosts = min(self.workers or self._default_workers(), n_clients)
        self.assignment = [list(range(g, n_clients, n_hosts)) for g in range(n_hosts)]
        self.owner = {cid: g for g, cids in enumerate(self.assignment) for cid in cids}
        self._launch_all()

    # transport hooks ---------------------------------------------------------------------
    @abstractmethod
    def _launch_all(self) -> None:
        """Start every host (clients built, restored from ``restore_dir`` if set)."""

    @abstractmethod
    def _restart(self, g: int) -> None:
        """Kill host ``g`` (if alive) and start a fresh one for the same clients."""

    @abstractmethod
    def _submit_fit(self, tasks: dict[int, FitTask]) -> None:
        """Send every task to its host; hosts run their clients in ascending id order."""

    @abstractmethod
    def _streams(self, g: int) -> bool:
        """Whether host ``g`` answers once per client (else once for its whole share, a batch)."""

    @abstractmethod
    def _next_results(
        self, timeout: float | None, busy: set[int], on_steps: StepSink | None
    ) -> tuple[list[tuple[int, FitOutcome]], dict[int, str]]:
        """Wait up to ``timeout`` s for fit results.

        Return the results that arrived and the hosts among ``busy`` found dead (with a reason). Env
        steps that a host reports while it trains are passed to ``on_steps`` where the transport
        carries them (they are not answers: no deadline restarts).
        """

    def _deadline(self, g: int, n_tasks: int) -> tuple[float, str] | None:
        """How long host ``g``, given ``n_tasks`` tasks, may go without answering.

        Returns the seconds and how that limit reads in a failure reason; ``None`` without
        ``client_timeout``.

        :param g: the host
        :param n_tasks: the number of tasks the host got this round
        """
        if not self.client_timeout:
            return None
        if self._streams(g):
            return self.client_timeout + self.kill_grace, "client_timeout + kill_grace"
        return self.client_timeout * n_tasks + self.kill_grace, f"client_timeout x {n_tasks} tasks + kill_grace"

    # fit loop ------------------------------------------------------------------------------
    def fit(
        self,
        tasks: dict[int, FitTask],
        on_result: Callable[[int], None] | None = None,
        on_steps: StepSink | None = None,
    ) -> dict[int, FitOutcome]:
        self.busy = True
        queues = {g: deque(c for c in cids if c in tasks) for g, cids in enumerate(self.assignment)}
        queues = {g: q for g, q in queues.items() if q}
        limits = {g: limit for g, q in queues.items() if (limit := self._deadline(g, len(q))) is not None}
        self._submit_fit(tasks)
        since = dict.fromkeys(queues, time.monotonic())
        out: dict[int, FitOutcome] = {}
        while queues:
            ends = [since[g] + limits[g][0] for g in queues if g in limits]
            wait_s = max(0.0, min(ends) - time.monotonic()) if ends else None
            arrived, dead = self._next_results(wait_s, set(queues), on_steps)
            now = time.monotonic()
            for cid, outcome in arrived:
                g = self.owner[cid]
                out[cid] = outcome
                if on_result is not None:
                    on_result(cid)
                queues[g].remove(cid)
                since[g] = now
                if not queues[g]:
                    del queues[g]
            for g in queues:
                if g in limits and g not in dead and now - since[g] >= limits[g][0]:
                    seconds, rule = limits[g]
                    dead[g] = f"no answer within {rule} = {seconds:g} s (killed)"
            for g, why in dead.items():
                lost = list(queues.pop(g, ()))  # the clients it still owed an answer
                if lost and not self._streams(g):
                    for cid in lost:
                        out[cid] = ClientFailure(f"{self.kind} {g} {why} during the batch of clients {lost}")
                elif lost:
                    culprit, *rest = lost
                    out[culprit] = ClientFailure(f"{self.kind} {g} {why} during this fit")
                    for cid in rest:
                        out[cid] = ClientFailure(f"not run: {self.kind} {g} restarted after client {culprit} failed")
                if on_result is not None:
                    for cid in lost:
                        on_result(cid)
                self._restart(g)
            if dead:  # restarting blocked this loop: do not count that time against the others
                now = time.monotonic()
                since = {g: max(t, now) for g, t in since.items()}
        self.busy = False
        return {cid: out[cid] for cid in tasks}

    def _restored_note(self, g: int) -> str:
        source = (
            f"restored from checkpoint {self.restore_dir.parent.name}"
            if self.restore_dir
            else "rebuilt fresh (no checkpoint yet)"
        )
        return f"{self.kind} {g} restarted, clients {self.assignment[g]} {source}"


def _pack(obj: Any) -> Any:
    """Turn tensors into numpy arrays (zero-copy through Ray's object store).

    Works recursively through dataclasses, dicts, lists and tuples.
    """
    return _map_leaves(obj, lambda x: _Packed(x.detach().cpu().numpy()) if isinstance(x, torch.Tensor) else x)


def _unpack(obj: Any) -> Any:
    """Inverse of :func:`_pack` (copies the read-only shared arrays into fresh tensors)."""
    return _map_leaves(obj, lambda x: torch.from_numpy(np.array(x.array)) if isinstance(x, _Packed) else x)


def _map_leaves(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``leaf`` applied to every value inside dataclasses, dicts, lists and tuples."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return replace(obj, **{f.name: _map_leaves(getattr(obj, f.name), leaf) for f in fields(obj) if f.init})
    if isinstance(obj, dict):
        return {k: _map_leaves(v, leaf) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_leaves(v, leaf) for v in obj)
    return leaf(obj)


class _Packed:
    """A tensor travelling as a numpy array."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
