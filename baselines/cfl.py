"""Clustered Federated Learning (CFL).

Sattler, Müller and Samek, "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints" (IEEE TNNLS 2021); reference code
felisat/clustered-federated-learning. The spec is docs/algorithms.md#cfl.

Federated averaging runs inside clusters (one cluster of everybody at the start). Once a
cluster's joint model is near a stationary point of the members' joint objective (the mean update
is small) while some members are still far from their own optimum (some update is large), the
members' objectives are incongruent and the cluster is split in two by the direction of their
updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.strategies.base import Strategy, split_event
from morlfed.strategies.similarity import cosine_matrix


def complete_linkage_bipartition(similarity: torch.Tensor) -> np.ndarray:
    """Split clients in two by complete-linkage agglomerative clustering on the distance ``-S``.

    Complete linkage minimises the largest cosine *dissimilarity* inside each side, i.e. it
    maximises the smallest within-side similarity (the quantity CFL's separation guarantee is
    about). Deterministic: agglomerative clustering draws no random numbers.

    :param similarity: ``[m, m]`` cosine similarities of the updates, ``m >= 2``
    :return: labels in {0, 1}, one per row of ``similarity``
    """
    if similarity.shape[0] < 2:
        raise ValueError(f"a bipartition needs at least 2 clients, got {similarity.shape[0]}")
    model = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
    return model.fit_predict((-similarity).double().numpy())


class CFL(Strategy):
    """CFL with the two-threshold split criterion of the reference code.

    Server state: a partition of the clients into clusters and one model per cluster. Each round,
    for each cluster ``c`` with participants (updates ``Delta_i = theta_i' - theta_c``, relative
    to the cluster model the client received):

    1. ``mean_norm = ||mean_i Delta_i||`` and ``max_norm = max_i ||Delta_i||`` over its
       participants;
    2. if ``mean_norm < eps1 and max_norm > eps2 and |c| > 2 and round > warmup`` (``|c|`` counts
       all members, present or not), c is split in two by :func:`complete_linkage_bipartition` on
       the cosine similarities ``S`` of its participants' flattened updates;
    3. every (new) cluster's model adds the unweighted mean update of its participants, so each
       cluster keeps exactly one model, which all its members deploy.

    With partial participation a member absent in a splitting round joins the side whose mean
    update has the highest cosine with the member's most recent reported update (kept as one
    ``[n, d]`` matrix); a member that never took part joins the side with more participants. The
    reference code assumes full participation and has no such rule.

    Client-side duties: start from the cluster model it receives, train locally with its private
    objective, return the trained vector. Nothing else.

    :param eps1: split only when the norm of the cluster's mean update is below this (>= 0)
    :param eps2: ... and the largest client update norm is above this (>= eps1)
    :param warmup: ... and the round (1-based) is greater than this (>= 0, and below the rounds
        aggregated: :meth:`validate`). 5: a quarter of deep-sea-treasure's 20 rounds, as the
        reference code's 20 is a quarter of its 80
    """

    def __init__(self, eps1: float = 0.4, eps2: float = 1.6, warmup: int = 5) -> None:
        if eps1 < 0:
            raise ValueError(f"cfl: eps1 must be >= 0, got {eps1}")
        if eps2 < 0:
            raise ValueError(f"cfl: eps2 must be >= 0, got {eps2}")
        if eps2 < eps1:
            raise ValueError(
                f"cfl: eps2 ({eps2}) must be >= eps1 ({eps1}): a split needs a small mean update "
                "(< eps1) and a large client update (> eps2)"
            )
        if isinstance(warmup, bool) or int(warmup) != warmup or warmup < 0:
            raise ValueError(f"cfl: warmup must be an integer >= 0 (rounds), got {warmup}")
        self.eps1, self.eps2, self.warmup = float(eps1), float(eps2), int(warmup)

    def validate(self, n_clients: int, rounds: int | None = None) -> None:
        """Reject a warm-up that no aggregated round gets past.

        With ``warmup >= rounds`` CFL could never split and would be FedAvg by construction.
        """
        if rounds is not None and rounds > 0 and self.warmup >= rounds:
            raise ValueError(
                f"cfl: warmup ({self.warmup}) must be below the number of aggregated rounds ({rounds}): a cluster "
                f"splits only in a round > warmup, so CFL could never split and would be FedAvg; set "
                f"algo.warmup to at most {rounds - 1} (e.g. a quarter of the rounds) or run more rounds"
            )

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Start with one cluster of every client, whose model is ``init_params``.

        Also zeroes the per-client record of the most recent update (for placing absent members at a
        split), the split-test tallies behind :meth:`inert_warning` and the record of splits.
        """
        super().setup(n_clients, init_params, layout, rng)
        self.clusters: list[list[int]] = [list(range(n_clients))]
        self.cluster_models: list[torch.Tensor] = [init_params.detach().float().clone()]
        self.last_updates = torch.zeros(n_clients, layout.dim)
        self.seen = torch.zeros(n_clients, dtype=torch.bool)
        self._last: dict[str, Any] = {}
        self._similarity: dict[tuple[int, ...], torch.Tensor] = {}
        # over the split tests that only the thresholds could fail (past the warm-up, > 2 members)
        self.tests = {"count": 0, "smallest_mean_norm": float("inf"), "largest_max_norm": 0.0}
        self.splits_so_far: list[dict[str, Any]] | None = []

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send each participant a copy of its cluster's model."""
        return {cid: FitTask(params=self.cluster_models[self.model_id(cid)].clone()) for cid in participants}

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Run the split test on every cluster with participants, then update each cluster's model.

        Follows steps 1-3 of the class docstring: a cluster without participants keeps its members
        and model; a cluster that splits places its absent members by :meth:`_sides_for_absent` (and
        without a split they stay in the one side). Records the participants' updates and
        similarities, the split-test tallies, the checks and splits for :meth:`diagnostics` and
        every split for :meth:`split_events`.
        """
        clusters, models, checks, splits = [], [], [], []
        self._similarity = {}
        for members, model in zip(self.clusters, self.cluster_models):
            present = [c for c in members if c in results]
            if not present:
                clusters.append(members)
                models.append(model)
                continue
            updates = torch.stack([results[c].params.float() for c in present]) - model
            self.last_updates[present] = updates
            self.seen[present] = True
            mean_norm = float(updates.mean(dim=0).norm())
            max_norm = float(updates.norm(dim=1).max())
            sim = cosine_matrix(updates)
            self._similarity[tuple(present)] = sim
            testable = round > self.warmup and len(members) > 2 and len(present) >= 2
            split = testable and mean_norm < self.eps1 and max_norm > self.eps2
            if testable:
                self.tests["count"] += 1
                self.tests["smallest_mean_norm"] = min(self.tests["smallest_mean_norm"], mean_norm)
                self.tests["largest_max_norm"] = max(self.tests["largest_max_norm"], max_norm)
            checks.append(
                {
                    "members": members,
                    "participants": len(present),
                    "mean_norm": mean_norm,
                    "max_norm": max_norm,
                    "split": split,
                }
            )
            if split:
                labels = complete_linkage_bipartition(sim)
                groups = [np.flatnonzero(labels == k) for k in (0, 1)]
            else:
                groups = [np.arange(len(present))]
            sides = [[present[i] for i in g] for g in groups]
            absent = [c for c in members if c not in results]
            if split and absent:
                for cid, nearest in zip(absent, self._sides_for_absent(absent, updates, groups)):
                    sides[nearest].append(cid)
            else:
                sides[0].extend(absent)
            if split:
                splits.append([sorted(s) for s in sides])
            for idx, side in zip(groups, sides):
                clusters.append(sorted(side))
                models.append(model + updates[idx].mean(dim=0))
        self.clusters, self.cluster_models = clusters, models
        if self.splits_so_far is not None:
            self.splits_so_far += [split_event(round, sides) for sides in splits]
        self._last = {"checks": checks, "splits": splits}

    def _sides_for_absent(self, absent: list[int], updates: torch.Tensor, groups: list[np.ndarray]) -> list[int]:
        """The side each absent member of a splitting cluster joins (see the class docstring)."""
        directions = torch.stack([updates[g].mean(dim=0) for g in groups])
        cos = cosine_matrix(torch.cat([self.last_updates[absent], directions]))
        by_cosine = cos[: len(absent), len(absent) :].argmax(dim=1)
        larger = int(len(groups[1]) > len(groups[0]))
        return [int(k) if bool(self.seen[c]) else larger for c, k in zip(absent, by_cosine)]

    def model_for(self, cid: int) -> torch.Tensor:
        """A copy of the model of the cluster client ``cid`` belongs to."""
        return self.cluster_models[self.model_id(cid)].clone()

    model_id_note = "its cluster, an index into the current list of clusters"

    def model_id(self, cid: int) -> int:
        """The index of the cluster client ``cid`` belongs to, in the current list of clusters."""
        return next(k for k, members in enumerate(self.clusters) if cid in members)

    def diagnostics(self) -> dict[str, Any]:
        """The clusters after this round's splits, this round's split checks and its splits.

        ``clusters`` (after this round's splits); ``checks``: per cluster that had participants,
        its members before the split test, participant count, ``mean_norm``, ``max_norm`` and
        whether it split; ``splits``: the two sides of every split.
        """
        return {"clusters": self.clusters, **self._last}

    def similarity(self) -> dict[tuple[int, ...], torch.Tensor]:
        """Per cluster with participants in the last round, the cosine similarities of their updates.

        Keyed by the participants (in member order) before any split of that round.
        """
        return self._similarity

    def split_events(self) -> list[dict[str, Any]] | None:
        """Every split of the run so far, or ``None`` if resumed from a checkpoint without the record."""
        return None if self.splits_so_far is None else list(self.splits_so_far)

    def inert_warning(self) -> str | None:
        """CFL that never split ran as FedAvg: say which threshold held it back."""
        if len(self.clusters) > 1:
            return None
        t = self.tests
        if t["count"] == 0:
            return (
                "cfl: no cluster split, so CFL ran as FedAvg: no round past the warm-up "
                f"(algo.warmup={self.warmup}) had a cluster of more than 2 clients with 2 or more participants"
            )
        return (
            f"cfl: no cluster split in {t['count']} split tests past the warm-up, so CFL ran as FedAvg. A split "
            f"needs a mean update norm below eps1={self.eps1:g} (smallest seen: {t['smallest_mean_norm']:.3g}) "
            f"and, in the same round, a client update norm above eps2={self.eps2:g} (largest seen: "
            f"{t['largest_max_norm']:.3g}); the thresholds scale with this environment's updates: set "
            "algo.eps1/algo.eps2 from the norms in clusters.jsonl (docs/algorithms.md#cfl)"
        )

    def state_dict(self) -> dict[str, Any]:
        """Add the clusters, their models, the last updates, the split-test tallies and the splits so far."""
        return {
            **super().state_dict(),
            "clusters": [list(c) for c in self.clusters],
            "cluster_models": [m.clone() for m in self.cluster_models],
            "last_updates": self.last_updates.clone(),
            "seen": self.seen.clone(),
            "tests": dict(self.tests),
            "splits_so_far": None if self.splits_so_far is None else list(self.splits_so_far),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a checkpoint without ``splits_so_far`` leaves that record ``None``."""
        super().load_state_dict(state)
        self.clusters = [list(c) for c in state["clusters"]]
        self.cluster_models = [m.clone() for m in state["cluster_models"]]
        self.last_updates = state["last_updates"].clone()
        self.seen = state["seen"].clone()
        self.tests = dict(state["tests"])
        splits = state.get("splits_so_far")  # None in a checkpoint from before splits were recorded
        self.splits_so_far = None if splits is None else list(splits)
