"""Similarity of client updates, computed on stacked ``[N, d]`` matrices.

FedPref compares updates layer by layer after keeping only each layer's ``ceil(R * size)``
largest-magnitude entries (top-R); with ``R = 1`` this is plain layer-wise cosine similarity.
Each layer costs one ``torch.topk`` on its ``[N, d_layer]`` block and one matrix product.
"""

from __future__ import annotations

import math

import torch

from morlfed.core.params import ParamLayout

_TINY = 1e-12


def top_r(block: torch.Tensor, r: float) -> torch.Tensor:
    """Keep the ``ceil(r * s)`` largest-magnitude entries in every row of ``block`` and zero the rest.

    ``block`` is ``[N, s]``. ``r`` must be in (0, 1]; ``r = 1`` returns ``block``.
    """
    if not 0.0 < r <= 1.0:
        raise ValueError(f"top-R fraction must be in (0, 1], got {r}")
    size = block.shape[1]
    k = math.ceil(r * size)
    if k >= size:
        return block
    idx = block.abs().topk(k, dim=1, sorted=False).indices
    return torch.zeros_like(block).scatter_(1, idx, block.gather(1, idx))


def cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    """``[N, N]`` cosine similarity between the rows of ``x`` (zero rows have similarity 0)."""
    unit = x / x.norm(dim=1, keepdim=True).clamp_min(_TINY)
    return unit @ unit.T


def layerwise_similarity(updates: torch.Tensor, layout: ParamLayout, r: float = 1.0) -> torch.Tensor:
    """FedPref's similarity ``S_ij = (1/L) sum_l cos(topR(Delta_i^l), topR(Delta_j^l))``.

    :param updates: ``[N, d]`` client updates
    :param layout: the parameter layout giving the L layers' column blocks
    :param r: the top-R fraction in (0, 1]
    :return: symmetric ``[N, N]`` float32 matrix with entries in [-1, 1]
    """
    if updates.ndim != 2 or updates.shape[1] != layout.dim:
        raise ValueError(f"updates must be [N, {layout.dim}], got {tuple(updates.shape)}")
    total = torch.zeros(updates.shape[0], updates.shape[0], dtype=updates.dtype)
    for layer in layout.layers:
        total += cosine_matrix(top_r(updates[:, layer.slice], r))
    return (total / len(layout.layers)).clamp_(-1.0, 1.0)


def row_normalise(scores: torch.Tensor) -> torch.Tensor:
    """Aggregation weights from non-negative ``[N, N]`` scores: each row divided by its sum.

    A row that sums to zero keeps the client's own model (a one on the diagonal).
    """
    sums = scores.sum(dim=1, keepdim=True)
    empty = sums.squeeze(1) <= 0
    if bool(empty.any()):
        scores = scores.clone()
        scores[empty] = torch.eye(scores.shape[0], dtype=scores.dtype)[empty]
        sums = scores.sum(dim=1, keepdim=True)
    return scores / sums
