"""FedMHC: one shared body, M group heads and a private personal model on every client.

The M group heads are found by K-means on the clients' heads.

Zheng et al., "FedMHC: Overcoming Dimensionality and Communication Challenges for Personalized
Federated Learning Using Model Head Clustering"; the spec is docs/algorithms.md#fedmhc.

The model is split by the layout into a body (every layer not in ``layout.head``) and a head.
Server state: the body entries ``phi``, the group heads ``H_1..H_M'`` (``M' <= M``; a single head,
the initial one, before the first aggregation) and each client's group.

Each round (the paper's Algorithm 1, which clusters every round):

1. every participant receives the ``[M', d]`` models ``{phi, H_m}``, evaluates its loss on each,
   trains the best one (``train_best``) and returns it, saying which in ``model_index``;
2. the server averages the bodies of all participants (sample-size weights: FedAvg; equal to the
   paper's plain mean when the sample counts are equal, as for RL clients with a fixed budget);
3. it clusters the participants' head vectors into ``min(M, distinct heads)`` groups with
   scikit-learn's ``KMeans`` (seeded from the strategy's generator) and averages the heads inside
   each group (same weights) into the new heads ``H_m``. A client absent this round joins the
   new head nearest (Euclidean) to the head of its previous group.

Each client also keeps a private personal model, trained every round with the regulariser
``lambda/2 ||theta_i - w_i||^2`` towards the model ``w_i`` it just trained (pFedMe-style); that
personal model is what it deploys (:attr:`deploys_personal`), so the final evaluation asks the
client for its own model. :meth:`model_for` gives the client's group model (shared body and the
head of the group it was last clustered into), for analysis.

Losses: vision clients use the mean cross-entropy of the received model over their training samples;
RL clients the negated scalarised return of
seeded evaluation episodes divided by the environment spec's return scale.

Client-side duties: with ``train_best=True`` on ``[M', d]`` parameters, measure the loss of each
received model, train the best one, return it ``[d]`` with its ``model_index``; with
``personal_lambda`` set, also train the private personal model towards that trained model;
``evaluate(None, seed)`` evaluates the personal model.

Budget: with ``equal_budget`` (the default) the task carries ``split_budget``, so the shared and
the personal model each train for ``local_steps // 2`` and a client spends what a one-model method
spends per round; ``equal_budget=False`` trains each for the whole ``local_steps`` (twice the env
steps of the other methods, as the paper's E iterations of each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn.cluster import KMeans

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.strategies.base import Strategy, sample_shares, stack_results


def cluster_heads(heads: torch.Tensor, n_groups: int, rng: np.random.Generator) -> np.ndarray:
    """Group head vectors with K-means.

    :param heads: ``[N, h]`` head vectors
    :param n_groups: the wanted number of groups M; fewer when there are fewer distinct heads
    :param rng: the generator that seeds K-means
    :return: labels in ``0..M'-1``, one per row, every label used
    """
    distinct = int(torch.unique(heads, dim=0).shape[0])
    k = min(n_groups, distinct)
    if k == 1:
        return np.zeros(heads.shape[0], dtype=np.int64)
    labels = KMeans(n_clusters=k, random_state=int(rng.integers(2**31 - 1))).fit_predict(heads.double().numpy())
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


class FedMHC(Strategy):
    """FedMHC strategy (shared body, K-means head groups, personal models on the clients).

    :param n_groups: number of head groups M, between 1 and the number of clients
    :param lam: weight ``lambda`` of the personal model's regulariser ``lambda/2 ||theta - w||^2``
        (> 0), sent to the clients as ``personal_lambda``
    :param equal_budget: split each client's ``local_steps`` between the shared and the personal
        model (the budget of every other method); ``False``: each trains for ``local_steps``
    """

    deploys_personal = True

    def __init__(self, n_groups: int = 4, lam: float = 1.0, equal_budget: bool = True) -> None:
        if n_groups < 1:
            raise ValueError(f"fedmhc: n_groups (M) must be >= 1, got {n_groups}")
        if not lam > 0:
            raise ValueError(f"fedmhc: lam (lambda) must be > 0, got {lam}")
        if not isinstance(equal_budget, bool):
            raise ValueError(f"fedmhc: equal_budget must be true or false, got {equal_budget!r}")
        self.n_groups, self.lam, self.equal_budget = n_groups, lam, equal_budget

    def validate(self, n_clients: int, rounds: int | None = None) -> None:
        """Raise ``ValueError`` when ``n_groups`` exceeds the number of clients; ``rounds`` is not checked."""
        if self.n_groups > n_clients:
            raise ValueError(
                f"fedmhc: n_groups (M) must be <= the number of clients ({n_clients}), got {self.n_groups}"
            )

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Split ``init_params`` by the layout into the shared body and a single head.

        That head (the initial one) is the only group, and every client starts in it.

        :raises ValueError: the layout's head is empty or covers the whole model
        """
        super().setup(n_clients, init_params, layout, rng)
        self.head_mask = layout.head_mask()
        if not bool(self.head_mask.any()) or bool(self.head_mask.all()):
            raise ValueError(
                f"fedmhc: the layout must split into a non-empty body and head, got head layers {list(layout.head)}"
            )
        init = init_params.detach().float()
        self.body = init[~self.head_mask].clone()
        self.heads = init[self.head_mask].unsqueeze(0).clone()
        self.groups = [0] * n_clients
        self._last: dict[str, Any] = {}

    def group_models(self) -> torch.Tensor:
        """The ``[M', d]`` models sent to the clients: the shared body with each group head."""
        models = torch.empty(self.heads.shape[0], self.layout.dim)
        models[:, ~self.head_mask] = self.body
        models[:, self.head_mask] = self.heads
        return models

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send every participant the ``[M', d]`` group models to pick the best of and train (``train_best``).

        The task also carries ``personal_lambda`` (``lam``) for the personal model, and
        ``split_budget`` follows ``equal_budget``.
        """
        models = self.group_models()
        return {
            cid: FitTask(
                params=models.clone(), train_best=True, personal_lambda=self.lam, split_budget=self.equal_budget
            )
            for cid in participants
        }

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Steps 2-3 of the module notes: average the bodies, regroup the heads by K-means and average each group.

        Bodies and heads are averaged with sample-size weights, and the new heads replace all the
        previous ones. Absent clients join the new head nearest to their previous group's head. A
        round without results only clears the diagnostics.

        :raises ValueError: a client returned something other than one ``[d]`` model
        """
        if not results:
            self._last = {}
            return
        cids, params, samples = stack_results(results)
        if params.shape[1:] != (self.layout.dim,):
            raise ValueError(f"fedmhc: clients must return one [d] model (train_best), got {tuple(params.shape[1:])}")
        self.body = sample_shares(samples) @ params[:, ~self.head_mask]
        heads = params[:, self.head_mask]
        labels = cluster_heads(heads, self.n_groups, self.rng)
        group_w = torch.as_tensor(np.eye(labels.max() + 1)[labels], dtype=torch.float32) * samples.unsqueeze(1)
        new_heads = (group_w / group_w.sum(dim=0, keepdim=True)).T @ heads  # [M', h]
        absent = [c for c in range(self.n_clients) if c not in results]
        if absent:
            previous = self.heads[[self.groups[c] for c in absent]]
            nearest = torch.cdist(previous, new_heads).argmin(dim=1)
            for cid, label in zip(absent, nearest.tolist()):
                self.groups[cid] = int(label)
        for cid, label in zip(cids, labels.tolist()):
            self.groups[cid] = int(label)
        self.heads = new_heads
        self._last = {
            "participants": cids,
            "head_choice": [results[c].model_index for c in cids],
            "labels": labels.tolist(),
        }

    def model_for(self, cid: int) -> torch.Tensor:
        """Client ``cid``'s group model: the shared body with the head of its current group.

        For analysis only: the client deploys its private personal model (:attr:`deploys_personal`).
        """
        return self.group_models()[self.groups[cid]].clone()

    model_id_note = "its head group (the clients of a group share one clustered head)"

    def model_id(self, cid: int) -> int:
        """The index of the head group client ``cid`` is in."""
        return self.groups[cid]

    def diagnostics(self) -> dict[str, Any]:
        """The head groups and the last aggregation's clustering.

        ``clusters`` (the clients of each non-empty group), ``groups`` (every client's group) and,
        after a round with results, ``participants``, ``head_choice`` (the ``model_index`` each
        participant trained) and ``labels`` (the group K-means put each participant in).
        """
        clusters = [[c for c in range(self.n_clients) if self.groups[c] == m] for m in range(self.heads.shape[0])]
        return {"clusters": [c for c in clusters if c], "groups": list(self.groups), **self._last}

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the shared body, the group heads and every client's group."""
        return {
            **super().state_dict(),
            "body": self.body.clone(),
            "heads": self.heads.clone(),
            "groups": list(self.groups),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the body, the heads and the groups from what :meth:`state_dict` returned."""
        super().load_state_dict(state)
        self.body = state["body"].clone()
        self.heads = state["heads"].clone()
        self.groups = list(state["groups"])
