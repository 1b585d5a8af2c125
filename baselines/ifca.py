"""Iterative Federated Clustering Algorithm (IFCA).

Ghosh, Chung, Yin and Ramchandran, "An Efficient Framework for Clustered Federated Learning"
(NeurIPS 2020); reference code jichan3751/ifca. The spec is docs/algorithms.md#ifca.

The server keeps K models. Every participant receives all K, measures its loss on each, trains the
one with the lowest loss and returns it; the server replaces each model by the average of the
models trained from it (the paper's "model averaging" option). Clients with similar objectives
thus settle on the same model without the server ever seeing their data or preferences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.strategies.base import Strategy, stack_results


def permuted_inits(init: torch.Tensor, layout: ParamLayout, n: int, rng: np.random.Generator) -> torch.Tensor:
    """``n`` further initialisations made from ``init`` by shuffling the entries of each layer.

    Standard initialisers draw a layer's entries i.i.d., so a random permutation of a layer is
    distributed like an independent fresh initialisation of that layer, at the same scale and
    without a noise-scale hyper-parameter. Layers whose entries are all equal (e.g. zero biases)
    stay as they are.

    :param init: the shared ``[d]`` initial model
    :param n: how many models to make
    :return: ``[n, d]`` models
    """
    out = init.detach().float().clone().unsqueeze(0).repeat(n, 1)
    for layer in layout.layers:
        order = torch.as_tensor(rng.random((n, layer.size)).argsort(axis=1))
        out[:, layer.slice] = init[layer.slice].float()[order]
    return out


class IFCA(Strategy):
    """IFCA with model averaging.

    Server state: K models ``[K, d]``; model 0 is the run's shared initial model, models 1..K-1 are
    per-layer shuffles of it (:func:`permuted_inits`, from the strategy's generator), standing in
    for the reference code's K independently seeded initialisations. Each round every participant
    gets all K models; model k becomes the sample-weighted mean of the models trained from it this
    round (a model nobody chose stays as it was). A client deploys the model it chose the last time
    it took part (model 0 if it never did).

    Client-side duties (``FitTask.train_best`` and ``report_losses``): compute its loss on each of
    the K models, train the one with the lowest loss, return that trained ``[d]`` vector with its
    index in ``FitResult.model_index`` and the K losses in ``FitResult.losses``. For RL clients the
    loss of a model is its negated scalarised return over seeded evaluation episodes divided by
    the env spec's ``return_scale``; for vision clients it is the training loss on local data.

    :param n_models: number of server models K, ``1 <= K <= number of clients`` (K = 1 is FedAvg)
    """

    def __init__(self, n_models: int = 3) -> None:
        if isinstance(n_models, bool) or int(n_models) != n_models or n_models < 1:
            raise ValueError(f"ifca: n_models (K) must be an integer >= 1, got {n_models}")
        self.n_models = int(n_models)

    def validate(self, n_clients: int, rounds: int | None = None) -> None:
        """Reject more server models than clients (``n_models > n_clients``); ``rounds`` is not checked."""
        if self.n_models > n_clients:
            raise ValueError(f"ifca: n_models (K = {self.n_models}) must be <= the number of clients ({n_clients})")

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Make the K server models: ``init_params`` and ``K - 1`` layer shuffles of it.

        The shuffles are :func:`permuted_inits`, drawn from the strategy's generator ``rng``; raises
        ``ValueError`` when they do not give K distinct models (an initial model with (almost) no
        layer of distinct entries). No client has chosen a model yet.
        """
        super().setup(n_clients, init_params, layout, rng)
        init = init_params.detach().float().clone()
        self.models = torch.cat([init.unsqueeze(0), permuted_inits(init, layout, self.n_models - 1, rng)])
        if torch.unique(self.models, dim=0).shape[0] < self.n_models:
            raise ValueError(
                f"ifca: could not make {self.n_models} distinct initial models by shuffling layers "
                "(the initial model has (almost) no layer with distinct entries); use n_models=1"
            )
        self.choices = torch.full((n_clients,), -1, dtype=torch.long)
        self._last: dict[str, Any] = {}

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send every participant all K models, asking it to train the best one and report the K losses."""
        return {cid: FitTask(params=self.models.clone(), train_best=True, report_losses=True) for cid in participants}

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Make each chosen model the sample-weighted mean of the models trained from it this round.

        Every result is checked first (one ``[d]`` model and a ``model_index`` in ``[0, K)``, else
        ``ValueError``); a model nobody chose stays as it was. Records each participant's choice (what
        it deploys) and, for :meth:`diagnostics`, the choosers of each model and the reported losses.
        """
        self._last = {}
        if not results:
            return
        for cid, result in results.items():
            self._check(cid, result)
        cids, trained, samples = stack_results(results)
        chosen = torch.tensor([results[c].model_index for c in cids], dtype=torch.long)
        weights = torch.nn.functional.one_hot(chosen, self.n_models).float() * samples.unsqueeze(1)  # [N, K]
        totals = weights.sum(dim=0)
        used = totals > 0
        self.models[used] = (weights.T @ trained)[used] / totals[used].unsqueeze(1)
        self.choices[cids] = chosen
        self._last = {
            "chosen": [[c for c, k in zip(cids, chosen.tolist()) if k == m] for m in range(self.n_models)],
            "losses": {c: losses.tolist() for c in cids if (losses := results[c].losses) is not None},
        }

    def _check(self, cid: int, result: FitResult) -> None:
        if result.params.ndim != 1:
            raise ValueError(
                f"ifca: client {cid} returned parameters of shape {tuple(result.params.shape)}; expected one trained [d] model"
            )
        k = result.model_index
        if k is None or not 0 <= k < self.n_models:
            raise ValueError(
                f"ifca: client {cid} returned model_index={k}; expected the index in [0, {self.n_models}) "
                "of the model it trained (the client must honour FitTask.train_best)"
            )

    def model_for(self, cid: int) -> torch.Tensor:
        """A copy of the model client ``cid`` deploys (:meth:`model_id`)."""
        return self.models[self.model_id(cid)].clone()

    model_id_note = "the server model it chose the last time it took part (0 before it took part)"

    def model_id(self, cid: int) -> int:
        """The model client ``cid`` chose the last time it took part; 0 if it never did."""
        return int(self._deployed()[cid])

    def _deployed(self) -> torch.Tensor:
        """``[n]`` the model each client deploys: its last choice, model 0 before it chose."""
        return self.choices.clamp_min(0)

    def inert_warning(self) -> str | None:
        """IFCA whose clients all end on one of its K models deploys one model, as FedAvg does."""
        deployed = self._deployed().unique()
        if self.n_models < 2 or len(deployed) != 1:
            return None
        return (
            f"ifca: every client ends on model {int(deployed[0])} of its {self.n_models}, so IFCA deploys one "
            "model for all clients, as FedAvg does"
        )

    def diagnostics(self) -> dict[str, Any]:
        """Which clients deploy and chose each model, and the losses reported this round.

        ``clusters``: per model, the clients deploying it (:meth:`model_id`); ``chosen``: per
        model, this round's choosers; ``losses``: each participant's reported losses of the K models.
        """
        deployed = self._deployed()
        clusters = [torch.nonzero(deployed == k).flatten().tolist() for k in range(self.n_models)]
        return {"clusters": clusters, **self._last}

    def state_dict(self) -> dict[str, Any]:
        """Add the K models and every client's last choice to the base state."""
        return {**super().state_dict(), "models": self.models.clone(), "choices": self.choices.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the K models and the clients' choices."""
        super().load_state_dict(state)
        self.models = state["models"].clone()
        self.choices = state["choices"].clone()
