"""Vision partitions: every sample used once, label skew, k classes per client, determinism, clear errors.

Every sample is used exactly once, label skew follows alpha, exactly k classes per client,
determinism by seed, and clear errors for impossible partitions.
"""

from __future__ import annotations

import numpy as np
import pytest

from morlfed.core.seeding import generator
from morlfed.tasks.vision.partition import PartitionError, make_partition

# 10 classes of 100 samples each, shuffled.
LABELS = np.random.default_rng(7).permutation(np.repeat(np.arange(10), 100))


def all_indices(partition) -> np.ndarray:
    return np.concatenate([*partition.train, *partition.test])


@pytest.mark.parametrize(
    "name, options", [("dirichlet", {"alpha": 0.5}), ("pathological", {"classes_per_client": 2}), ("iid", {})]
)
def test_every_sample_is_used_exactly_once(name, options):
    part = make_partition(name, LABELS, 20, generator(0, "partition"), **options)
    used = all_indices(part)
    assert len(used) == len(LABELS) and np.array_equal(np.sort(used), np.arange(len(LABELS)))
    for train, test in zip(part.train, part.test):
        assert len(train) >= 1 and len(test) >= 1 and not set(train) & set(test)
        share = len(test) / (len(train) + len(test))
        assert abs(share - 0.25) <= 1 / (len(train) + len(test))  # test_fraction, rounded up
    hist = part.histogram(LABELS, 10)
    assert hist.shape == (20, 10) and np.array_equal(hist.sum(axis=0), np.full(10, 100))
    assert np.array_equal(hist, part.histogram(LABELS, 10, "train") + part.histogram(LABELS, 10, "test"))


def dominant_share(labels: np.ndarray, alpha: float, seed: int) -> float:
    """Mean over clients of the share of a client's samples in its most frequent class."""
    hist = make_partition("dirichlet", labels, 10, generator(seed, "partition"), alpha=alpha, min_samples=2).histogram(
        labels, 10
    )
    return float(np.mean(hist.max(axis=1) / hist.sum(axis=1)))


def test_small_alpha_skews_the_label_histograms():
    skewed = np.mean([dominant_share(LABELS, 0.05, s) for s in range(5)])
    mild = np.mean([dominant_share(LABELS, 100.0, s) for s in range(5)])
    iid = make_partition("iid", LABELS, 10, generator(0, "partition")).histogram(LABELS, 10)
    assert skewed > 0.6  # most of a client's data is one class
    assert mild < 0.2 and np.mean(iid.max(axis=1) / iid.sum(axis=1)) < 0.2  # close to the uniform 0.1


@pytest.mark.parametrize("n_clients, k", [(20, 2), (7, 3), (10, 1), (3, 10)])
def test_pathological_gives_exactly_k_classes_spread_evenly(n_clients, k):
    part = make_partition(
        "pathological", LABELS, n_clients, generator(1, "partition"), classes_per_client=k, min_samples=2
    )
    hist = part.histogram(LABELS, 10)
    assert ((hist > 0).sum(axis=1) == k).all()
    holders = (hist > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1 and holders.sum() == n_clients * k
    assert len(all_indices(part)) == len(LABELS)  # n k >= C: every class used
    # a class's samples are split evenly among its holders
    for c in range(10):
        counts = hist[hist[:, c] > 0, c]
        assert counts.max() - counts.min() <= 1


def test_pathological_with_fewer_slots_than_classes_leaves_classes_out():
    part = make_partition("pathological", LABELS, 3, generator(2, "partition"), classes_per_client=2)
    hist = part.histogram(LABELS, 10)
    assert ((hist > 0).sum(axis=1) == 2).all() and (hist.sum(axis=0) > 0).sum() == 6
    assert len(np.unique(all_indices(part))) == len(all_indices(part)) == 600


@pytest.mark.parametrize(
    "name, options", [("dirichlet", {"alpha": 0.3}), ("pathological", {"classes_per_client": 3}), ("iid", {})]
)
def test_partition_is_determined_by_the_seed(name, options):
    a, b, c = (make_partition(name, LABELS, 8, generator(s, "partition"), **options) for s in (5, 5, 6))
    assert all(np.array_equal(x, y) for x, y in zip(a.train + a.test, b.train + b.test))
    assert not all(np.array_equal(x, y) for x, y in zip(a.train + a.test, c.train + c.test))


def test_dirichlet_gives_every_client_min_samples_or_a_clear_error():
    part = make_partition(
        "dirichlet", LABELS, 20, generator(3, "partition"), alpha=0.5, min_samples=25, max_retries=200
    )
    assert min(len(tr) + len(te) for tr, te in zip(part.train, part.test)) >= 25  # a draw succeeds ~15% of the time
    with pytest.raises(PartitionError, match=r"no draw in 3 attempts .* raise partition.alpha, lower data.min_samples"):
        make_partition("dirichlet", LABELS, 100, generator(3, "partition"), alpha=0.01, min_samples=10, max_retries=3)


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        (
            "dirichlet",
            {"n_clients": 200},
            r"200 clients x data.min_samples=10 = 2000 samples, but the dataset has only 1000",
        ),
        ("iid", {"n_clients": 101}, r"but the dataset has only 1000"),
        (
            "pathological",
            {"n_clients": 10, "classes_per_client": 11},
            r"classes_per_client must be an integer in \[1, 10\]",
        ),
        (
            "pathological",
            {"n_clients": 15, "classes_per_client": 1, "min_samples": 60},
            r"a client got only 50 samples, fewer than data.min_samples=60",
        ),
        ("dirichlet", {"n_clients": 5, "alpha": 0.0}, r"alpha must be a finite number > 0"),
        ("dirichlet", {"n_clients": 5, "beta": 1.0}, r"unknown option\(s\) \['beta'\]"),
        ("iid", {"n_clients": 5, "test_fraction": 1.0}, r"test_fraction must be in \(0, 1\)"),
        ("iid", {"n_clients": 5, "min_samples": 1}, r"min_samples must be an integer >= 2"),
        (
            "equidistant",
            {"n_clients": 5},
            r"unknown partition 'equidistant'; task=vision partitions data with: dirichlet, pathological, iid",
        ),
    ],
)
def test_impossible_or_bad_partitions_raise_a_specific_error(name, kwargs, message):
    kwargs = dict(kwargs)
    n = kwargs.pop("n_clients")
    with pytest.raises(PartitionError, match=message):
        make_partition(name, LABELS, n, generator(0, "partition"), **kwargs)


def test_pathological_class_with_fewer_samples_than_holders_is_an_error():
    labels = np.array([0] * 2 + [1] * 100)
    with pytest.raises(
        PartitionError, match=r"class\(es\) \[0\] have fewer samples than the clients that must hold them"
    ):
        make_partition("pathological", labels, 10, generator(0, "partition"), classes_per_client=1, min_samples=2)
