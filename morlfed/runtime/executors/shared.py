"""One host shared by several runs: each run's clients are *members* of one batch.

An engine that trains a worker's clients as one batched computation can train the clients of
several runs in that batch, as long as the runs share what its stacked networks need. The runs'
factories say so (:class:`BatchFactory`): :meth:`BatchFactory.batch_key` is what must be equal,
:meth:`BatchFactory.batch_host` builds the one host. Run ``r``'s client ``c`` is the host's member
``offset_r + c`` (:class:`Members`). Each run's federation sees its own :class:`RunView`, an
:class:`~morlfed.runtime.executors.base.Executor` onto the shared host that speaks in the run's
own client ids; :func:`fit_together` hands the host one call with every run's tasks of a round.

A member's training depends on nothing of the other members (the engine's guarantee), so each run
gets exactly the numbers it gets alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation, FitTask
from morlfed.runtime.executors.base import ClientFactory, ClientHost, Executor, FitOutcome, StepSink, state_file
from morlfed.storage.safestate import load_state, save_state


@dataclass(frozen=True)
class Members:
    """Where each run's clients sit among the shared host's members.

    :param sizes: each run's number of clients, in the batch's order of runs
    """

    sizes: tuple[int, ...]

    def offset(self, run: int) -> int:
        """The member id of run ``run``'s client 0.

        :param run: the run's index in the batch
        """
        return sum(self.sizes[:run])

    def of(self, run: int) -> list[int]:
        """Run ``run``'s member ids, by client id.

        :param run: the run's index in the batch
        """
        start = self.offset(run)
        return list(range(start, start + self.sizes[run]))

    @property
    def total(self) -> int:
        """The number of members."""
        return sum(self.sizes)


@runtime_checkable
class BatchFactory(Protocol):
    """A run's client factory whose clients can share one host with other runs' clients.

    :param device: the torch device its clients' networks live on (``cpu``, ``cuda``)
    """

    device: str

    def batch_key(self) -> tuple[Any, ...]:
        """What runs must share to train as one batch (equal keys: compatible)."""

    def client_bytes(self) -> int:
        """An estimate of the memory one client takes (replay, networks, optimiser state), in bytes."""

    def batch_host(self, runs: Sequence[Any], members: Members, timeout: float | None) -> ClientHost:
        """The host of every member of ``runs`` (this factory among them), built here in this process.

        :param runs: the runs' factories, in the batch's order (each with an equal :meth:`batch_key`)
        :param members: where each run's clients sit among the members
        :param timeout: ``client_timeout`` in seconds per client (``None`` or 0: unlimited)
        """


class RunView(Executor):
    """One run's executor onto a host shared with other runs: the run's client ids, its own initial model.

    The host is built and owned by the batch (:func:`shared_host`); :meth:`start` and :meth:`close`
    leave it alone. The view fits, evaluates, saves and restores its own run's clients only.

    :param host: the shared host
    :param members: the member id of each of the run's clients, by client id
    :param client_timeout: ``client_timeout`` in seconds (the host enforces it)
    """

    name = "batched"

    def __init__(self, host: ClientHost, members: Sequence[int], client_timeout: float | None = None) -> None:
        super().__init__(client_timeout)
        self.host, self.members = host, list(members)

    def start(self, factory: ClientFactory, n_clients: int) -> None:
        """Nothing to build: the shared host holds the clients already.

        :param factory: the run's client factory (unused)
        :param n_clients: the run's number of clients, checked against the view's
        """
        if n_clients != len(self.members):
            raise ValueError(f"this view serves {len(self.members)} clients, not {n_clients}")

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The run's shared initial model and its layout (those of its client 0)."""
        return self.host.initial_of(self.members[0])

    def fit(
        self,
        tasks: dict[int, FitTask],
        on_result: Callable[[int], None] | None = None,
        on_steps: StepSink | None = None,
    ) -> dict[int, FitOutcome]:
        """Fit this run's tasks alone on the shared host (a batch of runs fits with :func:`fit_together`)."""
        outcomes = fit_together([(self, tasks)], on_steps)[0]
        for cid in outcomes:
            if on_result is not None:
                on_result(cid)
        return outcomes

    def evaluate(self, models: Mapping[int, torch.Tensor | None], seeds: Mapping[int, int]) -> dict[int, Evaluation]:
        """Evaluate the run's models on its clients, in the order of ``models``."""
        asked = [(self.members[cid], params, seeds[cid]) for cid, params in models.items()]
        out = self.host.evaluate_many(asked)
        return {cid: out[self.members[cid]] for cid in models}

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """The run's clients' personal models."""
        out = self.host.personal_models([self.members[cid] for cid in cids])
        return {cid: out[self.members[cid]] for cid in cids}

    def save_clients(self, directory: Path) -> None:
        """Write each of the run's clients' state to ``directory/client_<cid>.safetensors`` (its own ids)."""
        for cid, member in enumerate(self.members):
            save_state(state_file(directory, cid), self.host.get_state(member))

    def load_clients(self, directory: Path) -> None:
        """Restore the run's clients from ``directory`` and remember it as ``restore_dir``."""
        for cid, member in enumerate(self.members):
            self.host.set_state(member, load_state(state_file(directory, cid)))
        self.restore_dir = Path(directory)

    def describe(self, n_clients: int) -> str:
        """``executor=batched`` and the batch's size, for the run's launch summary.

        :param n_clients: the run's number of clients
        """
        return f"executor={self.name} ({n_clients} of {len(self.host.cids)} clients of one shared batch)"


def shared_host(
    factories: Sequence[object], sizes: Sequence[int], timeout: float | None
) -> tuple[ClientHost, list[list[int]]]:
    """The one host of several runs' clients and each run's member ids.

    :param factories: each run's client factory, all :class:`BatchFactory` with one :meth:`~BatchFactory.batch_key`
    :param sizes: each run's number of clients
    :param timeout: ``client_timeout`` in seconds per client
    :raises ValueError: a factory that cannot batch, or runs that differ in what the batch must share
    """
    runs = [f for f in factories if isinstance(f, BatchFactory)]
    if len(runs) < len(factories):
        index = next(i for i, f in enumerate(factories) if not isinstance(f, BatchFactory))
        raise ValueError(f"run {index} cannot share a batch: its clients do not train as one batched computation")
    key = runs[0].batch_key()
    for index, factory in enumerate(runs[1:], start=1):
        other = factory.batch_key()
        if other != key:
            raise ValueError(f"run {index} cannot share a batch with run 0: {describe_difference(key, other)}")
    members = Members(tuple(int(n) for n in sizes))
    host = runs[0].batch_host(runs, members, timeout)
    return host, [members.of(r) for r in range(len(runs))]


def describe_difference(key: tuple[Any, ...], other: tuple[Any, ...]) -> str:
    """What differs between two batch keys, each a tuple of ``(name, value)`` pairs (long values by name only).

    :param key: one run's :meth:`BatchFactory.batch_key`
    :param other: another's
    """
    differ = [(name, a, b) for (name, a), (_, b) in zip(key, other, strict=True) if a != b]
    return "; ".join(
        f"{name} {a!r} != {b!r}" if len(repr(a) + repr(b)) <= 80 else f"{name} differs" for name, a, b in differ
    )


def fit_together(
    runs: Sequence[tuple[RunView, Mapping[int, FitTask]]], on_steps: StepSink | None = None
) -> list[dict[int, FitOutcome]]:
    """Fit several runs' tasks as one call of their shared host; each run's outcomes by its own client ids.

    :param runs: each run's view and its round's tasks (all views onto one host)
    :param on_steps: called with the env steps the batch took while it trains (the progress bar)
    """
    if not runs:
        return []
    host = runs[0][0].host
    if any(view.host is not host for view, _ in runs):
        raise ValueError("fit_together fits runs that share one host")
    owner = {view.members[cid]: (r, cid) for r, (view, tasks) in enumerate(runs) for cid in tasks}
    batch = [(view.members[cid], task) for view, tasks in runs for cid, task in tasks.items()]
    out: list[dict[int, FitOutcome]] = [{} for _ in runs]
    for member, outcome in host.fit_many(batch, on_steps):
        run, cid = owner[member]
        out[run][cid] = outcome
    return [{cid: out[r][cid] for cid in tasks} for r, (_, tasks) in enumerate(runs)]
