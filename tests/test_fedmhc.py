"""FedMHC: planted head groups, averaged bodies, absent clients, personal deployment, validation, resume.

Planted head groups share a head, bodies are averaged over everyone; personal models are deployed in
the federation loop.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch

from morlfed import envs
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation, FitResult, FitTask
from morlfed.federation import Federation, FederationConfig
from morlfed.runtime.client import Client, TrainJob, TrainOutput
from morlfed.runtime.executors import SequentialExecutor
from morlfed.storage.safestate import state_from_bytes, state_to_bytes
from morlfed.strategies.base import InertSettingWarning, make_strategy
from morlfed.strategies.fedmhc import FedMHC, cluster_heads
from morlfed.tasks.rl.client import RLClient

LAYOUT = ParamLayout.from_shapes(
    {"body.weight": (4, 3), "body.bias": (4,), "head.weight": (2, 4), "head.bias": (2,)},
    head=["head.weight", "head.bias"],
)
MASK = LAYOUT.head_mask()


def _setup(strategy: FedMHC, n: int, seed: int = 0) -> None:
    strategy.setup(n, torch.zeros(LAYOUT.dim), LAYOUT, np.random.default_rng(seed))


def _planted_results(rng: np.random.Generator, labels: np.ndarray, samples: np.ndarray) -> dict[int, FitResult]:
    centres = rng.normal(0.0, 5.0, size=(labels.max() + 1, int(MASK.sum())))
    params = torch.tensor(rng.normal(size=(len(labels), LAYOUT.dim)), dtype=torch.float32)
    heads = centres[labels] + 0.05 * rng.normal(size=(len(labels), centres.shape[1]))
    params[:, MASK] = torch.tensor(heads, dtype=torch.float32)
    return {c: FitResult(params=params[c], num_samples=int(samples[c]), model_index=0) for c in range(len(labels))}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_head_groups_share_a_head_and_bodies_average_over_everyone(seed):
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(3), 3))
    samples = rng.integers(1, 30, size=len(labels))
    results = _planted_results(rng, labels, samples)
    strat = FedMHC(n_groups=3, lam=0.5)
    _setup(strat, len(labels), seed)
    strat.aggregate(1, results)
    params = torch.stack([results[c].params for c in range(len(labels))])
    weights = torch.tensor(samples, dtype=torch.float32)
    weights /= weights.sum()
    body = weights @ params[:, ~MASK]
    groups = np.array([strat.model_id(c) for c in range(len(labels))])
    for g in range(3):  # one server group per planted group, and vice versa
        assert len(set(groups[labels == g])) == 1
    assert len(set(groups)) == 3
    for c in range(len(labels)):
        model = strat.model_for(c)
        torch.testing.assert_close(model[~MASK], body)
        same = torch.tensor(labels == labels[c])
        w = weights * same
        torch.testing.assert_close(model[MASK], (w / w.sum()) @ params[:, MASK])
    tasks = strat.configure(2, [0, 4])
    assert all(t.train_best and t.personal_lambda == 0.5 and t.params.shape == (3, LAYOUT.dim) for t in tasks.values())
    sent = tasks[0].params
    assert torch.equal(sent[:, ~MASK], body.unsqueeze(0).expand(3, -1))
    assert sorted(map(sorted, strat.diagnostics()["clusters"])) == sorted(
        sorted(np.flatnonzero(labels == g).tolist()) for g in range(3)
    )


def test_first_round_sends_the_single_initial_model():
    strat = FedMHC(n_groups=2)
    _setup(strat, 3)
    tasks = strat.configure(1, [0, 1, 2])
    assert tasks[0].params.shape == (1, LAYOUT.dim) and torch.equal(tasks[0].params[0], torch.zeros(LAYOUT.dim))


def test_fewer_distinct_heads_than_groups_gives_fewer_groups():
    heads = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, 0.0]])
    labels = cluster_heads(heads, 3, np.random.default_rng(0))
    assert labels[0] == labels[1] != labels[2] and set(labels) == {0, 1}


def test_absent_client_joins_the_nearest_new_head():
    rng = np.random.default_rng(4)
    labels = np.array([0, 0, 1, 1])
    strat = FedMHC(n_groups=2)
    _setup(strat, 4)
    results = _planted_results(rng, labels, np.ones(4))
    strat.aggregate(1, results)
    old_head = strat.model_for(3)[MASK]
    # round 2: client 3 is absent; the group of 2 moves a little, the other head moves far away
    moved = {c: FitResult(params=results[c].params.clone(), num_samples=1) for c in (0, 1, 2)}
    for c in (0, 1):
        moved[c].params[MASK] += 50.0
    moved[2].params[MASK] += 0.1
    strat.aggregate(2, moved)
    assert strat.model_id(3) == strat.model_id(2) != strat.model_id(0)
    assert (strat.model_for(3)[MASK] - old_head).norm() < 1.0


class _PlantedClient(Client):
    """A client whose loss is the distance to its own optimum; it records what it was asked to evaluate.

    A training moves its model halfway to the optimum; the personal model's training moves it
    halfway to the model just trained (its proximal centre).
    """

    def __init__(self, cid: int, optimum: torch.Tensor) -> None:
        super().__init__([cid], seed=0, local_steps=1)
        self.cid, self.optimum = cid, optimum
        self.evaluated: list[torch.Tensor | None] = []

    @property
    def layout(self) -> ParamLayout:
        return LAYOUT

    def initial_params(self) -> torch.Tensor:
        return torch.zeros(LAYOUT.dim)

    def _train(self, jobs: Mapping[int, TrainJob]) -> dict[int, TrainOutput]:
        ((cid, job),) = jobs.items()
        target = job.centre if job.personal else self.optimum
        return {cid: TrainOutput(job.start + 0.5 * (target - job.start))}

    def _loss(self, cid: int, params: torch.Tensor, keys: tuple[int, int]) -> tuple[float, int | None]:
        return float((params - self.optimum).norm()), None

    def _fit_metrics(self, cid: int, outputs: list[TrainOutput], serving: int) -> dict[str, float]:
        return {}

    def _personal_metrics(self, cid: int, output: TrainOutput) -> dict[str, float]:
        return {}

    def _num_samples(self, cid: int, steps: int, trained: int) -> int:
        return 10

    def evaluate_client(self, cid: int, params: torch.Tensor | None, seed: int) -> Evaluation:
        self.evaluated.append(params)
        model = self.personal_model(cid) if params is None else params
        assert model is not None, "every client trained its personal model"
        score = -float((model - self.optimum).norm())
        return Evaluation(np.array([score]), np.array([score]), score, score)

    def get_state(self, cid: int) -> dict[str, Any]:
        return {"personal": self.personal_model(cid)}

    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        self.set_personal_model(cid, state["personal"])


@pytest.mark.parametrize("finetune", [False, True])
def test_federation_evaluates_the_personal_models(finetune):
    rng = np.random.default_rng(0)
    optima = torch.tensor(rng.normal(size=(4, LAYOUT.dim)), dtype=torch.float32)
    clients = [_PlantedClient(c, optima[c % 2]) for c in range(4)]
    executor = SequentialExecutor()
    executor.start(lambda cid: clients[cid], 4)
    cfg = FederationConfig(n_clients=4, rounds=3, local_steps=1, seed=0, finetune=finetune, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = Federation(FedMHC(n_groups=2), executor, cfg).run()
    assert all(client.evaluated == [None] for client in clients)
    # "+FT" skips the last aggregation, which never reaches a personal model: the run says it changes nothing
    inert = [str(w.message) for w in caught if issubclass(w.category, InertSettingWarning)]
    if finetune:
        assert len(inert) == 1 and "deploys the models its plain run deploys" in inert[0]
        assert outcome.inert_warning == inert[0]
    else:
        assert inert == [] and outcome.inert_warning is None
    assert set(outcome.model_ids.values()) <= {0, 1}  # the clients' groups, never -1 (a fine-tuned model)
    for c, client in enumerate(clients):
        personal = client.personal_model(c)
        assert personal is not None
        assert outcome.evaluations[c].scalarised == pytest.approx(-float((personal - client.optimum).norm()))


def test_registered_with_paper_defaults():
    strat = make_strategy("fedmhc")
    assert isinstance(strat, FedMHC) and strat.deploys_personal
    assert (strat.n_groups, strat.lam) == (4, 1.0)
    assert strat.equal_budget  # not the paper's: every method takes the same env steps by default


@pytest.mark.parametrize("equal_budget", [True, False])
def test_equal_budget_splits_local_steps_between_shared_and_personal_model(equal_budget):
    """An RL client (deep-sea-treasure) fits the default task: ``equal_budget`` halves each model's steps.

    With the equal budget the shared and the personal model take half the steps each (a one-model
    client's env steps), else both take them all; the exploration clock advances by one round either
    way.
    """
    base = envs.get_spec("deep-sea-treasure")
    spec = dataclasses.replace(base, env_kwargs={}, agent_kwargs={**base.agent_kwargs, "learning_starts": 50})
    steps, w = 240, np.array([0.5, 0.5])  # 120 each: whole DQN rollouts of train_freq 4
    client, single = (RLClient(0, spec, w, seed=0, local_steps=steps, rounds=4) for _ in range(2))
    strategy = make_strategy("fedmhc", equal_budget=equal_budget)
    strategy.setup(4, client.initial_params(), client.layout, np.random.default_rng(0))
    task = dataclasses.replace(strategy.configure(1, [0])[0], round=1)
    assert task.split_budget is equal_budget and task.personal_lambda == 1.0
    result = client.fit(task)
    shared = steps // 2 if equal_budget else steps
    assert result.num_samples == shared and client.personal_model(0) is not None
    assert result.steps_spent == client.agent.num_timesteps == 2 * shared
    single.fit(FitTask(params=task.params[0], round=1))
    assert client.agent.exploration_rate == pytest.approx(single.agent.exploration_rate)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_groups": 0}, r"n_groups \(M\) must be >= 1, got 0"),
        ({"lam": 0.0}, r"lam \(lambda\) must be > 0, got 0.0"),
        ({"lam": -2.0}, r"lam \(lambda\) must be > 0, got -2.0"),
    ],
)
def test_invalid_hyper_parameters_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedMHC(**kwargs)


def test_more_groups_than_clients_rejected():
    with pytest.raises(ValueError, match=r"n_groups \(M\) must be <= the number of clients \(3\), got 4"):
        _setup(FedMHC(n_groups=4), 3)


def test_layout_without_head_rejected():
    layout = ParamLayout.from_shapes({"w": (3,)})
    with pytest.raises(ValueError, match="non-empty body and head"):
        FedMHC(n_groups=1).setup(2, torch.zeros(3), layout, np.random.default_rng(0))


def test_state_dict_round_trip():
    rng = np.random.default_rng(8)
    labels = rng.permutation(np.repeat(np.arange(3), 4))
    strat = FedMHC(n_groups=3)
    _setup(strat, len(labels), seed=1)
    strat.aggregate(1, _planted_results(rng, labels, np.ones(len(labels))))
    saved = state_to_bytes(strat.state_dict())  # as a checkpoint holds it: data only
    restored = FedMHC(n_groups=3)
    _setup(restored, len(labels), seed=77)
    restored.load_state_dict(state_from_bytes(saved))
    assert torch.equal(restored.group_models(), strat.group_models())
    assert restored.groups == strat.groups
    assert restored.rng.bit_generator.state == strat.rng.bit_generator.state
    # the K-means seed comes from the restored generator: both continue identically
    results = _planted_results(np.random.default_rng(9), rng.permutation(labels), np.ones(len(labels)))
    strat.aggregate(2, results)
    restored.aggregate(2, results)
    assert torch.equal(restored.group_models(), strat.group_models()) and restored.groups == strat.groups
