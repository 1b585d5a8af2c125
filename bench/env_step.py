"""The envs' own cost: microseconds per env step of each spec's training env, and per round.

The training env runs with morlfed's wrappers and random actions from a seeded generator, resets
included; also shown is what stepping alone costs per round of the spec's default run
(``n_clients x local_steps`` steps on one core).

No engine can run a round faster than its envs step on the cores it uses: this is the floor that
the GPU figures of docs/engines.md ("GPU") are read against.

    python bench/env_step.py                                  # the four DQN/DDPG targets' envs
    python bench/env_step.py --envs mo-lunar-lander --steps 50000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from morlfed.envs import EnvSpec, get_spec, make_train_env

DEFAULT_ENVS = ("deep-sea-treasure", "minecart", "mo-lunar-lander", "mo-lunar-lander-continuous")


def seconds_per_step(spec: EnvSpec, steps: int, seed: int) -> float:
    """Mean wall seconds of one step of ``spec``'s training env over ``steps`` random steps.

    :param spec: the env spec
    :param steps: env steps to time (resets after an episode's end included)
    :param seed: seeds the env and the actions
    """
    m = len(spec.objectives)
    env = make_train_env(spec, [1.0 / m] * m, seed=seed)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    space: gym.Space = env.action_space
    actions = [space.sample() for _ in range(steps)]
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> int:
    """Time each env and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS), help="env specs")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps timed per env (default: 20000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"{'env':28} {'us/step':>8} {'clients x steps':>16} {'stepping per round (1 core)':>28}")
    for name in args.envs:
        spec = get_spec(name)
        per_step = seconds_per_step(spec, args.steps, args.seed)
        steps = spec.n_clients * spec.local_steps
        print(
            f"{name:28} {per_step * 1e6:8.0f} {f'{spec.n_clients} x {spec.local_steps}':>16} {per_step * steps:27.1f}s"
        )
    print(f"\nrandom actions, {args.steps} steps per env, resets included, one process; numpy {np.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
