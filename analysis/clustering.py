"""How a clustered strategy's final clusters compare with the preferences the clients hold.

For a run whose strategy logs its clusters (``clusters.jsonl``: FedPref, CFL, MaTFL's groups,
FedMHC's head groups), :func:`final_clusters` is the partition in force after the last round. With
``dist=groups`` (several clients share each of a few planted preferences) the partition a correct
clustering should find is known: :func:`planted_groups` reads it off the clients' weights (clients
with equal weights form a group), and :func:`planted_ari` scores the final clusters against it with
scikit-learn's adjusted Rand index (1: the planted groups exactly; about 0: no better than a random
partition of the same sizes; negative: worse). :func:`planted_ari_by_round` gives the same score
for the clusters in force after every round: how fast the groups come apart.
:func:`similarity_ari_by_round` asks the same of the similarity the server saw rather than of the
partition it made: whether the saved similarity matrix, clustered into as many clusters as there
are planted groups, already separates them (so that a partition lagging behind it is the split
rule's doing, not the similarity's).

:data:`CLUSTER_METRICS` registers these per-run values beside :data:`morlfed.metrics.METRICS` for
the comparison tables (:data:`TABLE_METRICS`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import adjusted_rand_score

from morlfed.analysis.runs import Run
from morlfed.metrics import METRICS, MetricInfo

#: The per-run cluster values of a summary, as the tables read them.
CLUSTER_METRICS: dict[str, MetricInfo] = {
    "final_clusters": MetricInfo(
        "Final clusters",
        False,
        False,
        "clusters in force after the last round, each a non-empty group of clients (strategies that log clusters); "
        "a count, not a score: never tested",
    ),
    "planted_ari": MetricInfo(
        "ARI with the planted groups",
        True,
        False,
        "adjusted Rand index of the final clusters against the planted preference groups (dist=groups; "
        "1: exactly the groups, about 0: chance)",
    ),
}
#: Every value a comparison table may show: the front metrics, then the cluster values.
TABLE_METRICS: dict[str, MetricInfo] = {**METRICS, **CLUSTER_METRICS}
#: Values a table shows as they are, with no better or worse: no paired test marks them.
DESCRIPTIVE: frozenset[str] = frozenset({"final_clusters"})


def planted_groups(weights: np.ndarray) -> np.ndarray:
    """Each client's planted group: clients with equal preference weights share a label.

    Labels are ``0, 1, ...`` in order of first appearance.

    :param weights: ``[n, m]`` client preferences
    """
    _, first, labels = np.unique(np.asarray(weights), axis=0, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # relabel by first appearance, not by sort order
    return order[labels.reshape(-1)]


def labels_of(clusters: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """A partition of clients ``0..n-1`` as one label per client (its cluster's index).

    :param clusters: the clusters, lists of client ids covering ``0..n-1`` exactly once
    :param n: the number of clients
    :raises ValueError: the clusters do not cover every client exactly once
    """
    labels = np.full(n, -1, dtype=np.int64)
    for k, members in enumerate(clusters):
        for cid in members:
            if not 0 <= cid < n or labels[cid] != -1:
                raise ValueError(f"clusters {list(map(list, clusters))} are not a partition of clients 0..{n - 1}")
            labels[cid] = k
    if (labels == -1).any():
        raise ValueError(
            f"clusters {list(map(list, clusters))} leave out clients {np.flatnonzero(labels == -1).tolist()}"
        )
    return labels


def final_clusters(run: Run) -> list[list[int]] | None:
    """The clusters in force after ``run``'s last round, or ``None`` when its strategy logs none.

    :param run: a loaded RL run
    """
    history = run.cluster_history()
    return history[max(history)] if history else None


def planted_ari(run: Run) -> float:
    """The adjusted Rand index of ``run``'s final clusters against its planted preference groups.

    NaN unless the run used ``dist=groups`` and its strategy logs clusters.

    :param run: a loaded RL run
    """
    clusters = final_clusters(run)
    if clusters is None or run.dist != "groups":
        return float("nan")
    n = len(run.weights)
    return float(adjusted_rand_score(planted_groups(run.weights), labels_of(clusters, n)))


def planted_ari_by_round(run: Run) -> dict[int, float]:
    """``{round: ARI}`` of the clusters in force after each of ``run``'s rounds against its planted groups.

    Every round from 1 to the run's last, the clusters of the latest record at or before it (one
    cluster of everybody before the first record: ARI 0). Empty unless the run used
    ``dist=groups`` and its strategy logs clusters.

    :param run: a loaded RL run
    """
    history = run.cluster_history()
    if not history or run.dist != "groups":
        return {}
    truth, n = planted_groups(run.weights), len(run.weights)
    return {
        rnd: float(adjusted_rand_score(truth, labels_of(run.clusters_at(rnd), n)))
        for rnd in range(1, int(run.config["rounds"]) + 1)
    }


def similarity_ari_by_round(run: Run) -> dict[int, float]:
    """``{round: ARI}`` of the saved similarity matrix, clustered into as many groups as were planted.

    Each saved matrix (``save_similarity=true``) is clustered by average-linkage agglomerative
    clustering on the distance ``1 - S`` into as many clusters as the run has planted groups, and the
    result scored against those groups. Defined for the rounds whose matrix compares every pair of
    clients: a clustered strategy stops comparing clients of different clusters (NaN entries) after
    its first split, and those rounds are left out. Empty unless the run used ``dist=groups`` with
    more than one group and saved similarity matrices.

    :param run: a loaded RL run
    """
    if run.dist != "groups":
        return {}
    truth = planted_groups(run.weights)
    k = int(truth.max()) + 1
    if k < 2:
        return {}
    scores = {}
    for rnd in run.similarity_rounds():
        sim = run.similarity(rnd)
        if np.isnan(sim).any():
            continue
        model = AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage="average")
        scores[rnd] = float(adjusted_rand_score(truth, model.fit_predict(1.0 - sim)))
    return scores
