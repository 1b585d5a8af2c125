"""FedPG: a common descent direction for the global model and direction-drifted personal models.

The global model's common descent direction includes a fair-driven objective; each personal
model's direction is drifted from it so that it never conflicts with the other clients' gradients.

"Preserving Global Performance in Personalized Federated Learning" (FedPG, ICCV submission 6989);
the spec is docs/algorithms.md#fedpg.

Server state: the global model ``omega``, each client's personal model, each client's latest
pseudo-gradient and the round it was reported (for absent clients), and the current step size.

Each round the participants receive ``omega``, report its loss ``L_i(omega)`` (``report_losses``)
and train locally; the server treats ``g_i = omega - theta_i'`` (minus the update) as client i's
gradient and:

1. forms ``Q`` from the participants' gradients and the cached gradients of the clients absent
   this round that took part within the last ``tau`` rounds, drops zero-norm rows and rescales
   every row to their mean norm;
2. appends the gradient of the fair-driven objective ``F(omega) = -L.1 / (||L|| ||1||)`` over the
   participants, ``grad F = (G^T / ||L||) (L^T 1 L / (||1|| ||L||^2) - 1 / ||1||)`` (``G`` the
   participants' raw gradients), unless it is zero;
3. solves ``min ||Q lambda||^2`` over the simplex (:func:`min_norm_weights`), sets
   ``d = -Q lambda`` and rescales it to the norm of the plain mean direction ``-mean_i g_i``
   (``d = 0`` when ``omega`` is Pareto stationary, i.e. the minimum norm is 0);
4. drifts d towards each participant's own steepest descent direction,
   ``d_i = d + gamma_i (-g_i - d)``, ``gamma_i`` the largest value in [0, 1] with
   ``g_j . d_i <= 0`` for every other participant j (:func:`drift_gammas`);
5. builds the personal models ``omega + eta d_i`` and steps ``omega <- omega + eta d``.

Step size: ``eta`` (``lr``) multiplies directions whose norm is that of the mean client update, so
``lr = 1`` moves the global model as far as FedAvg's (unweighted) step and makes ``gamma_i = 1``
give client i exactly its own trained model; ``gamma_i = 0`` gives the new global model.

Absent clients: a client that took part in one of the last ``tau`` rounds contributes its latest
gradient to ``Q``; ``tau = None`` is the paper's ``tau = M / |S_t|`` (M the number of clients
seen so far, ``|S_t|`` this round's participants), rounded up; 0 disables the reuse.

Fair-driven objective and negative losses: ``F`` is a cosine with the all-ones vector and only
measures the spread of positive losses (the paper's cross-entropy). RL losses (negated scalarised
returns divided by the environment's return scale) can be <= 0; then the losses entering ``F``
are shifted so that the smallest is 1 (one return scale above zero), which keeps their order and
differences. The shift is reported in :meth:`diagnostics`.

S-FedPG (``line_search``): the paper halves ``eta`` from ``2^s eta`` until the Armijo conditions
``L_i(omega + eta d) <= L_i(omega) + beta eta g_i . d`` (and the same for ``F``) hold, asking the
clients for the losses of each candidate within the round. The strategy protocol has one fit per
client per round and the loop replaces a zero local budget with the run's default, so candidate
evaluations cannot be requested. Instead the test is made one round later, on the losses of the
new global model that the clients report anyway: if every participant present in both rounds
(and ``F``, when the same clients took part) passed, the next step doubles, otherwise it halves,
staying within ``[2^-s lr, 2^s lr]``.

Client-side duties: start from the global model, report its loss before training
(``report_losses``), train locally, return the trained vector and its number of samples. The
personal models live on the server (:meth:`model_for`), so a client needs no extra state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import nnls

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask
from morlfed.strategies.base import Strategy, stack_results

_TINY = 1e-12


def min_norm_weights(gram: torch.Tensor) -> torch.Tensor:
    """The weights ``lambda`` on the simplex that minimise ``||Q lambda||^2``.

    ``Q`` enters only through the Gram matrix ``Q^T Q`` of its columns.

    The minimum-norm point of a convex hull is an exact non-negative least-squares problem:
    with ``A = [Q; 1^T]`` and ``e = (0, .., 0, 1)``, the solution ``x`` of ``min_{x >= 0}
    ||A x - e||`` is proportional to ``lambda``. Only ``A^T A = Q^T Q + 1 1^T`` is needed, through
    a square root of it, so ``d`` never enters; :func:`scipy.optimize.nnls` (Lawson-Hanson active
    set) solves the small problem exactly.

    :param gram: ``[k, k]`` Gram matrix (symmetric positive semi-definite, non-zero diagonal)
    :return: ``[k]`` float64 weights, non-negative, summing to 1
    """
    gram = gram.double()
    scale = float(gram.diagonal().max())
    if not scale > 0:
        raise ValueError("min_norm_weights: the Gram matrix has no positive diagonal entry")
    system = (gram / scale + 1.0).numpy()
    values, vectors = np.linalg.eigh((system + system.T) / 2)
    keep = values > values.max() * 1e-13
    root = (vectors[:, keep] * np.sqrt(values[keep])).T  # root^T root = system
    target = vectors[:, keep].T @ np.ones(len(system)) / np.sqrt(values[keep])  # root^T target = 1
    x, _ = nnls(root, target)
    return torch.as_tensor(x / x.sum())


def drift_gammas(grads: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """For each client i, the largest drift ``gamma_i`` in [0, 1] that conflicts with no other client.

    That is, ``g_j . (d + gamma_i (-g_i - d)) <= 0`` for every ``j != i``.

    Per pair, ``a_j + gamma b_ij <= 0`` with ``a_j = g_j . d`` and ``b_ij = -g_j . g_i - a_j``
    bounds gamma by ``-a_j / b_ij`` when ``b_ij > 0`` and not at all otherwise.

    :param grads: ``[m, d]`` client gradients
    :param direction: ``[d]`` common direction ``d``
    :return: ``[m]`` float64 gammas
    """
    g = grads.double()
    a = g @ direction.double()  # [m]
    b = -(g @ g.T) - a.unsqueeze(1)  # b[j, i]
    bound = torch.where(b > 0, -a.unsqueeze(1) / b.clamp_min(_TINY), torch.full_like(b, math.inf))
    bound.fill_diagonal_(math.inf)
    return bound.min(dim=0).values.clamp(0.0, 1.0)


def fair_weights(losses: torch.Tensor) -> torch.Tensor:
    """``dF/dL`` for the fair-driven objective ``F = -L.1 / (||L|| ||1||)``.

    ``dF/dL = (L^T 1 L / (||1|| ||L||^2) - 1 / ||1||) / ||L||``, so that ``grad F = G^T dF/dL``
    for the gradients ``G`` of the losses.

    :param losses: ``[m]`` positive losses ``L``
    :return: ``[m]`` float64
    """
    losses = losses.double()
    norm, root_m = losses.norm(), math.sqrt(losses.numel())
    return (losses.sum() * losses / (root_m * norm**2) - 1.0 / root_m) / norm


def fair_gradient(grads: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """The gradient of the fair-driven objective.

    ``grad F = (G^T / ||L||) (L^T 1 L / (||1|| ||L||^2) - 1 / ||1||)``.

    :param grads: ``[m, d]`` gradients ``G`` of the m losses
    :param losses: ``[m]`` positive losses ``L``
    """
    return fair_weights(losses) @ grads.double()


def fair_objective(losses: torch.Tensor) -> float:
    """``F = -L.1 / (||L|| ||1||)`` (minus the cosine between the losses and the ones)."""
    losses = losses.double()
    return float(-losses.sum() / (losses.norm() * math.sqrt(losses.numel())))


def positive_shift(losses: torch.Tensor) -> float:
    """What to add to the losses before :func:`fair_objective`.

    0 when all are positive, otherwise the shift that makes the smallest equal to 1.
    """
    low = float(losses.min())
    return 0.0 if low > 0 else 1.0 - low


class FedPG(Strategy):
    """FedPG strategy (common descent direction, fair-driven objective, direction drift).

    :param lr: step size ``eta`` applied to the rescaled directions (> 0)
    :param fair: add the fair-driven objective's gradient to ``Q`` (the paper's ablation M2 turns
        it off)
    :param tau: rounds an absent client's latest gradient is reused (>= 0); ``None`` is the
        paper's ``M / |S_t|``
    :param line_search: S-FedPG: adapt the step size with the Armijo test (see the module notes)
    :param search_range: ``s``: the step stays within ``[2^-s lr, 2^s lr]`` (>= 0)
    :param armijo_beta: ``beta`` of the Armijo condition, in (0, 1)
    """

    def __init__(
        self,
        lr: float = 1.0,
        fair: bool = True,
        tau: int | None = None,
        line_search: bool = False,
        search_range: int = 2,
        armijo_beta: float = 1e-4,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"fedpg: lr (eta) must be > 0, got {lr}")
        if tau is not None and tau < 0:
            raise ValueError(f"fedpg: tau must be >= 0 or null (the paper's M / |S_t|), got {tau}")
        if search_range < 0:
            raise ValueError(f"fedpg: search_range (s) must be >= 0, got {search_range}")
        if not 0 < armijo_beta < 1:
            raise ValueError(f"fedpg: armijo_beta must be in (0, 1), got {armijo_beta}")
        self.lr, self.fair, self.tau = lr, fair, tau
        self.line_search, self.search_range, self.armijo_beta = line_search, search_range, armijo_beta

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Start the global model and every personal model at ``init_params``, the step size at ``lr``.

        No client has a cached gradient yet, and there is no pending Armijo test.
        """
        super().setup(n_clients, init_params, layout, rng)
        self.global_model = init_params.detach().float().clone()
        self.personal = self.global_model.unsqueeze(0).repeat(n_clients, 1)
        self.grads = torch.zeros(n_clients, layout.dim)
        self.last_round = torch.full((n_clients,), -1, dtype=torch.long)
        self.step = self.lr
        self.armijo: dict[str, Any] = {}
        self._last: dict[str, Any] = {}

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send every participant the global model ``omega`` and ask for its loss (``report_losses``)."""
        return {cid: FitTask(params=self.global_model.clone(), report_losses=True) for cid in participants}

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Steps 1-5 of the module notes: new personal models for the participants, a step of ``omega``.

        The participants' pseudo-gradients ``g_i = omega - theta_i'`` are cached for later rounds;
        with ``line_search`` the step size is first adapted from the losses the participants report
        for the current ``omega`` (S-FedPG). A round without results only clears the diagnostics.

        :raises ValueError: a participant did not report exactly one loss for the received model
        """
        if not results:
            self._last = {}
            return
        cids, params, _ = stack_results(results)
        reported = []
        for cid in cids:
            loss = results[cid].losses
            if loss is None or loss.numel() != 1:
                raise ValueError(f"fedpg: client {cid} must report the loss of the received model (report_losses)")
            reported.append(loss.double().reshape(1))
        losses = torch.cat(reported)
        grads = self.global_model.unsqueeze(0) - params  # [m, d] pseudo-gradients -Delta_i
        if self.line_search:
            self._armijo_update(cids, losses)

        self.last_round[cids] = round
        self.grads[cids] = grads
        seen = int((self.last_round >= 0).sum())
        tau = self.tau if self.tau is not None else math.ceil(seen / len(cids))
        age = round - self.last_round
        cached = torch.nonzero((self.last_round >= 0) & (age > 0) & (age <= tau)).flatten().tolist()
        shift = positive_shift(losses)
        direction, weights = self.common_direction(grads, self.grads[cached], losses + shift)
        gammas = drift_gammas(grads, direction)
        personal_dirs = direction + gammas.unsqueeze(1) * (-grads.double() - direction)
        self.personal[cids] = (self.global_model.double() + self.step * personal_dirs).float()
        if self.line_search:
            self.armijo = {"cids": cids, "losses": losses, "slopes": grads.double() @ direction, "step": self.step}
        self.global_model = (self.global_model.double() + self.step * direction).float()
        self._last = {
            "participants": cids,
            "reused": cached,
            "lambda": weights.tolist(),
            "gamma": gammas.tolist(),
            "step": self.step,
            "loss_shift": shift,
            "direction_norm": float(direction.norm()),
            "max_descent_product": float((grads.double() @ direction).max()),
        }

    def common_direction(
        self, grads: torch.Tensor, reused: torch.Tensor, losses: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 1-3 of the round: the rescaled common descent direction.

        :param grads: ``[m, d]`` the participants' gradients
        :param reused: ``[r, d]`` the cached gradients of absent clients
        :param losses: ``[m]`` the participants' (positive) losses for the fair-driven objective
        :return: ``d`` ``[d]`` and the min-norm weights ``lambda`` over the rows of ``Q`` (float64)
        """
        rows = torch.cat([grads, reused]).double()
        norms = rows.norm(dim=1)
        rows, norms = rows[norms > _TINY], norms[norms > _TINY]
        q = rows * (norms.mean() / norms).unsqueeze(1)  # every gradient at the mean norm
        if self.fair:
            fair_grad = fair_gradient(grads, losses)
            if float(fair_grad.norm()) > _TINY:
                q = torch.cat([q, fair_grad.unsqueeze(0)])
        direction = torch.zeros(self.layout.dim, dtype=torch.float64)
        if not len(q):
            return direction, torch.zeros(0, dtype=torch.float64)
        weights = min_norm_weights(q @ q.T)
        point = weights @ q
        if float(point.norm()) > _TINY * float(q.norm(dim=1).max()):  # else Pareto stationary: d = 0
            direction = -point * (grads.double().mean(dim=0).norm() / point.norm())
        return direction, weights

    def _armijo_update(self, cids: list[int], losses: torch.Tensor) -> None:
        """S-FedPG's step control from the losses of the new global model (see the module notes)."""
        prev = self.armijo
        if not prev:
            return
        now = dict(zip(cids, losses.tolist()))
        common = [i for i, c in enumerate(prev["cids"]) if c in now]
        if not common:
            return
        step, beta = prev["step"], self.armijo_beta
        new = torch.tensor([now[prev["cids"][i]] for i in common], dtype=torch.float64)
        ok = bool((new <= prev["losses"][common] + beta * step * prev["slopes"][common]).all())
        if self.fair and len(common) == len(prev["cids"]):
            # F of both rounds' losses with one shift, its slope grad F . d = dF/dL . (G d)
            shift = positive_shift(torch.cat([prev["losses"], new]))
            before = prev["losses"] + shift
            slope = float(fair_weights(before) @ prev["slopes"])
            ok = ok and fair_objective(new + shift) <= fair_objective(before) + beta * step * slope
        factor = 2.0 if ok else 0.5
        bound = 2.0**self.search_range
        self.step = min(max(self.step * factor, self.lr / bound), self.lr * bound)

    def model_for(self, cid: int) -> torch.Tensor:
        """Client ``cid``'s personal model from the last round it took part in (the initial model if none)."""
        return self.personal[cid].clone()

    model_id_note = "its own id: every client deploys its personal model"

    def model_id(self, cid: int) -> int:
        """``cid`` itself: every client deploys its own personal model."""
        return cid

    def diagnostics(self) -> dict[str, Any]:
        """The last aggregation's record (empty before the first one and after a round without results).

        ``participants``, ``reused`` (the absent clients whose cached gradients were reused),
        ``lambda``, ``gamma``, ``step``, ``loss_shift`` (the shift of the losses entering ``F``),
        ``direction_norm`` (``||d||``) and ``max_descent_product`` (the largest ``g_i . d``).
        """
        return dict(self._last)

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the models, cached gradients and their rounds, the step and the Armijo test."""
        return {
            **super().state_dict(),
            "global_model": self.global_model.clone(),
            "personal": self.personal.clone(),
            "grads": self.grads.clone(),
            "last_round": self.last_round.clone(),
            "step": self.step,
            "armijo": {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.armijo.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (copies of its tensors)."""
        super().load_state_dict(state)
        self.global_model = state["global_model"].clone()
        self.personal = state["personal"].clone()
        self.grads = state["grads"].clone()
        self.last_round = state["last_round"].clone()
        self.step = float(state["step"])
        self.armijo = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state["armijo"].items()}
