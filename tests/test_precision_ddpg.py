"""precision=bf16 with DDPG: the vectorised DDPG's hidden layers in bfloat16 (mixed precision).

A bfloat16 step follows the float32 step; clients stay independent of each other and of their
batch, bit for bit; loaded models reach the next step; a run trains and records its precision. (A
NaN stays in its client in either precision: ``tests/test_vectorised_ddpg.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import CliRunner

from morlfed import envs
from morlfed.tasks.rl.vectorised.ddpg import StackedDDPG
from morlfed.tasks.rl.vectorised.engine import stacked_algorithm
from morlfed.tasks.rl.vectorised.learner import Batch

N, B = 3, 64
NETWORKS = ("actor", "actor_target", "critic", "critic_target")


def _learner(precision: str, n: int = N, net_arch: list[int] | None = None) -> StackedDDPG:
    """The continuous lander's learner (its 400-300 networks unless ``net_arch``)."""
    spec = envs.get_spec("mo-lunar-lander-continuous")
    if net_arch is not None:
        spec = spec.replace(agent_kwargs={**spec.agent_kwargs, "policy_kwargs": {"net_arch": net_arch}})
    learner = stacked_algorithm(spec, n, 0, 1000, "cpu", precision)[1]
    assert isinstance(learner, StackedDDPG)
    return learner


def _batch(seed: int, n: int = N) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        observations=torch.randn(n, B, 8, generator=g),
        actions=torch.rand(n, B, 2, generator=g) * 2 - 1,
        next_observations=torch.randn(n, B, 8, generator=g),
        dones=(torch.rand(n, B, 1, generator=g) < 0.1).float(),
        rewards=torch.randn(n, B, 1, generator=g),
    )


def _state(learner: StackedDDPG, i: int) -> dict[str, torch.Tensor]:
    """Client ``i``'s networks, targets and Adam moments."""
    state = {net: getattr(learner, net)[i].clone() for net in NETWORKS}
    for net, adam in learner.optimiser_state(i).items():
        for key in ("exp_avg", "exp_avg_sq"):
            state |= {f"{net}.{key}.{k}": v for k, v in adam[key].items()}
    return state


def _no_prox(learner: StackedDDPG) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(learner.n), torch.zeros(learner.n, learner.layout.dim)


def test_a_bf16_step_follows_the_fp32_step() -> None:
    """A bfloat16 step from the same parameters and batches computes the float32 step's numbers to a rounding.

    bfloat16 keeps 8 significant bits (a relative rounding of up to 2**-9 per activation and
    weight); over the networks' layers that leaves the gradients a few percent off float32's
    (2-8% in norm, in the same direction: cosine similarity above 0.997 in every client over
    several seeds), hence the bounds below with some margin. The critic's loss is compared
    relatively. The actor's loss, ``-mean Q``, is a mean of Q-values that nearly cancel at
    initialisation (|mean| down to 0.006 where a Q-value is about 0.1), so it is compared
    absolutely: each Q-value is off by about the rounding of the activations that sum to it
    (measured up to 1.7e-3).
    """
    fp32, bf16 = _learner("fp32"), _learner("bf16")
    start = {net: getattr(fp32, net).clone() for net in ("actor", "critic")}
    mask, (mu, centre) = torch.ones(N, dtype=torch.bool), _no_prox(fp32)
    for step in range(3):
        batch = _batch(step)
        loss32, loss16 = fp32.gradient_step(batch, mask, mu, centre), bf16.gradient_step(batch, mask, mu, centre)
        torch.testing.assert_close(loss16["critic_loss"], loss32["critic_loss"], rtol=1e-2, atol=0.0)
        torch.testing.assert_close(loss16["actor_loss"], loss32["actor_loss"], rtol=0.0, atol=5e-3)
        for net in ("actor", "critic") if step == 0 else ():  # the first step's gradients, from equal parameters
            grad32, grad16 = fp32._networks[f"{net}_grad"][0], bf16._networks[f"{net}_grad"][0]
            cosine = torch.nn.functional.cosine_similarity(grad32, grad16, dim=1)
            assert bool((cosine > 0.99).all()), (net, cosine)
    for net in ("actor", "critic"):
        assert getattr(bf16, net).dtype == torch.float32  # the parameters Adam updates stay float32
        moved32, moved16 = getattr(fp32, net) - start[net], getattr(bf16, net) - start[net]
        cosine = torch.nn.functional.cosine_similarity(moved32, moved16, dim=1)
        assert bool((cosine > 0.95).all()), (net, cosine)


@pytest.mark.parametrize("net_arch", [[400, 300], [17, 5]], ids=["lander", "unaligned"])
def test_a_clients_bf16_step_does_not_depend_on_its_batch(net_arch: list[int]) -> None:
    """Client 2 trained beside two others (every mask, FedProx on) equals client 2 trained alone, bit for bit.

    17-5 hidden layers put the clients' bfloat16 blocks off 64-byte boundaries.
    """
    together, alone = _learner("bf16", N, net_arch), _learner("bf16", 1, net_arch)
    centre = torch.stack([together.read(0) - 0.1] * N)
    mu = torch.tensor([0.0, 0.5, 0.5])
    for step, mask in enumerate(([True] * N, [True, False, True], [False, False, True], [False, True, True])):
        batch = _batch(step)
        got = together.gradient_step(batch, torch.tensor(mask), mu, centre)
        one = Batch(
            *(getattr(batch, f)[2:] for f in ("observations", "actions", "next_observations", "dones", "rewards"))
        )
        want = alone.gradient_step(one, torch.ones(1, dtype=torch.bool), mu[2:], centre[2:])
        assert all(torch.equal(got[k][2:], want[k]) for k in want)
        mine, reference = _state(together, 2), _state(alone, 0)
        assert all(torch.equal(v, reference[k]) for k, v in mine.items()), step


def test_a_client_outside_the_mask_is_left_exactly_as_it_is() -> None:
    learner = _learner("bf16")
    before = _state(learner, 1)
    learner.gradient_step(_batch(0), torch.tensor([True, False, True]), *_no_prox(learner))
    assert all(torch.equal(v, before[k]) for k, v in _state(learner, 1).items())
    assert not torch.equal(learner.critic[0], before["critic"])


def test_a_loaded_model_reaches_the_next_bf16_step() -> None:
    """The bfloat16 copies follow load(): a client given new parameters is stepped from them."""
    a = _learner("bf16")
    flat = a.read(0) + 0.05 * torch.randn(a.layout.dim, generator=torch.Generator().manual_seed(1))
    mask, (mu, centre) = torch.ones(N, dtype=torch.bool), _no_prox(a)
    a.gradient_step(_batch(0), mask, mu, centre)  # its copies were made before the load
    a.load(1, flat)
    a.load_optimiser_state(1, None)  # a fresh Adam, as the fresh learner's
    a.gradient_step(_batch(1), mask, mu, centre)
    fresh = _learner("bf16")
    fresh.load(1, flat)
    fresh.gradient_step(_batch(1), mask, mu, centre)
    assert all(torch.equal(getattr(a, net)[1], getattr(fresh, net)[1]) for net in NETWORKS)


def test_a_tiny_bf16_run_on_the_continuous_lander(morlfed_cli: CliRunner, tmp_path: Path) -> None:
    """Two clients, two rounds of 150 steps, gradient steps from step 100: it trains and records bf16."""
    args = ["env=mo-lunar-lander-continuous", "engine=vectorised", "precision=bf16", "n_clients=2", "rounds=2"]
    args += ["local_steps=150", "progress=false", "env.eval_episodes=1", "env.max_episode_steps=50"]
    args += ["env.agent_kwargs.learning_starts=100", "env.agent_kwargs.batch_size=32"]
    args += ["env.agent_kwargs.policy_kwargs.net_arch=[32,32]"]
    done = morlfed_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["engine"], metrics["precision"]) == ("vectorised", "bf16")
