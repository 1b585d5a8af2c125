"""What both RL engines share (morlfed/tasks/rl/agent.py, clock.py, state.py, factory.py).

No module of the vectorised engine imports the SB3 client module; in both engines the optimiser
slots keep each slot's state, the exploration clock gives the same epsilon for the same counters,
and a client's state carries the same keys and round-trips (deep-sea-treasure, tiny budgets).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3 import DQN

from morlfed import envs
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitTask
from morlfed.runtime.client import Client
from morlfed.storage.safestate import state_from_bytes, state_to_bytes
from morlfed.tasks.rl.client import RLClient, RLClientFactory
from morlfed.tasks.rl.clock import FitClock
from morlfed.tasks.rl.factory import RLFactory
from morlfed.tasks.rl.state import CarriedState
from morlfed.tasks.rl.vectorised.engine import VectorisedClients
from morlfed.tasks.rl.vectorised.factory import VectorisedClientFactory

ROOT = Path(__file__).resolve().parents[1]
VECTORISED = ROOT / "morlfed" / "tasks" / "rl" / "vectorised"
STEPS, ROUNDS, SEED = 100, 10, 0
PREFS = np.array([[0.9, 0.1], [0.3, 0.7]])
FACTORIES: list[type[RLFactory]] = [RLClientFactory, VectorisedClientFactory]
UP, DOWN = 0, 1


def one_client(factory: RLFactory, cid: int) -> Client:
    """Client ``cid`` on its own: the SB3 engine's client, or an engine of one client."""
    return factory.engine([cid]) if isinstance(factory, VectorisedClientFactory) else factory(cid)  # type: ignore[operator]


def constant_policy(layout: ParamLayout, action: int) -> torch.Tensor:
    """A Q-network whose only non-zero parameter makes ``action`` the greedy action everywhere.

    On deep-sea-treasure, DOWN from the start reaches treasure 0.7 in one step and UP never ends
    (100 steps, no treasure): for client 1 (weights 0.3, 0.7), DOWN is the better model.
    """
    v = torch.zeros(layout.dim)
    layout.unflatten(v)["q_net.q_net.4.bias"][action] = 1.0
    return v


@pytest.fixture(scope="module")
def spec() -> envs.EnvSpec:
    """Gradient steps after every 4 env steps past step 20.

    That is 20 in a first 100-step training, 25 in every later one.
    """
    base = envs.get_spec("deep-sea-treasure")
    small = {"learning_starts": 20, "batch_size": 16, "buffer_size": 500, "target_update_interval": 50}
    return base.replace(agent_kwargs={**base.agent_kwargs, **small})


def imported_modules(source: str, package: str) -> set[str]:
    """Every module a module of ``package`` with this source imports, relative imports resolved.

    ``from x import y`` counts as ``x`` and ``x.y``, ``y`` may be a module.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            anchor = parts[: len(parts) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", sorted(VECTORISED.rglob("*.py")), ids=lambda p: p.name)
def test_no_vectorised_module_imports_the_sb3_client_module(path: Path) -> None:
    package = ".".join(path.relative_to(ROOT).parent.parts)
    assert "morlfed.tasks.rl.client" not in imported_modules(path.read_text(), package)


@pytest.mark.parametrize(
    "source", ["import morlfed.tasks.rl.client", "from morlfed.tasks.rl import client", "from ..client import x"]
)
def test_the_import_check_sees_every_form_of_import(source: str) -> None:
    assert "morlfed.tasks.rl.client" in imported_modules(source, "morlfed.tasks.rl.vectorised")


def same(a: Any, b: Any) -> bool:
    """Whether two states are equal, tensors bit for bit (nested dicts, lists and tuples)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def active_optimiser(state: dict[str, Any]) -> dict[str, Any]:
    """The active slot's optimiser state in a client's state, as its engine stores a slot's."""
    return {"policy": state["agent"]["policy.optimizer"]} if "agent" in state else state["optimiser"]


def adam_steps(slot_state: dict[str, Any]) -> int:
    """The Adam steps a slot's optimiser state has taken (SB3's state dict or the stacked learner's)."""
    if "policy" in slot_state:
        return max((int(s["step"]) for s in slot_state["policy"]["state"].values()), default=0)
    return int(slot_state["adam"]["step"])


def saved(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` written to a state file and read back, as a checkpoint does."""
    return state_from_bytes(state_to_bytes(state))


@pytest.mark.parametrize("factory", FACTORIES, ids=["sb3", "vectorised"])
def test_each_optimiser_slot_keeps_its_state(spec: envs.EnvSpec, factory: type[RLFactory]) -> None:
    client = one_client(factory(spec, PREFS, SEED, STEPS, ROUNDS), 1)
    good, bad = constant_policy(client.layout, DOWN), constant_policy(client.layout, UP)
    states = []
    for r, k in enumerate((0, 1, 0), start=1):  # model 0, model 1, model 0 again: the good one wins
        models = torch.stack([good, bad] if k == 0 else [bad, good])
        assert client.fit(FitTask(params=models, round=r, train_best=True)).model_index == k
        states.append(client.get_state(1))
    last = states[-1]
    assert last["active_slot"] == "model-0"
    # model 1's Adam state is the one it trained in round 2, untouched by model 0's round 3 ...
    assert same(last["optimiser_slots"]["model-1"], active_optimiser(states[1]))
    # ... and model 0 went on from its round-1 state: 20 steps in round 1, 25 in round 3
    assert adam_steps(active_optimiser(last)) == 45 and adam_steps(last["optimiser_slots"]["model-1"]) == 25


def test_the_exploration_clock_gives_both_engines_the_same_epsilon(spec: envs.EnvSpec) -> None:
    for exploration in ({"exploration_fraction": 0.3, "exploration_initial_eps": 0.9}, {"exploration_fraction": 0.0}):
        decaying = spec.replace(agent_kwargs={**spec.agent_kwargs, **exploration})
        reference = RLClient(0, decaying, PREFS[0], SEED, STEPS, ROUNDS)
        vectorised = VectorisedClients([0], decaying, PREFS, SEED, STEPS, ROUNDS)
        schedule, agent = reference._schedule, reference.agent
        assert isinstance(agent, DQN) and schedule is not None and agent.exploration_schedule is schedule
        clocks = [(t, offset) for t in (0, 1, 150, 299, 300, 301, 999, 5000) for offset in (0, 7, 300) if offset <= t]
        for t, offset in clocks:
            agent.num_timesteps, schedule.offset = t, offset
            epsilon = vectorised.exploration.epsilon(np.array([t]), np.array([offset]))  # type: ignore[attr-defined]
            assert schedule(1.0) == epsilon[0], (exploration, t, offset)
        if exploration["exploration_fraction"] > 0:
            assert schedule(1.0) == agent.exploration_final_eps  # the last clock: past the decay


def test_the_fit_clock_stands_still_within_a_fit() -> None:
    clock = FitClock()
    assert clock.offset(100, 0, first=True) == 0  # a fit's first training reads the clock at 100
    assert clock.offset(204, 0, first=False) == 104  # its second training: the clock still reads 100
    assert clock.offset(308, 104, first=True) == 104  # the next fit: 204, one training's 104 steps later
    assert clock.offset(400, 104, first=True) == 104  # split_budget: every training advances it


def test_both_engines_carry_the_same_state_and_it_round_trips(spec: envs.EnvSpec) -> None:
    carried = {}
    for factory in FACTORIES:
        build = factory(spec, PREFS, SEED, STEPS, ROUNDS)
        client = one_client(build, 1)
        models = torch.stack([constant_policy(client.layout, UP), constant_policy(client.layout, DOWN)])
        assert client.fit(FitTask(params=models, round=1, train_best=True, personal_lambda=0.5)).model_index == 1
        state = saved(client.get_state(1))
        restored = one_client(build, 1)
        restored.set_state(1, saved(state))
        again = restored.get_state(1)
        assert set(CarriedState.field_names()) <= set(state) and again.keys() == state.keys()
        assert same(CarriedState.of(again).as_dict(), CarriedState.of(state).as_dict())
        follow_up = FitTask(params=models[0], round=2)
        assert torch.equal(restored.fit(follow_up).params, client.fit(follow_up).params)
        carried[factory] = CarriedState.of(state)
    sb3, vectorised = carried.values()
    assert sb3.active_slot == vectorised.active_slot == "personal"
    assert sorted(sb3.optimiser_slots) == sorted(vectorised.optimiser_slots) == ["model-0", "model-1"]
    assert sb3.monitor.keys() == vectorised.monitor.keys()
    assert sb3.schedule_offset == vectorised.schedule_offset == STEPS  # the personal model's steps
    assert sb3.personal is not None and vectorised.personal is not None
