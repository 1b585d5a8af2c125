"""Many-Task Federated Learning (MaTFL) aggregation.

Cai et al., "Many-Task Federated Learning: A New Problem Setting and a Simple Baseline" (CVPR
Workshops 2023); reference code VITA-Group/MaT-FL (``dg_utils.py``: ``get_soft_grouping_score``,
``get_grouping_score``, ``aggregate``). The spec is docs/algorithms.md#matfl.

Every client keeps a personalised model. Each round the server compares the participants' trained
models by the direction in which each deviates from their mean, and gives every client a weighted
average of the trained models, weighted towards the clients that deviate the same way.

Deviations from the reference code, all deliberate:

- The reference aggregates only the shared backbone (its task-specific decoders stay local) and
  includes BatchNorm running statistics; here every client solves the same task with the same
  network, so the whole parameter vector is compared and aggregated.
- The reference has every client take part in every round. Here the weights are computed over
  the round's participants; absent clients keep their model.
- A row of soft-grouping weights that sums to zero (a zero deviation with ``th <= 0``, or any row
  with ``th = -1``) is a division by zero (NaN) in the reference; here such a client keeps its
  own trained model.
- The reference's command line has no default for ``th`` (its function default is 0, and a
  commented-out line uses 1); the default here is 0. The FedPref paper's MaTFL baseline tunes a
  "number of voting clients", a parameter that does not exist in the reference code and is not
  implemented here.
- Similarity is the cosine of the flattened deviations (the reference concatenates all its
  aggregated layers into one vector), not a layer-wise similarity.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult
from morlfed.strategies.base import PersonalisedStrategy, stack_results
from morlfed.strategies.similarity import cosine_matrix, row_normalise

MODES = ("soft-grouping", "grouping")


def soft_grouping_weights(cosine: torch.Tensor, th: float) -> torch.Tensor:
    """MaTFL's soft-grouping weights ``W = rownorm(max(C + th, 0))``.

    Client j contributes to client i exactly when ``C_ij > -th``: ``th = 0`` keeps the pairs with a
    positive cosine, ``th = 1`` every pair except exactly opposite ones (weights proportional to
    ``1 + C``), a large ``th`` tends to the plain mean, and ``th = -1`` (where ``C + th <= 0``
    everywhere) leaves each client its own model. A row that sums to zero keeps the client's own
    model.

    :param cosine: ``[N, N]`` cosine similarities
    :param th: the shift ``th >= -1``
    :return: ``[N, N]`` non-negative weights whose rows sum to 1
    """
    return row_normalise((cosine + th).clamp_min(0.0))


def average_linkage_groups(cosine: torch.Tensor, n_groups: int) -> np.ndarray:
    """Hard grouping: average-linkage agglomerative clustering on the cosine distance ``1 - C``.

    The reference clusters the deviations with ``metric="cosine"``, which is the same distance.

    :param cosine: ``[N, N]`` cosine similarities of the deviations
    :param n_groups: number of groups, ``1 <= n_groups <= N``
    :return: a group label per client
    """
    n = cosine.shape[0]
    if not 1 <= n_groups <= n:
        raise ValueError(f"number of groups must be in [1, {n}], got {n_groups}")
    if n == 1:
        return np.zeros(1, dtype=int)
    model = AgglomerativeClustering(n_clusters=n_groups, metric="precomputed", linkage="average")
    return model.fit_predict((1.0 - cosine).double().numpy())


def group_mean_weights(labels: np.ndarray) -> torch.Tensor:
    """``W_ij = 1 / |g|`` when i and j are in the same group g, else 0."""
    onehot = torch.nn.functional.one_hot(torch.as_tensor(labels, dtype=torch.long)).float()
    return (onehot / onehot.sum(dim=0)) @ onehot.T


class MaTFL(PersonalisedStrategy):
    """MaTFL personalised aggregation over the round's participants.

    With trained models ``theta_i'``: ``theta_bar = mean_i theta_i'``, deviations
    ``delta_i = theta_i' - theta_bar``, ``C`` = cosine similarity of the flattened deviations, and
    ``theta_i <- sum_j W_ij theta_j'`` where

    - ``mode="soft-grouping"``: ``W = rownorm(max(C + th, 0))`` (:func:`soft_grouping_weights`);
    - ``mode="grouping"``: the participants are split into ``cluster_num`` groups by
      average-linkage clustering on ``1 - C`` and ``W`` takes each group's plain mean (at most as
      many groups as participants).

    The deviations sum to zero, so their cosines average about ``-1/(N-1)`` (exactly, for equal
    norms): with few participants and ``th = 0`` most pairs get no weight and clients mostly keep
    their own model (with 3 participants often all of them do).

    Client-side duties: start from the personalised model it receives, train locally with its
    private objective, return the trained vector. Nothing else.

    :param mode: ``"soft-grouping"`` (similarity-weighted) or ``"grouping"`` (hard groups)
    :param th: soft-grouping shift added to the cosines before clipping at 0, ``>= -1``
    :param cluster_num: number of groups in grouping mode, ``>= 1`` and at most the number of
        clients
    """

    def __init__(
        self, mode: Literal["soft-grouping", "grouping"] = "soft-grouping", th: float = 0.0, cluster_num: int = 2
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"matfl: mode must be one of {', '.join(MODES)}; got {mode!r}")
        if th < -1:
            raise ValueError(f"matfl: th must be >= -1 (every th <= -1 zeroes all weights), got {th}")
        if isinstance(cluster_num, bool) or int(cluster_num) != cluster_num or cluster_num < 1:
            raise ValueError(f"matfl: cluster_num must be an integer >= 1, got {cluster_num}")
        self.mode, self.th, self.cluster_num = mode, float(th), int(cluster_num)

    def validate(self, n_clients: int, rounds: int | None = None) -> None:
        """In grouping mode, reject more groups than clients; ``rounds`` is not checked."""
        if self.mode == "grouping" and self.cluster_num > n_clients:
            raise ValueError(f"matfl: cluster_num ({self.cluster_num}) must be <= the number of clients ({n_clients})")

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Give every client ``init_params`` as its model, put it in group 0 and zero the mixing tallies.

        The tallies (rounds with participants, and those where some client got another client's
        model) feed :meth:`inert_warning`.
        """
        super().setup(n_clients, init_params, layout, rng)
        self.groups = torch.zeros(n_clients, dtype=torch.long)
        self._last: dict[str, Any] = {}
        self._similarity: dict[tuple[int, ...], torch.Tensor] = {}
        self.aggregations = 0  # rounds with participants
        self.mixing_rounds = 0  # of those, rounds where some client got another client's model

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Give every participant its weighted average of the participants' trained models.

        The weights ``W`` come from the cosines of the deviations from the participants' mean, by
        ``mode`` (see the class docstring); in grouping mode each participant's group is recorded for
        :meth:`model_id`. Absent clients keep their model. Records the cosines for :meth:`similarity`,
        the weights or groups for :meth:`diagnostics`, and whether any client got another's model.
        A round without results only clears the diagnostics and similarities.
        """
        if not results:
            self._last, self._similarity = {}, {}
            return
        cids, trained, _ = stack_results(results)
        cosine = cosine_matrix(trained - trained.mean(dim=0))
        self._similarity = {tuple(cids): cosine}
        if self.mode == "soft-grouping":
            weights = soft_grouping_weights(cosine, self.th)
            self._last = {"participants": cids, "weights": weights.tolist()}
        else:
            labels = average_linkage_groups(cosine, min(self.cluster_num, len(cids)))
            weights = group_mean_weights(labels)
            self.groups[cids] = torch.as_tensor(labels, dtype=torch.long)
            groups = [[c for c, g in zip(cids, labels) if g == k] for k in range(int(labels.max()) + 1)]
            self._last = {"participants": cids, "clusters": groups}
        self.models[cids] = weights @ trained
        self.aggregations += 1
        self.mixing_rounds += int(bool((weights - torch.diag(torch.diagonal(weights)) > 0).any()))

    model_id_note = "its own id in soft-grouping mode (personal models); its last group in grouping mode"

    def model_id(self, cid: int) -> int:
        """The client's own id in soft-grouping mode; its last group in grouping mode.

        Soft grouping: the client's own id (every model is personal). Grouping: the group the
        client was put in the last round it took part (0 before that).
        """
        return cid if self.mode == "soft-grouping" else int(self.groups[cid])

    def diagnostics(self) -> dict[str, Any]:
        """The participants of the last aggregation and its weights or groups.

        ``participants`` of the last aggregation and either the soft-grouping ``weights``
        (rows and columns in participant order) or the hard groups as ``clusters``.
        """
        return self._last

    def similarity(self) -> dict[tuple[int, ...], torch.Tensor]:
        """The last round's cosines of the deviations, one block keyed by the participants (sorted)."""
        return self._similarity

    def inert_warning(self) -> str | None:
        """MaTFL whose every client kept its own trained model in every round ran as local training."""
        if self.aggregations == 0 or self.mixing_rounds > 0:
            return None
        why = (
            f"no pair of deviations had a cosine above -th={-self.th:g}"
            if self.mode == "soft-grouping"
            else "every group held a single client"
        )
        return (
            f"matfl: every client kept its own trained model in all {self.aggregations} aggregations ({why}), "
            "so MaTFL ran as local training"
        )

    def state_dict(self) -> dict[str, Any]:
        """Add the clients' groups and the mixing tallies to the personal models' state."""
        return {
            **super().state_dict(),
            "groups": self.groups.clone(),
            "aggregations": self.aggregations,
            "mixing_rounds": self.mixing_rounds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the personal models, groups and mixing tallies."""
        super().load_state_dict(state)
        self.groups = state["groups"].clone()
        self.aggregations, self.mixing_rounds = state["aggregations"], state["mixing_rounds"]
