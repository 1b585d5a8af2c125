"""Tests of the envs package's factories: building and stepping envs, training rewards, seeding.

Also global-RNG isolation. Specs, aliases and fronts: ``tests/test_envs.py``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import CANONICAL_ENVS, skip_if_unavailable

from morlfed import envs
from morlfed.envs import factory as envs_factory


# ------------------------------------------------------------------------------------------
# factories
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CANONICAL_ENVS)
def test_env_builds_and_steps(name: str) -> None:
    skip_if_unavailable(name)
    spec = envs.get_spec(name)
    m = spec.n_objectives
    weights = np.full(m, 1.0 / m)

    train = envs.make_train_env(spec, weights, seed=0)
    obs, _ = envs.reset_env(train, 0)
    assert train.observation_space.contains(obs) or obs.shape == train.observation_space.shape
    for _ in range(5):
        obs, reward, terminated, truncated, info = train.step(train.action_space.sample())
        assert np.ndim(np.asarray(reward)) == 0
        assert np.asarray(info["vector_reward"]).shape == (m,)
        if terminated or truncated:
            envs.reset_env(train, 1)
    train.close()

    ev = envs.make_eval_env(spec, seed=0)
    envs.reset_env(ev, 0)
    assert ev.spec is not None and ev.spec.max_episode_steps == spec.max_episode_steps
    for _ in range(5):
        _, vec, terminated, truncated, _ = ev.step(ev.action_space.sample())
        assert np.asarray(vec).shape == (m,)
        if terminated or truncated:
            envs.reset_env(ev, 1)
    ev.close()


def test_wrong_weights_dimension() -> None:
    with pytest.raises(ValueError, match="weights have 3 entries but deep-sea-treasure has 2 objectives"):
        envs.make_train_env(envs.get_spec("deep-sea-treasure"), [0.2, 0.3, 0.5], seed=0)
    with pytest.raises(ValueError, match="minecart has 3 objectives"):
        envs.make_train_env("minecart", [0.5, 0.5], seed=0)
    with pytest.raises(ValueError, match="finite"):
        envs.make_train_env("deep-sea-treasure", [np.nan, 1.0], seed=0)
    with pytest.raises(ValueError, match=r"one entry per objective .* got shape \(2, 2\)"):
        envs.make_train_env("deep-sea-treasure", np.eye(2), seed=0)


def test_env_kwargs_reach_the_constructor() -> None:
    spec = envs.get_spec("deep-sea-treasure")
    assert spec.env_kwargs == {"float_state": True}
    obs, _ = envs.reset_env(envs.make_eval_env(spec, seed=0), 0)
    assert obs.dtype == np.float32 and np.all((obs >= 0) & (obs <= 1))
    raw, _ = envs.reset_env(envs.make_eval_env(spec.replace(env_kwargs={}), seed=0), 0)
    assert raw.dtype == np.int32
    with pytest.raises(ValueError, match="set the episode cap with max_episode_steps"):
        spec.replace(env_kwargs={"max_episode_steps": 5})


def test_time_limit_override_applies() -> None:
    spec = envs.get_spec("deep-sea-treasure").replace(max_episode_steps=7)
    env = envs.make_eval_env(spec, seed=0)
    envs.reset_env(env, 0)
    steps, done = 0, False
    while not done:
        _, _, terminated, truncated, _ = env.step(0)  # action 0 = up: never reaches a treasure
        steps += 1
        done = terminated or truncated
    assert steps == 7 and truncated


@pytest.mark.parametrize(
    "name, weights", [("deep-sea-treasure", [0.3, 0.7]), ("mo-lunar-lander", [0.1, 0.2, 0.3, 0.4])]
)
def test_train_reward_is_the_weighted_vector_reward(name: str, weights: list[float]) -> None:
    spec = envs.get_spec(name)
    train = envs.make_train_env(spec, weights, seed=5)
    ev = envs.make_eval_env(spec, seed=5)
    envs.reset_env(train, 5)
    envs.reset_env(ev, 5)
    rng = np.random.default_rng(0)
    w = np.asarray(weights, dtype=np.float32)
    assert isinstance(train.action_space, gym.spaces.Discrete)
    for _ in range(60):
        a = int(rng.integers(train.action_space.n))
        _, r, t1, tr1, info = train.step(a)
        _, vec_reward, t2, tr2, _ = ev.step(a)
        vec = np.asarray(vec_reward)  # gymnasium types a reward as a scalar; MO-Gymnasium's is a vector
        np.testing.assert_allclose(info["vector_reward"], vec)
        np.testing.assert_allclose(np.asarray(r), float(np.dot(vec, w)), rtol=1e-5, atol=1e-5)
        assert (t1, tr1) == (t2, tr2)
        if t1 or tr1:
            envs.reset_env(train, 6)
            envs.reset_env(ev, 6)


def test_monitor_records_episodes() -> None:
    env = envs.make_train_env("deep-sea-treasure", [0.5, 0.5], seed=0)
    envs.reset_env(env, 0)
    _, _, terminated, _, info = env.step(1)  # DST: first step down reaches the 0.7 treasure
    assert terminated and "episode" in info and info["episode"]["l"] == 1
    assert info["episode"]["r"] == pytest.approx(0.5 * 0.7 - 0.5)


def _rollout(env, seed: int, n: int = 40) -> tuple[list[np.ndarray], list[np.ndarray]]:
    obs, _ = envs.reset_env(env, seed)
    observations, rewards = [obs], []
    for _ in range(n):
        obs, r, terminated, truncated, _ = env.step(env.action_space.sample())
        observations.append(obs)
        rewards.append(np.asarray(r))
        if terminated or truncated:
            break
    return observations, rewards


@pytest.mark.parametrize(
    "name", ["deep-sea-treasure", "minecart", "mo-lunar-lander", "mo-lunar-lander-continuous", "mo-halfcheetah"]
)
def test_same_seed_same_episode(name: str) -> None:
    skip_if_unavailable(name)
    spec = envs.get_spec(name)
    a_obs, a_rew = _rollout(envs.make_eval_env(spec, seed=11), 11)
    b_obs, b_rew = _rollout(envs.make_eval_env(spec, seed=11), 11)
    assert len(a_obs) == len(b_obs)
    for x, y in zip(a_obs, b_obs):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a_rew, b_rew):
        np.testing.assert_array_equal(x, y)


def test_different_seed_different_start() -> None:
    spec = envs.get_spec("mo-lunar-lander")
    a, _ = envs.reset_env(envs.make_eval_env(spec, seed=1), 1)
    b, _ = envs.reset_env(envs.make_eval_env(spec, seed=2), 2)
    assert not np.array_equal(a, b)


# ------------------------------------------------------------------------------------------
# numpy's global RNG (minecart)
# ------------------------------------------------------------------------------------------
class _GlobalRNGEnv(gym.Env):
    """A toy env that, like minecart, draws everything from numpy's global RNG."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.random.random(1), {}

    def step(self, action):
        return np.random.random(1), float(np.random.random()), False, False, {}


def _global_state_key() -> tuple:
    st = np.random.get_state(legacy=False)["state"]
    return tuple(st["key"].tolist()), st["pos"]


def test_global_numpy_rng_isolation_wrapper() -> None:
    # where the caller's global RNG must end up: seed 123 plus the caller's own 5 x 17 draws
    np.random.seed(123)
    np.random.random(17 * 5)
    reference = _global_state_key()

    np.random.seed(123)
    env = envs.GlobalNumpyRNGIsolation(_GlobalRNGEnv(), seed=0)
    obs, _ = env.reset(seed=3)
    draws = [obs[0]]
    for _ in range(5):
        np.random.random(17)  # another client / library drawing from the global RNG in between
        o, r, *_ = env.step(0)
        draws += [o[0], r]
    # the env saw exactly the stream np.random.seed(3) would give ...
    np.testing.assert_array_equal(draws, np.random.RandomState(3).random_sample(11))
    # ... and the caller's global RNG advanced only by the caller's own draws
    assert _global_state_key() == reference


# drive from home towards the (0.84, 0.84) mine, brake, mine once: the cart content (last two
# observation entries) is then a draw from the mine's yield distributions, which minecart-v0
# samples with scipy.stats + numpy's GLOBAL RNG
_TO_MINE_AND_MINE = [3, 3, 5, 5, 5, 5, 4, 0]


def _mined_content(env, seed: int, disturb: int | None = None) -> np.ndarray:
    envs.reset_env(env, seed)
    for a in _TO_MINE_AND_MINE:
        if disturb is not None:
            np.random.seed(disturb)  # someone else re-seeding / drawing from the global RNG
            np.random.random(5)
        obs, *_ = env.step(a)
    return np.asarray(obs[-2:])


def test_minecart_yields_reproducible_and_isolated() -> None:
    spec = envs.get_spec("minecart").replace(gym_id="minecart-v0")  # the stochastic variant
    np.random.seed(1)
    before = _global_state_key()
    a = _mined_content(envs.make_eval_env(spec, seed=4), 4)
    assert a.sum() > 0, "the scripted rollout no longer reaches a mine"
    assert _global_state_key() == before  # the env left the caller's global RNG alone
    b = _mined_content(envs.make_eval_env(spec, seed=4), 4, disturb=77)
    np.testing.assert_array_equal(a, b)
    c = _mined_content(envs.make_eval_env(spec, seed=4), 5)
    assert not np.array_equal(a, c)
    # the spec's deterministic variant: fixed yields, identical whatever the seed
    det = envs.get_spec("minecart")
    np.testing.assert_array_equal(
        _mined_content(envs.make_eval_env(det, seed=0), 0), _mined_content(envs.make_eval_env(det, seed=1), 1)
    )


class _SwappingIsolation(envs.GlobalNumpyRNGIsolation):
    """The wrapper's general path: the private state swapped into np.random around every step."""

    def _route_step_draws(self) -> bool:
        return False


def test_minecart_routed_draws_equal_the_swapped_global_stream() -> None:
    import mo_gymnasium

    spec = envs.get_spec("minecart").replace(gym_id="minecart-v0")  # stochastic yields
    routed = envs.make_eval_env(spec, seed=4)
    isolation = envs_factory._find_isolation(routed)
    assert isolation is not None and isolation._steps_routed  # the fast path is the one under test
    swapped = _SwappingIsolation(mo_gymnasium.make("minecart-v0", max_episode_steps=spec.max_episode_steps), 4)
    contents = []
    for env in (routed, swapped):
        # four episodes of mining, each a fresh seed, then one continuing from the advanced RNG
        mined = [_mined_content(env, seed) for seed in (4, 5, 4, 6)]
        for a in _TO_MINE_AND_MINE:
            obs, *_ = env.step(a)
        contents.append(np.stack([*mined, np.asarray(obs[-2:])]))
    assert (contents[0] > 0).all()
    np.testing.assert_array_equal(contents[0], contents[1])


def test_reset_env_seeds_global_numpy_for_hand_built_minecart() -> None:
    import mo_gymnasium

    env = mo_gymnasium.make("minecart-v0")  # no isolation wrapper: reset_env calls np.random.seed
    np.random.seed(99)
    envs.reset_env(env, 7)
    assert np.random.random() == np.random.RandomState(7).random_sample()
    a = _mined_content(env, 7)
    np.random.seed(123)
    b = _mined_content(env, 7)
    np.testing.assert_array_equal(a, b)
    # envs that do not use the global RNG are left alone
    np.random.seed(99)
    envs.reset_env(mo_gymnasium.make("deep-sea-treasure-v0"), 7)
    assert np.random.random() == np.random.RandomState(99).random_sample()
