"""StackedDDPG against SB3's own DDPG: one gradient step equals ``DDPG.train`` client by client.

One gradient step on a fixed minibatch equals ``DDPG.train(gradient_steps=1)`` client by client
(actor, critic, both targets, Adam moments, the losses), with masked clients untouched, with
FedProx's proximal wrapper installed as the SB3 client installs it, and on the GPU when there is
one; the flat layout and shared initial vector are the SB3 client's; a NaN in one client's batch
stays there, in float32 and in bfloat16; the exploration helpers are SB3's ``_sample_action``.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import DDPG
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from morlfed import envs
from morlfed.core.params import ParamLayout
from morlfed.core.proximal import install_proximal
from morlfed.envs import make_train_env
from morlfed.tasks.rl.client import RLClient
from morlfed.tasks.rl.vectorised.ddpg import (
    StackedDDPG,
    explore_actions,
    scale_action,
    unscale_action,
)
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.learner import Batch
from morlfed.tasks.rl.vectorised.template import template_agent

N, B, SEED = 3, 16, 7
WEIGHTS = np.full(4, 0.25)
NETWORKS = ("actor", "actor_target", "critic", "critic_target")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


@pytest.fixture(scope="module")
def spec() -> envs.EnvSpec:
    base = envs.get_spec("mo-lunar-lander-continuous")
    small = {"buffer_size": 1000, "batch_size": B, "policy_kwargs": {"net_arch": [32, 32]}}
    return base.replace(agent_kwargs={**base.agent_kwargs, **small})


@pytest.fixture(scope="module")
def env(spec: envs.EnvSpec) -> gym.Env:
    return make_train_env(spec, WEIGHTS, seed=None)


def make_batch(seed: int, obs_dim: int = 8, act_dim: int = 2) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        observations=torch.randn(N, B, obs_dim, generator=g),
        actions=torch.rand(N, B, act_dim, generator=g) * 2 - 1,
        next_observations=torch.randn(N, B, obs_dim, generator=g),
        dones=(torch.rand(N, B, 1, generator=g) < 0.25).float(),
        rewards=torch.randn(N, B, 1, generator=g),
    )


def sb3_state(agent: DDPG) -> dict[str, torch.Tensor]:
    return {f"{net}.{k}": p.detach().cpu() for net in NETWORKS for k, p in getattr(agent, net).named_parameters()}


def stacked_state(learner: StackedDDPG, i: int) -> dict[str, torch.Tensor]:
    return {f"{net}.{k}": p[i].detach().cpu() for net in NETWORKS for k, p in learner.params(net).items()}


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=f"{what} {name}")


def ddpg_template(spec: envs.EnvSpec, env: gym.Env) -> DDPG:
    """The vectorised engine's template agent for ``spec``, a DDPG."""
    agent = template_agent(spec, env, SEED)
    assert isinstance(agent, DDPG)
    return agent


def distinct_clients(spec: envs.EnvSpec, env: gym.Env, device: str) -> tuple[StackedDDPG, list[DDPG]]:
    """A learner and N SB3 agents whose client i has the same online and target networks.

    The networks are all different from each other, and the optimisers are a fresh Adam.
    """
    agents = [ddpg_template(spec, env) for _ in range(N)]
    learner = StackedDDPG(N, ddpg_template(spec, env), device)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for i, agent in enumerate(agents):
            for net in NETWORKS:
                flat = getattr(learner, net)
                flat[i] += 0.1 * torch.randn(flat.shape[1], generator=g).to(flat.device)
                for k, p in getattr(agent, net).named_parameters():
                    p.copy_(learner.params(net)[k][i].cpu())
    return learner, agents


def sb3_step(
    agent: DDPG,
    batch: Batch,
    i: int,
    mu: float,
    centre: torch.Tensor,
    layout: ParamLayout,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``agent.train(gradient_steps=1)`` on client ``i``'s slice of ``batch``.

    The proximal wrapper is on both optimisers when ``mu > 0`` (as ``RLClient._proximal`` installs
    it).
    """
    samples = ReplayBufferSamples(*(getattr(batch, f)[i] for f in ReplayBufferSamples._fields[:5]))
    monkeypatch.setattr(agent.replay_buffer, "sample", lambda batch_size, env=None: samples)
    with contextlib.ExitStack() as stack:
        if mu > 0:
            named = layout.unflatten(centre)
            online = {f"{net}.{k}": p for net in ("actor", "critic") for k, p in getattr(agent, net).named_parameters()}
            centres = {p: named[name] for name, p in online.items()}
            for owner in (agent.actor, agent.critic):
                stack.enter_context(install_proximal(owner, "optimizer", centres, mu))
        with torch.random.fork_rng(devices=[]):  # SB3 draws its (zero) target noise from the global RNG
            agent.train(gradient_steps=1, batch_size=B)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mus", [(0.0, 0.0, 0.0), (0.5, 0.0, 2.0)], ids=["plain", "fedprox"])
def test_gradient_steps_equal_sb3_train(
    spec: envs.EnvSpec, env: gym.Env, device: str, mus: tuple[float, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    learner, agents = distinct_clients(spec, env, device)
    layout = learner.layout
    centre = torch.stack([learner.read(i) + 0.05 for i in range(N)])
    prox_mu = torch.tensor(mus)
    for step, mask in enumerate(([True] * N, [True, False, True], [True] * N)):
        batch = make_batch(step)
        before = stacked_state(learner, 1)
        adam_before = learner.optimiser_state(1)
        losses = learner.gradient_step(batch, torch.tensor(mask), prox_mu, centre)
        for i, agent in enumerate(agents):
            if mask[i]:
                sb3_step(agent, batch, i, mus[i], centre[i], layout, monkeypatch)
                logged = agent.logger.name_to_value
                for name in ("actor_loss", "critic_loss"):
                    assert losses[name][i].item() == pytest.approx(logged[f"train/{name}"], rel=1e-5, abs=1e-6)
            assert_close(stacked_state(learner, i), sb3_state(agent), f"step {step} client {i}")
        if not mask[1]:
            assert all(torch.equal(v, before[k]) for k, v in stacked_state(learner, 1).items())
            after = learner.optimiser_state(1)
            assert after["actor"]["step"] == adam_before["actor"]["step"] == 1.0
            for net in ("actor", "critic"):
                for key in ("exp_avg", "exp_avg_sq"):
                    assert all(torch.equal(v, adam_before[net][key][k]) for k, v in after[net][key].items())
    assert learner.optimiser_state(0)["critic"]["step"] == 3.0
    assert learner.optimiser_state(1)["critic"]["step"] == 2.0


def test_layout_and_initial_vector_are_the_sb3_clients(spec: envs.EnvSpec, env: gym.Env) -> None:
    client = RLClient(0, spec, WEIGHTS, seed=SEED, local_steps=100, rounds=10)
    learner = StackedDDPG(N, ddpg_template(spec, env))
    assert learner.layout == client.layout
    assert learner.layout.names[0] == "actor.mu.0.weight" and "critic.qf0.0.weight" in learner.layout.names
    assert [layer.shape for layer in learner.layout.layers] == [layer.shape for layer in client.layout.layers]
    for i in range(N):
        assert torch.equal(learner.read(i), client.initial_params())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_nan_in_one_client_stays_there(spec: envs.EnvSpec, env: gym.Env, precision: str) -> None:
    runs = []
    for poison in (False, True):
        learner = StackedDDPG(N, ddpg_template(spec, env), precision=precision)
        centre = torch.stack([learner.read(0) - 0.1] * N)
        for step in range(2):
            batch = make_batch(step)
            if poison:
                batch.rewards[0, 3] = float("nan")
            losses = learner.gradient_step(batch, torch.ones(N, dtype=torch.bool), torch.tensor([0.5, 0.5, 0]), centre)
        runs.append((learner, losses))
    (clean, clean_losses), (poisoned, poisoned_losses) = runs
    assert torch.isnan(poisoned.critic[0]).all() and torch.isnan(poisoned.actor[0]).all()
    for i in (1, 2):
        assert all(torch.equal(v, stacked_state(clean, i)[k]) for k, v in stacked_state(poisoned, i).items())
        for name in ("actor_loss", "critic_loss"):
            assert torch.equal(poisoned_losses[name][i], clean_losses[name][i])
        for net, state in poisoned.optimiser_state(i).items():
            reference = clean.optimiser_state(i)[net]
            for key in ("exp_avg", "exp_avg_sq"):
                assert all(torch.equal(v, reference[key][k]) for k, v in state[key].items())


def pendulum_agent(net_arch: list[int]) -> DDPG:
    """A DDPG on Pendulum-v1: one action, so the actor's last layer has a single output."""
    with torch.random.fork_rng(devices=[]):  # SB3 initialises an unseeded agent from the global RNG
        torch.manual_seed(0)
        return DDPG("MlpPolicy", "Pendulum-v1", policy_kwargs={"net_arch": net_arch}, device="cpu")


@pytest.mark.parametrize("case", ["lunar-32-32", "lunar-17-5", "lunar-400-300", "pendulum-8"])
def test_a_clients_step_does_not_depend_on_its_batch(spec: envs.EnvSpec, env: gym.Env, case: str) -> None:
    """Client 2 trained with two other clients (every mask) equals client 2 trained alone, bit for bit.

    Networks, targets, Adam moments, losses and actions.
    """
    if case == "pendulum-8":
        agents = [pendulum_agent([8]) for _ in range(2)]
        dims = {"obs_dim": 3, "act_dim": 1}
    else:
        arch = {"policy_kwargs": {"net_arch": [int(h) for h in case.split("-")[1:]]}}
        other = spec.replace(agent_kwargs={**spec.agent_kwargs, **arch})
        agents = [ddpg_template(other, env) for _ in range(2)]
        dims = {}
    together, alone = StackedDDPG(N, agents[0]), StackedDDPG(1, agents[1])
    centre = torch.stack([together.read(0) - 0.1] * N)
    for step, mask in enumerate(([True] * N, [True, False, True], [False, False, True], [False, True, True])):
        batch = make_batch(step, **dims)
        mu = torch.tensor([0.0, 0.5, 0.5])
        got = together.gradient_step(batch, torch.tensor(mask), mu, centre)
        one = Batch(
            *(getattr(batch, f)[2:] for f in ("observations", "actions", "next_observations", "dones", "rewards"))
        )
        want = alone.gradient_step(one, torch.ones(1, dtype=torch.bool), mu[2:], centre[2:])
        assert all(torch.equal(got[k][2:], want[k]) for k in want)
        assert all(torch.equal(v, stacked_state(alone, 0)[k]) for k, v in stacked_state(together, 2).items())
        for net, state in together.optimiser_state(2).items():
            reference = alone.optimiser_state(0)[net]
            for key in ("exp_avg", "exp_avg_sq"):
                assert all(torch.equal(v, reference[key][k]) for k, v in state[key].items())
    obs = make_batch(9, **dims).observations[:, 0]
    assert torch.equal(together.act(obs)[2], alone.act(obs[2:])[0])


def test_load_read_act_and_optimiser_state(spec: envs.EnvSpec, env: gym.Env) -> None:
    agent = ddpg_template(spec, env)
    learner = StackedDDPG(N, agent)
    vector = learner.read(0) + torch.randn(learner.layout.dim, generator=torch.Generator().manual_seed(3))
    learner.load(2, vector)
    assert torch.equal(learner.read(2), vector)
    assert torch.equal(torch.cat([learner.actor_target[2], learner.critic_target[2]]), vector)
    obs = torch.randn(N, 8, generator=torch.Generator().manual_seed(4))
    actions = learner.act(obs)
    assert actions.shape == (N, 2) and bool((actions.abs() <= 1).all())
    with torch.no_grad():
        torch.testing.assert_close(actions[:2], agent.actor(obs[:2]))
    learner.gradient_step(
        make_batch(0), torch.ones(N, dtype=torch.bool), torch.zeros(N), torch.zeros(N, learner.layout.dim)
    )
    saved = learner.optimiser_state(1)
    learner.load_optimiser_state(0, saved)
    assert learner.optimiser_state(0)["actor"]["step"] == 1.0
    learner.load_optimiser_state(1, None)
    fresh = learner.optimiser_state(1)
    assert fresh["critic"]["step"] == 0.0 and all(not v.any() for v in fresh["critic"]["exp_avg"].values())


def test_action_helpers_are_sb3s() -> None:
    box = spaces.Box(low=np.array([-2.0, 0.0], dtype=np.float32), high=np.array([3.0, 1.0], dtype=np.float32))
    fake_policy = SimpleNamespace(action_space=box)
    a = np.array([[-1.0, 0.25], [2.5, 1.0]], dtype=np.float32)
    sb3_scale, sb3_unscale = BasePolicy.scale_action, BasePolicy.unscale_action  # read only .action_space
    assert np.array_equal(scale_action(a, box.low, box.high), sb3_scale(fake_policy, a))  # type: ignore[arg-type]
    unscaled = sb3_unscale(fake_policy, a / 3)  # type: ignore[arg-type]
    assert np.array_equal(unscale_action(a / 3, box.low, box.high), unscaled)
    # SB3's _sample_action after the warm-up, with a pinned exploration noise (Pendulum: bounds +-2)
    with torch.random.fork_rng(devices=[]):  # SB3 initialises an unseeded agent from the global RNG
        agent = DDPG("MlpPolicy", "Pendulum-v1", learning_starts=0, policy_kwargs={"net_arch": [8]}, device="cpu")
    learner = StackedDDPG(1, agent)
    obs = np.array([[0.6, -0.8, 0.3]], dtype=np.float32)
    noise = np.array([0.7])
    agent._last_obs = obs
    env_action, buffer_action = agent._sample_action(0, lambda: noise, n_envs=1)  # type: ignore[arg-type]
    assert isinstance(agent.action_space, spaces.Box)
    low, high = agent.action_space.low, agent.action_space.high
    mine = explore_actions(unscale_action(learner.act(torch.from_numpy(obs)).numpy(), low, high), noise, low, high)
    np.testing.assert_allclose(mine[0], env_action, rtol=1e-6)
    np.testing.assert_allclose(mine[1], buffer_action, rtol=1e-6)


def test_a_learner_refuses_another_algorithms_agent(spec: envs.EnvSpec, env: gym.Env) -> None:
    with pytest.raises(TypeError, match="StackedDQN mirrors an SB3 DQN, got DDPG"):
        StackedDQN(2, ddpg_template(spec, env))
