"""The SB3 arguments the vectorised engine implements (``keywords.HONOURED``) and the refusal of all others.

Each SB3 DQN / DDPG constructor argument, policy argument and Adam argument the engine does not
implement is refused by name, by the engine and by the command line (before anything is written);
every shipped spec is accepted; every implemented one changes the training.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from morlfed import envs
from morlfed.core.protocol import FitTask
from morlfed.tasks.rl.agent import AGENTS
from morlfed.tasks.rl.task import RLTask
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.keywords import HONOURED, unhonoured

#: the env each agent is tested on, and settings that make a fit tiny
SMALL: dict[str, tuple[str, dict[str, Any]]] = {
    "dqn": (
        "deep-sea-treasure",
        {"learning_starts": 20, "batch_size": 16, "buffer_size": 500, "target_update_interval": 10},
    ),
    "ddpg": (
        "mo-lunar-lander-continuous",
        {"learning_starts": 20, "batch_size": 16, "buffer_size": 500, "policy_kwargs": {"net_arch": [16, 16]}},
    ),
}
#: morlfed's own keyword, which the SB3 client consumes instead of SB3
MORLFED_KEYWORDS = {"action_noise_std"}


def sb3_arguments(agent: str) -> dict[str, Any]:
    """Every keyword an ``agent_kwargs`` entry can name for ``agent``, with its SB3 default.

    The default is None where it has none. The keywords are the algorithm's constructor arguments
    (those build_agent sets itself included), its policy's (``policy_kwargs.*``) and torch Adam's
    (``policy_kwargs.optimizer_kwargs.*``); ``policy_kwargs`` and ``optimizer_kwargs`` themselves
    are the groups of the latter.
    """
    algorithm = AGENTS[agent]
    policy = algorithm.policy_aliases["MlpPolicy"]

    def parameters(function: Any, skip: set[str], prefix: str = "") -> dict[str, Any]:
        items = inspect.signature(function).parameters.items()
        return {prefix + k: None if p.default is p.empty else p.default for k, p in items if k not in skip}

    arguments = parameters(algorithm.__init__, {"self", "env", "policy_kwargs"})
    built = {"self", "observation_space", "action_space", "lr_schedule", "optimizer_kwargs"}
    arguments |= parameters(policy.__init__, built, "policy_kwargs.")
    arguments |= parameters(torch.optim.Adam.__init__, {"self", "params", "lr"}, "policy_kwargs.optimizer_kwargs.")
    return arguments


def with_keyword(kwargs: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """A copy of ``kwargs`` with the dotted keyword ``name`` set to ``value``."""
    out = copy.deepcopy(kwargs)
    *parents, key = name.split(".")
    node = out
    for parent in parents:
        node = node.setdefault(parent, {})
    node[key] = value
    return out


def small_spec(agent: str, changes: dict[str, Any] | None = None) -> envs.EnvSpec:
    """The tiny spec of ``agent``, with the keywords in ``changes`` (dotted names) set."""
    name, small = SMALL[agent]
    base = envs.get_spec(name)
    kwargs = base.agent_kwargs | small
    for key, value in (changes or {}).items():
        kwargs = with_keyword(kwargs, key, value)
    return base.replace(max_episode_steps=40, eval_episodes=1, agent_kwargs=kwargs)


REFUSED = [(agent, name) for agent in SMALL for name in sb3_arguments(agent) if name not in HONOURED[agent]]


@pytest.mark.parametrize("agent", sorted(SMALL))
def test_every_honoured_keyword_is_an_sb3_argument(agent: str) -> None:
    assert set(HONOURED[agent]) <= set(sb3_arguments(agent)) | MORLFED_KEYWORDS


@pytest.mark.parametrize("agent, name", REFUSED, ids=[f"{a}-{n}" for a, n in REFUSED])
def test_the_engine_refuses_each_argument_it_does_not_implement(agent: str, name: str) -> None:
    spec = small_spec(agent, {name: sb3_arguments(agent)[name]})
    assert unhonoured(spec) == [name]
    with pytest.raises(ValueError, match=rf"does not implement agent_kwargs {name} \(") as refusal:
        VectorisedClients([0], spec, np.full((1, len(spec.objectives)), 1 / len(spec.objectives)), 0, 100, 1)
    assert "it implements " + ", ".join(sorted(HONOURED[agent])) in str(refusal.value)


@pytest.mark.parametrize("group", ["policy_kwargs", "policy_kwargs.optimizer_kwargs"])
def test_an_empty_group_of_arguments_is_accepted(group: str) -> None:
    assert unhonoured(small_spec("ddpg", {group: None})) == []
    assert unhonoured(small_spec("ddpg", {group: {}})) == []


def test_a_learning_rate_schedule_is_refused() -> None:
    spec = small_spec("dqn", {"learning_rate": lambda progress_remaining: 1e-3 * progress_remaining})
    with pytest.raises(ValueError, match="constant learning_rate"):
        VectorisedClients([0], spec, np.array([[0.5, 0.5]]), 0, 100, 1)


@pytest.mark.parametrize("agent", sorted(SMALL))
def test_the_command_line_refuses_them_all_by_name_and_writes_nothing(
    agent: str, tmp_path: Path, morlfed_cli: Any
) -> None:
    refused = [name for a, name in REFUSED if a == agent]
    # each as hydra would set it from the command line: null, or (inside a mapping) a placeholder
    overrides = [f"+env.agent_kwargs.{name}={'null' if '.' not in name else 0}" for name in refused]
    out = tmp_path / "runs" / "x"
    env = SMALL[agent][0]
    args = [f"env={env}", "engine=vectorised", "n_clients=2", "rounds=1", "local_steps=10", *overrides]
    proc = morlfed_cli([*args, f"hydra.run.dir={out}"], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("morlfed: error: engine=vectorised does not implement agent_kwargs ")
    named = lines[0].split("agent_kwargs ", 1)[1].split(" (env ", 1)[0].split(", ")
    assert sorted(named) == sorted(refused)
    assert list(tmp_path.iterdir()) == []


SHIPPED = sorted(p.stem for p in envs.ENV_CONF_DIR.glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_spec_is_accepted(name: str) -> None:
    spec = envs.get_spec(name)
    assert spec.agent in HONOURED
    assert unhonoured(spec) == []
    task = RLTask(spec, np.full((2, len(spec.objectives)), 1 / len(spec.objectives)), engine="vectorised")
    assert task.engine == "vectorised"


#: a value of every honoured keyword that changes a tiny fit (the specs' values are SMALL's,
#: learning_starts 20 of 100 steps, DDPG training after every episode with gradient_steps -1)
CHANGED = {
    "dqn": {
        "learning_rate": 1e-2,
        "buffer_size": 30,
        "learning_starts": 50,
        "batch_size": 8,
        "tau": 0.5,
        "gamma": 0.5,
        "train_freq": 2,
        "gradient_steps": 2,
        "target_update_interval": 25,
        "exploration_fraction": 0.05,
        "exploration_initial_eps": 0.2,
        "exploration_final_eps": 0.6,
        "max_grad_norm": 1e-4,
        "policy_kwargs.net_arch": [16],
        "policy_kwargs.activation_fn": torch.nn.Tanh,
        "policy_kwargs.optimizer_kwargs.betas": (0.5, 0.9),
        "policy_kwargs.optimizer_kwargs.eps": 1e-2,
    },
    "ddpg": {
        "learning_rate": 1e-2,
        "buffer_size": 30,
        "learning_starts": 50,
        "batch_size": 8,
        "tau": 0.5,
        "gamma": 0.5,
        "train_freq": 2,
        "gradient_steps": 1,
        "action_noise_std": 0.5,
        "policy_kwargs.net_arch": [8],
        "policy_kwargs.activation_fn": torch.nn.Tanh,
        "policy_kwargs.n_critics": 2,
        "policy_kwargs.optimizer_kwargs.betas": (0.5, 0.9),
        "policy_kwargs.optimizer_kwargs.eps": 1e-2,
    },
}


def trained(spec: envs.EnvSpec) -> torch.Tensor:
    """One client's model after a 100-step fit from the shared initial model."""
    engine = VectorisedClients([0], spec, np.full((1, len(spec.objectives)), 1 / len(spec.objectives)), 0, 100, 2)
    return engine.fit(FitTask(params=engine.initial_params(), round=1)).params


@pytest.mark.parametrize("agent", sorted(SMALL))
def test_every_honoured_keyword_changes_the_training(agent: str) -> None:
    """The list is honest: each keyword it names reaches the engine's training."""
    assert set(CHANGED[agent]) == set(HONOURED[agent])
    reference = trained(small_spec(agent))
    for name, value in CHANGED[agent].items():
        params = trained(small_spec(agent, {name: value}))
        assert params.shape != reference.shape or not torch.equal(params, reference), name
