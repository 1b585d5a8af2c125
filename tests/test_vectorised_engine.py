"""The vectorised engine on deep-sea-treasure with tiny budgets.

The SB3 client's fit results, losses, evaluations and exploration clock; determinism, independence
of the batch a client is trained in, state round trips; the host's fault handling; the factory and
an executor.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle

import numpy as np
import pytest
import torch
from conftest import assert_restored_engine_fits_alike, assert_same_results_whatever_the_batch, saved_states
from stable_baselines3 import DQN

from morlfed import envs
from morlfed.core.protocol import ClientFailure, FitResult, FitTask
from morlfed.runtime.executors.sequential import SequentialExecutor
from morlfed.tasks.rl.client import RLClient
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.factory import VectorisedClientFactory
from morlfed.tasks.rl.vectorised.host import VectorisedHost

STEPS, ROUNDS, SEED = 150, 10, 0
PREFS = np.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9]])
CIDS = [0, 1, 2]


@pytest.fixture(scope="module")
def spec() -> envs.EnvSpec:
    base = envs.get_spec("deep-sea-treasure")
    kwargs = {"learning_starts": 40, "batch_size": 16, "target_update_interval": 50, "buffer_size": 500}
    return dataclasses.replace(base, agent_kwargs={**base.agent_kwargs, **kwargs})


def engine(spec: envs.EnvSpec, cids: list[int] = CIDS, seed: int = SEED) -> VectorisedClients:
    return VectorisedClients(cids, spec, PREFS, seed=seed, local_steps=STEPS, rounds=ROUNDS)


def tasks_of_every_kind(models: torch.Tensor, r: int = 1) -> list[FitTask]:
    """[d], split train_all, train_best, train_all and personal_lambda tasks of round ``r``."""
    return [
        FitTask(params=models[0], round=r, report_losses=True, prox_mu=0.1),
        FitTask(params=models, round=r, train_all=True, split_budget=True),
        FitTask(params=models, round=r, train_best=True),
        FitTask(params=models, round=r, train_all=True, report_losses=True),
        FitTask(params=models, round=r, train_best=True, personal_lambda=0.5),
    ]


def two_models(spec: envs.EnvSpec) -> torch.Tensor:
    initial = engine(spec, [0]).initial_params()
    return torch.stack(
        [initial, initial + 0.05 * torch.randn(len(initial), generator=torch.Generator().manual_seed(3))]
    )


def assert_same_result(got: FitResult, want: FitResult) -> None:
    assert got.params.shape == want.params.shape
    assert got.num_samples == want.num_samples
    assert got.model_index == want.model_index
    assert sorted(got.metrics) == sorted(want.metrics)
    if want.losses is None:
        assert got.losses is None
    else:  # the received models' losses: the same seeded deterministic evaluations
        assert got.losses is not None and torch.equal(got.losses, want.losses)


@pytest.mark.parametrize("kind", range(5), ids=["d", "split", "train_best", "train_all", "personal"])
def test_fit_results_have_the_sb3_clients_shapes_losses_and_metrics(spec: envs.EnvSpec, kind: int) -> None:
    models = two_models(spec)
    task = tasks_of_every_kind(models)[kind]
    results = engine(spec).fit_many({cid: task for cid in CIDS})
    for cid in CIDS:
        want = RLClient(cid, spec, PREFS[cid], seed=SEED, local_steps=STEPS, rounds=ROUNDS).fit(task)
        assert_same_result(results[cid], want)
        assert results[cid].is_finite() and results[cid].metrics["episodes"] > 0
        # the learner's scalars for tracking: the same keys, the same budget-wide epsilon
        got_stats, want_stats = results[cid].learner_stats, want.learner_stats
        assert sorted(got_stats) == sorted(want_stats) == ["exploration_rate", "loss"]
        assert got_stats["exploration_rate"] == pytest.approx(want_stats["exploration_rate"])
        assert got_stats["loss"] > 0


def test_same_seed_same_results_whatever_the_batch(spec: envs.EnvSpec) -> None:
    tasks = dict(zip(CIDS, tasks_of_every_kind(two_models(spec))[1:4], strict=True))
    assert_same_results_whatever_the_batch(functools.partial(engine, spec), tasks, alone=(0, 2), seed=SEED)


def test_a_trained_model_evaluates_identically_in_the_sb3_client(spec: envs.EnvSpec) -> None:
    vec = engine(spec)
    results = vec.fit_many({cid: FitTask(params=vec.initial_params(), round=1) for cid in CIDS})
    for cid in CIDS:
        reference = RLClient(cid, spec, PREFS[cid], seed=SEED, local_steps=STEPS, rounds=ROUNDS)
        for seed in (5, 6):
            got, want = (
                vec.evaluate_client(cid, results[cid].params, seed),
                reference.evaluate(results[cid].params, seed),
            )
            assert np.array_equal(got.vector_return, want.vector_return)
            assert np.array_equal(got.discounted_return, want.discounted_return)
            assert (got.scalarised, got.scalarised_discounted) == (want.scalarised, want.scalarised_discounted)
    never_personal = vec.evaluate_many([(0, None, 5)])[0]  # no personal model yet: the shared initial one
    assert np.array_equal(never_personal.vector_return, vec.evaluate_client(0, vec.initial_params(), 5).vector_return)


def test_state_round_trip_reproduces_the_next_fit(spec: envs.EnvSpec) -> None:
    models = two_models(spec)
    first = engine(spec)
    first.fit_many(dict(zip(CIDS, tasks_of_every_kind(models)[2:5], strict=True)))
    second = dict(zip(CIDS, tasks_of_every_kind(models, r=2)[1:4], strict=True))
    restored = assert_restored_engine_fits_alike(first, saved_states(first), functools.partial(engine, spec), second)
    assert torch.equal(restored.personal_models[2], first.personal_models[2])
    assert restored.evaluate_client(2, None, 3).scalarised == first.evaluate_client(2, None, 3).scalarised


@pytest.mark.parametrize("steps", [150, 202])
def test_counters_and_exploration_clock_follow_the_sb3_client(spec: envs.EnvSpec, steps: int) -> None:
    models = two_models(spec)
    rounds = [
        FitTask(params=models[0], round=1),
        FitTask(params=models, round=2, train_all=True),
        FitTask(params=models[0], round=3, personal_lambda=0.2),
    ]
    vec = VectorisedClients([1], spec, PREFS, seed=SEED, local_steps=steps, rounds=ROUNDS)
    reference = RLClient(1, spec, PREFS[1], seed=SEED, local_steps=steps, rounds=ROUNDS)
    for task in rounds:
        got, want = vec.fit(task), reference.fit(task)
        assert got.steps_spent == want.steps_spent  # whole rollouts: the overshoot included
        agent, schedule, c = reference.agent, reference._schedule, vec.counters
        assert isinstance(agent, DQN) and schedule is not None
        assert (c.num_timesteps[0], c.n_calls[0]) == (agent.num_timesteps, agent._n_calls)
        assert c.offset[0] == schedule.offset
        clock = np.array([agent.num_timesteps]), np.array([schedule.offset])
        assert vec.exploration.epsilon(*clock)[0] == schedule(1.0)  # type: ignore[attr-defined]
    rollouts = -(-steps // 4) * 4  # SB3 finishes the last rollout of train_freq 4 steps
    assert vec.counters.num_timesteps[0] == 5 * rollouts
    assert vec.counters.num_timesteps[0] - vec.counters.offset[0] == 3 * rollouts  # one budget per round


def test_episodic_train_freq_trains_after_every_episode(spec: envs.EnvSpec) -> None:
    episodic = dataclasses.replace(
        spec,
        agent_kwargs={**spec.agent_kwargs, "train_freq": [1, "episode"], "gradient_steps": -1, "learning_starts": 0},
    )
    vec = engine(episodic, [0, 1])
    vec.fit_many({cid: FitTask(params=vec.initial_params(), round=1) for cid in (0, 1)})
    for i in range(2):
        lengths = vec.train_envs[i].get_episode_lengths()
        assert vec.counters.num_timesteps[i] == sum(lengths) >= STEPS  # every rollout ends an episode
        assert vec.learner.optimiser_state(i)["adam"]["step"] == sum(lengths)  # as many gradient steps as env steps


def test_host_fails_and_rolls_back_only_the_faulty_clients(spec: envs.EnvSpec) -> None:
    host = VectorisedHost(engine(spec), timeout=None)
    start = host.initial()[0]
    reward = 2 * host.engine.replay.obs_dim + 1
    host.engine.replay.data[1, :, reward] = float("nan")  # client 1 diverges
    host.engine.replay.full[1] = True
    before = {cid: host.get_state(cid) for cid in CIDS}
    tasks = [(cid, FitTask(params=start, round=1)) for cid in CIDS]
    tasks.append((3, FitTask(params=start[:5], round=1)))
    outcomes = dict(host.fit_many(tasks))
    assert isinstance(outcomes[1], ClientFailure) and "non-finite" in outcomes[1].reason
    assert isinstance(outcomes[3], ClientFailure) and "ValueError" in outcomes[3].reason
    assert all(isinstance(outcomes[cid], FitResult) for cid in (0, 2))
    assert host.get_state(1)["counters"] == before[1]["counters"]
    trained = host.get_state(0)["counters"]
    assert trained["num_timesteps"] >= STEPS

    def broken(*args: object) -> None:
        raise RuntimeError("lockstep broke")

    host.engine.lockstep.run = broken  # type: ignore[method-assign, assignment]
    outcomes = dict(host.fit_many([(cid, FitTask(params=start, round=2)) for cid in (0, 2)]))
    assert all(isinstance(o, ClientFailure) and "lockstep broke" in o.reason for o in outcomes.values())
    assert host.get_state(0)["counters"] == trained  # rolled back to before round 2


def test_factory_hosts_and_clients_through_an_executor(spec: envs.EnvSpec) -> None:
    factory = pickle.loads(pickle.dumps(VectorisedClientFactory(spec, PREFS, SEED, STEPS, ROUNDS)))
    executor = SequentialExecutor(client_timeout=None)
    executor.start(factory, len(CIDS))
    assert isinstance(executor.host, VectorisedHost) and executor.host.batched  # it answers per batch
    initial, layout = executor.initial()
    task = FitTask(params=initial, round=1)
    outcome = executor.fit({cid: task for cid in CIDS})[2]
    assert isinstance(outcome, FitResult)
    single = factory.engine([2])
    assert single.layout == layout and torch.equal(single.initial_params(), initial)
    result = single.fit(task)
    assert torch.equal(result.params, outcome.params)
    evaluations = executor.evaluate({2: outcome.params}, {2: 7})
    assert evaluations[2].scalarised == single.evaluate(result.params, 7).scalarised
    single.set_state(2, single.get_state(2))
