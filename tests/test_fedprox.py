"""FedProx: the proximal optimiser wrapper, the strategy, and the RL client's proximal term."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
import torch

from morlfed import envs
from morlfed.baselines.fedavg import FedAvg
from morlfed.baselines.fedprox import FedProx
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitTask
from morlfed.core.proximal import ProximalOptimizer, install_proximal
from morlfed.strategies.base import make_strategy
from morlfed.tasks.rl.client import RLClient

STEPS = 300


@pytest.fixture(scope="module")
def spec() -> envs.EnvSpec:
    base = envs.get_spec("deep-sea-treasure")
    return dataclasses.replace(base, agent_kwargs={**base.agent_kwargs, "learning_starts": 50})


def make_client(spec: envs.EnvSpec) -> RLClient:
    return RLClient(0, spec, np.array([0.8, 0.2]), seed=3, local_steps=STEPS, rounds=2)


class Holder:
    """Something that owns an optimiser, like an SB3 policy."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer


def toy() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.randn(2, 3, generator=gen))
        model.bias.copy_(torch.randn(2, generator=gen))
    return model, torch.randn(2, 3, generator=gen), torch.randn(2, generator=gen)


def test_wrapper_adds_mu_times_distance_to_the_gradient_and_is_removed() -> None:
    model, c_w, c_b = toy()
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    holder = Holder(sgd)
    mu = 0.3
    x = torch.tensor([[1.0, -2.0, 0.5]])
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    with install_proximal(holder, "optimizer", {model.weight: c_w, model.bias: c_b}, mu) as wrapper:
        assert holder.optimizer is wrapper and isinstance(wrapper, ProximalOptimizer)
        holder.optimizer.zero_grad()
        model(x).sum().backward()
        assert model.weight.grad is not None and model.bias.grad is not None
        g_w, g_b = model.weight.grad.clone(), model.bias.grad.clone()
        holder.optimizer.step()
    assert holder.optimizer is sgd  # the very same object is back
    expected_w = g_w + mu * (w0 - c_w)
    assert torch.allclose(model.weight.grad, expected_w, atol=1e-6)
    assert torch.allclose(model.bias.grad, g_b + mu * (b0 - c_b), atol=1e-6)
    # SGD with lr = 1: theta' = theta - (grad + mu (theta - centre))
    assert torch.allclose(model.weight.detach(), w0 - expected_w, atol=1e-6)


def test_wrapper_pulls_parameters_without_gradient_and_delegates_lr() -> None:
    model, c_w, c_b = toy()
    wrapper = ProximalOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), {model.weight: c_w, model.bias: c_b}, 0.5)
    for group in wrapper.param_groups:  # what SB3's update_learning_rate does
        group["lr"] = 0.1
    assert wrapper.optimizer.param_groups[0]["lr"] == 0.1
    w0 = model.weight.detach().clone()
    wrapper.zero_grad()
    wrapper.step()  # no backward: the proximal term alone
    assert torch.allclose(model.weight.detach(), w0 - 0.1 * 0.5 * (w0 - c_w), atol=1e-6)


def test_wrapper_restores_on_error_and_rejects_bad_input() -> None:
    model, c_w, c_b = toy()
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    holder = Holder(sgd)
    with (
        pytest.raises(RuntimeError, match="boom"),
        install_proximal(holder, "optimizer", {model.weight: c_w, model.bias: c_b}, 1.0),
    ):
        raise RuntimeError("boom")
    assert holder.optimizer is sgd
    with pytest.raises(ValueError, match="no proximal centre"):
        ProximalOptimizer(sgd, {model.weight: c_w}, 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        ProximalOptimizer(sgd, {model.weight: c_w, model.bias: c_b}, -1.0)
    with pytest.raises(ValueError, match="shape"):
        ProximalOptimizer(sgd, {model.weight: c_w, model.bias: c_w}, 1.0)
    centres = {model.weight: c_w, model.bias: c_b}
    with (
        install_proximal(holder, "optimizer", centres, 1.0),
        pytest.raises(ValueError, match="already"),
        install_proximal(holder, "optimizer", centres, 1.0),
    ):
        pass


def test_strategy_config_and_validation() -> None:
    strategy = make_strategy("fedprox")
    assert isinstance(strategy, FedProx) and strategy.mu == 0.01
    other = make_strategy("fedprox", mu=0.5)
    assert isinstance(other, FedProx) and other.mu == 0.5
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="fedprox: mu"):
            FedProx(mu=bad)
    layout = ParamLayout.from_shapes({"w": (3,)})
    strategy.setup(2, torch.tensor([1.0, 2.0, 3.0]), layout, np.random.default_rng(0))
    tasks = strategy.configure(1, [0, 1])
    for task in tasks.values():
        assert task.prox_mu == 0.01
        assert task.prox_centre is not None
        assert torch.equal(task.prox_centre, strategy.global_model) and torch.equal(task.params, strategy.global_model)
    assert tasks[0].prox_centre is not tasks[1].prox_centre  # no aliasing between clients


def test_mu_zero_client_equals_fedavg_client(spec: envs.EnvSpec) -> None:
    rng = np.random.default_rng(0)
    prox_client, avg_client = make_client(spec), make_client(spec)
    init, layout = prox_client.initial_params(), prox_client.layout
    prox, avg = FedProx(mu=0.0), FedAvg()
    prox.setup(1, init, layout, rng)
    avg.setup(1, init, layout, rng)
    for rnd in (1, 2):  # the second round starts from kept buffer and optimiser state
        t_prox = replace(prox.configure(rnd, [0])[0], round=rnd)
        t_avg = replace(avg.configure(rnd, [0])[0], round=rnd)
        r_prox, r_avg = prox_client.fit(t_prox), avg_client.fit(t_avg)
        assert torch.equal(r_prox.params, r_avg.params)
        assert not torch.equal(r_prox.params, t_prox.params)  # it did train
        prox.aggregate(rnd, {0: r_prox})
        avg.aggregate(rnd, {0: r_avg})


def test_huge_mu_keeps_the_client_at_the_centre(spec: envs.EnvSpec) -> None:
    free, held = make_client(spec), make_client(spec)
    start = free.initial_params()
    strategy = FedProx(mu=0.0)
    strategy.setup(1, start, free.layout, np.random.default_rng(0))
    free_task = replace(strategy.configure(1, [0])[0], round=1)
    held_task = replace(free_task, prox_mu=1e4)
    drift_free = (free.fit(free_task).params - start).norm()
    drift_held = (held.fit(held_task).params - start).norm()
    assert drift_free > 0.1
    assert drift_held < 0.02 * drift_free
    # the SB3 optimiser object is the original again after the fit
    assert type(held.agent.policy.optimizer) is torch.optim.Adam


def test_centre_other_than_start_pulls_towards_it(spec: envs.EnvSpec) -> None:
    client = make_client(spec)
    start = client.initial_params()
    centre = start + 0.05 * torch.sign(torch.randn(start.shape, generator=torch.Generator().manual_seed(1)))
    t = FitTask(params=start, round=1, prox_mu=1e4, prox_centre=centre)
    trained = client.fit(t).params
    assert (trained - centre).norm() < 0.5 * (start - centre).norm()
