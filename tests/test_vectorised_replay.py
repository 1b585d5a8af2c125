"""Per-client replay tensors against SB3's ReplayBuffer, and the lockstep loop's transitions.

The buffer: circular storage, ``full``, timeouts; the transitions: true final observations,
truncation stored as not done.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.monitor import Monitor

from morlfed import envs
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.explore import EpsilonGreedy
from morlfed.tasks.rl.vectorised.replay import StackedReplay
from morlfed.tasks.rl.vectorised.rollout import Counters, Lockstep, LoopSettings
from morlfed.tasks.rl.vectorised.template import template_agent


@pytest.mark.parametrize("numpy_writes", [True, False], ids=["numpy", "torch"])
def test_storage_follows_sb3_replay_buffer_with_timeouts(numpy_writes: bool) -> None:
    obs_space, act_space = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3)
    rng = np.random.default_rng(0)
    reference = ReplayBuffer(5, obs_space, act_space, device="cpu", handle_timeout_termination=True)
    replay = StackedReplay(2, 5, obs_dim=2, action_dim=1, discrete=True)
    if not numpy_writes:
        replay._host = None  # the torch path (the one used on a GPU)
    for step in range(8):  # wraps around after 5
        obs, nxt = rng.random((1, 2), dtype=np.float32), rng.random((1, 2), dtype=np.float32)
        action, reward = rng.integers(3, size=(1, 1)), rng.random(1, dtype=np.float32)
        terminated, truncated = step % 3 == 0, step % 4 == 1
        reference.add(
            obs, nxt, action, reward, np.array([terminated or truncated]), [{"TimeLimit.truncated": truncated}]
        )
        staged = replay.transitions()
        staged.obs[1], staged.next_obs[1], staged.actions[1] = obs[0], nxt[0], action[0]
        staged.rewards[1], staged.dones[1] = reward[0], terminated
        replay.add(np.array([1]), staged.rows[[1]])
    assert (replay.pos[1], replay.full[1], replay.pos[0], replay.full[0]) == (reference.pos, reference.full, 0, False)
    everything = np.tile((np.arange(5) + 0.5) / 5, (2, 1))  # one uniform per row: every row once
    batch = replay.sample(everything)
    dones = reference.dones[:, 0] * (1 - reference.timeouts[:, 0])
    assert np.array_equal(batch.observations[1].numpy(), reference.observations[:, 0])
    assert np.array_equal(batch.next_observations[1].numpy(), reference.next_observations[:, 0])
    assert np.array_equal(batch.actions[1].numpy(), reference.actions[:, 0])
    assert batch.actions.dtype == torch.int64
    assert np.array_equal(batch.rewards[1, :, 0].numpy(), reference.rewards[:, 0])
    assert np.array_equal(batch.dones[1, :, 0].numpy(), dones)
    state = replay.state_of(1)
    other = StackedReplay(2, 5, obs_dim=2, action_dim=1, discrete=True)
    other.load_state_of(0, state)
    assert torch.equal(other.data[0], replay.data[1]) and other.full[0] and other.size(0) == 5


def test_samples_are_uniform_over_the_filled_rows_only() -> None:
    replay = StackedReplay(2, 100, obs_dim=1, action_dim=1, discrete=True)
    for t in range(7):
        row = np.array([[t, t + 1, 0, 0, 0]], dtype=np.float32)
        replay.add(np.array([0]), row)
    uniforms = np.random.default_rng(1).random((2, 5000))
    drawn = replay.sample(uniforms).observations[0, :, 0].numpy()
    assert set(drawn.tolist()) == set(range(7))
    assert np.allclose(np.bincount(drawn.astype(int)) / 5000, 1 / 7, atol=0.02)
    assert np.all(replay.sample(np.full((2, 3), 1 - 1e-17)).observations[0, :, 0].numpy() == 6)


class Counter(gym.Env):
    """Observation = steps since reset; action 1 terminates, action 0 goes on (TimeLimit truncates)."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.array([self.t], np.float32), 1.0, int(action) == 1, False, {}


def test_lockstep_stores_true_final_observations_and_truncations_as_not_done() -> None:
    spec = envs.get_spec("deep-sea-treasure")
    learner = StackedDQN(2, template_agent(spec, envs.make_train_env(spec, [0.5, 0.5], None), 0))
    settings = LoopSettings(10**6, 8, 4, False, 1)
    exploration = EpsilonGreedy(learner, 10**6, n_actions=2, fraction=0.5, initial=1.0, final=0.1, total_steps=100)
    replay = StackedReplay(2, 100, obs_dim=1, action_dim=1, discrete=True)
    counters = Counters.zeros(2)
    train_envs = [Monitor(gym.wrappers.TimeLimit(Counter(), max_episode_steps=3)) for _ in range(2)]
    lockstep = Lockstep(settings, exploration, learner, replay, train_envs, counters)
    steps = np.array([40, 0])
    lockstep.run(np.array([0]), [11], steps, torch.zeros(2), torch.zeros(2, learner.layout.dim))
    assert counters.num_timesteps.tolist() == [40, 0] and replay.pos.tolist() == [40, 0]
    rows = replay.data[0, :40].numpy()
    obs, nxt, action, reward, done = rows.T
    assert np.array_equal(nxt, obs + 1)  # the true next observation, also at an episode's end
    assert np.array_equal(done, action)  # only action 1 terminates; truncation at step 3 is not done
    truncated = (nxt == 3) & (action == 0)
    assert truncated.any() and not done[truncated].any()
    assert np.all(obs[1:][done[:-1] == 1] == 0) and np.all(obs[1:][truncated[:-1]] == 0)  # then a new episode
    assert (reward == 1).all() and sum(train_envs[0].get_episode_lengths()) <= 40
