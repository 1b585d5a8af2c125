"""The vectorised engine's picklable factory (``engine=vectorised``).

Executors build one :class:`~morlfed.tasks.rl.vectorised.host.VectorisedHost` per worker with
:meth:`VectorisedClientFactory.make_host`.
"""

from __future__ import annotations

from dataclasses import dataclass

from morlfed.envs import EnvSpec
from morlfed.tasks.rl.factory import RLFactory
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.host import VectorisedHost
from morlfed.tasks.rl.vectorised.keywords import check_agent_kwargs


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
