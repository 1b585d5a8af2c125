"""FedPG: the min-norm solver, the descent directions, absent clients, S-FedPG, validation, resume.

The common descent direction, the drifted personal directions, absent-client reuse, the fair-driven
objective, S-FedPG's step control.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult
from morlfed.storage.safestate import state_from_bytes, state_to_bytes
from morlfed.strategies.base import make_strategy
from morlfed.strategies.fedpg import FedPG, drift_gammas, fair_gradient, min_norm_weights

DIM = 20


def _setup(strategy: FedPG, n: int, seed: int = 0) -> None:
    strategy.setup(n, torch.zeros(DIM), ParamLayout.from_shapes({"w": (DIM,)}), np.random.default_rng(seed))


def _results(strategy: FedPG, grads: torch.Tensor, losses, cids=None) -> dict[int, FitResult]:
    """Clients whose update is minus the given gradient, reporting the given losses."""
    cids = range(len(grads)) if cids is None else cids
    return {
        c: FitResult(params=strategy.global_model - g, num_samples=10, losses=torch.tensor([float(loss)]))
        for c, g, loss in zip(cids, grads, losses)
    }


def _conflicting_grads(rng: np.random.Generator, m: int) -> torch.Tensor:
    """Gradients sharing a component along a random direction, with large individual parts.

    Many pairs conflict (g_i . g_j < 0), yet a common descent direction exists.
    """
    common = rng.normal(size=DIM)
    common /= np.linalg.norm(common)
    return torch.tensor(common + 3.0 * rng.normal(size=(m, DIM)) / np.sqrt(DIM), dtype=torch.float32)


def test_min_norm_weights_known_answers():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    torch.testing.assert_close(min_norm_weights(q @ q.T), torch.tensor([0.5, 0.5], dtype=torch.float64))
    q = torch.tensor([[1.0, 0.0], [-1.0, 1.0]])  # ||(2l - 1, 1 - l)||^2 is smallest at l = 0.6
    torch.testing.assert_close(min_norm_weights(q @ q.T), torch.tensor([0.6, 0.4], dtype=torch.float64))
    q = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # 0 is in the hull
    weights = min_norm_weights(q @ q.T)
    assert (weights @ q.double()).norm() < 1e-12 and weights.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(5))
def test_min_norm_point_satisfies_optimality_conditions(seed):
    rng = np.random.default_rng(seed)
    q = torch.tensor(rng.normal(size=(8, 5)) * rng.uniform(0.01, 100.0, size=(8, 1)), dtype=torch.float64)
    weights = min_norm_weights(q @ q.T)
    point = weights @ q
    assert (weights >= 0).all() and weights.sum() == pytest.approx(1.0)
    # the minimum-norm point p of the hull has q_k . p >= ||p||^2 for every k, with equality on the support
    slack = q @ point - point @ point
    scale = float(q.norm(dim=1).max() ** 2)
    assert slack.min() > -1e-10 * scale
    assert slack[weights > 1e-9].abs().max() < 1e-9 * scale


@pytest.mark.parametrize("seed", range(6))
def test_common_and_personal_directions_do_not_conflict(seed):
    rng = np.random.default_rng(seed)
    m = 6
    grads = _conflicting_grads(rng, m)
    assert (grads @ grads.T < 0).any(), "the test needs conflicting clients"
    losses = rng.uniform(0.5, 2.0, size=m)
    strat = FedPG(lr=0.5)
    _setup(strat, m)
    before = strat.global_model.clone()
    strat.aggregate(1, _results(strat, grads, losses))
    d = ((strat.global_model - before) / 0.5).double()
    g = grads.double()
    assert (g @ d < 0).all(), f"d conflicts with a client: {g @ d}"
    assert float(fair_gradient(g, torch.tensor(losses)) @ d) < 0
    assert d.norm().item() == pytest.approx(g.mean(dim=0).norm().item(), rel=1e-5)
    personal = ((strat.personal - before) / 0.5).double()  # d_i, one row per client
    products = g @ personal.T  # [j, i] = g_j . d_i
    off_diagonal = products[~torch.eye(m, dtype=torch.bool)]
    assert off_diagonal.max() <= 1e-5 * float(g.norm(dim=1).max() * personal.norm(dim=1).max())
    gammas = torch.tensor(strat.diagnostics()["gamma"], dtype=torch.float64)
    for i in range(m):  # gamma_i is the largest feasible: at 1, or some constraint is tight
        torch.testing.assert_close(personal[i], d + gammas[i] * (-g[i] - d), atol=1e-5, rtol=1e-5)
        if gammas[i] < 1:
            others = products[:, i][torch.arange(m) != i]
            assert others.max().abs() < 1e-4
        assert products[i, i] <= (g[i] @ d) + 1e-6  # drifting towards -g_i helps client i
    assert (gammas > 0).any()


def test_drift_gammas_hand_computed():
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    d = torch.tensor([-1.0, -1.0])
    # client 0: d_0 = (-1, -1) + gamma (0, 1); g_1 . d_0 = -1 + gamma <= 0 -> gamma = 1; same for client 1
    torch.testing.assert_close(drift_gammas(grads, d), torch.tensor([1.0, 1.0], dtype=torch.float64))
    grads = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    d = torch.tensor([-1.0, -0.5])
    # client 0: g_1 . (d + gamma (-g_0 - d)) = -1.5 + gamma * 1.5 -> gamma = 1
    # client 1: g_0 . (d + gamma (-g_1 - d)) = -1 + gamma * 0 -> no bound -> 1
    torch.testing.assert_close(drift_gammas(grads, d), torch.tensor([1.0, 1.0], dtype=torch.float64))
    grads = torch.tensor([[1.0, 0.0], [-0.5, 1.0]])
    d = torch.tensor([-0.2, -0.5])
    # client 1: g_0 . (d + gamma (-g_1 - d)) = -0.2 + gamma * 0.7 -> gamma = 2/7
    assert drift_gammas(grads, d)[1].item() == pytest.approx(2 / 7)


def test_fair_gradient_equals_autograd():
    rng = np.random.default_rng(2)
    grads = torch.tensor(rng.normal(size=(5, DIM)), dtype=torch.float64)
    losses = torch.tensor(rng.uniform(0.2, 3.0, size=5), dtype=torch.float64)
    omega = torch.zeros(DIM, dtype=torch.float64, requires_grad=True)
    linear = losses + grads @ omega  # losses whose gradients at omega = 0 are the rows of grads
    fair = -linear.sum() / (linear.norm() * np.sqrt(5))
    (expected,) = torch.autograd.grad(fair, omega)
    torch.testing.assert_close(fair_gradient(grads, losses), expected)


def test_gradients_are_rescaled_to_their_mean_norm():
    g = torch.eye(2, DIM)
    g[0] *= 10.0  # without rescaling, the min-norm point would lean almost entirely on client 1
    strat = FedPG(fair=False)
    _setup(strat, 2)
    strat.aggregate(1, _results(strat, g, [1.0, 1.0]))
    torch.testing.assert_close(strat.diagnostics()["lambda"], [0.5, 0.5])
    assert strat.global_model[0].item() == pytest.approx(strat.global_model[1].item())
    assert strat.global_model.norm().item() == pytest.approx(g.mean(dim=0).norm().item(), rel=1e-6)


def test_pareto_stationary_point_does_not_move():
    strat = FedPG()
    _setup(strat, 2)
    g = torch.zeros(2, DIM)
    g[0, 0], g[1, 0] = 1.0, -1.0
    strat.aggregate(1, _results(strat, g, [1.0, 1.0]))
    assert torch.equal(strat.global_model, torch.zeros(DIM))
    assert strat.diagnostics()["direction_norm"] == 0.0


def test_fair_objective_pulls_towards_the_worse_client():
    g = torch.eye(2, DIM)  # two orthogonal clients of equal gradient norm
    plain, fair = FedPG(fair=False), FedPG(fair=True)
    for strat in (plain, fair):
        _setup(strat, 2)
        strat.aggregate(1, _results(strat, g, [1.0, 3.0]))
    assert len(plain.diagnostics()["lambda"]) == 2 and len(fair.diagnostics()["lambda"]) == 3
    # without F the direction treats both alike; with F it favours client 1, whose loss is higher
    assert plain.global_model[0] == pytest.approx(plain.global_model[1].item())
    assert -fair.global_model[1] > -fair.global_model[0] > 0


def test_non_positive_losses_are_shifted_for_the_fair_objective():
    g = torch.eye(2, DIM)
    strat = FedPG()
    _setup(strat, 2)
    strat.aggregate(1, _results(strat, g, [-3.0, -1.0]))  # client 0 is better off (lower loss)
    assert strat.diagnostics()["loss_shift"] == pytest.approx(4.0)
    assert -strat.global_model[1] > -strat.global_model[0] > 0  # still favours the worse client 1


def test_absent_clients_gradients_are_reused_for_tau_rounds():
    rng = np.random.default_rng(3)
    grads = _conflicting_grads(rng, 4)
    strat = FedPG(tau=1)
    _setup(strat, 4)
    strat.aggregate(1, _results(strat, grads, [1.0] * 4))
    before = strat.global_model.clone()
    strat.aggregate(2, _results(strat, grads[:2], [1.0] * 2, cids=[0, 1]))
    assert strat.diagnostics()["reused"] == [2, 3]
    d = (strat.global_model - before).double()
    assert (grads.double() @ d < 0).all()  # also a descent direction for the absent clients' last gradients
    personal_3 = strat.model_for(3)
    strat.aggregate(3, _results(strat, grads[:2], [1.0] * 2, cids=[0, 1]))
    assert strat.diagnostics()["reused"] == []  # absent for two rounds > tau
    assert torch.equal(strat.model_for(3), personal_3)  # an absent client keeps its personal model
    none = FedPG(tau=0)
    _setup(none, 4)
    none.aggregate(1, _results(none, grads, [1.0] * 4))
    none.aggregate(2, _results(none, grads[:2], [1.0] * 2, cids=[0, 1]))
    assert none.diagnostics()["reused"] == []


def test_default_tau_is_clients_seen_over_participants():
    grads = torch.eye(4, DIM)
    strat = FedPG()  # tau = ceil(M / |S_t|)
    _setup(strat, 4)
    strat.aggregate(1, _results(strat, grads, [1.0] * 4))
    strat.aggregate(2, _results(strat, grads[:1], [1.0], cids=[0]))  # tau = 4 / 1
    assert strat.diagnostics()["reused"] == [1, 2, 3]
    strat.aggregate(5, _results(strat, grads[:2], [1.0] * 2, cids=[0, 1]))  # tau = 4 / 2: client 2, 3 are 4 rounds old
    assert strat.diagnostics()["reused"] == []


def test_line_search_halves_after_a_failed_step_and_doubles_after_a_good_one():
    g = torch.eye(2, DIM)  # |d| = |mean g| = 1/sqrt(2), g_i . d = -1/2
    strat = FedPG(lr=1.0, fair=False, line_search=True, search_range=1, armijo_beta=0.5)
    _setup(strat, 2)
    strat.aggregate(1, _results(strat, g, [1.0, 1.0]))
    strat.aggregate(2, _results(strat, g, [1.5, 1.5]))  # the step made the losses worse
    assert strat.diagnostics()["step"] == 0.5
    strat.aggregate(3, _results(strat, g, [1.4, 1.4]))  # better, but not by beta * 0.5 * 1/2 = 0.125
    assert strat.diagnostics()["step"] == 0.5  # the lower bound 2^-s lr
    strat.aggregate(4, _results(strat, g, [1.2, 1.2]))  # sufficient decrease
    assert strat.diagnostics()["step"] == 1.0
    strat.aggregate(5, _results(strat, g, [0.9, 0.9]))
    strat.aggregate(6, _results(strat, g, [0.0, 0.0]))
    assert strat.diagnostics()["step"] == 2.0  # the upper bound 2^s lr
    plain = FedPG(lr=1.0)
    _setup(plain, 2)
    plain.aggregate(1, _results(plain, g, [1.0, 1.0]))
    plain.aggregate(2, _results(plain, g, [5.0, 5.0]))
    assert plain.diagnostics()["step"] == 1.0


def test_line_search_also_tests_the_fair_objective():
    g = torch.eye(2, DIM)
    steps = []
    for fair in (False, True):
        strat = FedPG(lr=1.0, fair=fair, line_search=True, armijo_beta=0.1)
        _setup(strat, 2)
        strat.aggregate(1, _results(strat, g, [1.0, 1.1]))
        strat.aggregate(2, _results(strat, g, [0.1, 0.9]))  # both improve, but far more unequal
        steps.append(strat.diagnostics()["step"])
    assert steps == [2.0, 0.5]


def test_registered_with_defaults():
    strat = make_strategy("fedpg")
    assert isinstance(strat, FedPG)
    assert (strat.lr, strat.fair, strat.tau, strat.line_search) == (1.0, True, None, False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0.0}, r"lr \(eta\) must be > 0, got 0.0"),
        ({"tau": -1}, r"tau must be >= 0 or null"),
        ({"search_range": -1}, r"search_range \(s\) must be >= 0"),
        ({"armijo_beta": 1.0}, r"armijo_beta must be in \(0, 1\), got 1.0"),
        ({"armijo_beta": 0.0}, r"armijo_beta must be in \(0, 1\), got 0.0"),
    ],
)
def test_invalid_hyper_parameters_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedPG(**kwargs)


def test_missing_losses_rejected():
    strat = FedPG()
    _setup(strat, 1)
    with pytest.raises(ValueError, match="report_losses"):
        strat.aggregate(1, {0: FitResult(params=torch.ones(DIM), num_samples=1)})


def test_state_dict_round_trip():
    rng = np.random.default_rng(11)
    grads = _conflicting_grads(rng, 4)
    strat = FedPG(line_search=True, tau=2)
    _setup(strat, 4)
    strat.aggregate(1, _results(strat, grads, [1.0, 2.0, 1.5, 1.0]))
    strat.aggregate(2, _results(strat, grads[:2] * 0.5, [0.9, 1.8], cids=[0, 1]))
    saved = state_to_bytes(strat.state_dict())  # as a checkpoint holds it: data only
    restored = FedPG(line_search=True, tau=2)
    _setup(restored, 4, seed=5)
    restored.load_state_dict(state_from_bytes(saved))
    for name in ("global_model", "personal", "grads", "last_round"):
        assert torch.equal(getattr(restored, name), getattr(strat, name))
    assert restored.step == strat.step
    results = _results(strat, grads[1:] * 0.3, [0.7, 1.0, 0.9], cids=[1, 2, 3])
    strat.aggregate(3, results)
    restored.aggregate(3, results)
    assert torch.equal(restored.global_model, strat.global_model) and torch.equal(restored.personal, strat.personal)
    assert restored.diagnostics() == strat.diagnostics()
