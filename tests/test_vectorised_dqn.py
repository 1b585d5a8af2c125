"""StackedDQN against stable-baselines3: one batched gradient step equals every client's own ``DQN.train``.

It equals ``DQN.train`` of every client's own SB3 agent on the same minibatch and parameters (Adam
moments, masks, gradient clipping, the proximal term), the target update follows ``DQN._on_step``, a
NaN stays in its client, and the flat layout is the SB3 client's. The gradient step is also checked
on CUDA where a GPU is present (skipped otherwise).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from morlfed import envs
from morlfed.core.proximal import install_proximal
from morlfed.tasks.rl.client import RLClient
from morlfed.tasks.rl.vectorised.ddpg import StackedDDPG
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.learner import Batch
from morlfed.tasks.rl.vectorised.rollout import flushed_denormals
from morlfed.tasks.rl.vectorised.template import template_agent

N, B, SEED = 3, 32, 0
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


def make_spec(**agent_kwargs: object) -> envs.EnvSpec:
    base = envs.get_spec("deep-sea-treasure")
    return dataclasses.replace(base, agent_kwargs={**base.agent_kwargs, **agent_kwargs})


def sb3_agent(spec: envs.EnvSpec) -> DQN:
    env = envs.make_train_env(spec, [0.5, 0.5], seed=None)
    agent = DQN("MlpPolicy", env, device="cpu", **spec.sb3_kwargs)
    agent.set_logger(Logger(folder=None, output_formats=[]))
    return agent


def load_sb3(agent: DQN, learner: StackedDQN, online: torch.Tensor, target: torch.Tensor) -> None:
    for module, flat in ((agent.q_net, online), (agent.q_net_target, target)):
        named = learner.layout.unflatten(flat)
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.copy_(named[f"q_net.{name}"])


def read_sb3(agent: DQN, learner: StackedDQN) -> torch.Tensor:
    return learner.layout.flatten({f"q_net.{k}": p for k, p in agent.q_net.named_parameters()})


def random_batch(gen: torch.Generator) -> Batch:
    return Batch(
        observations=torch.rand(N, B, 2, generator=gen),
        actions=torch.randint(4, (N, B, 1), generator=gen),
        next_observations=torch.rand(N, B, 2, generator=gen),
        dones=(torch.rand(N, B, 1, generator=gen) < 0.3).float(),
        rewards=torch.randn(N, B, 1, generator=gen) * 5,
    )


def feed(agent: DQN, batch: Batch, i: int) -> None:
    """Make the SB3 agent's next replay samples client ``i``'s slice of ``batch``."""
    samples = ReplayBufferSamples(
        batch.observations[i], batch.actions[i], batch.next_observations[i], batch.dones[i], batch.rewards[i]
    )
    agent.replay_buffer.sample = lambda batch_size, env=None: samples  # type: ignore[union-attr, method-assign]


def on(batch: Batch, device: str) -> Batch:
    """``batch`` with every tensor on ``device`` (the engine samples its batches where its replay lives)."""
    return Batch(*(getattr(batch, f.name).to(device) for f in dataclasses.fields(Batch)))


def setup(spec: envs.EnvSpec, device: str = "cpu") -> tuple[StackedDQN, list[DQN], torch.Generator]:
    """A learner on ``device`` and N SB3 agents (on the CPU) holding the same networks.

    Each agent holds the same client-specific online and target networks as its client of the
    learner.
    """
    gen = torch.Generator().manual_seed(1)
    learner = StackedDQN(N, template_agent(spec, envs.make_train_env(spec, [0.5, 0.5], None), SEED), device)
    agents = []
    for i in range(N):
        online = learner.read(i) + 0.3 * torch.randn(learner.layout.dim, generator=gen)
        target = online + 0.3 * torch.randn(learner.layout.dim, generator=gen)
        learner.load(i, online)
        learner.target[i] = target
        agent = sb3_agent(spec)
        load_sb3(agent, learner, online, target)
        agents.append(agent)
    return learner, agents, gen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "max_grad_norm, activation", [(10.0, torch.nn.ReLU), (0.05, torch.nn.ReLU), (10.0, torch.nn.Tanh)]
)
def test_gradient_steps_equal_sb3_train_per_client(max_grad_norm: float, activation: type, device: str) -> None:
    policy_kwargs = {"net_arch": [64, 64], "activation_fn": activation}
    learner, agents, gen = setup(make_spec(max_grad_norm=max_grad_norm, policy_kwargs=policy_kwargs), device)
    no_prox, centre = torch.zeros(N, device=device), torch.zeros(N, learner.layout.dim, device=device)
    masks = [torch.ones(N, dtype=torch.bool), torch.tensor([True, False, True]), torch.ones(N, dtype=torch.bool)]
    for mask in masks:
        batch = random_batch(gen)
        before = [learner.read(i) for i in range(N)]
        losses = learner.gradient_step(on(batch, device), mask, no_prox, centre)["loss"]  # mask: CPU, as the engine
        for i, agent in enumerate(agents):
            if not mask[i]:
                assert torch.equal(learner.read(i), before[i])  # untouched, exactly
                continue
            feed(agent, batch, i)
            agent.train(gradient_steps=1, batch_size=B)
            torch.testing.assert_close(learner.read(i), read_sb3(agent, learner), rtol=1e-5, atol=1e-6)
            assert losses[i].item() == pytest.approx(agent.logger.name_to_value["train/loss"], rel=1e-5)
        if max_grad_norm < 1:  # clipping was active: every client's applied gradient has norm max_grad_norm
            norms = torch.linalg.vector_norm(learner.online.grad, dim=1).cpu()
            torch.testing.assert_close(norms, torch.full((N,), max_grad_norm), rtol=1e-4, atol=0)
    assert learner.optimiser.step_count.tolist() == [3.0, 2.0, 3.0]


def test_proximal_term_is_added_after_clipping_like_the_sb3_client() -> None:
    learner, agents, gen = setup(make_spec(max_grad_norm=0.05))
    mu = torch.tensor([0.5, 0.0, 2.0])
    centre = torch.stack([learner.read(i) + torch.randn(learner.layout.dim, generator=gen) for i in range(N)])
    for _ in range(2):
        batch = random_batch(gen)
        learner.gradient_step(batch, torch.ones(N, dtype=torch.bool), mu, centre)
        for i, agent in enumerate(agents):
            feed(agent, batch, i)
            named = learner.layout.unflatten(centre[i])
            centres: dict[torch.Tensor, torch.Tensor] = {
                p: named[f"q_net.{k}"] for k, p in agent.q_net.named_parameters()
            }
            if mu[i] > 0:
                with install_proximal(agent.policy, "optimizer", centres, float(mu[i])):
                    agent.train(gradient_steps=1, batch_size=B)
            else:
                agent.train(gradient_steps=1, batch_size=B)
            torch.testing.assert_close(learner.read(i), read_sb3(agent, learner), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tau", [1.0, 0.3])
def test_target_update_follows_sb3_on_step(tau: float) -> None:
    learner, agents, _ = setup(make_spec(target_update_interval=3, tau=tau))
    n_calls = torch.zeros(N, dtype=torch.int64)
    steps = torch.tensor([True, True, False])  # client 2 never steps
    for _ in range(7):
        n_calls += steps
        learner.after_env_step(n_calls, steps)
        for i in range(N):
            if steps[i]:
                agents[i]._on_step()
    for i, agent in enumerate(agents):
        target = learner.layout.flatten({f"q_net.{k}": p for k, p in agent.q_net_target.named_parameters()})
        torch.testing.assert_close(learner.target[i], target, rtol=0, atol=1e-7)
    assert agents[0]._n_calls == 7 and not torch.equal(learner.target[2], learner.online[2])
    if tau == 1.0:
        assert torch.equal(learner.target[0], learner.online[0])


def test_greedy_actions_are_each_clients_sb3_argmax() -> None:
    learner, agents, gen = setup(make_spec())
    observations = torch.rand(N, 2, generator=gen)
    numpy_path = learner.act(observations)
    learner._online_numpy = None  # the torch path (the one used on a GPU)
    torch_path = learner.act(observations)
    for i, agent in enumerate(agents):
        want = agent.q_net(observations[i : i + 1]).argmax(dim=1)
        assert numpy_path[i] == torch_path[i] == want


def test_a_nan_in_one_client_leaves_the_others_updates_identical() -> None:
    spec = make_spec(target_update_interval=1)
    clean, _, gen = setup(spec)
    poisoned, _, _ = setup(spec)
    bad = poisoned.read(1)
    bad[5] = float("nan")
    poisoned.load(1, bad)
    no_prox, centre = torch.zeros(N), torch.zeros(N, clean.layout.dim)
    for _ in range(3):
        batch = random_batch(gen)
        everyone = torch.ones(N, dtype=torch.bool)
        for learner in (clean, poisoned):
            learner.gradient_step(batch, everyone, no_prox, centre)
            learner.after_env_step(torch.ones(N, dtype=torch.int64), everyone)
    for i in (0, 2):
        assert torch.equal(poisoned.read(i), clean.read(i))
        assert torch.equal(poisoned.target[i], clean.target[i])
    assert not torch.isfinite(poisoned.read(1)).all()


def test_flushing_denormals_changes_nothing_above_denormal_scale() -> None:
    learner, _, gen = setup(make_spec())
    other, _, _ = setup(make_spec())
    no_prox, centre = torch.zeros(N), torch.zeros(N, learner.layout.dim)
    for _ in range(3):
        batch = random_batch(gen)
        learner.gradient_step(batch, torch.ones(N, dtype=torch.bool), no_prox, centre)
        with flushed_denormals():
            other.gradient_step(batch, torch.ones(N, dtype=torch.bool), no_prox, centre)
    torch.testing.assert_close(other.online, learner.online, rtol=0, atol=1e-30)
    assert float(torch.tensor(1e-39) * 2.0) != 0.0  # the mode is restored


def test_flushing_is_turned_off_when_interrupted_as_it_is_turned_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # a client's timeout (SIGALRM) that strikes just as the mode was set: the later clients of the
    # process must not inherit it
    real = torch.set_flush_denormal

    def interrupted(mode: bool) -> bool:
        done = real(mode)
        if mode:
            raise KeyboardInterrupt("timeout")
        return done

    monkeypatch.setattr(torch, "set_flush_denormal", interrupted)
    with pytest.raises(KeyboardInterrupt), flushed_denormals():
        pass
    assert float(torch.tensor(1e-39) * 2.0) != 0.0


def test_layout_and_initial_model_are_the_sb3_clients() -> None:
    spec = make_spec()
    prefs = np.array([[0.2, 0.8], [0.7, 0.3]])
    reference = RLClient(1, spec, prefs[1], seed=SEED, local_steps=100, rounds=10)
    engine = VectorisedClients([0, 1], spec, prefs, seed=SEED, local_steps=100, rounds=10)
    assert engine.layout == reference.layout
    assert engine.layout.names == [f"q_net.q_net.{k}.{p}" for k in (0, 2, 4) for p in ("weight", "bias")]
    assert engine.layout.head == ("q_net.q_net.4.weight", "q_net.q_net.4.bias")
    assert torch.equal(engine.initial_params(), reference.initial_params())
    for i in range(2):
        assert torch.equal(engine.learner.read(i), reference.initial_params())


def test_unsupported_architectures_are_refused() -> None:
    spec = make_spec(policy_kwargs={"net_arch": [8], "activation_fn": torch.nn.ELU})
    with pytest.raises(ValueError, match="ELU"):
        StackedDQN(2, template_agent(spec, envs.make_train_env(spec, [0.5, 0.5], None), SEED))


def test_a_learner_refuses_another_algorithms_agent() -> None:
    spec = make_spec()
    dqn = template_agent(spec, envs.make_train_env(spec, [0.5, 0.5], None), SEED)
    with pytest.raises(TypeError, match="StackedDDPG mirrors an SB3 DDPG, got DQN"):
        StackedDDPG(2, dqn)
