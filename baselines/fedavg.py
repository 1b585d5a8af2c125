"""FedAvg (McMahan et al., 2017): one global model.

The global model is the sample-size weighted mean of the participants' trained models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.strategies.base import Strategy, sample_shares, stack_results


class FedAvg(Strategy):
    """Federated averaging.

    Client-side duties: start from the global model, train locally, report the trained vector
    and its number of samples (env steps for RL, examples for vision).
    """

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Make ``init_params`` the global model."""
        super().setup(n_clients, init_params, layout, rng)
        self.global_model = init_params.detach().float().clone()

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send every participant a copy of the global model."""
        return {cid: FitTask(params=self.global_model.clone()) for cid in participants}

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Replace the global model by the sample-count weighted mean of the participants' trained models.

        A round without results leaves the global model as it is.
        """
        if not results:
            return
        _, params, samples = stack_results(results)
        self.global_model = sample_shares(samples) @ params

    def model_for(self, cid: int) -> torch.Tensor:
        """A copy of the global model: every client deploys the same one."""
        return self.global_model.clone()

    def state_dict(self) -> dict[str, Any]:
        """Add the global model to the base state."""
        return {**super().state_dict(), "global_model": self.global_model.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, the global model included."""
        super().load_state_dict(state)
        self.global_model = state["global_model"].clone()
