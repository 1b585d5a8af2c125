"""FedProx: FedAvg whose clients add a proximal term to their local objective.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020: FedAvg whose clients
minimise their local objective plus ``mu/2 ||theta - theta_global||^2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from morlfed.baselines.fedavg import FedAvg
from morlfed.core.protocol import FitTask


class FedProx(FedAvg):
    """FedAvg with a client-side proximal term; the server side is FedAvg's weighted mean.

    Client-side duties: start from the global model; during local training add
    ``prox_mu * (theta - prox_centre)`` to the gradients before every optimiser step, with the
    centre the global model it received (RL clients wrap the SB3 policy optimiser(s) with
    :class:`morlfed.core.proximal.ProximalOptimizer`); report the trained vector and its number of
    samples. With ``mu = 0`` this is exactly FedAvg.

    :param mu: the proximal coefficient, ``>= 0``; larger keeps clients closer to the global model
    """

    def __init__(self, mu: float = 0.01) -> None:
        if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu >= 0):
            raise ValueError(f"fedprox: mu must be a finite number >= 0 (0 is plain FedAvg), got {mu!r}")
        self.mu = float(mu)

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send every participant the global model, with ``mu`` and the global model as proximal centre."""
        return {
            cid: FitTask(params=self.global_model.clone(), prox_mu=self.mu, prox_centre=self.global_model.clone())
            for cid in participants
        }
