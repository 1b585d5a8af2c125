"""How an RL client evaluates a model, for every engine.

The model is loaded into a copy of the SB3 policy, then runs deterministic, seeded episodes on the
vector-reward evaluation env. The SB3 client and the vectorised engine both evaluate through these
functions, so a model evaluates identically in either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.policies import BasePolicy

from morlfed.core.protocol import Evaluation
from morlfed.core.seeding import derive_seed
from morlfed.envs import reset_env


def load_networks(policy: BasePolicy, networks: Iterable[str], named_params: Mapping[str, torch.Tensor]) -> None:
    """Copy a model into ``policy``'s online networks, in place.

    :param policy: the SB3 policy that evaluates (a copy of the training agent's)
    :param networks: the policy's online networks, by attribute name (``q_net``; ``actor`` and
        ``critic``)
    :param named_params: the model's parameters keyed ``<network>.<parameter name>``
        (:meth:`~morlfed.core.params.ParamLayout.unflatten`)
    """
    with torch.no_grad():
        for network in networks:
            for name, param in getattr(policy, network).named_parameters():
                param.copy_(named_params[f"{network}.{name}"])


def evaluate_episodes(
    policy: BasePolicy, env: gym.Env, weights: np.ndarray, gamma: float, episodes: int, seed: int
) -> Evaluation:
    """The mean vector return of ``episodes`` deterministic episodes of ``policy`` on ``env``.

    Episode ``k`` is reset with ``derive_seed(seed, "episode", k)``. The return is given
    undiscounted and discounted, and both scalarised with ``weights``; ``env_steps`` counts the
    steps of all the episodes.

    :param policy: the SB3 policy, with the model loaded (:func:`load_networks`)
    :param env: the client's evaluation env (vector reward, :func:`morlfed.envs.make_eval_env`)
    :param weights: the client's preference ``w_i`` (``[m]``)
    :param gamma: the discount of the discounted return
    :param episodes: number of episodes
    :param seed: the evaluation's seed
    """
    undiscounted, discounted, steps = [], [], 0
    for episode in range(episodes):
        obs, _ = reset_env(env, derive_seed(seed, "episode", episode))
        total, disc = np.zeros(len(weights)), np.zeros(len(weights))
        gamma_t, done = 1.0, False
        while not done:
            action, _ = policy.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            steps += 1
            reward = np.asarray(reward, dtype=np.float64)
            total += reward
            disc += gamma_t * reward
            gamma_t *= gamma
            done = terminated or truncated
        undiscounted.append(total)
        discounted.append(disc)
    ret, dret = np.mean(undiscounted, axis=0), np.mean(discounted, axis=0)
    return Evaluation(
        vector_return=ret,
        discounted_return=dret,
        scalarised=float(weights @ ret),
        scalarised_discounted=float(weights @ dret),
        env_steps=steps,
    )
