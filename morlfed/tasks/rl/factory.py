"""What every RL engine's client factory is built from, and the check of an env spec against the engine.

:meth:`RLTask.client_factory <morlfed.tasks.rl.task.RLTask.client_factory>` builds the chosen
engine's factory with these fields; the check compares an env spec with what the engine implements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from morlfed.envs import EnvSpec
from morlfed.tasks.rl.agent import check_sb3_kwargs


@dataclass
class RLFactory:
    """Builds an engine's RL clients by id; picklable, so worker processes can build their own.

    :param spec: the environment spec
    :param preferences: ``[n, m]`` private weights, row ``cid`` for client ``cid``
    :param seed: root seed
    :param local_steps: the env steps of one fit
    :param rounds: the run's rounds (each client's whole budget is ``rounds x local_steps``)
    :param torch_threads: torch threads per client computation
    :param device: the torch device of the clients' networks
    """

    spec: EnvSpec
    preferences: np.ndarray
    seed: int
    local_steps: int
    rounds: int
    torch_threads: int = 1
    device: str = "cpu"

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> None:
        """Raise ``ValueError`` naming what in ``spec`` this engine does not implement.

        By default it refuses what SB3 does not take (:func:`~morlfed.tasks.rl.agent.check_sb3_kwargs`):
        the engine passes every SB3 argument to SB3.

        :param spec: the environment spec a run asks for
        """
        check_sb3_kwargs(spec)
