"""The vectorised engine with DDPG on mo-lunar-lander-continuous (tiny networks and budgets).

With ``train_freq=(1, "episode")`` and ``gradient_steps=-1`` as in the spec: the SB3 client's fit
results and counters (the last episode's overshoot included), SB3's ``_sample_action``, determinism
and independence of the batch, a trained model in the SB3 client, state round trips.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from conftest import assert_restored_engine_fits_alike, assert_same_results_whatever_the_batch, saved_states
from gymnasium import spaces
from stable_baselines3 import DDPG

from morlfed import envs
from morlfed.core.protocol import FitResult, FitTask
from morlfed.core.seeding import generator
from morlfed.tasks.rl.client import RLClient
from morlfed.tasks.rl.vectorised.ddpg import StackedDDPG, scale_action
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.explore import ActionNoise
from morlfed.tasks.rl.vectorised.factory import VectorisedClientFactory
from morlfed.tasks.rl.vectorised.template import template_agent

STEPS, ROUNDS, SEED = 80, 10, 0
PREFS = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
CIDS = [0, 1, 2]


@pytest.fixture(scope="module")
def spec() -> envs.EnvSpec:
    base = envs.get_spec("mo-lunar-lander-continuous")
    small = {"learning_starts": 40, "batch_size": 16, "buffer_size": 1000, "policy_kwargs": {"net_arch": [32, 32]}}
    return base.replace(eval_episodes=2, agent_kwargs={**base.agent_kwargs, **small})


@pytest.fixture(scope="module")
def truncated(spec: envs.EnvSpec) -> envs.EnvSpec:
    """Every episode is cut at 30 steps (the lander is still in the air).

    Episode lengths, and with them SB3's episodic rollouts and overshoot, do not depend on the
    actions.
    """
    return spec.replace(max_episode_steps=30)


def engine(spec: envs.EnvSpec, cids: list[int] = CIDS, seed: int = SEED) -> VectorisedClients:
    return VectorisedClients(cids, spec, PREFS, seed=seed, local_steps=STEPS, rounds=ROUNDS)


@pytest.fixture(scope="module")
def models(spec: envs.EnvSpec) -> torch.Tensor:
    """The shared initial model and a perturbed copy (``[2, d]``)."""
    initial = engine(spec, [0]).initial_params()
    noise = torch.randn(len(initial), generator=torch.Generator().manual_seed(3))
    return torch.stack([initial, initial + 0.05 * noise])


def tasks(models: torch.Tensor, r: int = 1) -> list[FitTask]:
    """A [d] task with FedProx and losses, a train_all task and a personal_lambda task of round ``r``."""
    return [
        FitTask(params=models[0], round=r, report_losses=True, prox_mu=0.1),
        FitTask(params=models, round=r, train_all=True),
        FitTask(params=models, round=r, train_best=True, personal_lambda=0.5),
    ]


@pytest.mark.parametrize("kind", range(3), ids=["d", "train_all", "personal"])
def test_fit_results_have_the_sb3_clients_shapes_losses_and_metrics(
    spec: envs.EnvSpec, models: torch.Tensor, kind: int
) -> None:
    task = tasks(models)[kind]
    vec = VectorisedClientFactory(spec, PREFS, SEED, STEPS, ROUNDS).engine(CIDS[:2])
    results = vec.fit_many({cid: task for cid in CIDS[:2]})
    for i, cid in enumerate(CIDS[:2]):
        want = RLClient(cid, spec, PREFS[cid], seed=SEED, local_steps=STEPS, rounds=ROUNDS).fit(task)
        got: FitResult = results[cid]
        assert got.params.shape == want.params.shape and got.num_samples == want.num_samples
        assert got.model_index == want.model_index and sorted(got.metrics) == sorted(want.metrics)
        if want.losses is None:
            assert got.losses is None
        else:  # the received models' losses: the same seeded deterministic evaluations
            assert got.losses is not None and torch.equal(got.losses, want.losses)
        assert got.is_finite() and got.metrics["episodes"] > 0
        # every training ran whole episodes, and as many gradient steps as env steps once past learning_starts
        lengths = vec.train_envs[i].get_episode_lengths()
        assert vec.counters.num_timesteps[i] == sum(lengths) >= STEPS
        assert vec.counters.n_calls[i] == 0  # DDPG's _on_step counts nothing
        first_trained = next(k for k in range(len(lengths)) if sum(lengths[: k + 1]) > 40)
        trained = sum(lengths[first_trained:])
        steps = vec.learner.optimiser_state(i)["critic"]["step"]
        if kind == 0:
            assert steps == trained
        assert vec.learner.optimiser_state(i)["actor"]["step"] == steps


def adam_steps(slots: dict, active: str, current: dict) -> dict[str, dict[str, float]]:
    """Every optimiser slot's Adam step count per network (``current``: the active slot's state)."""
    return {
        slot: {net: state[net]["step"] for net in ("actor", "critic")}
        for slot, state in (slots | {active: current}).items()
    }


def sb3_adam_steps(client: RLClient) -> dict[str, dict[str, float]]:
    """The same for the SB3 client (its optimisers' state dicts; a fresh one has taken no step)."""
    slots = client._optimiser_slots | {client._active_slot: client._optimiser_state()}
    return {
        slot: {net: max((float(s["step"]) for s in state[net]["state"].values()), default=0.0) for net in state}
        for slot, state in slots.items()
    }


@pytest.mark.parametrize("steps, spent", [(90, 90), (100, 120)])
def test_counters_follow_the_sb3_client_with_episodic_training(
    truncated: envs.EnvSpec, models: torch.Tensor, steps: int, spent: int
) -> None:
    """90 steps: three whole episodes of 30; 100: SB3 finishes the running episode (120 steps)."""
    rounds = [
        FitTask(params=models[0], round=1),
        FitTask(params=models, round=2, train_all=True),
        FitTask(params=models[0], round=3, personal_lambda=0.2),
    ]
    vec = VectorisedClients([1], truncated, PREFS, seed=SEED, local_steps=steps, rounds=ROUNDS)
    reference = RLClient(1, truncated, PREFS[1], seed=SEED, local_steps=steps, rounds=ROUNDS)
    agent = reference.agent
    assert isinstance(agent, DDPG)
    for task in rounds:
        got, want = vec.fit(task), reference.fit(task)
        assert got.steps_spent == want.steps_spent and got.num_samples == want.num_samples
        assert vec.counters.num_timesteps[0] == agent.num_timesteps
        assert vec.train_envs[0].get_episode_lengths() == reference.train_env.get_episode_lengths()
        steps_per_slot = adam_steps(vec.slots[0], vec.active_slot[0], vec.learner.optimiser_state(0))
        assert steps_per_slot == sb3_adam_steps(reference)
        assert sum(s["critic"] for s in steps_per_slot.values()) == agent._n_updates
    assert vec.counters.num_timesteps[0] == 5 * spent  # [d]; two models; a model and the personal one
    assert vec.counters.n_calls[0] == 0


def test_exploration_is_sb3s_sample_action(spec: envs.EnvSpec) -> None:
    """Exploration is SB3's ``_sample_action``; a client that does not step draws nothing.

    Warm-up: a uniform sample of the Box plus noise; afterwards the actor's action plus noise; both
    clipped to [-1, 1] and stored scaled (the helpers themselves are checked against SB3 in
    tests/test_vectorised_ddpg.py); a client that does not step draws nothing.
    """
    box = spaces.Box(low=np.array([-2.0, 0.0], dtype=np.float32), high=np.array([3.0, 1.0], dtype=np.float32))
    agent = template_agent(spec, envs.make_train_env(spec, PREFS[0], seed=None), SEED)
    hook = ActionNoise(StackedDDPG(2, agent), learning_starts=5, space=box, std=0.3)
    hook.start(2, np.array([0, 1]), [11, 12])
    obs = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    uniforms = generator(11, "explore").random((2, 2))
    noise = [(0.3 * generator(seed, "noise").standard_normal((2, 2))).astype(np.float32) for seed in (11, 12)]
    with torch.no_grad():
        acting = agent.actor(obs[1:]).numpy()[0]
    clock = np.array([4, 7])  # client 0 still warms up, client 1 acts

    def warm_up(k: int) -> np.ndarray:
        sample = (box.low + uniforms[k] * (box.high - box.low)).astype(np.float32)
        return np.clip(scale_action(sample, box.low, box.high) + noise[0][k], -1, 1)

    actions, stored = hook.actions(np.array([True, True]), obs, clock, np.zeros(2))
    np.testing.assert_allclose(stored[0], warm_up(0), rtol=1e-6)
    np.testing.assert_allclose(stored[1], np.clip(acting + noise[1][0], -1, 1), rtol=1e-5, atol=1e-6)
    assert stored.dtype == actions.dtype == np.float32
    np.testing.assert_allclose(scale_action(actions, box.low, box.high), stored, rtol=1e-5, atol=1e-6)
    assert ((actions >= box.low) & (actions <= box.high)).all()
    _, stored = hook.actions(np.array([False, True]), obs, clock, np.zeros(2))
    np.testing.assert_allclose(stored[1], np.clip(acting + noise[1][1], -1, 1), rtol=1e-5, atol=1e-6)
    _, stored = hook.actions(np.array([True, False]), obs, clock, np.zeros(2))
    np.testing.assert_allclose(stored[0], warm_up(1), rtol=1e-6)


def test_same_seed_same_results_whatever_the_batch(spec: envs.EnvSpec, models: torch.Tensor) -> None:
    work = dict(zip(CIDS, tasks(models), strict=True))
    assert_same_results_whatever_the_batch(functools.partial(engine, spec), work, alone=(0, 2), seed=SEED)


def test_a_trained_model_evaluates_identically_in_the_sb3_client(spec: envs.EnvSpec) -> None:
    vec = engine(spec, CIDS[:2])
    results = vec.fit_many({cid: FitTask(params=vec.initial_params(), round=1) for cid in CIDS[:2]})
    for cid in CIDS[:2]:
        assert not torch.equal(results[cid].params, vec.initial_params())
        reference = RLClient(cid, spec, PREFS[cid], seed=SEED, local_steps=STEPS, rounds=ROUNDS)
        assert reference.layout == vec.layout and torch.equal(reference.initial_params(), vec.initial_params())
        got, want = vec.evaluate_client(cid, results[cid].params, 5), reference.evaluate(results[cid].params, 5)
        assert np.array_equal(got.vector_return, want.vector_return)
        assert np.array_equal(got.discounted_return, want.discounted_return)
        assert (got.scalarised, got.scalarised_discounted) == (want.scalarised, want.scalarised_discounted)


def test_state_round_trip_reproduces_the_next_fit(spec: envs.EnvSpec, models: torch.Tensor) -> None:
    first = engine(spec)
    first.fit_many(dict(zip(CIDS, tasks(models)[::-1], strict=True)))
    states = saved_states(first)
    assert set(states[0]["optimiser"]) == {"actor", "critic"} and states[0]["personal"] is not None
    second = dict(zip(CIDS, tasks(models, r=2), strict=True))
    restored = assert_restored_engine_fits_alike(first, states, functools.partial(engine, spec), second)
    assert torch.equal(restored.personal_models[0], first.personal_models[0])
    assert restored.evaluate_client(0, None, 3).scalarised == first.evaluate_client(0, None, 3).scalarised
