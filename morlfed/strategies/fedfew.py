"""FedFew: K server models trained jointly with the smooth Tchebycheff set scalarisation.

Guo et al., "Few-for-Many Personalized Federated Learning" (CVPR 2026); reference code
pgg3/FedFew (``serverfedfews.py``); the spec is docs/algorithms.md#fedfew.

Server state: K models ``theta_1..theta_K`` and, per client, the K losses it reported last.

Each round every participant i receives all K models, trains each of them locally and reports the
K updates ``Delta_ik = theta_ik' - theta_k`` and the losses ``L_ik`` of the K received models. The
server computes, in log space, with ``Lt_ik = n_i / sum_j n_j * L_ik`` (the paper's sample-size
weighting, footnote 2):

- ``z_ik = -Lt_ik / mu``,
- inner weights ``w_ik = softmax_k(z_ik)`` (soft model selection),
- ``log S_i = logsumexp_k z_ik`` and outer weights ``alpha_i = softmax_i(-log S_i)`` (clients that
  are served badly by every model weigh more),
- ``theta_k <- theta_k + eta_s * sum_i alpha_i w_ik Delta_ik``.

Each client deploys ``argmin_k L_ik`` of the losses it reported last (model 0 before it ever
reported). Those losses were measured on the models it received in its last round, i.e. before
that round's server step: the paper's post-training selection would cost one more round of loss
reports, which the protocol folds into the next round's ``report_losses``.

How the K models start: the reference server starts from K identical copies and relies on each
client's K separate, stochastic local trainings to make them differ. A client whose training is
deterministic given its start (the same seed for each of the K copies, or the synthetic updates
of the tests) then returns K identical updates and losses, every ``w_ik = 1/K``, and the models
never specialise. So by default models 2..K are perturbed once at set-up with Gaussian noise of
standard deviation ``init_noise`` (0.01, the reference code's ``same_noise`` initialisation in
``models_fedfew_shared.py``), drawn from the strategy's generator; ``init_noise: 0`` gives
identical copies.

Losses: vision clients report the mean cross-entropy of each *received* model over their training
samples, measured before training; RL clients report the
negated scalarised return of seeded evaluation episodes divided by the environment spec's return
scale, so that ``mu`` means the same across environments.

Client-side duties: with ``train_all=True`` and ``report_losses=True`` on ``[K, d]`` parameters,
measure the loss of each received model before training, train each of the K models locally,
return the ``[K, d]`` trained models, the ``[K]`` losses and the number of samples.

Budget: with ``equal_budget`` (the default) the task carries ``split_budget``, so each of the K
models trains for ``local_steps // K`` and a client spends what a one-model method spends per round;
``equal_budget=False`` is the paper's protocol, each model for the whole ``local_steps`` (K times
the env steps of the other methods).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.strategies.base import Strategy, sample_shares


def stch_set_weights(losses: torch.Tensor, samples: torch.Tensor, mu: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The STCH-Set weights of FedFew, computed in log space.

    :param losses: ``[N, K]`` loss of each client on each model
    :param samples: ``[N]`` sample counts ``n_i``
    :param mu: smoothing parameter (> 0)
    :return: the inner weights ``w`` ``[N, K]`` (rows sum to 1) and the outer weights ``alpha``
        ``[N]`` (sum to 1), both float64
    """
    losses, samples = losses.double(), samples.double()
    z = -sample_shares(samples).unsqueeze(1) * losses / mu
    w = torch.softmax(z, dim=1)
    alpha = torch.softmax(-torch.logsumexp(z, dim=1), dim=0)
    return w, alpha


class FedFew(Strategy):
    """FedFew strategy (K server models, STCH-Set weighted server step).

    :param n_models: number of server models K, between 1 and the number of clients
    :param mu: smoothing parameter of the log-sum-exp approximations (> 0)
    :param server_lr: server step ``eta_s`` applied to the weighted sum of updates (> 0)
    :param init_noise: standard deviation of the Gaussian perturbation added to models 2..K at
        set-up (>= 0; 0 gives K identical copies)
    :param equal_budget: split each client's ``local_steps`` among the K models (the budget of
        every other method); ``False``: every model trains for ``local_steps`` (the paper)
    """

    def __init__(
        self,
        n_models: int = 3,
        mu: float = 0.01,
        server_lr: float = 1.0,
        init_noise: float = 0.01,
        equal_budget: bool = True,
    ) -> None:
        if n_models < 1:
            raise ValueError(f"fedfew: n_models (K) must be >= 1, got {n_models}")
        if not mu > 0:
            raise ValueError(f"fedfew: mu must be > 0, got {mu}")
        if not server_lr > 0:
            raise ValueError(f"fedfew: server_lr (eta_s) must be > 0, got {server_lr}")
        if not init_noise >= 0:
            raise ValueError(f"fedfew: init_noise must be >= 0, got {init_noise}")
        if not isinstance(equal_budget, bool):
            raise ValueError(f"fedfew: equal_budget must be true or false, got {equal_budget!r}")
        self.n_models, self.mu, self.server_lr, self.init_noise = n_models, mu, server_lr, init_noise
        self.equal_budget = equal_budget

    def validate(self, n_clients: int, rounds: int | None = None) -> None:
        """Raise ``ValueError`` when ``n_models`` exceeds the number of clients; ``rounds`` is not checked."""
        if self.n_models > n_clients:
            raise ValueError(
                f"fedfew: n_models (K) must be <= the number of clients ({n_clients}), got {self.n_models}"
            )

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Build the K server models from ``init_params``; no client has reported losses yet (NaN).

        Models 2..K get Gaussian noise of standard deviation ``init_noise`` drawn from ``rng`` (none
        when ``init_noise`` is 0 or K is 1).
        """
        super().setup(n_clients, init_params, layout, rng)
        models = init_params.detach().float().clone().unsqueeze(0).repeat(self.n_models, 1)
        if self.init_noise > 0 and self.n_models > 1:
            noise = rng.normal(0.0, self.init_noise, size=(self.n_models - 1, layout.dim))
            models[1:] += torch.as_tensor(noise, dtype=torch.float32)
        self.models = models
        self.losses = torch.full((n_clients, self.n_models), float("nan"))
        self._last: dict[str, Any] = {}

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send every participant all K models, to train each and report the loss of each.

        The task sets ``train_all`` and ``report_losses``; ``split_budget`` follows ``equal_budget``
        (when it is true, the K trainings share the client's ``local_steps``).
        """
        return {
            cid: FitTask(params=self.models.clone(), train_all=True, report_losses=True, split_budget=self.equal_budget)
            for cid in participants
        }

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Take the STCH-Set weighted server step on the K models and keep each participant's losses.

        ``theta_k <- theta_k + eta_s * sum_i alpha_i w_ik Delta_ik`` with the weights of
        :func:`stch_set_weights`; the reported losses replace the participants' rows used by
        :meth:`choice`. A round without results only clears the diagnostics.

        :raises ValueError: a client did not return ``[K, d]`` parameters and ``[K]`` losses
        """
        if not results:
            self._last = {}
            return
        cids = sorted(results)
        reported = []
        for cid in cids:
            res = results[cid]
            if res.params.shape != self.models.shape or res.losses is None or res.losses.shape != (self.n_models,):
                raise ValueError(
                    f"fedfew: client {cid} must return [K, d] = {tuple(self.models.shape)} params and [K] losses "
                    f"(train_all and report_losses), got params {tuple(res.params.shape)} and losses "
                    f"{None if res.losses is None else tuple(res.losses.shape)}"
                )
            reported.append(res.losses.float())
        trained = torch.stack([results[c].params.float() for c in cids])  # [N, K, d]
        losses = torch.stack(reported)  # [N, K]
        samples = torch.tensor([float(results[c].num_samples) for c in cids])
        w, alpha = stch_set_weights(losses, samples, self.mu)
        weights = (alpha.unsqueeze(1) * w).float()  # [N, K]
        deltas = trained - self.models.unsqueeze(0)
        self.models = self.models + self.server_lr * torch.einsum("nk,nkd->kd", weights, deltas)
        self.losses[cids] = losses
        self._last = {
            "participants": cids,
            "w": w.tolist(),
            "alpha": alpha.tolist(),
            "update_norms": (weights.unsqueeze(2) * deltas).sum(dim=0).norm(dim=1).tolist(),
        }

    def choice(self, cid: int) -> int:
        """The model client ``cid`` deploys.

        The argmin of its latest reported losses (0 before it reported any).
        """
        row = self.losses[cid]
        return 0 if bool(torch.isnan(row).any()) else int(row.argmin())

    def model_for(self, cid: int) -> torch.Tensor:
        """A copy of the server model client ``cid`` chooses (:meth:`choice`)."""
        return self.models[self.choice(cid)].clone()

    model_id_note = "the server model it deploys (0 to K-1), the one with its lowest loss"

    def model_id(self, cid: int) -> int:
        """The index of the server model client ``cid`` chooses (:meth:`choice`)."""
        return self.choice(cid)

    def finetuned_model(self, cid: int, result: FitResult) -> torch.Tensor:
        """The row of a "+FT" result that the client keeps: its trained copy of its best model.

        After a "+FT" round a client keeps its locally trained copy of the model whose reported loss
        was lowest.

        :raises ValueError: the result carries no losses (``report_losses``)
        """
        if result.losses is None:
            raise ValueError(f"fedfew: client {cid} must report the losses of the received models (report_losses)")
        return result.params[int(result.losses.argmin())].clone()

    def diagnostics(self) -> dict[str, Any]:
        """Every client's model choice, the clients grouped by it, and the last aggregation's weights.

        ``clusters`` (the clients choosing each model, models nobody chooses left out), ``choices``
        (:meth:`choice` of every client) and, after a round with results, ``participants``, ``w``,
        ``alpha`` and ``update_norms`` (the norm of each model's weighted update before
        ``server_lr``).
        """
        choices = [self.choice(c) for c in range(self.n_clients)]
        clusters = [[c for c in range(self.n_clients) if choices[c] == k] for k in range(self.n_models)]
        return {"clusters": [c for c in clusters if c], "choices": choices, **self._last}

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the K models and every client's latest reported losses."""
        return {**super().state_dict(), "models": self.models.clone(), "losses": self.losses.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the K models and the reported losses from what :meth:`state_dict` returned."""
        super().load_state_dict(state)
        self.models = state["models"].clone()
        self.losses = state["losses"].clone()
