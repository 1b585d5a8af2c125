"""The vectorised engine's picklable factory (``engine=vectorised``).

Executors build one :class:`~morlfed.tasks.rl.vectorised.host.VectorisedHost` per worker with
:meth:`VectorisedClientFactory.make_host`. The factory is also a
:class:`~morlfed.runtime.executors.shared.BatchFactory`: the clients of several runs that share the
env spec, budget, device and precision train as one batch (:meth:`VectorisedClientFactory.batch_host`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from morlfed.envs import EnvSpec, make_train_env
from morlfed.runtime.executors.shared import Members
from morlfed.tasks.rl.factory import RLFactory
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.host import VectorisedHost
from morlfed.tasks.rl.vectorised.keywords import check_agent_kwargs
from morlfed.tasks.rl.vectorised.template import template_agent


@dataclass
class VectorisedClientFactory(RLFactory):
    """Builds the vectorised engine's hosts from the fields of the shared RL factory.

    The fields are those of :class:`~morlfed.tasks.rl.factory.RLFactory`, as for the SB3 engine's
    factory; picklable, so worker processes build their own. ``torch_threads`` are per worker here.

    :param precision: the gradient step's arithmetic, ``fp32`` or ``bf16`` (after the shared fields)
    """

    precision: str = "fp32"

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> None:
        """Refuse the SB3 arguments this engine does not implement.

        The check is :func:`~morlfed.tasks.rl.vectorised.keywords.check_agent_kwargs`.

        :param spec: the environment spec a run asks for
        """
        check_agent_kwargs(spec)

    def engine(self, cids: list[int]) -> VectorisedClients:
        """An engine owning clients ``cids``.

        :param cids: the client ids
        """
        return VectorisedClients(
            cids,
            self.spec,
            self.preferences,
            self.seed,
            self.local_steps,
            self.rounds,
            self.torch_threads,
            self.device,
            self.precision,
        )

    def make_host(self, cids: list[int], timeout: float | None) -> VectorisedHost:
        """The host of clients ``cids``: one engine fitting them as one batch.

        :param cids: the client ids the host owns
        :param timeout: ``client_timeout`` in seconds per client (``None`` or 0: unlimited)
        """
        return VectorisedHost(self.engine(list(cids)), timeout)

    def batch_key(self) -> tuple[tuple[str, Any], ...]:
        """What runs must share to train as one batch: the env spec, ``local_steps``, device, precision and threads.

        The stacked networks and replay need one spec and the lockstep loop one local budget; the
        runs' ``rounds`` may differ (each client keeps its own budget-wide epsilon schedule).
        """
        spec = json.dumps(self.spec.to_dict(), sort_keys=True, default=str)
        return (
            ("env", self.spec.name),
            ("env spec", spec),
            ("local_steps", self.local_steps),
            ("device", self.device),
            ("precision", self.precision),
            ("torch_threads", self.torch_threads),
        )

    def client_bytes(self) -> int:
        """An estimate of one client's memory: its replay buffer, networks and optimiser states.

        The replay holds ``buffer_size`` float32 rows of ``2 x obs + action + 2`` numbers; each of the
        agent's parameters (online and target networks) counts 6 float32 numbers: itself, its
        gradient, Adam's two moments and the two of a kept optimiser slot.
        """
        weights = np.full(len(self.spec.objectives), 1 / len(self.spec.objectives))
        agent = template_agent(self.spec, make_train_env(self.spec, weights, seed=None), self.seed)
        obs = int(np.prod(agent.observation_space.shape))  # type: ignore[arg-type]
        action = 1 if isinstance(agent.action_space, spaces.Discrete) else int(np.prod(agent.action_space.shape))  # type: ignore[arg-type]
        params = sum(p.numel() for p in agent.policy.parameters())
        return 4 * (int(agent.buffer_size) * (2 * obs + action + 2) + 6 * params)

    def batch_host(self, runs: Sequence[Any], members: Members, timeout: float | None) -> VectorisedHost:
        """One engine owning every client of ``runs``: member ``offset_r + c`` is run ``r``'s client ``c``.

        Each member keeps its run's root seed, client id, preference (``streams``) and whole budget
        (``budgets``), so it trains as in its own run.

        :param runs: the runs' factories (equal :meth:`batch_key`)
        :param members: where each run's clients sit among the members
        :param timeout: ``client_timeout`` in seconds per client (``None`` or 0: unlimited)
        """
        streams = {
            member: (int(run.seed), cid) for r, run in enumerate(runs) for cid, member in enumerate(members.of(r))
        }
        preferences = np.concatenate([np.asarray(run.preferences)[: members.sizes[r]] for r, run in enumerate(runs)])
        budgets = {member: run.local_steps * run.rounds for r, run in enumerate(runs) for member in members.of(r)}
        engine = VectorisedClients(
            list(range(members.total)),
            self.spec,
            preferences,
            int(runs[0].seed),
            self.local_steps,
            self.rounds,
            self.torch_threads,
            self.device,
            self.precision,
            streams=streams,
            budgets=budgets,
        )
        return VectorisedHost(engine, timeout)
