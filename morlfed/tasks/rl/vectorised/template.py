"""The SB3 agent the vectorised engine mirrors.

The vectorised learners (:class:`~morlfed.tasks.rl.vectorised.dqn.StackedDQN`,
:class:`~morlfed.tasks.rl.vectorised.ddpg.StackedDDPG`) do not describe networks of their own:
they read the architecture, the shared initial parameters, the optimiser's settings and the
hyper-parameters off a real SB3 agent, built by :func:`template_agent` with the same call and the
same init seed as the SB3 client's (:func:`morlfed.tasks.rl.agent.build_agent`), so both engines
start every client from exactly the same network.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from morlfed.envs import EnvSpec
from morlfed.tasks.rl.agent import build_agent


@contextlib.contextmanager
def isolated_global_rngs() -> Iterator[None]:
    """Run the block, then put Python's, numpy's and torch's global RNG states back."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def template_agent(spec: EnvSpec, env: Any, seed: int) -> OffPolicyAlgorithm:
    """The SB3 agent (DQN or DDPG, after ``spec.agent``) the SB3 client would build.

    It is built on the CPU and without DDPG's action noise (which does not touch the networks). SB3
    seeds the process-wide RNGs while it builds the agent; their states are restored afterwards, so
    building a template draws nothing from them.

    :param spec: the environment spec
    :param env: an env with the spec's spaces (only its spaces are read)
    :param seed: the run's root seed
    """
    with isolated_global_rngs():
        agent = build_agent(spec, env, seed)
    agent.set_logger(Logger(folder=None, output_formats=[]))
    return agent
