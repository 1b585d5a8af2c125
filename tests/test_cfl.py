"""CFL: split criterion, complete-linkage bipartition, planted groups, cluster-wise averaging."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from morlfed import envs
from morlfed.baselines.cfl import CFL, complete_linkage_bipartition
from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult
from morlfed.strategies.base import make_strategy

LAYOUT = ParamLayout.from_shapes({"l0": (6, 4), "l1": (6,)})
D = LAYOUT.dim


def _setup(strategy: CFL, n: int, seed: int = 0) -> CFL:
    strategy.setup(n, torch.zeros(D), LAYOUT, np.random.default_rng(seed))
    return strategy


def _orthogonal_centres(n_groups: int, scale: float, seed: int) -> torch.Tensor:
    q = np.linalg.qr(np.random.default_rng(seed).normal(size=(D, n_groups)))[0].T
    return torch.tensor(scale * q, dtype=torch.float32)


def _train(
    strategy: CFL, rnd: int, targets: torch.Tensor, rng: np.random.Generator, participants=None, noise: float = 0.02
):
    """Each participant moves from the model it received to its own optimum (plus noise)."""
    participants = range(len(targets)) if participants is None else participants
    tasks = strategy.configure(rnd, list(participants))
    results = {}
    for cid, task in tasks.items():
        step = targets[cid] - task.params + noise * torch.tensor(rng.normal(size=D), dtype=torch.float32)
        results[cid] = FitResult(params=task.params + step, num_samples=100 + cid)
    strategy.aggregate(rnd, results)
    return results


def test_invalid_hyper_parameters_are_rejected():
    with pytest.raises(ValueError, match=r"eps2 \(0.3\) must be >= eps1 \(0.4\)"):
        CFL(eps1=0.4, eps2=0.3)
    with pytest.raises(ValueError, match="eps1 must be >= 0"):
        CFL(eps1=-0.1, eps2=1.0)
    with pytest.raises(ValueError, match="eps2 must be >= 0"):
        CFL(eps1=0.0, eps2=-1.0)
    with pytest.raises(ValueError, match="warmup must be an integer >= 0"):
        CFL(warmup=-1)
    with pytest.raises(ValueError, match="warmup must be an integer >= 0"):
        CFL(warmup=2.5)


def test_config_defaults_are_the_reference_thresholds_and_a_quarter_of_the_dst_rounds_as_warmup():
    strategy = make_strategy("cfl")
    assert isinstance(strategy, CFL)
    assert (strategy.eps1, strategy.eps2, strategy.warmup) == (0.4, 1.6, 5)


def test_a_warmup_no_aggregated_round_gets_past_is_rejected():
    with pytest.raises(ValueError, match=r"warmup \(20\) must be below the number of aggregated rounds \(20\).*FedAvg"):
        CFL(warmup=20).validate(10, 20)  # the reference's warm-up at deep-sea-treasure's budget
    with pytest.raises(ValueError, match=r"set algo.warmup to at most 9"):
        CFL(warmup=10).validate(10, 10)
    CFL(warmup=19).validate(10, 20)  # round 20 may split
    CFL(warmup=20).validate(10)  # rounds unknown (setup): not checked


def test_default_config_splits_planted_clusters_at_the_default_dst_budget():
    dst = envs.get_spec("deep-sea-treasure")
    n, rounds = dst.n_clients, dst.rounds
    strategy = make_strategy("cfl")
    strategy.validate(n, rounds)
    _setup(strategy, n)
    centre = _orthogonal_centres(1, 3.0, seed=15)[0]
    labels = np.random.default_rng(16).permutation(np.repeat([0, 1], n // 2))
    targets = torch.stack([centre if g == 0 else -centre for g in labels])  # two planted clusters
    rng = np.random.default_rng(17)
    split_rounds = []
    for rnd in range(1, rounds + 1):
        _train(strategy, rnd, targets, rng)
        split_rounds += [rnd] * len(strategy.diagnostics()["splits"])
    assert split_rounds == [strategy.warmup + 1]  # the first round past the warm-up, once
    assert sorted(strategy.clusters) == sorted([list(np.flatnonzero(labels == g)) for g in (0, 1)])


def test_complete_linkage_bipartition_separates_opposite_pairs():
    sim = torch.tensor(
        [[1.0, 0.9, -0.8, -0.9], [0.9, 1.0, -0.7, -0.8], [-0.8, -0.7, 1.0, 0.95], [-0.9, -0.8, 0.95, 1.0]]
    )
    labels = complete_linkage_bipartition(sim)
    assert labels[0] == labels[1] and labels[2] == labels[3] and labels[0] != labels[2]
    with pytest.raises(ValueError, match="at least 2"):
        complete_linkage_bipartition(torch.ones(1, 1))


def test_every_member_adds_the_unweighted_mean_update():
    strategy = _setup(CFL(warmup=100), 4)
    start = strategy.model_for(0)
    rng = np.random.default_rng(0)
    trained = torch.tensor(rng.normal(size=(3, D)), dtype=torch.float32)
    strategy.aggregate(1, {c: FitResult(params=trained[c], num_samples=[1, 10, 1000][c]) for c in range(3)})
    expected = start + (trained - start).mean(dim=0)  # sample counts play no role
    for cid in range(4):  # client 3 did not take part and still gets its cluster's model
        torch.testing.assert_close(strategy.model_for(cid), expected)


def test_no_split_before_warmup_then_split_along_planted_opposite_groups():
    centre = _orthogonal_centres(1, 3.0, seed=1)[0]
    targets = torch.stack([centre] * 3 + [-centre] * 3)  # two groups, opposite optima
    strategy = _setup(CFL(eps1=0.4, eps2=1.6, warmup=4), 6)
    rng = np.random.default_rng(2)
    for rnd in range(1, 5):
        _train(strategy, rnd, targets, rng)
        check = strategy.diagnostics()["checks"][0]
        assert check["mean_norm"] < 0.4 and check["max_norm"] > 1.6  # criterion met, but warm-up
        assert strategy.clusters == [[0, 1, 2, 3, 4, 5]] and not check["split"]
    _train(strategy, 5, targets, rng)
    assert sorted(strategy.clusters) == [[0, 1, 2], [3, 4, 5]]
    splits = strategy.diagnostics()["splits"]
    assert len(splits) == 1 and sorted(splits[0]) == [[0, 1, 2], [3, 4, 5]]
    (event,) = strategy.split_events()  # the run's record of its splits (metrics.json)
    assert (event["round"], event["sizes"], sorted(event["sides"])) == (5, [3, 3], [[0, 1, 2], [3, 4, 5]])
    # after the split each cluster's model is its group's optimum (up to noise)
    torch.testing.assert_close(strategy.model_for(0), centre, atol=0.1, rtol=0)
    torch.testing.assert_close(strategy.model_for(5), -centre, atol=0.1, rtol=0)
    assert strategy.model_id(0) != strategy.model_id(3)


def test_no_split_while_the_mean_update_is_large():
    centres = _orthogonal_centres(2, 3.0, seed=3)
    # two groups moving to different optima, both far from the model: mean update norm is large
    targets = torch.stack([centres[0]] * 3 + [centres[1]] * 3) + 20.0 * centres[0]
    strategy = _setup(CFL(eps1=0.4, eps2=1.6, warmup=0), 6)
    rng = np.random.default_rng(4)
    _train(strategy, 1, targets, rng)
    check = strategy.diagnostics()["checks"][0]
    assert check["mean_norm"] > 0.4 and check["max_norm"] > 1.6
    assert strategy.clusters == [[0, 1, 2, 3, 4, 5]] and strategy.diagnostics()["splits"] == []


def test_a_run_that_never_split_warns_with_the_norms_that_held_it_back():
    centre = _orthogonal_centres(1, 3.0, seed=3)[0]
    targets = torch.stack([centre] * 3 + [-centre] * 3)  # incongruent groups, but eps1 = 0 never lets them split
    strategy = _setup(CFL(eps1=0.0, eps2=1.6, warmup=1), 6)
    rng = np.random.default_rng(4)
    means, maxes = [], []
    for rnd in range(1, 4):
        _train(strategy, rnd, targets, rng)
        check = strategy.diagnostics()["checks"][0]
        if rnd > 1:  # the warm-up round is not a split test
            means.append(check["mean_norm"])
            maxes.append(check["max_norm"])
    warning = strategy.inert_warning()
    assert warning is not None and "ran as FedAvg" in warning and "2 split tests" in warning
    assert f"smallest seen: {min(means):.3g}" in warning and f"largest seen: {max(maxes):.3g}" in warning
    tests = copy.deepcopy(strategy.state_dict())["tests"]  # the statistics survive a resume
    resumed = _setup(CFL(eps1=0.0, eps2=1.6, warmup=1), 6)
    resumed.load_state_dict(strategy.state_dict())
    assert resumed.tests == tests and resumed.inert_warning() == warning


def test_a_run_inside_its_warmup_warns_that_no_split_test_ran_and_a_split_run_does_not_warn():
    centre = _orthogonal_centres(1, 3.0, seed=1)[0]
    targets = torch.stack([centre] * 3 + [-centre] * 3)
    strategy = _setup(CFL(warmup=4), 6)
    rng = np.random.default_rng(2)
    for rnd in range(1, 5):
        _train(strategy, rnd, targets, rng)
    assert "no round past the warm-up (algo.warmup=4)" in (strategy.inert_warning() or "")
    _train(strategy, 5, targets, rng)  # splits (test_no_split_before_warmup_then_split_along_planted_opposite_groups)
    assert len(strategy.clusters) == 2 and strategy.inert_warning() is None


def test_no_split_when_every_update_is_small():
    centre = _orthogonal_centres(1, 0.5, seed=5)[0]
    targets = torch.stack([centre] * 3 + [-centre] * 3)  # incongruent, but max norm 0.5 < eps2
    strategy = _setup(CFL(eps1=0.4, eps2=1.6, warmup=0), 6)
    _train(strategy, 1, targets, np.random.default_rng(6))
    assert strategy.clusters == [[0, 1, 2, 3, 4, 5]]


def test_recursive_splits_recover_three_orthogonal_groups():
    centres = _orthogonal_centres(3, 3.0, seed=7)
    labels = np.repeat(np.arange(3), 3)
    targets = centres[labels]
    strategy = _setup(CFL(eps1=0.4, eps2=1.6, warmup=1), 9)
    rng = np.random.default_rng(8)
    for rnd in range(1, 6):
        _train(strategy, rnd, targets, rng)
        for cluster in strategy.clusters:  # a group is never cut in two
            groups = set(labels[cluster])
            assert all(set(np.flatnonzero(labels == g)) <= set(cluster) for g in groups)
    assert sorted(strategy.clusters) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    for cid in range(9):
        torch.testing.assert_close(strategy.model_for(cid), centres[labels[cid]], atol=0.1, rtol=0)
    # similarities are computed per cluster, over its participants only
    assert sorted(strategy.similarity()) == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]


def test_a_cluster_of_two_is_never_split():
    centre = _orthogonal_centres(1, 3.0, seed=9)[0]
    strategy = _setup(CFL(warmup=0), 2)
    _train(strategy, 1, torch.stack([centre, -centre]), np.random.default_rng(0))
    assert strategy.clusters == [[0, 1]]


def test_absent_members_follow_their_last_update_or_the_larger_side():
    unit = _orthogonal_centres(1, 1.0, seed=11)[0]
    targets = torch.stack([3.0 * unit] * 2 + [-1.5 * unit] * 5)  # A = {0, 1}, B = {2, ..., 6}
    strategy = _setup(CFL(warmup=1), 7)
    rng = np.random.default_rng(12)
    _train(strategy, 1, targets, rng, participants=[0, 1, 2, 3, 4, 5])  # mean update ~0; 6 never takes part
    _train(strategy, 2, targets, rng, participants=[1, 2, 3])  # mean update ~0: split; A side 1, B side 2
    assert strategy.diagnostics()["checks"][0]["split"]
    # 0 follows its last update to the smaller side A; 6 (never seen) joins the larger side B
    assert sorted(strategy.clusters) == [[0, 1], [2, 3, 4, 5, 6]]
    torch.testing.assert_close(strategy.model_for(0), strategy.model_for(1))
    torch.testing.assert_close(strategy.model_for(6), strategy.model_for(2))


def test_state_dict_round_trip_resumes_exactly():
    centres = _orthogonal_centres(3, 3.0, seed=13)
    targets = centres[np.repeat(np.arange(3), 3)]
    first = _setup(CFL(warmup=1), 9, seed=5)
    rng = np.random.default_rng(14)
    _train(first, 1, targets, rng)
    _train(first, 2, targets, rng)  # first split
    state = copy.deepcopy(first.state_dict())
    rng_state = rng.bit_generator.state
    _train(first, 3, targets, rng)
    second = _setup(CFL(warmup=1), 9, seed=99)
    second.load_state_dict(state)
    rng.bit_generator.state = rng_state
    _train(second, 3, targets, rng)
    assert second.clusters == first.clusters
    for a, b in zip(second.cluster_models, first.cluster_models):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.equal(second.last_updates, first.last_updates) and torch.equal(second.seen, first.seen)
    assert second.split_events() == first.split_events() and first.split_events()[0]["round"] == 2  # the first split
    assert second.rng.bit_generator.state == first.rng.bit_generator.state
