"""FedPref: similarity-weighted personalised aggregation with recursive spectral bipartition.

Hartmann et al., "FedPref: Federated Learning Across Heterogeneous Multi-objective Preferences";
the spec is docs/algorithms.md#fedpref.

Server state: a partition of the clients into clusters (one cluster of everybody at the start),
a reference model ``ref_c`` per cluster (the mean of its members' personalised models after the
previous aggregation), each client's personalised model, and per cluster the number of
consecutive rounds its mean update stayed below ``eps``.

Each round, for each cluster c with participants:

1. ``Delta_i = theta_i' - ref_c``;
2. ``S_ij = (1/L) sum_l cos(topR(Delta_i^l), topR(Delta_j^l))`` (:mod:`morlfed.strategies.similarity`);
3. if ``||mean_i theta_i' - ref_c|| < threshold`` for ``patience`` consecutive rounds and
   ``|c| >= 2``, c is split in two by spectral clustering on the affinity ``(S + 1) / 2`` (at most
   one split per cluster per round). ``threshold`` is ``eps`` (``eps_mode="absolute"``) or
   ``eps`` times the largest cluster-mean update norm seen so far, this round's included
   (``eps_mode="relative"``: the paper sets its threshold "based on the maximum observed gradient
   magnitude");
4. inside each (new) cluster, ``W = rownorm((clip(S, s_min, 1) - s_min) / (1 - s_min))`` and
   ``theta_i <- sum_j W_ij theta_j'``; then ``ref_c <- mean of the members' models``.

Client-side duties: start each round from the personalised model it receives, train locally with
its private preference, return the trained vector. Nothing else.

Members of a split cluster that did not participate this round join the side whose mean trained
model is nearest (Euclidean) to their current personalised model. Every split is recorded
(:meth:`FedPref.split_events`: round, sides and their sizes; ``metrics.json``). A run that never
split was FedPref's weighting-only ablation (with the weighting off too, one cluster's plain mean):
:meth:`FedPref.inert_warning` says so, with the smallest norm ratio seen and the eps that would have
split.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from sklearn.cluster import SpectralClustering

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult
from morlfed.strategies.base import InertSettingWarning, PersonalisedStrategy, split_event
from morlfed.strategies.similarity import layerwise_similarity, row_normalise

#: The forms of FedPref's split threshold (``eps_mode``).
EPS_MODES: tuple[str, ...] = ("absolute", "relative")


def preference_weights(similarity: torch.Tensor, s_min: float) -> torch.Tensor:
    """FedPref's aggregation weights: clip ``S`` to ``[s_min, 1]``, rescale to [0, 1] and row-normalise.

    A row that is all zero (possible only with ``s_min >= 0``) keeps the client's own model.
    """
    return row_normalise((similarity.clamp(s_min, 1.0) - s_min) / (1.0 - s_min))


def spectral_bipartition(similarity: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    """Split clients in two by spectral clustering on the affinity ``(S + 1) / 2``.

    :return: labels in {0, 1}, one per row of ``similarity``; two clients are simply separated
    """
    n = similarity.shape[0]
    if n == 2:
        return np.array([0, 1])
    affinity = ((similarity + similarity.T) / 4.0 + 0.5).clamp(0.0, 1.0).double().numpy()
    model = SpectralClustering(
        n_clusters=2,
        affinity="precomputed",
        assign_labels="cluster_qr",
        random_state=int(rng.integers(2**31 - 1)),
    )
    return model.fit_predict(affinity)


class FedPref(PersonalisedStrategy):
    """FedPref strategy.

    :param top_r: fraction R in (0, 1] of each layer's entries kept when comparing updates
    :param s_min: lower similarity bound in [-1, 1) for the aggregation weights
    :param eps: split threshold on the norm of a cluster's mean update: the norm itself
        (``eps_mode="absolute"``) or a fraction of the largest cluster-mean update norm seen so far
        in the run (``"relative"``)
    :param patience: rounds the mean update must stay below the threshold before a split
    :param clustering: enable the recursive bipartition (ablation switch)
    :param weighting: enable similarity-weighted aggregation; off means a plain mean inside each
        cluster (ablation switch)
    :param eps_mode: ``"absolute"`` or ``"relative"``, the form of ``eps`` (:data:`EPS_MODES`)
    """

    def __init__(
        self,
        top_r: float = 0.1,
        s_min: float = -0.2,
        eps: float = 0.1,
        patience: int = 2,
        clustering: bool = True,
        weighting: bool = True,
        eps_mode: str = "relative",
    ) -> None:
        if not 0.0 < top_r <= 1.0:
            raise ValueError(f"fedpref: top_r must be in (0, 1], got {top_r}")
        if not -1.0 <= s_min < 1.0:
            raise ValueError(f"fedpref: s_min must be in [-1, 1), got {s_min}")
        if eps < 0:
            raise ValueError(f"fedpref: eps must be >= 0, got {eps}")
        if patience < 1:
            raise ValueError(f"fedpref: patience must be >= 1, got {patience}")
        if eps_mode not in EPS_MODES:
            raise ValueError(f"fedpref: eps_mode must be one of {', '.join(EPS_MODES)}, got {eps_mode!r}")
        self.top_r, self.s_min, self.eps, self.patience = top_r, s_min, eps, patience
        self.clustering, self.weighting, self.eps_mode = clustering, weighting, eps_mode

    def validate(self, n_clients: int, rounds: int | None = None) -> None:
        """Warn when no run of ``rounds`` aggregated rounds can reach the patience.

        The warning is an :class:`~morlfed.strategies.base.InertSettingWarning`: the clustering could never
        split, and FedPref would be its weighting-only ablation. Not an error: the similarity
        weighting still works.
        """
        if self.clustering and rounds is not None and rounds > 0 and self.patience > rounds:
            warnings.warn(
                f"fedpref: patience ({self.patience}) exceeds the number of aggregated rounds ({rounds}): a cluster "
                f"splits only after {self.patience} rounds below eps, so the clustering can never split and this run "
                f"is {self._unsplit()}; lower algo.patience, run more rounds, or set algo.clustering=false",
                InertSettingWarning,
                stacklevel=2,
            )

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Start from one cluster of every client, with ``init_params`` as its reference model.

        Every personalised model starts at ``init_params`` too; no rounds below the threshold, no
        update norm seen and no split recorded yet.
        """
        super().setup(n_clients, init_params, layout, rng)
        self.clusters: list[list[int]] = [list(range(n_clients))]
        self.refs: list[torch.Tensor] = [init_params.detach().float().clone()]
        self.below: list[int] = [0]
        self.largest_norm = 0.0  # the largest cluster-mean update norm so far (relative eps)
        # (round, norm, largest norm so far) of the one cluster in each round before the first split:
        # what inert_warning reports when no split ever came
        self.unsplit_norms: list[tuple[int, float, float]] | None = []
        self.splits_so_far: list[dict[str, Any]] | None = []
        self._last: dict[str, Any] = {}
        self._similarity: dict[tuple[int, ...], torch.Tensor] = {}

    def threshold(self) -> float:
        """The split threshold in force.

        ``eps``, or ``eps`` times the largest cluster-mean update norm seen so far
        (``eps_mode="relative"``).
        """
        return self.eps if self.eps_mode == "absolute" else self.eps * self.largest_norm

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Steps 1-4 of the module notes for every cluster with participants; the others stay as they are.

        A cluster is split at most once per round, and only when at least two of its members took
        part and the spectral clustering gives two non-empty sides; its absent members join the
        nearest side (module notes), and both sides start their count of rounds below the threshold
        at 0. Every aggregated cluster's reference model becomes the mean of its members' models.
        Splits are added to :meth:`split_events`.
        """
        # every cluster's mean update first: a relative threshold counts this round's largest norm,
        # whichever cluster it is in
        updates = []
        for members, ref in zip(self.clusters, self.refs):
            present = [c for c in members if c in results]
            trained = torch.stack([results[c].params.float() for c in present]) if present else None
            norm = float((trained.mean(dim=0) - ref).norm()) if trained is not None else None
            updates.append((present, trained, norm))
        norms = [norm for _, _, norm in updates if norm is not None]
        self.largest_norm = max([self.largest_norm, *norms])
        if self.unsplit_norms is not None and len(self.clusters) == 1 and norms:
            self.unsplit_norms.append((round, norms[0], self.largest_norm))
        threshold = self.threshold()
        clusters, refs, below, splits = [], [], [], []
        self._similarity = {}
        for members, ref, count, (present, trained, norm) in zip(self.clusters, self.refs, self.below, updates):
            if trained is None or norm is None:
                clusters.append(members)
                refs.append(ref)
                below.append(count)
                continue
            sim = layerwise_similarity(trained - ref, self.layout, self.top_r)
            self._similarity[tuple(present)] = sim
            count = count + 1 if norm < threshold else 0
            groups = [list(range(len(present)))]
            if self.clustering and count >= self.patience and len(members) >= 2 and len(present) >= 2:
                labels = spectral_bipartition(sim, self.rng)
                if 0 < labels.sum() < len(labels):
                    groups = [list(np.flatnonzero(labels == k)) for k in (0, 1)]
            sides = [[present[i] for i in g] for g in groups]
            for absent in (c for c in members if c not in results):
                nearest = self._nearest_side(absent, trained, groups)
                sides[nearest].append(absent)
            if len(groups) == 2:
                splits.append([sorted(s) for s in sides])
            for idx, side in zip(groups, sides):
                self._aggregate_group(trained[idx], sim[idx][:, idx], [present[i] for i in idx])
                clusters.append(sorted(side))
                refs.append(self.models[sorted(side)].mean(dim=0))
                below.append(0 if len(groups) == 2 else count)
        self.clusters, self.refs, self.below = clusters, refs, below
        if self.splits_so_far is not None:
            self.splits_so_far += [split_event(round, sides) for sides in splits]
        self._last = {"update_norms": norms, "threshold": threshold, "splits": splits}

    def _aggregate_group(self, trained: torch.Tensor, sim: torch.Tensor, cids: list[int]) -> None:
        weights = preference_weights(sim, self.s_min) if self.weighting else torch.full_like(sim, 1.0 / len(cids))
        self.models[cids] = weights @ trained

    def _nearest_side(self, cid: int, trained: torch.Tensor, groups: list[list[int]]) -> int:
        centres = torch.stack([trained[g].mean(dim=0) for g in groups])
        return int((centres - self.models[cid]).norm(dim=1).argmin())

    model_id_note = "its cluster, an index into the current partition (indices shift at splits)"

    def model_id(self, cid: int) -> int:
        """The index of client ``cid``'s cluster in the current partition (indices shift at splits)."""
        return next(k for k, members in enumerate(self.clusters) if cid in members)

    def diagnostics(self) -> dict[str, Any]:
        """The partition and the last round's split test.

        ``clusters`` (after this round's splits), ``below_eps`` (each one's rounds below the
        threshold), ``update_norms`` (this round's cluster-mean update norms, one per cluster with
        participants), ``threshold`` (the split threshold in force) and ``splits`` (the two sides
        of every split).
        """
        return {"clusters": self.clusters, "below_eps": self.below, **self._last}

    def split_events(self) -> list[dict[str, Any]] | None:
        """A copy of the run's split record, one :func:`~morlfed.strategies.base.split_event` per split, in order.

        ``None`` when the run was resumed from a checkpoint that predates the record.
        """
        return None if self.splits_so_far is None else list(self.splits_so_far)

    def _unsplit(self) -> str:
        """What FedPref with its clustering on is when no cluster ever splits.

        Its weighting alone, or, with the weighting off too (the clustering-only ablation), the plain mean of
        one cluster, FedAvg's aggregation rule.
        """
        if self.weighting:
            return "FedPref's weighting-only ablation"
        return "the clustering-only ablation with one cluster throughout, whose aggregate is FedAvg's plain mean"

    def inert_warning(self) -> str | None:
        """A run with the clustering on that never split: say what it was (:meth:`_unsplit`), and why.

        Names the smallest ratio of the cluster's mean update norm to the largest one seen, and the
        eps (in this run's ``eps_mode``) above which ``patience`` consecutive rounds would have
        been below the threshold: the first split that eps would have made. ``None`` when a
        cluster split, the clustering is off, or the run was resumed from a checkpoint that
        predates the record.
        """
        if not self.clustering or self.splits_so_far != [] or self.unsplit_norms is None or self.n_clients < 2:
            return None
        head = f"fedpref: no cluster split, so this run was {self._unsplit()}"
        rounds = [rnd for rnd, _, _ in self.unsplit_norms]
        ratios = [norm / largest if largest > 0 else 1.0 for _, norm, largest in self.unsplit_norms]
        measured = ratios if self.eps_mode == "relative" else [norm for _, norm, _ in self.unsplit_norms]
        if len(measured) < self.patience:
            return (
                f"{head}: {len(measured)} round(s) aggregated, fewer than the patience ({self.patience}); "
                "lower algo.patience or run more rounds"
            )
        low = int(np.argmin(ratios))
        # a split needs `patience` consecutive rounds below eps: the eps that would have split first is
        # just above the smallest of the windows' largest values
        windows = [max(measured[i : i + self.patience]) for i in range(len(measured) - self.patience + 1)]
        first = int(np.argmin(windows))
        unit = "x the largest cluster-mean update norm seen" if self.eps_mode == "relative" else "(absolute)"
        return (
            f"{head}. A split needs the cluster's mean update norm below eps={self.eps:g} {unit} for "
            f"{self.patience} consecutive rounds; the smallest ratio of that norm to the largest seen was "
            f"{ratios[low]:.3g} (round {rounds[low]}), and eps above {windows[first]:.3g} "
            f"(eps_mode={self.eps_mode}) would have split at round {rounds[first + self.patience - 1]}. Set "
            "algo.eps (or the env spec's fedpref.eps) from the update_norms in "
            "clusters.jsonl (docs/algorithms.md#fedpref)"
        )

    def similarity(self) -> dict[tuple[int, ...], torch.Tensor]:
        """The last round's similarity matrices ``S``, one per cluster with participants.

        Each is keyed by the ids of that cluster's participants, in ascending order (the rows' order).
        """
        return self._similarity

    def state_dict(self) -> dict[str, Any]:
        """The personalised models plus the partition, reference models, threshold counts and split record.

        ``largest_norm`` (for the relative threshold) and the unsplit cluster's norms (for
        :meth:`inert_warning`) are stored too.
        """
        return {
            **super().state_dict(),
            "clusters": [list(c) for c in self.clusters],
            "refs": [r.clone() for r in self.refs],
            "below": list(self.below),
            "largest_norm": self.largest_norm,
            "unsplit_norms": None if self.unsplit_norms is None else [list(entry) for entry in self.unsplit_norms],
            "splits_so_far": None if self.splits_so_far is None else list(self.splits_so_far),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        A checkpoint that predates ``largest_norm``, ``splits_so_far`` and ``unsplit_norms`` restores
        them as 0, ``None`` (split record unknown) and ``None`` (no inert warning can be told).
        """
        super().load_state_dict(state)
        self.clusters = [list(c) for c in state["clusters"]]
        self.refs = [r.clone() for r in state["refs"]]
        self.below = list(state["below"])
        # a checkpoint from before these were kept: no relative threshold ran, splits unknown
        self.largest_norm = float(state.get("largest_norm", 0.0))
        splits = state.get("splits_so_far")
        self.splits_so_far = None if splits is None else list(splits)
        unsplit = state.get("unsplit_norms")
        self.unsplit_norms = None if unsplit is None else [(int(r), float(n), float(m)) for r, n, m in unsplit]
