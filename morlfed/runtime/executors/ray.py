"""The ``ray`` executor: Ray actors, each owning a fixed subset of the clients.

Client ``c`` is on actor ``c % workers``, in one host built inside the actor
(:func:`~morlfed.runtime.executors.base.make_host`).

Each round's tasks are put into the object store once (``ray.put``); every actor reads its own
clients' parameters from it (zero-copy numpy views) and fits its whole share in one call
(``ClientHost.fit_many``), answering once. Its deadline is therefore per host:
``client_timeout x (number of its tasks) + kill_grace`` seconds, after which it is killed and
restarted, and every client of its batch fails that round (:mod:`morlfed.runtime.executors.remote`).
``address`` joins an existing cluster, otherwise a local, loopback-only instance is started. Ray is
an optional extra (``pip install -e .[ray]``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from morlfed.core.commands import pip_install
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation, FitTask
from morlfed.runtime.executors.base import (
    DEFAULT_CLIENT_TIMEOUT,
    DEFAULT_KILL_GRACE,
    ClientFactory,
    FitOutcome,
    StepSink,
    make_host,
    state_file,
)
from morlfed.runtime.executors.remote import _pack, _RemoteExecutor, _unpack

RAY_MISSING = f"executor=ray needs Ray, an optional extra: {pip_install('-e', '.[ray]')}"


class RayHost:
    """What a Ray actor runs: a host that reads its tasks from the round's shared object.

    The host is built by :func:`~morlfed.runtime.executors.base.make_host`; only its own clients' arrays
    are materialised.

    :param factory: builds a client from its id (or the host itself, see ``make_host``)
    :param cids: the client ids this actor owns
    :param timeout: ``client_timeout`` in seconds (``None`` or 0: unlimited)
    """

    def __init__(self, factory: ClientFactory, cids: list[int], timeout: float | None) -> None:
        torch.set_num_threads(1)
        self.host = make_host(factory, cids, timeout)

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The initial model and layout of this actor's first client."""
        return self.host.initial()

    def fit_shared(self, cids: list[int], tasks: Mapping[int, Any]) -> list[tuple[int, Any]]:
        """Fit clients ``cids``, this actor's share of the round, as one batch; return their packed outcomes.

        Their tasks are read from the round's packed task dict.

        :param cids: the clients to fit, in order
        :param tasks: the round's packed tasks by client id
        """
        return [(cid, _pack(outcome)) for cid, outcome in self.host.fit_many([(c, _unpack(tasks[c])) for c in cids])]

    def evaluate_shared(
        self, cids: list[int], models: Mapping[int, Any], seeds: Mapping[int, int]
    ) -> dict[int, Evaluation]:
        """Evaluate clients ``cids`` on their models from the packed model dict.

        :param cids: the clients to evaluate
        :param models: the packed models by client id
        :param seeds: the evaluation seeds by client id
        """
        return self.host.evaluate_many([(cid, _unpack(models[cid]), seeds[cid]) for cid in cids])

    def personal_models(self, cids: list[int]) -> dict[int, torch.Tensor | None]:
        """Clients ``cids``' personal models (:meth:`~morlfed.runtime.executors.base.ClientHost.personal_models`).

        :param cids: some of this actor's clients
        """
        return self.host.personal_models(cids)

    def states(self) -> dict[int, bytes]:
        """Every client's serialised state."""
        return self.host.states()

    def set_states(self, states: Mapping[int, bytes]) -> None:
        """Restore clients from serialised states.

        :param states: serialised states by client id
        """
        self.host.set_states(states)


class RayExecutor(_RemoteExecutor):
    """Ray actors, each owning a fixed subset of the clients.

    :param address: an existing cluster to join (``"auto"``, ``"ray://host:10001"``, ...);
        ``None`` starts a local instance on the loopback interface, without dashboard and
        without usage reporting
    :param workers: number of actors (``None``: the cluster's CPUs divided by ``cpus_per_actor``)
    :param cpus_per_actor: Ray CPU resources each actor reserves
    :param num_cpus: CPUs of a locally started instance (``None``: ``os.cpu_count()``)
    :param client_timeout: seconds a fit may take (``None``/0: no limit)
    :param kill_grace: extra seconds before an actor that does not answer is killed
    """

    name = "ray"
    kind = "actor"

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        cpus_per_actor: float = 1.0,
        num_cpus: int | None = None,
        client_timeout: float | None = DEFAULT_CLIENT_TIMEOUT,
        kill_grace: float = DEFAULT_KILL_GRACE,
    ) -> None:
        super().__init__(workers, client_timeout, kill_grace)
        if not address:
            # A local instance stays on the loopback interface: Ray otherwise advertises the
            # machine's network address (read when ray is first imported).
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import ray
        except ImportError as exc:
            raise ImportError(RAY_MISSING) from exc
        if isinstance(cpus_per_actor, bool) or not cpus_per_actor > 0:
            raise ValueError(f"cpus_per_actor must be > 0, got {cpus_per_actor!r}")
        if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
            raise ValueError(f"num_cpus must be a positive integer or null, got {num_cpus!r}")
        self.ray, self.address, self.cpus_per_actor, self.num_cpus = ray, address, float(cpus_per_actor), num_cpus
        self.actors: list[Any] = []
        self._owns_ray = False
        self._pending: dict[Any, int] = {}

    def _default_workers(self) -> int:
        return max(1, int(self.ray.cluster_resources().get("CPU", 1) // self.cpus_per_actor))

    def describe(self, n_clients: int) -> str:
        """Say how many actors run the ``n_clients`` clients, and on which Ray instance.

        The actors are ``workers`` (at most one per client) or, when unset, one per
        ``cpus_per_actor`` CPUs of the cluster; the instance is the cluster at ``address`` or a
        local one.
        """
        where = f"the cluster at {self.address}" if self.address else "a local Ray instance"
        actors = (
            f"{min(self.workers, n_clients)} actors"
            if self.workers
            else f"an actor per {self.cpus_per_actor:g} CPUs of the cluster, at most {n_clients}"
        )
        return f"executor=ray ({actors} on {where})"

    def start(self, factory: ClientFactory, n_clients: int) -> None:
        """Initialise Ray unless it already is, then spread the clients over actors and start them.

        When Ray is not initialised yet, this joins the cluster at ``address`` or starts a local
        instance (``num_cpus`` CPUs, default ``os.cpu_count()``; on 127.0.0.1, without dashboard),
        with usage statistics off unless ``RAY_USAGE_STATS_ENABLED`` says otherwise, and
        :meth:`close` shuts Ray down again. An instance that was already initialised is used as it
        is and left running.
        """
        ray = self.ray
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            if self.address:
                ray.init(address=self.address)
            else:
                ray.init(
                    num_cpus=self.num_cpus or os.cpu_count(),
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    configure_logging=False,
                )
            self._owns_ray = True
        super().start(factory, n_clients)

    def _launch_all(self) -> None:
        ray = self.ray
        self._actor_class = ray.remote(num_cpus=self.cpus_per_actor, max_restarts=0)(RayHost)
        self.actors = [self._new_actor(g) for g in range(len(self.assignment))]
        self._initial = ray.get(self.actors[0].initial.remote())
        ray.get([a.initial.remote() for a in self.actors[1:]])

    def _new_actor(self, g: int) -> Any:
        actor = self._actor_class.remote(self.factory, self.assignment[g], self.client_timeout)
        if self.restore_dir is not None:
            states = {cid: state_file(self.restore_dir, cid).read_bytes() for cid in self.assignment[g]}
            actor.set_states.remote(states)
        return actor

    def _restart(self, g: int) -> None:
        self.ray.kill(self.actors[g], no_restart=True)
        self._pending = {ref: h for ref, h in self._pending.items() if h != g}
        self.actors[g] = self._new_actor(g)
        self.ray.get(self.actors[g].initial.remote())
        self._events.append(self._restored_note(g))

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The shared initial model and its layout, as actor 0 reported it when the actors started."""
        return self._initial

    def _submit_fit(self, tasks: dict[int, FitTask]) -> None:
        shared = self.ray.put(_pack(tasks))  # every parameter vector enters the object store once
        self._pending = {}
        for g, cids in enumerate(self.assignment):
            mine = [cid for cid in cids if cid in tasks]
            if mine:
                self._pending[self.actors[g].fit_shared.remote(mine, shared)] = g

    def _streams(self, g: int) -> bool:
        return False  # an actor fits its share in one call

    def _next_results(
        self, timeout: float | None, busy: set[int], on_steps: StepSink | None
    ) -> tuple[list[tuple[int, FitOutcome]], dict[int, str]]:
        # on_steps is never called: an actor's fit_shared answers once, with its whole batch
        ray = self.ray
        refs = list(self._pending)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        arrived: list[tuple[int, FitOutcome]] = []
        dead: dict[int, str] = {}
        for ref in ready:
            g = self._pending.pop(ref)
            try:
                arrived.extend((cid, _unpack(outcome)) for cid, outcome in ray.get(ref))
            except ray.exceptions.RayActorError as exc:
                dead[g] = f"died ({type(exc).__name__})"
        return arrived, dead

    def evaluate(self, models: Mapping[int, torch.Tensor | None], seeds: Mapping[int, int]) -> dict[int, Evaluation]:
        """Evaluate each actor's clients on their models and merge the answers, in the order of ``models``.

        The models enter the object store once, as one packed dict, and every actor reads its own
        clients' models from it. There is no deadline: it waits for every actor.
        """
        shared = self.ray.put(_pack(dict(models)))
        parts = self._each(
            "evaluate",
            lambda g: self.actors[g].evaluate_shared.remote(
                [c for c in self.assignment[g] if c in models], shared, dict(seeds)
            ),
        )
        merged = {cid: ev for part in parts for cid, ev in part.items()}
        return {cid: merged[cid] for cid in models}

    def _each(self, command: str, call: Callable[[int], Any]) -> list[Any]:
        """Every actor's answer to ``call(g)`` (a remote call on actor ``g``), in actor order.

        An actor that dies before it answers is restarted (its clients restored from the latest
        checkpoint, as in training) and called once more; the restart is an event (:meth:`take_events`).
        """
        refs = [call(g) for g in range(len(self.actors))]
        answers = []
        for g, ref in enumerate(refs):
            try:
                answers.append(self.ray.get(ref))
            except self.ray.exceptions.RayActorError:
                self._restart(g)
                self._events[-1] = f"actor {g} died during {command}; {self._events[-1]}; {command} retried"
                answers.append(self.ray.get(call(g)))
        return answers

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """Ask each actor for its own clients' personal models."""
        calls = [
            self.actors[g].personal_models.remote(owned)
            for g, cids_of in enumerate(self.assignment)
            if (owned := [c for c in cids_of if c in cids])
        ]
        return {cid: model for part in self.ray.get(calls) for cid, model in part.items()}

    def save_clients(self, directory: Path) -> None:
        """Fetch every actor's serialised client states and write them to ``directory/client_<cid>.safetensors``.

        The files are written by this (the driver) process, so ``directory`` need not be visible
        to the actors.
        """
        for part in self._each("save", lambda g: self.actors[g].states.remote()):
            for cid, data in part.items():
                state_file(directory, cid).write_bytes(data)

    def load_clients(self, directory: Path) -> None:
        """Read every client's state file here and send it to its actor; remember ``directory``.

        The files are read by this (the driver) process, and ``directory`` becomes ``restore_dir``,
        from which a restarted actor's clients are restored.
        """
        self._each(
            "load",
            lambda g: self.actors[g].set_states.remote(
                {cid: state_file(directory, cid).read_bytes() for cid in self.assignment[g]}
            ),
        )
        self.restore_dir = Path(directory)

    def close(self) -> None:
        """Kill every actor, and shut Ray down if :meth:`start` initialised it."""
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []
        if self._owns_ray:
            self.ray.shutdown()
            self._owns_ray = False
