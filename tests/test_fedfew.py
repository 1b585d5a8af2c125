"""FedFew: STCH-Set weights, the server step, planted groups, model choice, validation, resume.

STCH-Set weights are checked against a direct computation, and the K models must specialise to the
planted groups.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from morlfed import envs
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.core.seeding import derive_seed
from morlfed.storage.safestate import state_from_bytes, state_to_bytes
from morlfed.strategies.base import make_strategy
from morlfed.strategies.fedfew import FedFew, stch_set_weights
from morlfed.tasks.rl.client import RLClient


def _direct_weights(losses: np.ndarray, samples: np.ndarray, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """The paper's equations (11)-(12) computed literally, in linear space."""
    scaled = samples[:, None] / samples.sum() * losses
    e = np.exp(-scaled / mu)
    s = e.sum(axis=1)
    return e / s[:, None], (1 / s) / (1 / s).sum()


def _setup(strategy: FedFew, n: int, dim: int, seed: int = 0) -> ParamLayout:
    layout = ParamLayout.from_shapes({"w": (dim,)})
    strategy.setup(n, torch.zeros(dim), layout, np.random.default_rng(seed))
    return layout


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_equal_direct_computation(seed):
    rng = np.random.default_rng(seed)
    losses = rng.uniform(0.0, 2.0, size=(7, 4))
    samples = rng.integers(5, 50, size=7).astype(float)
    w, alpha = stch_set_weights(torch.tensor(losses), torch.tensor(samples), mu=0.05)
    w_ref, alpha_ref = _direct_weights(losses, samples, 0.05)
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-10)
    np.testing.assert_allclose(alpha.numpy(), alpha_ref, rtol=1e-10)
    np.testing.assert_allclose(w.sum(dim=1).numpy(), 1.0, atol=1e-12)
    assert alpha.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_weights_stay_finite_where_linear_space_underflows():
    losses = np.array([[30.0, 31.0], [40.0, 45.0], [35.0, 33.0]])
    samples = np.ones(3)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w_ref, _ = _direct_weights(losses, samples, 1e-3)
    assert not np.isfinite(w_ref).all()  # exp(-10000) underflows: 0 / 0
    w, alpha = stch_set_weights(torch.tensor(losses), torch.tensor(samples), mu=1e-3)
    assert torch.isfinite(w).all() and torch.isfinite(alpha).all()
    assert w[0].argmax() == 0 and w[2].argmax() == 1
    assert alpha.argmax() == 1  # the client served worst by every model weighs most
    torch.testing.assert_close(w.sum(dim=1), torch.ones(3, dtype=torch.float64))


def test_server_step_is_alpha_w_weighted_sum_of_updates():
    rng = np.random.default_rng(3)
    n, k, dim, eta = 5, 3, 6, 0.7
    strat = FedFew(n_models=k, mu=0.2, server_lr=eta, init_noise=0.1)
    _setup(strat, n, dim)
    start = strat.models.clone()
    trained = start.unsqueeze(0) + torch.tensor(rng.normal(size=(n, k, dim)), dtype=torch.float32)
    losses = rng.uniform(0, 1, size=(n, k))
    samples = rng.integers(1, 20, size=n)
    results = {
        i: FitResult(
            params=trained[i], num_samples=int(samples[i]), losses=torch.tensor(losses[i], dtype=torch.float32)
        )
        for i in range(n)
    }
    strat.aggregate(1, results)
    w_ref, alpha_ref = _direct_weights(losses.astype(np.float32).astype(float), samples.astype(float), 0.2)
    expected = start.numpy() + eta * np.einsum("nk,nkd->kd", alpha_ref[:, None] * w_ref, (trained - start).numpy())
    np.testing.assert_allclose(strat.models.numpy(), expected, atol=1e-5)
    diag = strat.diagnostics()
    np.testing.assert_allclose(np.array(diag["w"]), w_ref, rtol=1e-5)
    np.testing.assert_allclose(np.array(diag["alpha"]), alpha_ref, rtol=1e-5)
    assert diag["choices"] == list(np.argmin(losses, axis=1))


def _train(models: torch.Tensor, optimum: torch.Tensor, step: float) -> FitResult:
    """A client of a planted group: training moves each model a fraction of the way to its group's optimum.

    The loss of a model is its distance to that optimum.
    """
    return FitResult(params=models + step * (optimum - models), num_samples=10, losses=(models - optimum).norm(dim=1))


def _planted_run(seed: int, init_noise: float, rounds: int = 30) -> tuple[FedFew, torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    k, per_group, dim = 3, 3, 12
    optima = torch.tensor(np.linalg.qr(rng.normal(size=(dim, k)))[0].T, dtype=torch.float32)
    labels = rng.permutation(np.repeat(np.arange(k), per_group))
    strat = FedFew(n_models=k, init_noise=init_noise)  # the defaults mu = 0.01, eta_s = 1
    _setup(strat, len(labels), dim, seed)
    for rnd in range(1, rounds + 1):
        tasks = strat.configure(rnd, range(len(labels)))
        strat.aggregate(rnd, {c: _train(t.params, optima[labels[c]], 0.5) for c, t in tasks.items()})
    return strat, optima, labels


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_models_specialise_to_planted_groups(seed):
    strat, optima, labels = _planted_run(seed, init_noise=0.01)
    choices = np.array([strat.choice(c) for c in range(len(labels))])
    per_group = [set(choices[labels == g]) for g in range(3)]
    assert all(len(s) == 1 for s in per_group), f"a group is split over models: {per_group}"
    assert len(set.union(*per_group)) == 3, f"groups share a model: {per_group}"
    for g in range(3):  # the model a group chose sits at that group's optimum
        k = per_group[g].pop()
        assert (strat.models[k] - optima[g]).norm() < 0.05
        torch.testing.assert_close(strat.model_for(int(np.flatnonzero(labels == g)[0])), strat.models[k])
    assert sorted(map(sorted, strat.diagnostics()["clusters"])) == sorted(
        sorted(np.flatnonzero(labels == g).tolist()) for g in range(3)
    )


def test_identical_start_with_deterministic_clients_never_specialises():
    strat, _, _ = _planted_run(0, init_noise=0.0, rounds=5)
    assert torch.equal(strat.models[0], strat.models[1]) and torch.equal(strat.models[1], strat.models[2])


def test_choice_defaults_to_model_zero_and_follows_latest_losses():
    strat = FedFew(n_models=2, mu=0.1)
    _setup(strat, 3, 4)
    assert [strat.choice(c) for c in range(3)] == [0, 0, 0]
    tasks = strat.configure(1, [0, 1])
    assert all(t.train_all and t.report_losses and t.params.shape == (2, 4) for t in tasks.values())
    models = strat.models.clone()
    reports = {0: torch.tensor([0.5, 0.1]), 1: torch.tensor([0.2, 0.9])}
    strat.aggregate(1, {c: FitResult(models, 1, losses=losses) for c, losses in reports.items()})
    assert [strat.choice(c) for c in range(3)] == [1, 0, 0]
    strat.aggregate(2, {0: FitResult(strat.models.clone(), 1, losses=torch.tensor([0.05, 0.1]))})
    assert [strat.choice(c) for c in range(3)] == [0, 0, 0]
    assert strat.model_id(0) == 0
    trained = torch.arange(8.0).reshape(2, 4)
    assert torch.equal(strat.finetuned_model(0, FitResult(trained, 1, losses=torch.tensor([0.3, 0.2]))), trained[1])


def test_registered_with_paper_defaults():
    strat = make_strategy("fedfew")
    assert isinstance(strat, FedFew)
    assert (strat.n_models, strat.mu, strat.server_lr, strat.init_noise) == (3, 0.01, 1.0, 0.01)
    assert strat.equal_budget  # not the paper's: every method takes the same env steps by default


@pytest.mark.parametrize("equal_budget", [True, False])
def test_equal_budget_splits_local_steps_among_the_k_models(equal_budget):
    """An RL client (deep-sea-treasure) fits the default 3-model task: ``equal_budget`` splits its env steps.

    With the equal budget it takes the env steps of a one-model client (80 per model), else 3 times
    as many; either way its exploration clock advances by one round, as a one-model client's.
    """
    base = envs.get_spec("deep-sea-treasure")
    spec = dataclasses.replace(base, env_kwargs={}, agent_kwargs={**base.agent_kwargs, "learning_starts": 50})
    steps, w = 240, np.array([0.5, 0.5])  # 240 // 3 = 80: whole DQN rollouts of train_freq 4
    client, single = (RLClient(0, spec, w, seed=0, local_steps=steps, rounds=4) for _ in range(2))
    strategy = make_strategy("fedfew", equal_budget=equal_budget)
    strategy.setup(3, client.initial_params(), client.layout, np.random.default_rng(0))
    task = dataclasses.replace(strategy.configure(1, [0])[0], round=1)
    assert task.split_budget is equal_budget
    result = client.fit(task)
    per_client = steps if equal_budget else 3 * steps
    assert result.steps_spent == result.num_samples == client.agent.num_timesteps == per_client
    # the losses of the 3 received models were measured by evaluation episodes: their env steps
    # are counted apart from the training's (which they do not touch)
    episodes = [client.evaluate(task.params[k], derive_seed(0, "loss", 0, 1, k)).env_steps for k in range(3)]
    assert result.loss_steps_spent == sum(episodes) and all(e >= 1 for e in episodes)
    single.fit(FitTask(params=task.params[0], round=1))
    assert client.agent.exploration_rate == pytest.approx(single.agent.exploration_rate)
    with pytest.raises(ValueError, match="split_budget must be true or false"):
        client.fit(dataclasses.replace(task, split_budget="yes"))
    with pytest.raises(ValueError, match="equal_budget must be true or false"):
        FedFew(equal_budget="yes")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_models": 0}, r"n_models \(K\) must be >= 1, got 0"),
        ({"mu": 0.0}, r"mu must be > 0, got 0.0"),
        ({"mu": -1.0}, r"mu must be > 0, got -1.0"),
        ({"server_lr": 0.0}, r"server_lr \(eta_s\) must be > 0"),
        ({"init_noise": -0.1}, r"init_noise must be >= 0"),
    ],
)
def test_invalid_hyper_parameters_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedFew(**kwargs)


def test_more_models_than_clients_rejected():
    with pytest.raises(ValueError, match=r"n_models \(K\) must be <= the number of clients \(2\), got 3"):
        _setup(FedFew(n_models=3), 2, 4)


def test_malformed_results_rejected():
    strat = FedFew(n_models=2)
    _setup(strat, 2, 3)
    with pytest.raises(ValueError, match=r"must return \[K, d\]"):
        strat.aggregate(1, {0: FitResult(torch.zeros(3), 1, losses=torch.zeros(2))})


def test_state_dict_round_trip():
    strat, _, labels = _planted_run(5, init_noise=0.01, rounds=3)
    saved = state_to_bytes(strat.state_dict())  # as a checkpoint holds it: data only
    restored = FedFew(n_models=3)
    _setup(restored, len(labels), 12, seed=99)
    restored.load_state_dict(state_from_bytes(saved))
    assert torch.equal(restored.models, strat.models)
    assert [restored.choice(c) for c in range(len(labels))] == [strat.choice(c) for c in range(len(labels))]
    assert restored.rng.bit_generator.state == strat.rng.bit_generator.state
    results = {c: _train(t.params, torch.ones(12), 0.3) for c, t in strat.configure(4, range(len(labels))).items()}
    strat.aggregate(4, results)
    restored.aggregate(4, results)
    assert torch.equal(restored.models, strat.models)
