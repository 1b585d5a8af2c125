"""MaTFL: soft-grouping weights and th, hard grouping, known-answer aggregation, state."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from morlfed.baselines.matfl import MaTFL, average_linkage_groups, group_mean_weights, soft_grouping_weights
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult
from morlfed.strategies.base import make_strategy
from morlfed.strategies.similarity import cosine_matrix

LAYOUT = ParamLayout.from_shapes({"l0": (5, 3), "l1": (5,)})
D = LAYOUT.dim


def _setup(strategy: MaTFL, n: int, seed: int = 0) -> MaTFL:
    strategy.setup(n, torch.zeros(D), LAYOUT, np.random.default_rng(seed))
    return strategy


def _results(params: torch.Tensor, cids=None) -> dict[int, FitResult]:
    cids = range(len(params)) if cids is None else cids
    return {c: FitResult(params=p, num_samples=10) for c, p in zip(cids, params)}


def _random(n: int, seed: int) -> torch.Tensor:
    return torch.tensor(np.random.default_rng(seed).normal(size=(n, D)), dtype=torch.float32)


def test_invalid_hyper_parameters_are_rejected():
    with pytest.raises(ValueError, match="mode must be one of soft-grouping, grouping"):
        MaTFL(mode="soft")
    with pytest.raises(ValueError, match="th must be >= -1"):
        MaTFL(th=-1.5)
    with pytest.raises(ValueError, match="cluster_num must be an integer >= 1"):
        MaTFL(mode="grouping", cluster_num=0)
    with pytest.raises(ValueError, match="cluster_num must be an integer >= 1"):
        MaTFL(mode="grouping", cluster_num=1.5)
    with pytest.raises(ValueError, match=r"cluster_num \(4\) must be <= the number of clients \(3\)"):
        MaTFL(mode="grouping", cluster_num=4).validate(3)
    MaTFL(mode="soft-grouping", cluster_num=4).validate(3)  # unused in soft-grouping mode


def test_config_defaults_are_the_reference_values():
    strategy = make_strategy("matfl")
    assert (strategy.mode, strategy.th, strategy.cluster_num) == ("soft-grouping", 0.0, 2)


def test_known_answer_soft_grouping_round():
    trained = _random(5, seed=1)
    th = 0.3
    # independent computation in numpy, following the reference code's steps
    x = trained.double().numpy()
    delta = x - x.mean(axis=0)
    unit = delta / np.linalg.norm(delta, axis=1, keepdims=True)
    scores = np.maximum(unit @ unit.T + th, 0.0)
    expected = (scores / scores.sum(axis=1, keepdims=True)) @ x
    strategy = _setup(MaTFL(th=th), 5)
    strategy.aggregate(1, _results(trained))
    np.testing.assert_allclose(strategy.models.numpy(), expected, atol=1e-5)
    weights = np.array(strategy.diagnostics()["weights"])
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-6)
    assert (weights >= 0).all()


@pytest.mark.parametrize("th", [-1.0, -0.5, 0.0, 0.4, 1.0, 3.0])
def test_weights_are_row_normalised_and_non_negative(th):
    cosine = cosine_matrix(_random(7, seed=2))
    w = soft_grouping_weights(cosine, th)
    torch.testing.assert_close(w.sum(dim=1), torch.ones(7))
    assert bool((w >= 0).all())


@pytest.mark.parametrize("th", [-0.5, 0.0, 0.5])
def test_a_pair_contributes_exactly_when_its_cosine_exceeds_minus_th(th):
    cosine = cosine_matrix(_random(8, seed=3))
    w = soft_grouping_weights(cosine, th)
    assert torch.equal(w > 0, cosine > -th)


def test_th_one_weights_are_proportional_to_one_plus_cosine():
    cosine = cosine_matrix(_random(6, seed=4))
    w = soft_grouping_weights(cosine, 1.0)
    torch.testing.assert_close(w, (1 + cosine) / (1 + cosine).sum(dim=1, keepdim=True))
    assert bool((w[cosine < 0] > 0).all())  # negative cosines contribute too, only -1 would not


def test_th_minus_one_keeps_each_clients_own_model():
    trained = _random(4, seed=5)
    strategy = _setup(MaTFL(th=-1.0), 4)
    strategy.aggregate(1, _results(trained))
    torch.testing.assert_close(strategy.models, trained)


def test_large_th_tends_to_the_plain_mean():
    trained = _random(4, seed=6)
    strategy = _setup(MaTFL(th=1e6), 4)
    strategy.aggregate(1, _results(trained))
    torch.testing.assert_close(strategy.models, trained.mean(dim=0).expand(4, D), atol=1e-4, rtol=0)


def test_opposite_deviations_do_not_mix_at_th_zero():
    base = _random(1, seed=7)[0]
    direction = _random(1, seed=8)[0]
    trained = torch.stack([base + direction, base + 1.1 * direction, base - direction, base - 1.1 * direction])
    strategy = _setup(MaTFL(th=0.0), 4)
    strategy.aggregate(1, _results(trained))
    torch.testing.assert_close(strategy.models[0], trained[:2].mean(dim=0))
    torch.testing.assert_close(strategy.models[2], trained[2:].mean(dim=0))


def test_a_run_in_which_no_client_mixed_warns_that_matfl_ran_as_local_training():
    base = _random(1, seed=7)[0]
    u, v = _random(2, seed=8)
    v = v - (v @ u) / (u @ u) * u  # orthogonal to u, then scaled to its norm
    v = v * u.norm() / v.norm()
    angles = torch.tensor([0.0, 2.0, 4.0]) * torch.pi / 3  # deviations 120 degrees apart: cosines -0.5
    trained = base + torch.cos(angles)[:, None] * u + torch.sin(angles)[:, None] * v
    strategy = _setup(MaTFL(th=0.0), 3)
    assert strategy.inert_warning() is None  # nothing aggregated yet
    for round in (1, 2):
        strategy.aggregate(round, _results(trained))
        torch.testing.assert_close(strategy.models, trained)
    warning = strategy.inert_warning()
    assert warning is not None and "all 2 aggregations" in warning and "local training" in warning
    # th = 0.6 admits cosines above -0.6: every client mixes, so the method was not inert
    mixing = _setup(MaTFL(th=0.6), 3)
    mixing.aggregate(1, _results(trained))
    assert mixing.inert_warning() is None
    # one round with two similar clients is enough to clear the warning
    strategy.aggregate(3, _results(torch.stack([base + u, base + 1.1 * u, base - u])))
    assert strategy.inert_warning() is None
    # hard groups of one client each are local training too
    grouping = _setup(MaTFL(mode="grouping", cluster_num=3), 3)
    grouping.aggregate(1, _results(trained))
    assert "every group held a single client" in grouping.inert_warning()


@pytest.mark.parametrize("mode", ["soft-grouping", "grouping"])
def test_identical_clients_get_identical_models(mode):
    trained = _random(5, seed=9)
    trained[3] = trained[1]
    strategy = _setup(MaTFL(mode=mode, th=0.2, cluster_num=2), 5)
    strategy.aggregate(1, _results(trained))
    torch.testing.assert_close(strategy.model_for(1), strategy.model_for(3), rtol=0, atol=0)


def test_absent_clients_keep_their_model_and_one_participant_keeps_its_own():
    strategy = _setup(MaTFL(th=0.5), 4)
    trained = _random(4, seed=10)
    strategy.aggregate(1, _results(trained))
    before = strategy.models.clone()
    lone = _random(1, seed=11)
    strategy.aggregate(2, _results(lone, cids=[2]))  # zero deviation: nothing to mix with
    torch.testing.assert_close(strategy.models[2], lone[0])
    torch.testing.assert_close(strategy.models[[0, 1, 3]], before[[0, 1, 3]])


def test_grouping_mode_recovers_planted_groups_and_takes_group_means():
    base = _random(1, seed=12)[0]
    directions = torch.tensor(np.linalg.qr(np.random.default_rng(13).normal(size=(D, 3)))[0].T, dtype=torch.float32)
    labels = np.array([0, 1, 2, 0, 1, 2, 0])
    trained = base + 3.0 * directions[labels] + 0.05 * _random(7, seed=14)
    strategy = _setup(MaTFL(mode="grouping", cluster_num=3), 7)
    strategy.aggregate(1, _results(trained))
    groups = sorted(strategy.diagnostics()["clusters"])
    assert groups == [[0, 3, 6], [1, 4], [2, 5]]
    for group in groups:
        for cid in group:
            torch.testing.assert_close(strategy.model_for(cid), trained[group].mean(dim=0))
        assert len({strategy.model_id(c) for c in group}) == 1


def test_group_helpers():
    torch.testing.assert_close(
        group_mean_weights(np.array([0, 1, 0])), torch.tensor([[0.5, 0, 0.5], [0, 1, 0], [0.5, 0, 0.5]])
    )
    cosine = cosine_matrix(_random(3, seed=15))
    assert average_linkage_groups(cosine, 1).tolist() == [0, 0, 0]
    assert average_linkage_groups(cosine[:1, :1], 1).tolist() == [0]
    with pytest.raises(ValueError, match=r"number of groups must be in \[1, 3\]"):
        average_linkage_groups(cosine, 4)


def test_grouping_with_fewer_participants_than_groups_uses_one_group_each():
    trained = _random(2, seed=16)
    strategy = _setup(MaTFL(mode="grouping", cluster_num=3), 4)
    strategy.aggregate(1, _results(trained, cids=[0, 2]))
    torch.testing.assert_close(strategy.models[[0, 2]], trained)


def test_state_dict_round_trip_resumes_exactly():
    first = _setup(MaTFL(mode="grouping", cluster_num=2), 5, seed=1)
    first.aggregate(1, _results(_random(5, seed=17)))
    state = copy.deepcopy(first.state_dict())
    first.aggregate(2, _results(_random(5, seed=18)))
    second = _setup(MaTFL(mode="grouping", cluster_num=2), 5, seed=2)
    second.load_state_dict(state)
    second.aggregate(2, _results(_random(5, seed=18)))
    assert torch.equal(second.models, first.models) and torch.equal(second.groups, first.groups)
    assert (second.aggregations, second.mixing_rounds) == (first.aggregations, first.mixing_rounds)
    assert second.rng.bit_generator.state == first.rng.bit_generator.state
