"""IFCA: K distinct initial models, lowest-loss choice, per-model averaging of exactly the choosers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from morlfed.baselines.fedavg import FedAvg
from morlfed.baselines.ifca import IFCA, permuted_inits
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.federation.round import RoundReport
from morlfed.strategies.base import make_strategy

LAYOUT = ParamLayout.from_shapes({"l0": (4, 3), "l1": (4,), "l2": (2, 4)})
D = LAYOUT.dim


def _init(seed: int = 0) -> torch.Tensor:
    return torch.tensor(np.random.default_rng(seed).normal(size=D), dtype=torch.float32)


def _setup(strategy: IFCA, n: int, seed: int = 0, init: torch.Tensor | None = None) -> IFCA:
    strategy.setup(n, _init() if init is None else init, LAYOUT, np.random.default_rng(seed))
    return strategy


class QuadraticClient:
    """A synthetic client honouring ``train_best``: loss ``||theta - target||^2 / d``.

    It takes one step of size ``lr`` towards its target on the model with the lowest loss.
    """

    def __init__(self, target: torch.Tensor, num_samples: int, lr: float = 0.5) -> None:
        self.target, self.num_samples, self.lr = target, num_samples, lr

    def fit(self, task: FitTask) -> FitResult:
        assert task.train_best and task.report_losses and task.params.shape[0] > 1
        losses = (task.params - self.target).pow(2).mean(dim=1)
        best = int(losses.argmin())
        trained = task.params[best] + self.lr * (self.target - task.params[best])
        return FitResult(params=trained, num_samples=self.num_samples, losses=losses, model_index=best)


def test_invalid_hyper_parameters_are_rejected():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_models \\(K\\) must be an integer >= 1"):
            IFCA(n_models=bad)
    with pytest.raises(ValueError, match=r"n_models \(K = 4\) must be <= the number of clients \(3\)"):
        IFCA(n_models=4).validate(3)
    with pytest.raises(ValueError, match="must be <= the number of clients"):
        _setup(IFCA(n_models=4), 3)
    IFCA(n_models=3).validate(3)


def test_config_default():
    assert make_strategy("ifca").n_models == 3


def test_initial_models_are_distinct_layer_shuffles_of_the_shared_init():
    init = _init(1)
    strategy = _setup(IFCA(n_models=3), 5, seed=2, init=init)
    assert strategy.models.shape == (3, D)
    torch.testing.assert_close(strategy.models[0], init, rtol=0, atol=0)
    assert torch.unique(strategy.models, dim=0).shape[0] == 3
    for k in (1, 2):  # same entries per layer, i.e. the same initialisation distribution and scale
        for layer in LAYOUT.layers:
            assert torch.equal(strategy.models[k, layer.slice].sort().values, init[layer.slice].sort().values)
    again = _setup(IFCA(n_models=3), 5, seed=2, init=init)
    assert torch.equal(again.models, strategy.models)  # reproducible from the strategy's generator


def test_constant_initial_model_cannot_give_distinct_models():
    with pytest.raises(ValueError, match="could not make 2 distinct initial models"):
        _setup(IFCA(n_models=2), 3, init=torch.zeros(D))
    _setup(IFCA(n_models=1), 3, init=torch.zeros(D))


def test_configure_sends_all_models_and_asks_for_the_best():
    strategy = _setup(IFCA(n_models=2), 4)
    tasks = strategy.configure(1, [0, 2])
    assert sorted(tasks) == [0, 2]
    for task in tasks.values():
        assert task.train_best and task.report_losses
        assert torch.equal(task.params, strategy.models)


def test_each_model_becomes_the_sample_weighted_mean_of_exactly_its_choosers():
    strategy = _setup(IFCA(n_models=3), 6)
    before = strategy.models.clone()
    trained = torch.tensor(np.random.default_rng(3).normal(size=(4, D)), dtype=torch.float32)
    chosen, samples = [1, 0, 1, 1], [10, 20, 30, 60]
    strategy.aggregate(
        1, {c: FitResult(params=trained[c], num_samples=samples[c], model_index=chosen[c]) for c in range(4)}
    )
    torch.testing.assert_close(strategy.models[0], trained[1])
    torch.testing.assert_close(strategy.models[1], (10 * trained[0] + 30 * trained[2] + 60 * trained[3]) / 100)
    torch.testing.assert_close(strategy.models[2], before[2], rtol=0, atol=0)  # nobody chose it
    assert [strategy.model_id(c) for c in range(6)] == [1, 0, 1, 1, 0, 0]  # 4, 5 never took part: model 0
    torch.testing.assert_close(strategy.model_for(3), strategy.models[1])
    assert strategy.diagnostics()["clusters"] == [[1, 4, 5], [0, 2, 3], []]


def test_one_model_is_fedavg():
    init = _init(4)
    ifca, fedavg = _setup(IFCA(n_models=1), 3, init=init), FedAvg()
    fedavg.setup(3, init, LAYOUT, np.random.default_rng(0))
    trained = torch.tensor(np.random.default_rng(5).normal(size=(3, D)), dtype=torch.float32)
    ifca.aggregate(1, {c: FitResult(params=trained[c], num_samples=c + 1, model_index=0) for c in range(3)})
    fedavg.aggregate(1, {c: FitResult(params=trained[c], num_samples=c + 1) for c in range(3)})
    torch.testing.assert_close(ifca.model_for(2), fedavg.model_for(2))


def test_clients_pick_the_lowest_loss_model_and_planted_groups_specialise():
    init = _init(6)
    strategy = _setup(IFCA(n_models=2), 6, seed=7, init=init)
    rng = np.random.default_rng(8)
    # group A's optima lie near model 0, group B's near model 1 (each group in one model's basin)
    centres = strategy.models.clone()
    labels = [0, 1, 0, 1, 0, 1]
    clients = {
        c: QuadraticClient(centres[g] + 0.3 * torch.tensor(rng.normal(size=D), dtype=torch.float32), num_samples=5 + c)
        for c, g in enumerate(labels)
    }
    for rnd in range(1, 9):
        models = strategy.models.clone()
        tasks = strategy.configure(rnd, list(clients))
        results = {c: clients[c].fit(t) for c, t in tasks.items()}
        strategy.aggregate(rnd, results)
        for c, result in results.items():
            losses = (models - clients[c].target).pow(2).mean(dim=1)
            assert result.model_index == int(losses.argmin())  # the lowest-loss model was chosen ...
            assert strategy.model_id(c) == result.model_index  # ... and the server records it
        assert strategy.diagnostics()["losses"][0] == results[0].losses.tolist()
    assert [strategy.model_id(c) for c in clients] == labels
    # each model converges to the sample-weighted mean of its group's optima
    for k in (0, 1):
        group = [c for c in clients if labels[c] == k]
        n = torch.tensor([clients[c].num_samples for c in group], dtype=torch.float32)
        optimum = (n @ torch.stack([clients[c].target for c in group])) / n.sum()
        torch.testing.assert_close(strategy.models[k], optimum, atol=0.01, rtol=0)


def test_warns_when_every_client_ends_on_one_model():
    strategy = _setup(IFCA(n_models=3), 4)
    assert strategy.inert_warning() == (
        "ifca: every client ends on model 0 of its 3, so IFCA deploys one model for all clients, as FedAvg does"
    )  # nobody has chosen yet: everyone deploys model 0
    trained = torch.tensor(np.random.default_rng(1).normal(size=(4, D)), dtype=torch.float32)
    strategy.aggregate(1, {c: FitResult(params=trained[c], num_samples=1, model_index=2) for c in range(4)})
    assert "ends on model 2 of its 3" in (strategy.inert_warning() or "")
    strategy.aggregate(2, {0: FitResult(params=trained[0], num_samples=1, model_index=1)})
    assert strategy.inert_warning() is None  # client 0 now deploys model 1, the others model 2
    assert _setup(IFCA(n_models=1), 4).inert_warning() is None  # K = 1 is FedAvg by choice


def test_a_round_counts_the_groups_of_clients_not_the_models():
    # clients 0-2 choose model 2, client 3 model 0, nobody model 1: 2 clusters in rounds.csv, not K = 3
    strategy = _setup(IFCA(n_models=3), 4)
    trained = torch.tensor(np.random.default_rng(1).normal(size=(4, D)), dtype=torch.float32)
    results = {c: FitResult(params=trained[c], num_samples=1, model_index=0 if c == 3 else 2) for c in range(4)}
    strategy.aggregate(1, results)
    diagnostics = strategy.diagnostics()
    assert diagnostics["clusters"] == [[3], [], [0, 1, 2]]
    report = RoundReport(round=1, participants=4, ok=results, failed={}, aggregated=True, diagnostics=diagnostics)
    assert report.n_clusters == 2


def test_results_without_a_valid_model_index_are_rejected():
    strategy = _setup(IFCA(n_models=2), 3)
    with pytest.raises(ValueError, match="client 1 returned model_index=None"):
        strategy.aggregate(1, {1: FitResult(params=torch.zeros(D), num_samples=1)})
    with pytest.raises(ValueError, match="client 1 returned model_index=2"):
        strategy.aggregate(1, {1: FitResult(params=torch.zeros(D), num_samples=1, model_index=2)})
    with pytest.raises(ValueError, match=rf"shape \(2, {D}\)"):
        strategy.aggregate(1, {1: FitResult(params=torch.zeros(2, D), num_samples=1, model_index=0)})


def test_permuted_inits_keep_constant_layers():
    init = torch.cat([torch.arange(12.0), torch.zeros(4), torch.arange(8.0)])
    out = permuted_inits(init, LAYOUT, 2, np.random.default_rng(0))
    assert torch.equal(out[:, 12:16], torch.zeros(2, 4))


def test_state_dict_round_trip_resumes_exactly():
    first = _setup(IFCA(n_models=2), 4, seed=3)
    trained = torch.tensor(np.random.default_rng(9).normal(size=(4, D)), dtype=torch.float32)
    first.aggregate(1, {c: FitResult(params=trained[c], num_samples=1, model_index=c % 2) for c in range(3)})
    state = copy.deepcopy(first.state_dict())
    second_round = {c: FitResult(params=trained[c] * 2, num_samples=1, model_index=(c + 1) % 2) for c in range(2)}
    first.aggregate(2, second_round)
    second = _setup(IFCA(n_models=2), 4, seed=11)
    second.load_state_dict(state)
    assert torch.equal(second.choices, torch.tensor([0, 1, 0, -1]))
    second.aggregate(2, second_round)
    assert torch.equal(second.models, first.models) and torch.equal(second.choices, first.choices)
    assert second.rng.bit_generator.state == first.rng.bit_generator.state
