"""Adam for N clients' stacked parameters, with a per-client mask.

Every parameter tensor is stacked over clients (``[N, ...]``). Clients whose mask entry is false
this step are left exactly as they are: parameters, moments and step count. Each client's row is
updated as its own tensor by torch's fused Adam kernel (``torch.optim.Adam(fused=True)``'s, with
default ``betas``, ``eps``, no weight decay, not amsgrad): one pass over the row instead of the
dozen element-wise passes of the default implementation that SB3 uses, whose results it matches
to within a float32 rounding. Since every row is a separate tensor of the same length, a client's
update does not depend on the other clients, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.optim.adam import adam


class MaskedAdam:
    """Per-client Adam over stacked parameters.

    :param params: the stacked parameters (``[N, ...]`` tensors)
    :param lr: step size
    :param betas: Adam's moment decay rates
    :param eps: Adam's denominator term
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = dict(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        first = next(iter(self.params.values()))
        self.n = first.shape[0]
        #: the step count of each (parameter, client) (float32, as torch's Adam keeps it); the
        #: parameters of a client advance together unless one of them has no gradient
        self.steps = torch.zeros(len(self.params), self.n, device=first.device)
        self.exp_avg = {k: torch.zeros_like(p) for k, p in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in self.params.items()}
        # per-row views, so that the fused kernel updates each client's row as its own tensor
        self._rows = {
            k: (p.unbind(0), self.exp_avg[k].unbind(0), self.exp_avg_sq[k].unbind(0), self.steps[j].unbind(0))
            for j, (k, p) in enumerate(self.params.items())
        }

    @property
    def step_count(self) -> torch.Tensor:
        """Each client's step count (``[N]``, of its first parameter)."""
        return self.steps[0]

    @torch.no_grad()
    def step(self, mask: torch.Tensor, grads: Mapping[str, torch.Tensor] | None = None) -> None:
        """One Adam step for the clients where ``mask`` (``[N]`` bool) is true.

        All the masked clients' rows of every parameter go through one fused-kernel call.

        :param mask: the clients that take the step (read on the CPU)
        :param grads: the masked clients' gradients, ``{name: [k, ...]}`` in client order;
            default: the masked rows of every parameter's ``grad``
        """
        rows = torch.nonzero(mask.cpu()).flatten().tolist()
        # the fused kernel's argument lists, one entry per (parameter, masked client) row
        params_in: list[torch.Tensor] = []
        grads_in: list[torch.Tensor] = []
        exp_avgs_in: list[torch.Tensor] = []
        exp_avg_sqs_in: list[torch.Tensor] = []
        steps_in: list[torch.Tensor] = []
        for name, (params, exp_avg, exp_avg_sq, steps) in self._rows.items():
            grad = self.params[name].grad if grads is None else grads.get(name)
            if grad is None or not rows:
                continue
            params_in.extend(params[i] for i in rows)
            grads_in.extend(grad.unbind(0) if grads is not None else (grad[i] for i in rows))
            exp_avgs_in.extend(exp_avg[i] for i in rows)
            exp_avg_sqs_in.extend(exp_avg_sq[i] for i in rows)
            steps_in.extend(steps[i] for i in rows)
        if not params_in:
            return
        beta1, beta2 = self.betas
        adam(
            params_in,
            grads_in,
            exp_avgs_in,
            exp_avg_sqs_in,
            [],  # max_exp_avg_sqs: amsgrad only
            steps_in,
            fused=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=self.lr,
            weight_decay=0.0,
            eps=self.eps,
            maximize=False,
        )

    def state_of(self, i: int) -> dict[str, object]:
        """Client ``i``'s optimiser state (an independent copy)."""
        return {
            "step": float(self.step_count[i]),
            "exp_avg": {k: v[i].clone() for k, v in self.exp_avg.items()},
            "exp_avg_sq": {k: v[i].clone() for k, v in self.exp_avg_sq.items()},
        }

    def load_state_of(self, i: int, state: Mapping[str, object]) -> None:
        """Restore client ``i``'s optimiser state from :meth:`state_of`."""
        self.steps[:, i] = float(state["step"])  # type: ignore[arg-type]
        for key, target in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
            for name, value in state[key].items():  # type: ignore[attr-defined]
                target[name][i].copy_(value)

    def reset(self, i: int) -> None:
        """Give client ``i`` a fresh optimiser (no steps, zero moments)."""
        self.steps[:, i] = 0
        for target in (self.exp_avg, self.exp_avg_sq):
            for value in target.values():
                value[i].zero_()
