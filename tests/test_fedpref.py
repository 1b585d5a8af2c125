"""FedPref: top-R similarity, weighted aggregation, split test, planted clusters."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult
from morlfed.strategies.base import InertSettingWarning, make_strategy
from morlfed.strategies.fedpref import FedPref, preference_weights
from morlfed.strategies.similarity import layerwise_similarity, top_r

LAYOUT = ParamLayout.from_shapes({"a.weight": (2,), "b.weight": (3,)})


def test_top_r_keeps_largest_magnitudes_per_row():
    block = torch.tensor([[3.0, -5.0, 1.0, 0.5], [0.1, 0.2, -0.3, 0.4]])
    kept = top_r(block, 0.5)  # ceil(0.5 * 4) = 2 per row
    assert torch.equal(kept, torch.tensor([[3.0, -5.0, 0.0, 0.0], [0.0, 0.0, -0.3, 0.4]]))
    assert torch.equal(top_r(block, 1.0), block)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        top_r(block, 0.0)


def test_layerwise_similarity_hand_computed():
    # layer a: [1, 0] vs [0, 1] -> cos 0; layer b: [3, 1, 1] vs [1, 1, 3] -> 7 / 11
    u = torch.tensor([[1.0, 0.0, 3.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 3.0]])
    s = layerwise_similarity(u, LAYOUT, r=1.0)
    assert s[0, 1].item() == pytest.approx((0.0 + 7 / 11) / 2, abs=1e-6)
    assert s[0, 0].item() == pytest.approx(1.0, abs=1e-6)
    # R = 1/3: layer a keeps ceil(2/3) = 1 entry, layer b ceil(1) = 1: b becomes [3,0,0] vs [0,0,3]
    s = layerwise_similarity(u, LAYOUT, r=1 / 3)
    assert s[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_r_one_equals_plain_layerwise_cosine():
    rng = np.random.default_rng(0)
    layout = ParamLayout.from_shapes({"l0": (4, 3), "l1": (3,), "l2": (2, 5)})
    u = rng.normal(size=(6, layout.dim))
    expected = np.zeros((6, 6))
    for layer in layout.layers:
        block = u[:, layer.slice]
        for i in range(6):
            for j in range(6):
                expected[i, j] += block[i] @ block[j] / (np.linalg.norm(block[i]) * np.linalg.norm(block[j]))
    expected /= len(layout.layers)
    got = layerwise_similarity(torch.tensor(u, dtype=torch.float32), layout, r=1.0).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_preference_weights_clip_and_normalise():
    s = torch.tensor([[1.0, 0.5, -0.5], [0.5, 1.0, 0.2], [-0.5, 0.2, 1.0]])
    w = preference_weights(s, s_min=0.0)
    torch.testing.assert_close(w.sum(dim=1), torch.ones(3))
    assert w[0, 2] == 0 and w[2, 0] == 0  # below s_min: no weight
    torch.testing.assert_close(w[0], torch.tensor([1.0, 0.5, 0.0]) / 1.5)
    w = preference_weights(s, s_min=-1.0)  # (s + 1) / 2 before normalising
    torch.testing.assert_close(w[0], torch.tensor([1.0, 0.75, 0.25]) / 2.0)


def _results(params: torch.Tensor) -> dict[int, FitResult]:
    return {i: FitResult(params=p, num_samples=10) for i, p in enumerate(params)}


def _setup(strategy: FedPref, n: int, layout: ParamLayout, seed: int = 0) -> None:
    strategy.setup(n, torch.zeros(layout.dim), layout, np.random.default_rng(seed))


def test_identical_clients_stay_identical_and_rows_sum_to_one():
    rng = np.random.default_rng(1)
    layout = ParamLayout.from_shapes({"w": (8,), "b": (2,)})
    params = torch.tensor(rng.normal(size=(4, layout.dim)), dtype=torch.float32)
    params[1] = params[0]
    strat = FedPref(top_r=0.5, s_min=-0.5, eps=0.0, patience=1)
    _setup(strat, 4, layout)
    strat.aggregate(1, _results(params))
    torch.testing.assert_close(strat.model_for(0), strat.model_for(1))
    # each new model is a convex combination: it lies in the span and the weights sum to 1
    sim = layerwise_similarity(params, layout, 0.5)
    torch.testing.assert_close(strat.models, preference_weights(sim, -0.5) @ params)
    assert strat.clusters == [[0, 1, 2, 3]]  # eps = 0: never below, never split


def _planted(n_per_group: int, n_groups: int, dim: int, rng: np.random.Generator):
    basis = np.linalg.qr(rng.normal(size=(dim, n_groups)))[0].T  # orthonormal directions
    labels = np.repeat(np.arange(n_groups), n_per_group)
    return basis, labels


def test_planted_clusters_are_recovered_and_never_mixed():
    rng = np.random.default_rng(7)
    layout = ParamLayout.from_shapes({"l0": (16, 4), "l1": (16,), "l2": (4, 4)})
    basis, labels = _planted(4, 3, layout.dim, rng)
    n = len(labels)
    strat = FedPref(top_r=0.5, s_min=0.0, eps=5.0, patience=1)
    _setup(strat, n, layout)
    for rnd in range(1, 7):
        steps = basis[labels] + 0.2 * rng.normal(size=(n, layout.dim))
        trained = strat.models + torch.tensor(steps, dtype=torch.float32)
        strat.aggregate(rnd, _results(trained))
        for cluster in strat.clusters:
            assert len(set(labels[cluster])) == 1 or len(cluster) == n or _only_merged_groups(cluster, labels)
    for cluster in strat.clusters:
        assert len(set(labels[cluster])) == 1, f"cluster {cluster} mixes groups {labels[cluster]}"
    assert len(strat.clusters) >= 3
    assert sorted(c for cl in strat.clusters for c in cl) == list(range(n))


def _only_merged_groups(cluster: list[int], labels: np.ndarray) -> bool:
    """A cluster may hold several whole groups on the way down, never part of one with another."""
    groups = set(labels[cluster])
    return all(set(np.flatnonzero(labels == g)) <= set(cluster) for g in groups)


def test_split_fires_only_after_patience_rounds():
    rng = np.random.default_rng(3)
    layout = ParamLayout.from_shapes({"w": (12,)})
    basis, labels = _planted(3, 2, layout.dim, rng)
    strat = FedPref(top_r=1.0, s_min=0.0, eps=1e6, patience=3)
    _setup(strat, 6, layout)
    for rnd in (1, 2, 3):
        trained = strat.models + torch.tensor(basis[labels], dtype=torch.float32)
        strat.aggregate(rnd, _results(trained))
        assert len(strat.clusters) == (1 if rnd < 3 else 2)
    assert sorted(sorted(labels[c].tolist()) for c in strat.clusters) == [[0, 0, 0], [1, 1, 1]]


def _planted_norms(strat: FedPref, norms: list[float]) -> list[int]:
    """Aggregate one round per norm on 4 clients whose cluster-mean update has exactly that norm.

    The norm is on layer "a", while clients 0-1 and 2-3 move apart along layer "b" (mean zero): the
    sides a split must find. Returns the number of clusters after each round.
    """
    counts = []
    for rnd, norm in enumerate(norms, start=1):
        shared = torch.tensor([norm, 0.0, 0.0, 0.0, 0.0])
        apart = torch.tensor([0.0, 0.0, 0.0, 0.0, 50.0])
        trained = torch.stack([strat.refs[0] + shared + sign * apart for sign in (1.0, 1.0, -1.0, -1.0)])
        strat.aggregate(rnd, _results(trained))
        counts.append(len(strat.clusters))
    return counts


@pytest.mark.parametrize(
    "norms, relative_counts, absolute_counts",
    [
        # large updates that shrink: a fraction of the largest one is crossed (0.6 x 10 = 6 > 5, 4),
        # the absolute eps = 1 never is
        ([10.0, 5.0, 4.0], [1, 1, 2], [1, 1, 1]),
        # small updates throughout: below eps = 1 from round 1, never below 0.6 x the largest (0.5)
        ([0.5, 0.45, 0.4], [1, 1, 1], [1, 2, 2]),
    ],
)
def test_relative_eps_splits_on_the_largest_norm_seen_where_absolute_does_not(norms, relative_counts, absolute_counts):
    relative = FedPref(top_r=1.0, s_min=0.0, eps=0.6, patience=2, eps_mode="relative")
    absolute = FedPref(top_r=1.0, s_min=0.0, eps=1.0, patience=2, eps_mode="absolute")
    for strat, expected in ((relative, relative_counts), (absolute, absolute_counts)):
        _setup(strat, 4, LAYOUT)
        assert _planted_norms(strat, norms) == expected
        split_round = expected.index(2) + 1 if 2 in expected else None
        events = strat.split_events()
        if split_round is None:
            assert events == []
        else:  # the split is recorded: its round, its sides (the planted pairs) and their sizes
            (event,) = events
            assert (event["round"], event["sizes"]) == (split_round, [2, 2])
            assert sorted(event["sides"]) == [[0, 1], [2, 3]]
    # the relative threshold is eps times the largest cluster-mean update norm so far
    assert relative.diagnostics()["threshold"] == pytest.approx(0.6 * max(norms), rel=1e-6)
    assert relative.diagnostics()["update_norms"] == [pytest.approx(norms[-1], rel=1e-6)]
    assert absolute.diagnostics()["threshold"] == 1.0


@pytest.mark.parametrize("eps_mode", ["relative", "absolute"])
def test_a_run_that_never_split_says_it_was_the_weighting_only_ablation_and_which_eps_would_have_split(eps_mode):
    # norms 10, 5, 4, 6: ratios to the largest seen 1, 0.5, 0.4, 0.6; with patience 2 the lowest pair of
    # consecutive rounds is (0.5, 0.4), so eps above 0.5 (relative) or 5 (absolute) splits at round 3
    norms, scale = [10.0, 5.0, 4.0, 6.0], (1.0 if eps_mode == "relative" else 10.0)
    strat = FedPref(top_r=1.0, s_min=0.0, eps=0.3 * scale, patience=2, eps_mode=eps_mode)
    _setup(strat, 4, LAYOUT)
    assert _planted_norms(strat, norms) == [1, 1, 1, 1] and strat.split_events() == []
    warning = strat.inert_warning() or ""
    assert warning.startswith("fedpref: no cluster split, so this run was FedPref's weighting-only ablation")
    assert "smallest ratio of that norm to the largest seen was 0.4 (round 3)" in warning
    assert f"eps above {0.5 * scale:.3g} (eps_mode={eps_mode}) would have split at round 3" in warning
    # the eps it names is the boundary: just above splits at round 3, just below never does
    above = FedPref(top_r=1.0, s_min=0.0, eps=0.501 * scale, patience=2, eps_mode=eps_mode)
    below = FedPref(top_r=1.0, s_min=0.0, eps=0.499 * scale, patience=2, eps_mode=eps_mode)
    for strat_, counts in ((above, [1, 1, 2, 2]), (below, [1, 1, 1, 1])):
        _setup(strat_, 4, LAYOUT)
        assert _planted_norms(strat_, norms)[:3] == counts[:3]
    assert above.inert_warning() is None and below.inert_warning() is not None
    # the record survives a checkpoint; a checkpoint from before it cannot tell, so says nothing
    clone = FedPref(top_r=1.0, s_min=0.0, eps=0.3 * scale, patience=2, eps_mode=eps_mode)
    _setup(clone, 4, LAYOUT)
    clone.load_state_dict(strat.state_dict())
    assert clone.inert_warning() == warning
    clone.load_state_dict({k: v for k, v in strat.state_dict().items() if k != "unsplit_norms"})
    assert clone.inert_warning() is None


def test_the_clustering_only_ablation_that_never_split_says_it_aggregated_as_fedavg():
    strat = FedPref(top_r=1.0, s_min=0.0, eps=0.3, patience=2, weighting=False)
    _setup(strat, 4, LAYOUT)
    assert _planted_norms(strat, [10.0, 5.0, 4.0, 6.0]) == [1, 1, 1, 1]
    warning = strat.inert_warning() or ""
    assert warning.startswith(
        "fedpref: no cluster split, so this run was the clustering-only ablation with one cluster"
    )
    assert "FedAvg's plain mean" in warning
    assert "weighting-only" not in warning and "eps above 0.5 (eps_mode=relative) would have split" in warning


def test_no_inert_warning_for_the_weighting_only_ablation_or_a_run_shorter_than_the_patience():
    ablation = FedPref(top_r=1.0, s_min=0.0, eps=0.3, patience=2, clustering=False)
    _setup(ablation, 4, LAYOUT)
    _planted_norms(ablation, [10.0, 5.0, 4.0])
    assert ablation.inert_warning() is None  # no split by choice: nothing to warn about
    short = FedPref(top_r=1.0, s_min=0.0, eps=0.3, patience=3)
    _setup(short, 4, LAYOUT)
    _planted_norms(short, [10.0, 1.0])
    assert "2 round(s) aggregated, fewer than the patience (3)" in (short.inert_warning() or "")


def test_config_takes_the_searched_relative_threshold_by_default_and_the_absolute_one_on_request():
    default = make_strategy("fedpref")
    assert (default.eps, default.patience, default.eps_mode) == (0.1, 2, "relative")
    assert make_strategy("fedpref", eps=1.0, eps_mode="absolute").eps_mode == "absolute"


def test_split_events_survive_a_checkpoint_and_an_old_one_records_none():
    strat = FedPref(top_r=1.0, eps=0.6, patience=2, eps_mode="relative")
    _setup(strat, 4, LAYOUT)
    _planted_norms(strat, [10.0, 5.0, 4.0])
    state = strat.state_dict()
    clone = FedPref(top_r=1.0, eps=0.6, patience=2, eps_mode="relative")
    _setup(clone, 4, LAYOUT)
    clone.load_state_dict(state)
    assert clone.split_events() == strat.split_events() and clone.threshold() == strat.threshold() == 6.0
    old = {k: v for k, v in state.items() if k not in ("splits_so_far", "largest_norm")}
    clone.load_state_dict(old)  # a checkpoint from before splits were recorded: unknown, not "none"
    assert clone.split_events() is None


def test_ablation_switches():
    rng = np.random.default_rng(4)
    layout = ParamLayout.from_shapes({"w": (12,)})
    basis, labels = _planted(3, 2, layout.dim, rng)
    trained = torch.tensor(basis[labels], dtype=torch.float32)
    no_clustering = FedPref(top_r=1.0, s_min=0.0, eps=1e6, patience=1, clustering=False, eps_mode="absolute")
    _setup(no_clustering, 6, layout)
    no_clustering.aggregate(1, _results(trained))
    assert no_clustering.clusters == [list(range(6))]
    no_weighting = FedPref(top_r=1.0, s_min=0.0, eps=0.0, weighting=False, eps_mode="absolute")
    _setup(no_weighting, 6, layout)
    no_weighting.aggregate(1, _results(trained))
    torch.testing.assert_close(no_weighting.models, trained.mean(dim=0).expand(6, -1))


def test_absent_members_follow_their_nearest_side_and_state_round_trips():
    rng = np.random.default_rng(5)
    layout = ParamLayout.from_shapes({"w": (10,)})
    basis, labels = _planted(3, 2, layout.dim, rng)
    strat = FedPref(top_r=1.0, s_min=0.0, eps=1e6, patience=1, eps_mode="absolute")
    _setup(strat, 6, layout)
    strat.models = torch.tensor(basis[labels], dtype=torch.float32)
    trained = strat.models * 2
    results = {c: r for c, r in _results(trained).items() if c not in (0, 3)}
    strat.aggregate(1, results)
    assert sorted(sorted(labels[c].tolist()) for c in strat.clusters) == [[0, 0, 0], [1, 1, 1]]
    clone = FedPref()
    _setup(clone, 6, layout)
    clone.load_state_dict(strat.state_dict())
    assert clone.clusters == strat.clusters and torch.equal(clone.models, strat.models)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"top_r": 0}, "top_r"),
        ({"s_min": 1.0}, "s_min"),
        ({"patience": 0}, "patience"),
        ({"eps": -1}, "eps"),
        ({"eps_mode": "max"}, "eps_mode must be one of absolute, relative"),
    ],
)
def test_invalid_hyper_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedPref(**kwargs)


def test_a_patience_longer_than_the_run_warns_that_clustering_is_inert():
    with pytest.warns(InertSettingWarning, match=r"patience \(3\) exceeds the number of aggregated rounds \(2\)"):
        FedPref(patience=3).validate(10, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FedPref(patience=2).validate(10, 2)  # the last round may split
        FedPref(patience=3, clustering=False).validate(10, 2)  # nothing to switch off
        FedPref(patience=3).validate(10)  # rounds unknown


def test_param_layout_round_trip():
    layout = ParamLayout.from_shapes({"x": (2, 3), "y": (4,)}, head=["y"])
    vec = torch.arange(layout.dim, dtype=torch.float32)
    parts = layout.unflatten(vec)
    assert parts["x"].shape == (2, 3) and torch.equal(layout.flatten(parts), vec)
    assert layout.head_mask().sum().item() == 4 and math.prod((2, 3)) == layout.layers[0].size
    assert ParamLayout.from_dict(layout.to_dict()) == layout
