"""Sample-weighted means (FedAvg, FedMHC's body, FedFew's STCH-Set weights) when no client reports a sample.

``n_i / sum n`` is 0 / 0 then; the shares become equal (a plain mean) instead of NaN in every
parameter of every client's next model.
"""

from __future__ import annotations

import numpy as np
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult
from morlfed.strategies.base import make_strategy, sample_shares
from morlfed.strategies.fedfew import stch_set_weights

LAYOUT = ParamLayout.from_shapes({"w": (2,), "head": (1,)})


def test_shares_are_the_sample_fractions_or_equal_when_there_are_no_samples() -> None:
    assert sample_shares(torch.tensor([1.0, 3.0])).tolist() == [0.25, 0.75]
    assert sample_shares(torch.tensor([0.0, 0.0, 0.0, 0.0])).tolist() == [0.25] * 4


def test_fedavg_averages_plainly_when_no_client_reports_a_sample() -> None:
    params = torch.tensor([[1.0, 2.0, 3.0], [3.0, 6.0, 9.0]])
    for samples, expected in (([1, 3], [2.5, 5.0, 7.5]), ([0, 0], [2.0, 4.0, 6.0])):
        strategy = make_strategy("fedavg")
        strategy.setup(2, torch.zeros(3), LAYOUT, np.random.default_rng(0))
        strategy.aggregate(1, {c: FitResult(params=params[c], num_samples=samples[c]) for c in range(2)})
        assert strategy.model_for(0).tolist() == expected


def test_fedfew_weights_stay_finite_when_no_client_reports_a_sample() -> None:
    losses = torch.tensor([[0.5, 1.0], [2.0, 0.1], [1.0, 1.0]])
    w, alpha = stch_set_weights(losses, torch.zeros(3), mu=0.1)
    w_equal, alpha_equal = stch_set_weights(losses, torch.ones(3), mu=0.1)
    assert torch.equal(w, w_equal) and torch.equal(alpha, alpha_equal)
