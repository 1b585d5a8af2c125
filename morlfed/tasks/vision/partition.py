"""Label-skewed federated partitions of a dataset (``partition=`` for ``task=vision``).

* ``dirichlet`` (``partition.alpha``): for every class, the proportions of its samples that go to the n
  clients are drawn from ``Dirichlet(alpha * ones(n))`` (Hsu et al., 2019); small alpha gives each
  client few dominant classes. A draw that leaves some client with fewer than ``min_samples``
  samples is redrawn, at most ``max_retries`` times, then a :class:`PartitionError` says what to
  change.
* ``pathological`` (``dist.classes_per_client``, k): every client holds exactly k distinct
  classes, every class is held by ``floor(n k / C)`` or ``ceil(n k / C)`` clients (the classes
  with one holder more are drawn at random), and a class's samples are split evenly among its
  holders. With ``n k < C`` only ``n k`` classes are used and the other classes' samples are
  left out (the FedFew paper's CIFAR-100, 2 classes per client, 10 or 20 clients).
* ``iid``: a random permutation cut into n near-equal shares.

Every client then splits its share into local train and test data
(``sklearn.model_selection.train_test_split``, ``test_fraction`` of it for testing). Every sample
of the used classes lands in exactly one client's train or test data. All randomness comes from
the generator passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

#: Names ``partition=`` accepts for ``task=vision``.
PARTITIONS: tuple[str, ...] = ("dirichlet", "pathological", "iid")


class PartitionError(ValueError):
    """A partition that cannot be made as configured; the message says what to change."""


@dataclass(frozen=True)
class Partition:
    """Each client's local train and test sample indices (sorted int64 arrays).

    :param train: per client, its training indices
    :param test: per client, its test indices
    """

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]

    @property
    def n_clients(self) -> int:
        """Number of clients."""
        return len(self.train)

    def histogram(self, labels: np.ndarray, n_classes: int, split: str = "all") -> np.ndarray:
        """``[n_clients, n_classes]`` label counts of each client's ``train``, ``test`` or ``all`` samples.

        ``all`` counts train and test samples together.
        """
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be train, test or all, got {split!r}")
        labels = np.asarray(labels)
        parts = {
            "train": self.train,
            "test": self.test,
            "all": [np.concatenate(p) for p in zip(self.train, self.test)],
        }[split]
        return np.stack([np.bincount(labels[idx], minlength=n_classes) for idx in parts])


def dirichlet_shares(
    labels: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator, min_samples: int, max_retries: int
) -> list[np.ndarray]:
    """Dirichlet label skew: per class, proportions ``~ Dirichlet(alpha * ones(n_clients))``.

    :param labels: ``[N]`` integer labels
    :param alpha: concentration, > 0 (small: strong skew)
    :param min_samples: the fewest samples any client may get
    :param max_retries: draws attempted before giving up, >= 1
    :raises PartitionError: when no draw within ``max_retries`` gives every client
        ``min_samples`` samples (or when that is impossible outright)
    """
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise PartitionError(f"dirichlet: alpha must be a finite number > 0, got {alpha!r}")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 1:
        raise PartitionError(f"dirichlet: max_retries must be an integer >= 1, got {max_retries!r}")
    _check_enough(len(labels), n_clients, min_samples)
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    smallest = 0
    for _ in range(max_retries):
        pieces: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            cuts = np.floor(np.cumsum(rng.dirichlet(np.full(n_clients, float(alpha))))[:-1] * len(idx)).astype(int)
            for client, part in enumerate(np.split(idx, cuts)):
                pieces[client].append(part)
        shares = [np.concatenate(p) for p in pieces]
        smallest = min(len(s) for s in shares)
        if smallest >= min_samples:
            return shares
    raise PartitionError(
        f"dirichlet: no draw in {max_retries} attempts (data.max_retries) gave every one of {n_clients} clients "
        f"at least data.min_samples={min_samples} of {len(labels)} samples (alpha={alpha}; the last draw's "
        f"smallest client had {smallest}); raise partition.alpha, lower data.min_samples, use fewer clients "
        f"or raise data.max_retries"
    )


def pathological_shares(
    labels: np.ndarray, n_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Exactly ``classes_per_client`` (k) distinct classes per client, classes spread evenly.

    Holders are assigned client by client, each taking the k classes that still need the most
    holders (ties broken at random); with capacities ``floor``/``ceil(n k / C)`` this always
    succeeds. A class's shuffled samples are then split evenly among its holders.
    """
    classes = np.unique(labels)
    n_classes = len(classes)
    k = classes_per_client
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_classes:
        raise PartitionError(
            f"pathological: classes_per_client must be an integer in [1, {n_classes}] (the number of classes), got {k!r}"
        )
    need = np.full(n_classes, n_clients * k // n_classes)
    need[rng.choice(n_classes, n_clients * k % n_classes, replace=False)] += 1
    holders: list[list[int]] = [[] for _ in range(n_classes)]
    for client in range(n_clients):
        chosen = np.argsort(-(need + 0.5 * rng.random(n_classes)), kind="stable")[:k]
        need[chosen] -= 1
        for c in chosen:
            holders[c].append(client)
    counts = np.array([int(np.sum(labels == c)) for c in classes])
    short = [int(classes[c]) for c in range(n_classes) if len(holders[c]) > counts[c]]
    if short:
        raise PartitionError(
            f"pathological: class(es) {short} have fewer samples than the clients that must hold them "
            f"({n_clients} clients x {k} classes over {n_classes} classes); use fewer clients or fewer classes_per_client"
        )
    pieces: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c, owners in enumerate(holders):
        if owners:
            for client, part in zip(
                owners, np.array_split(rng.permutation(np.flatnonzero(labels == classes[c])), len(owners))
            ):
                pieces[client].append(part)
    return [np.concatenate(p) for p in pieces]


def iid_shares(n_samples: int, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation of ``0..n_samples-1`` cut into ``n_clients`` near-equal shares."""
    return np.array_split(rng.permutation(n_samples), n_clients)


def split_train_test(shares: list[np.ndarray], test_fraction: float, rng: np.random.Generator) -> Partition:
    """Split every client's share into train and test indices.

    ``test_fraction`` of each share, rounded up, is for testing; at least one sample each.
    """
    train, test = [], []
    for share in shares:
        tr, te = train_test_split(
            np.sort(share), test_size=test_fraction, shuffle=True, random_state=int(rng.integers(2**31 - 1))
        )
        train.append(np.sort(tr).astype(np.int64))
        test.append(np.sort(te).astype(np.int64))
    return Partition(tuple(train), tuple(test))


def make_partition(
    name: str,
    labels: np.ndarray,
    n_clients: int,
    rng: np.random.Generator,
    *,
    test_fraction: float = 0.25,
    min_samples: int = 10,
    max_retries: int = 100,
    **options: Any,
) -> Partition:
    """Partition ``labels`` over ``n_clients`` clients with partition ``name``, then split each share.

    Every client's share is split into train and test data.

    :param name: one of :data:`PARTITIONS`
    :param labels: ``[N]`` integer labels of the pooled dataset
    :param rng: the partition's generator
    :param test_fraction: share of each client's samples held out for its local test data, in (0, 1)
    :param min_samples: the fewest samples (train + test) a client may hold, >= 2
    :param max_retries: Dirichlet redraws before giving up
    :param options: the partition's own options: ``alpha`` (dirichlet), ``classes_per_client``
        (pathological)
    :raises PartitionError: for an unknown name or option, a bad value, or an impossible partition
    """
    labels = np.asarray(labels)
    if name not in PARTITIONS:
        raise PartitionError(f"unknown partition {name!r}; task=vision partitions data with: {', '.join(PARTITIONS)}")
    allowed = {"dirichlet": {"alpha"}, "pathological": {"classes_per_client"}, "iid": set()}[name]
    unknown = set(options) - allowed
    if unknown:
        raise PartitionError(f"{name}: unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed) or 'none'}")
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise PartitionError(f"n_clients must be a positive integer, got {n_clients!r}")
    if not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
        raise PartitionError(f"data.test_fraction must be in (0, 1), got {test_fraction!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise PartitionError(
            f"data.min_samples must be an integer >= 2 (a client needs a train and a test sample), got {min_samples!r}"
        )
    if name == "dirichlet":
        shares = dirichlet_shares(labels, n_clients, options.get("alpha", 1.0), rng, min_samples, max_retries)
    else:
        _check_enough(len(labels), n_clients, min_samples)
        if name == "pathological":
            shares = pathological_shares(labels, n_clients, options.get("classes_per_client", 2), rng)
        else:
            shares = iid_shares(len(labels), n_clients, rng)
        smallest = min(len(s) for s in shares)
        if smallest < min_samples:
            raise PartitionError(
                f"{name}: a client got only {smallest} samples, fewer than data.min_samples={min_samples}; "
                "use fewer clients or a larger dataset"
            )
    return split_train_test(shares, float(test_fraction), rng)


def _check_enough(n_samples: int, n_clients: int, min_samples: int) -> None:
    if n_clients * min_samples > n_samples:
        raise PartitionError(
            f"{n_clients} clients x data.min_samples={min_samples} = {n_clients * min_samples} samples, "
            f"but the dataset has only {n_samples}; use fewer clients or lower data.min_samples"
        )
