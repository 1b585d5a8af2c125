"""The RL client's fit options, determinism and input checks (deep-sea-treasure, tiny budgets).

The fit options: losses, train_best / train_all, per-model optimiser state, the
personal model.

Planted policies give known answers: with every weight zero the Q-values are the last bias, so a
one-hot bias is a constant action (down from the start reaches treasure 0.7 in 1 step; up never
ends: 100 steps, no treasure); "right while column < 1, then down" reaches treasure 8.2 in 3 steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
import torch
from stable_baselines3 import DQN

from morlfed import envs
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitTask
from morlfed.tasks.rl.client import RLClient

STEPS = 300
UP, DOWN, RIGHT = 0, 1, 3
TREASURE = np.array([0.9, 0.1])  # prefers the far, large treasure
TIME = np.array([0.1, 0.9])  # prefers the nearest treasure


@pytest.fixture(scope="module")
def spec() -> envs.EnvSpec:
    base = envs.get_spec("deep-sea-treasure")
    return dataclasses.replace(base, env_kwargs={}, agent_kwargs={**base.agent_kwargs, "learning_starts": 50})


def make_client(spec: envs.EnvSpec, weights: np.ndarray = TREASURE, seed: int = 0) -> RLClient:
    return RLClient(0, spec, weights, seed=seed, local_steps=STEPS, rounds=4)


def constant_policy(layout: ParamLayout, action: int) -> torch.Tensor:
    v = torch.zeros(layout.dim)
    layout.unflatten(v)["q_net.q_net.4.bias"][action] = 1.0
    return v


def second_column_policy(layout: ParamLayout) -> torch.Tensor:
    """Q_right = 0.5 - column, Q_down = column - 0.5 (the column passes through both ReLUs)."""
    v = torch.zeros(layout.dim)
    named = layout.unflatten(v)
    named["q_net.q_net.0.weight"][0, 1] = 1.0  # observation = (row, column)
    named["q_net.q_net.2.weight"][0, 0] = 1.0
    named["q_net.q_net.4.weight"][RIGHT, 0], named["q_net.q_net.4.bias"][RIGHT] = -1.0, 0.5
    named["q_net.q_net.4.weight"][DOWN, 0], named["q_net.q_net.4.bias"][DOWN] = 1.0, -0.5
    return v


def expected_loss(weights: np.ndarray, vector_return: list[float], spec: envs.EnvSpec) -> float:
    return -float(weights @ np.array(vector_return)) / spec.return_scale


def adam_steps(client: RLClient) -> int:
    return max(int(s["step"]) for s in client.agent.policy.optimizer.state.values())


def test_report_losses_are_the_scaled_negated_return_of_the_received_models(spec: envs.EnvSpec) -> None:
    client = make_client(spec)
    layout = client.layout
    models = torch.stack([constant_policy(layout, UP), constant_policy(layout, DOWN), second_column_policy(layout)])
    result = client.fit(FitTask(params=models, round=1, train_best=True, report_losses=True))
    expected = [expected_loss(TREASURE, r, spec) for r in ([0.0, -100.0], [0.7, -1.0], [8.2, -3.0])]
    assert result.losses is not None
    assert result.losses.shape == (3,)
    assert result.losses.tolist() == pytest.approx(expected, abs=1e-5)
    single = client.fit(FitTask(params=models[1], round=2, report_losses=True))
    assert single.losses is not None
    assert single.losses.shape == (1,)
    assert single.losses.item() == pytest.approx(expected[1], abs=1e-5)
    assert client.fit(FitTask(params=models[1], round=3)).losses is None


@pytest.mark.parametrize("weights, best", [(TREASURE, 1), (TIME, 2)])
def test_train_best_trains_the_model_best_for_the_clients_preference(
    spec: envs.EnvSpec, weights: np.ndarray, best: int
) -> None:
    client = make_client(spec, weights)
    layout = client.layout
    models = torch.stack([constant_policy(layout, UP), second_column_policy(layout), constant_policy(layout, DOWN)])
    result = client.fit(FitTask(params=models, round=1, train_best=True))
    assert result.losses is not None
    assert result.model_index == best == int(torch.argmin(result.losses))
    assert result.params.shape == (layout.dim,)
    assert not torch.equal(result.params, models[best])  # it was trained ...
    distances = (models - result.params).norm(dim=1)
    assert int(torch.argmin(distances)) == best  # ... starting from the chosen model


def test_train_all_keeps_one_optimiser_state_per_model_and_is_deterministic(spec: envs.EnvSpec) -> None:
    client, twin = make_client(spec), make_client(spec)
    layout = client.layout
    models = torch.stack([client.initial_params(), constant_policy(layout, DOWN)])
    task = FitTask(params=models, round=1, train_all=True, report_losses=True)
    result = client.fit(task)
    assert result.losses is not None
    assert result.params.shape == (2, layout.dim) and result.losses.shape == (2,) and result.model_index is None
    assert result.num_samples == 2 * STEPS
    for k in range(2):
        assert not torch.equal(result.params[k], models[k])
        assert int(torch.argmin((models - result.params[k]).norm(dim=1))) == k
    assert torch.equal(twin.fit(task).params, result.params)  # same seed, same state: same result

    # Adam's moments per model: model 1's step count is its own gradient steps, not the sum.
    updates_round_1 = client.agent._n_updates
    steps_model_1 = adam_steps(client)
    assert 0 < steps_model_1 < updates_round_1
    client.fit(FitTask(params=result.params[0], round=2))  # model 0 again, its own optimiser slot
    updates_round_2 = client.agent._n_updates - updates_round_1
    assert adam_steps(client) == (updates_round_1 - steps_model_1) + updates_round_2

    # The exploration schedule advanced by one round, as for a client that trains one model.
    single = make_client(spec)
    single.fit(FitTask(params=models[0], round=1))
    assert isinstance(twin.agent, DQN) and isinstance(single.agent, DQN)
    assert twin.agent.exploration_rate == pytest.approx(single.agent.exploration_rate)
    assert twin.agent.num_timesteps == 2 * single.agent.num_timesteps


def test_training_depends_on_seed_and_round(spec: envs.EnvSpec) -> None:
    a, b, c = make_client(spec), make_client(spec), make_client(spec, seed=1)
    start = a.initial_params()
    task = FitTask(params=start, round=1)
    first = a.fit(task).params
    assert torch.equal(b.fit(task).params, first)
    assert not torch.equal(c.fit(task).params, first)  # same start (shared init seed), other root seed
    assert not torch.equal(a.fit(replace(task, round=2)).params, b.fit(replace(task, round=3)).params)


def test_personal_model_stays_private_and_is_evaluated_with_none(spec: envs.EnvSpec) -> None:
    loose, tight = make_client(spec), make_client(spec)
    start = loose.initial_params()
    # never sampled: its personal model is what it would have started from, the shared initial model
    before = loose.evaluate(None, 0)
    np.testing.assert_array_equal(before.vector_return, loose.evaluate(start, 0).vector_return)
    task = FitTask(params=start, round=1, personal_lambda=0.0)
    shared = loose.fit(task).params
    assert torch.equal(shared, tight.fit(replace(task, personal_lambda=1e4)).params)  # the shared result is unaffected
    for client in (loose, tight):
        personal = client.personal_model(0)
        assert personal is not None and personal.shape == shared.shape
        assert not torch.equal(personal, shared) and not torch.equal(personal, start)
        own, direct = client.evaluate(None, 7), client.evaluate(personal, 7)
        assert own.scalarised == direct.scalarised
        assert np.array_equal(own.vector_return, direct.vector_return)
    # lambda/2 ||theta - w||^2 pulls the personal model towards w, the model just trained
    tight_personal, loose_personal = tight.personal_model(0), loose.personal_model(0)
    assert tight_personal is not None and loose_personal is not None
    assert (tight_personal - shared).norm() < 0.5 * (loose_personal - shared).norm()


def test_invalid_tasks_are_rejected_with_a_reason(spec: envs.EnvSpec) -> None:
    client = make_client(spec)
    d = client.layout.dim
    one, two = client.initial_params(), torch.stack([client.initial_params()] * 2)
    cases = [
        (FitTask(params=torch.zeros(d + 1)), r"shape \[4612\] or \[K, 4612\]"),
        (FitTask(params=torch.zeros(1, 2, d)), "shape"),
        (FitTask(params=torch.full((d,), float("nan"))), "NaN"),
        (FitTask(params=one, train_best=True), r"train_best needs \[K, 4612\]"),
        (FitTask(params=two), "need one of train_best or train_all"),
        (FitTask(params=two, train_best=True, train_all=True), "at most one"),
        (FitTask(params=one, prox_mu=-1.0), "prox_mu"),
        (FitTask(params=one, prox_mu=1.0, prox_centre=torch.zeros(3)), "prox_centre"),
        (FitTask(params=one, personal_lambda=-1.0), "personal_lambda"),
        (FitTask(params=two, train_all=True, personal_lambda=1.0), "train_all"),
    ]
    for task, message in cases:
        with pytest.raises(ValueError, match=message):
            client.fit(task)
    assert client.agent.num_timesteps == 0  # rejected before any training


@pytest.mark.parametrize("steps", [0, -5, 2.5, True])
def test_a_local_budget_that_is_not_a_positive_integer_is_refused(spec: envs.EnvSpec, steps: object) -> None:
    with pytest.raises(ValueError, match=f"local_steps must be an integer >= 1, got {steps!r}"):
        RLClient(0, spec, TREASURE, seed=0, local_steps=steps, rounds=4)  # type: ignore[arg-type]


def test_ties_between_lowest_losses_are_broken_at_random_by_seed():
    from morlfed.runtime.client import break_ties

    losses = torch.tensor([1.0, 0.5, 0.5, 2.0, 0.5])
    picks = {break_ties(losses, np.random.default_rng(s)) for s in range(50)}
    assert picks == {1, 2, 4}
    assert break_ties(losses, np.random.default_rng(3)) == break_ties(losses, np.random.default_rng(3))
    assert break_ties(torch.tensor([3.0, 0.1, 0.2]), np.random.default_rng(0)) == 1
