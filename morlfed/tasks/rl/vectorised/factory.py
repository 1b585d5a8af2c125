"""The vectorised engine's picklable factory (``engine=vectorised``).

Executors build one :class:`~morlfed.tasks.rl.vectorised.host.VectorisedHost` per worker with
:meth:`VectorisedClientFactory.make_host`; a single client on its own is :class:`VectorisedClient`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from morlfed.envs import EnvSpec
from morlfed.params import ParamLayout
from morlfed.protocol import Evaluation, FitResult, FitTask
from morlfed.tasks.rl.factory import RLFactory
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.host import VectorisedHost
from morlfed.tasks.rl.vectorised.keywords import check_agent_kwargs


class VectorisedClient:
    """One client of the vectorised engine behind the :class:`~morlfed.protocol.Client` protocol.

    It also has ``get_state`` / ``set_state``; it serves code that builds clients one by one.

    :param engine: an engine owning exactly this client
    """

    def __init__(self, engine: VectorisedClients) -> None:
        if len(engine.cids) != 1:
            raise ValueError(f"a VectorisedClient wraps an engine of one client, got {len(engine.cids)}")
        self.engine, self.cid = engine, engine.cids[0]

    @property
    def layout(self) -> ParamLayout:
        """The layout of the federated parameter vector."""
        return self.engine.layout

    def initial_params(self) -> torch.Tensor:
        """The shared initial model as a ``[d]`` vector."""
        return self.engine.initial_params()

    def fit(self, task: FitTask) -> FitResult:
        """Carry out ``task`` (see :class:`~morlfed.client.ClientBase`).

        :param task: the round's task
        """
        return self.engine.fit(task)

    def evaluate(self, params: torch.Tensor | None, seed: int) -> Evaluation:
        """Evaluate a ``[d]`` model (``None``: the personal model).

        :param params: the model
        :param seed: the evaluation seed
        """
        return self.engine.evaluate_client(self.cid, params, seed)

    def get_state(self) -> dict[str, Any]:
        """Everything the client carries from one round to the next."""
        return self.engine.get_state(self.cid)

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state returned by :meth:`get_state`.

        :param state: the state
        """
        self.engine.set_state(self.cid, state)


@dataclass
class VectorisedClientFactory(RLFactory):
    """Builds the vectorised engine's hosts (and single clients) from the fields of the shared RL factory.

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
            self.total_steps,
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

    def __call__(self, cid: int) -> VectorisedClient:
        """Client ``cid`` on its own (an engine of one client).

        :param cid: the client id
        """
        return VectorisedClient(self.engine([cid]))
