"""What every executor shares: the :class:`Executor` interface, the guarded fit and the host.

Clients are stateful (replay buffers, optimisers), so an executor builds them once and keeps them
for the whole run; only parameter vectors, results and evaluations cross process boundaries. The
same seed gives the same results under every executor: clients derive all randomness from
(seed, client, round), never from the order in which they run.

**Hosts.** A :class:`ClientHost` owns a fixed subset of the clients on one worker (the main
process, a worker process or a Ray actor) and is the only thing an executor talks to there: every
executor fits through :meth:`ClientHost.fit_many`, evaluates through
:meth:`ClientHost.evaluate_many` and saves, restores and ships client state through
:meth:`ClientHost.save` / :meth:`~ClientHost.load` / :meth:`~ClientHost.states` /
:meth:`~ClientHost.set_states`. A host holds :class:`~morlfed.runtime.client.Client` objects, the one
client abstraction: the default :class:`ClientHost` one per client id, an engine's host one for
all its clients. Hosts are built by :func:`make_host`: a :class:`HostFactory` (a factory with a
``make_host(cids, timeout)`` method) builds its own host (an *engine*, which trains its clients as
one batched computation), any other factory gets the default per-client :class:`ClientHost`.

An engine's host (a :class:`ClientHost` subclass, built inside the worker, so only the factory
must be picklable) must provide:

* ``cids``: the client ids it owns (the factory's ``make_host(cids, timeout)`` gets them);
* :meth:`~ClientHost.initial`: the shared initial model and its layout;
* :meth:`~ClientHost.fit_many`: one ``(cid, outcome)`` per task, each outcome a ``FitResult`` or
  a ``ClientFailure``, never raising for a client's fault: a client whose training raised, ran past
  ``timeout`` or produced non-finite numbers yields a ``ClientFailure`` and is rolled back to its
  state from before the call (what :func:`guarded_fit` does). Yielding each result
  as soon as it is ready lets the ``process`` executor stream it back; a host that yields only once
  the whole batch is done sets :attr:`~ClientHost.batched` (the time limits of remote executors
  are per answer: see :mod:`morlfed.runtime.executors.remote`), should itself limit the batch to
  ``timeout x (number of tasks)`` seconds, and reports the env steps its batch takes while it
  runs through ``on_steps`` (the progress bar; :class:`~morlfed.core.progress.StepReporter`);
* :meth:`~ClientHost.evaluate_many`: one ``Evaluation`` per ``(cid, params, seed)`` request;
* where client state lives: :meth:`~ClientHost.get_state` / :meth:`~ClientHost.set_state` (one
  client's state, a tree of tensors, numbers, strings and lists (:mod:`morlfed.storage.safestate`); ``save``/``load``/``states``/``set_states`` are built on
  them), or those four methods themselves.

Fault injection (:mod:`morlfed.runtime.faults`) replaces per-client hosts only; an engine's host runs its
clients as they are.

**Faults.** Every fit is guarded (:func:`guarded_fit`): the client's state is snapshotted first
(``get_state``), and a fit that raises, runs past ``client_timeout`` seconds or returns
non-finite numbers yields a :class:`~morlfed.core.protocol.ClientFailure` and the client is rolled back
to that snapshot, so it retries from its last good state next round. The timeout is enforced
inside the process that runs the client with ``SIGALRM`` (sequential executor included; main
thread only), which interrupts hangs in Python code. A remote worker that does not answer in time
(see :mod:`morlfed.runtime.executors.remote`), or that dies, is killed and restarted, its clients restored
from the latest checkpoint (or rebuilt fresh when there is none); the restart is reported through
:meth:`Executor.take_events`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import ClientFailure, Evaluation, FitResult, FitTask
from morlfed.runtime.client import Client
from morlfed.storage.safestate import load_state, save_state, state_from_bytes, state_to_bytes

FitOutcome = FitResult | ClientFailure
#: Takes the env steps a batch of clients took since the last call, while the batch still trains.
StepSink = Callable[[int], None]

#: Default ``client_timeout`` in seconds (generous: a lunar-lander round is about a minute).
DEFAULT_CLIENT_TIMEOUT = 3600.0
#: Default extra seconds a remote worker gets beyond ``client_timeout`` before it is killed.
DEFAULT_KILL_GRACE = 30.0


@runtime_checkable
class HostFactory(Protocol):
    """A factory that builds its own host: an engine, which trains a worker's clients as one batch."""

    def make_host(self, cids: list[int], timeout: float | None) -> ClientHost:
        """The host of clients ``cids``.

        :param cids: the client ids the host owns
        :param timeout: ``client_timeout`` in seconds per client (``None`` or 0: unlimited)
        """


#: What an executor builds clients with: a picklable callable from a client id to its one-client
#: :class:`~morlfed.runtime.client.Client` (kept in a default :class:`ClientHost`), or a
#: :class:`HostFactory`.
ClientFactory = Callable[[int], Client] | HostFactory


class ClientTimeout(BaseException):
    """Raised inside a fit that ran past ``client_timeout``.

    A ``BaseException`` so that library code catching ``Exception`` cannot swallow it.
    """


def state_file(directory: Path, cid: int) -> Path:
    """Where client ``cid``'s state lives inside a checkpoint's ``clients`` directory.

    :param directory: the checkpoint's ``clients`` directory
    :param cid: the client id
    """
    return Path(directory) / f"client_{cid}.safetensors"


_warned_thread = False


@contextlib.contextmanager
def alarm(seconds: float | None) -> Iterator[None]:
    """Raise :class:`ClientTimeout` in the block once ``seconds`` have passed.

    After the first, it raises again every second until the block ends, in case a library
    swallowed the first one. Uses ``SIGALRM``, so it works in the main thread only; elsewhere it
    warns once and does not limit the block. The block ends with torch's gradient mode as it began:
    the timeout can strike inside a ``torch.no_grad()``'s ``__enter__``, after it turned gradients
    off and before its ``with`` took hold, and the process's later fits would then all fail.

    :param seconds: the time limit (``None`` or 0: unlimited)
    """
    global _warned_thread
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        if not _warned_thread:
            warnings.warn(
                "client_timeout is enforced with SIGALRM, which only works in the main thread; "
                "fits run without a time limit here",
                RuntimeWarning,
                stacklevel=3,
            )
            _warned_thread = True
        yield
        return
    armed = [True]

    def on_alarm(_signum: int, _frame: object) -> None:
        if armed[0]:
            raise ClientTimeout(f"timeout after {seconds:g} s")

    grad_enabled = torch.is_grad_enabled()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
        torch.set_grad_enabled(grad_enabled)


def describe(exc: BaseException) -> str:
    """A one-line failure reason: exception type, message and where it was raised.

    :param exc: the exception
    """
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"exception {type(exc).__name__}: {exc}{where}"


def guarded_fit(
    client: Client,
    tasks: Mapping[int, FitTask],
    timeout: float | None,
    fit: Callable[[Mapping[int, FitTask]], Mapping[int, FitResult]] | None = None,
) -> dict[int, FitOutcome]:
    """``client.fit_many(tasks)`` that never raises: each client's result or the reason it failed.

    Every client of ``tasks`` is snapshotted first (:meth:`~morlfed.runtime.client.Client.get_state`). An
    exception or running past ``timeout`` fails every client of the call; a non-finite result
    fails its client alone. A failed client gets a :class:`ClientFailure` and is rolled back to
    its snapshot, so it retries from its last good state next round.

    :param client: the object training the clients
    :param tasks: the tasks by client id
    :param timeout: seconds the whole call may take (``None`` or 0: unlimited)
    :param fit: what runs the tasks, by default ``client.fit_many`` (fault injection wraps it:
        :class:`~morlfed.runtime.faults.FaultyHost`)
    """
    snapshots = {cid: client.get_state(cid) for cid in tasks}
    try:
        with alarm(timeout):
            results = (fit or client.fit_many)(tasks)
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
                client.set_state(cid, snapshots[cid])
                outcomes[cid] = ClientFailure("non-finite parameters")
        return outcomes
    for cid, snapshot in snapshots.items():
        client.set_state(cid, snapshot)
    return {cid: ClientFailure(reason) for cid in tasks}


class ClientHost:
    """Owns a fixed subset of the clients: the unit an executor places in a process or actor.

    It is also the unit an engine replaces (see the module docstring). This default host keeps one
    one-client :class:`~morlfed.runtime.client.Client` per id and fits them one at a time with
    :func:`guarded_fit`.

    :param factory: builds a client from its id
    :param cids: the client ids this host owns
    :param timeout: ``client_timeout`` in seconds (``None`` or 0: unlimited)
    """

    #: Whether :meth:`fit_many` answers only once its whole batch is done (an engine's host) rather
    #: than client by client; a ``process`` worker then gets ``client_timeout x (its tasks) +
    #: kill_grace`` seconds for the batch instead of ``client_timeout + kill_grace`` per answer.
    batched = False

    def __init__(self, factory: Callable[[int], Client], cids: Sequence[int], timeout: float | None) -> None:
        self.cids = list(cids)
        self.timeout = timeout
        self.clients = {cid: factory(cid) for cid in self.cids}

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The initial model and layout of this host's first client."""
        client = self.clients[self.cids[0]]
        return client.initial_params(), client.layout

    def initial_of(self, cid: int) -> tuple[torch.Tensor, ParamLayout]:
        """The initial model and layout of client ``cid``'s run (a host shared by several runs has one per run).

        :param cid: one of this host's client ids
        """
        client = self.clients[cid]
        return client.initial_params(), client.layout

    def fit_many(
        self, tasks: Sequence[tuple[int, FitTask]], on_steps: StepSink | None = None
    ) -> Iterator[tuple[int, FitOutcome]]:
        """Run guarded fits (:func:`guarded_fit`) in the given order.

        Each outcome is yielded as soon as it is ready.

        :param tasks: ``(cid, task)`` pairs of this host's clients
        :param on_steps: for a ``batched`` host, called with the env steps its batch took since the
            last call, while it trains; this host answers client by client and does not call it
        """
        for cid, task in tasks:
            yield cid, guarded_fit(self.clients[cid], {cid: task}, self.timeout, self._fit)[cid]

    def _fit(self, tasks: Mapping[int, FitTask]) -> Mapping[int, FitResult]:
        """Run one client's task (:class:`~morlfed.runtime.faults.FaultyHost` makes it misbehave)."""
        ((cid, task),) = tasks.items()
        return {cid: self.clients[cid].fit(task)}

    def evaluate_many(self, requests: Sequence[tuple[int, torch.Tensor | None, int]]) -> dict[int, Evaluation]:
        """Evaluate models on this host's clients.

        :param requests: ``(cid, params, seed)`` triples; ``params`` ``None``: the client's own model
        """
        return {cid: self.clients[cid].evaluate_client(cid, params, seed) for cid, params, seed in requests}

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """Clients ``cids``' private personal models (``None``: one that has none yet).

        :param cids: some of this host's client ids
        """
        return {cid: self.clients[cid].personal_model(cid) for cid in cids}

    def get_state(self, cid: int) -> dict[str, Any]:
        """Client ``cid``'s state (what a checkpoint stores for it).

        :param cid: one of this host's client ids
        """
        return self.clients[cid].get_state(cid)

    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        """Restore client ``cid`` from a state returned by :meth:`get_state`.

        :param cid: one of this host's client ids
        :param state: its state
        """
        self.clients[cid].set_state(cid, state)

    def save(self, directory: Path) -> None:
        """Write every client's state to ``directory/client_<cid>.safetensors``.

        :param directory: a checkpoint's ``clients`` directory
        """
        for cid in self.cids:
            save_state(state_file(directory, cid), self.get_state(cid))

    def load(self, directory: Path) -> None:
        """Restore every client from ``directory/client_<cid>.safetensors``.

        :param directory: a checkpoint's ``clients`` directory
        """
        for cid in self.cids:
            self.set_state(cid, load_state(state_file(directory, cid)))

    def states(self) -> dict[int, bytes]:
        """Every client's serialised state."""
        return {cid: state_to_bytes(self.get_state(cid)) for cid in self.cids}

    def set_states(self, states: Mapping[int, bytes]) -> None:
        """Restore clients from serialised states.

        :param states: serialised states (:func:`state_to_bytes`) by client id
        """
        for cid, data in states.items():
            self.set_state(cid, state_from_bytes(data))


def make_host(factory: ClientFactory, cids: Sequence[int], timeout: float | None) -> ClientHost:
    """The host of clients ``cids``, built by the factory itself where it can.

    That is ``factory.make_host(cids, timeout)`` when the factory has that method (an engine's own
    host), else a default :class:`ClientHost`.

    :param factory: the client factory
    :param cids: the client ids the host owns
    :param timeout: ``client_timeout`` in seconds (``None`` or 0: unlimited)
    """
    if isinstance(factory, HostFactory):
        return factory.make_host(list(cids), timeout)
    return ClientHost(factory, cids, timeout)


class Executor(ABC):
    """Runs clients' work. Results never depend on which executor runs them.

    :param client_timeout: seconds a fit may take before it counts as failed (``None``/0: no limit)

    ``restore_dir`` is the ``clients`` directory of the latest complete checkpoint (set by the
    checkpointer); a restarted worker restores its clients from there.
    """

    #: the ``executor=`` option
    name: ClassVar[str]

    def __init__(self, client_timeout: float | None = DEFAULT_CLIENT_TIMEOUT) -> None:
        if client_timeout is not None and (isinstance(client_timeout, bool) or client_timeout < 0):
            raise ValueError(
                f"client_timeout must be a number of seconds >= 0 (0 or null: no limit), got {client_timeout!r}"
            )
        self.client_timeout = float(client_timeout) if client_timeout else None
        self.restore_dir: Path | None = None
        self._events: list[str] = []

    @abstractmethod
    def start(self, factory: ClientFactory, n_clients: int) -> None:
        """Build clients ``0..n_clients-1`` with ``factory`` (hosts built by :func:`make_host`).

        :param factory: the client factory
        :param n_clients: the number of clients
        """

    @abstractmethod
    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The shared initial model and its layout."""

    @abstractmethod
    def fit(
        self,
        tasks: dict[int, FitTask],
        on_result: Callable[[int], None] | None = None,
        on_steps: StepSink | None = None,
    ) -> dict[int, FitOutcome]:
        """Run every task and return each client's outcome.

        A client that fails yields a :class:`ClientFailure` (see the module docstring) and is
        rolled back to its last good state.

        :param tasks: the round's tasks by client id
        :param on_result: called with each client's id as soon as its outcome is back (the
            progress bar); a host that trains its clients as one batch answers for all at once
        :param on_steps: called with env steps that a batched host (an engine's) reports while its
            batch still trains (the progress bar moves within the batch); not called by the
            ``ray`` executor, whose actors answer once per batch
        """

    @abstractmethod
    def evaluate(self, models: Mapping[int, torch.Tensor | None], seeds: Mapping[int, int]) -> dict[int, Evaluation]:
        """Evaluate each client's model with its evaluation seed.

        :param models: the model to evaluate by client id (``None``: the client's own)
        :param seeds: the evaluation seed by client id
        """

    @abstractmethod
    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """Clients ``cids``' private personal models (``None``: one that has none yet), for the run's files.

        :param cids: client ids
        """

    @abstractmethod
    def save_clients(self, directory: Path) -> None:
        """Write every client's state to ``directory/client_<cid>.safetensors``.

        :param directory: a checkpoint's ``clients`` directory
        """

    @abstractmethod
    def load_clients(self, directory: Path) -> None:
        """Restore every client from ``directory/client_<cid>.safetensors``.

        The executor also remembers ``directory`` as the restore point for restarted workers.

        :param directory: a checkpoint's ``clients`` directory
        """

    def describe(self, n_clients: int) -> str:
        """How this executor runs ``n_clients`` clients, for the run's launch summary.

        :param n_clients: the number of clients
        """
        return f"executor={self.name}"

    def take_events(self) -> list[str]:
        """Infrastructure events (worker restarts) since the last call, for ``rounds.csv``."""
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        """Release workers."""
