"""N clients' SB3 DQN Q-networks, stacked along a client dimension and updated as one computation.

:class:`StackedDQN` mirrors ``stable_baselines3.DQN``: its Q-network is the one SB3 builds from the
env spec (read off a real SB3 agent,
:func:`~morlfed.tasks.rl.vectorised.template.template_agent`, built with the same arguments and
init seed as the SB3 client, so the architecture and the shared initial parameters are exactly
the SB3 client's), and one :meth:`StackedDQN.gradient_step` is ``DQN.train(gradient_steps=1)``
for every masked client: the target ``r + (1 - done) * gamma * max_a Q_target(s', a)``, the
Huber loss (mean over the client's own batch), ``clip_grad_norm_`` at ``max_grad_norm`` over the
client's own parameters, then the proximal term (added after clipping, as
:class:`~morlfed.core.proximal.ProximalOptimizer` does inside ``optimizer.step``) and one Adam step.
Nothing in an update mixes clients: a NaN in one client's slice stays there.

The Q-network's MLP runs as a :class:`~morlfed.tasks.rl.vectorised.mlp.StackedMLP` (one batched
matrix product per layer over all clients, backward pass written out), which costs far less per
step than ``vmap(functional_call(...))`` with autograd and computes the same function and
gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3 import DQN
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.torch_layers import FlattenExtractor

from morlfed.core.params import ParamLayout
from morlfed.tasks.rl.agent import layout_of
from morlfed.tasks.rl.vectorised.learner import Batch, StackedLearner
from morlfed.tasks.rl.vectorised.low_precision import PRECISIONS
from morlfed.tasks.rl.vectorised.mlp import StackedMLP, Workspace, aligned_rows
from morlfed.tasks.rl.vectorised.optim import MaskedAdam


class StackedDQN(StackedLearner):
    """N copies of an SB3 DQN's online and target Q-networks and Adam optimisers.

    Each network is stored as one ``[N, d]`` tensor in the layout's order (client ``i``'s row is
    its federated vector), and so is the gradient, so clipping, the proximal term, Adam and target
    updates are a handful of whole-tensor operations.

    :param n: number of clients
    :param agent: the SB3 DQN to mirror
        (:func:`~morlfed.tasks.rl.vectorised.template.template_agent`): its Q-network's
        architecture and parameters (every client starts from them), ``gamma``, ``tau``,
        ``max_grad_norm``, ``target_update_interval`` and the policy optimiser's settings
    :param device: torch device of the stacked parameters and of every update
    :param precision: ``fp32`` (SB3's arithmetic) or ``bf16``: the hidden layers' matrix products
        of a gradient step in bfloat16 (mixed precision: parameters, gradients, the output layer,
        the Q-values, the loss and Adam stay float32; each step casts the hidden layers' parameters
        once, their products and activations are bfloat16)
    """

    counts_calls = True

    def __init__(self, n: int, agent: OffPolicyAlgorithm, device: str = "cpu", precision: str = "fp32") -> None:
        if not isinstance(agent, DQN):
            raise TypeError(f"StackedDQN mirrors an SB3 DQN, got {type(agent).__name__}")
        if agent.n_steps != 1 or agent.n_envs != 1:
            raise ValueError("the vectorised DQN supports n_steps=1 and one env per client")
        if not isinstance(agent.learning_rate, (int, float)):
            raise ValueError("the vectorised DQN needs a constant learning_rate")
        q_net = agent.q_net
        space = q_net.observation_space
        if not isinstance(q_net.features_extractor, FlattenExtractor) or not (
            isinstance(space, spaces.Box) and len(space.shape) == 1
        ):
            raise ValueError("the vectorised DQN needs a 1-d Box observation space and SB3's MlpPolicy")
        optimiser = agent.policy.optimizer
        defaults = optimiser.defaults
        if type(optimiser) is not torch.optim.Adam or defaults.get("weight_decay") or defaults.get("amsgrad"):
            raise ValueError(
                "the vectorised DQN supports SB3's default optimiser: Adam without weight decay or amsgrad"
            )
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.n, self.device, self.precision = n, torch.device(device), precision
        self._layout = layout_of({"q_net": q_net})
        self.mlp = StackedMLP(q_net.q_net, "q_net.q_net.", self._layout)
        self.gamma, self.tau, self.max_grad_norm = float(agent.gamma), float(agent.tau), float(agent.max_grad_norm)
        self.target_interval = max(int(agent.target_update_interval) // agent.n_envs, 1)
        initial = self._layout.flatten({f"q_net.{k}": p for k, p in q_net.named_parameters()}).detach()
        dim = self._layout.dim
        #: the online networks, ``[N, d]`` (:func:`aligned_rows`); ``online.grad`` is the gradient buffer of a step
        self.online = aligned_rows(n, dim, self.device).copy_(initial)
        self.online.grad = aligned_rows(n, dim, self.device)
        #: the target networks, ``[N, d]``
        self.target = aligned_rows(n, dim, self.device).copy_(initial)
        self._online_views = self.mlp.views(self.online)
        self._target_views = self.mlp.views(self.target)
        self._grad_views = self.mlp.views(self.online.grad)
        #: bf16: the networks as the gradient step computes with them: a dense bfloat16 copy of
        #: every hidden layer's parameters, ``[N, *shape]`` (oneDNN's bfloat16 products copy an
        #: operand whose clients are not laid out densely), and the float32 output layer itself.
        #: The output layer stays float32 because the loss subtracts its outputs: Q-values rounded
        #: to bfloat16's 8 significant bits (steps of 0.25 at a Q-value of 50) would quantise the
        #: TD errors that the Huber loss clips at 1. The target's copy is refreshed only when it
        #: changed.
        self._low: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        self._low_names = [k for k in self._online_views if k not in self.mlp.output_names()]
        self._low_target_stale = True
        if precision == "bf16":
            self._low = tuple(  # type: ignore[assignment]
                views | {k: views[k].to(torch.bfloat16, memory_format=torch.contiguous_format) for k in self._low_names}
                for views in (self._online_views, self._target_views)
            )
        cpu = self.device.type == "cpu"
        self._online_numpy = {k: v.numpy() for k, v in self._online_views.items()} if cpu else None
        beta1, beta2 = defaults["betas"]
        lr, eps = float(agent.learning_rate), float(defaults["eps"])
        self.optimiser = MaskedAdam({"q_net": self.online}, lr, (float(beta1), float(beta2)), eps)
        # one set of buffers per use within a gradient step (the target's pass, the online pass
        # and its backward), reused from step to step
        self._workspaces = {"target": Workspace(), "online": Workspace(), "backward": Workspace()}

    @property
    def layout(self) -> ParamLayout:
        """The SB3 client's layout: ``q_net.q_net.<k>.weight`` / ``.bias``, the last layer as head."""
        return self._layout

    def read(self, i: int) -> torch.Tensor:
        """Client ``i``'s online Q-network as a ``[d]`` vector."""
        return self.online[i].cpu().clone()

    def load(self, i: int, flat: torch.Tensor) -> None:
        """Load a ``[d]`` vector into client ``i``'s online Q-network and its target."""
        if flat.shape != (self._layout.dim,):
            raise ValueError(f"expected a parameter vector of shape ({self._layout.dim},), got {tuple(flat.shape)}")
        self.online[i] = flat
        self.target[i] = flat
        self._low_target_stale = True

    def q_values(self, observations: torch.Tensor, target: bool = False) -> torch.Tensor:
        """Every client's Q-values for a batch of observations each.

        ``[N, B, obs_dim]`` -> ``[N, B, n_actions]``; the observations are preprocessed as SB3's
        ``preprocess_obs`` does: cast to float, flattened.

        :param observations: one batch per client
        :param target: use the target networks instead of the online ones
        """
        x = observations.to(self.device).float().flatten(2)
        return self.mlp.forward(self._target_views if target else self._online_views, x)[0]

    def act(self, observations: torch.Tensor) -> torch.Tensor:
        """Every client's greedy action (argmax of its Q-values) for its ``[obs_dim]`` observation.

        On the CPU it is computed in numpy, cheaper for one observation per client.
        """
        if self._online_numpy is None:
            return self.q_values(observations.unsqueeze(1)).argmax(dim=2).squeeze(1)
        x = observations.float().flatten(1).numpy()[:, None, :]
        return torch.from_numpy(self.mlp.forward_numpy(self._online_numpy, x)[:, 0].argmax(axis=1))

    def gradient_step(
        self, batch: Batch, mask: torch.Tensor, prox_mu: torch.Tensor, prox_centre: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One ``DQN.train(gradient_steps=1)`` step for the clients where ``mask`` is true.

        The step is described in the module docstring.

        :return: the per-client Huber ``loss`` (``[N]``)
        """
        ws = self._workspaces
        online_views, target_views = self._online_views, self._target_views
        if self._low is not None:
            for name in self._low_names:
                self._low[0][name].copy_(self._online_views[name])
            if self._low_target_stale:
                for name in self._low_names:
                    self._low[1][name].copy_(self._target_views[name])
                self._low_target_stale = False
            online_views, target_views = self._low
        # float32 inputs; each layer casts its input to its own precision (StackedMLP.forward)
        next_x = batch.next_observations.to(self.device, torch.float32).flatten(2)
        next_q = self.mlp.forward(target_views, next_x, workspace=ws["target"])[0].max(dim=2).values.unsqueeze(2)
        target_q = batch.rewards + (1 - batch.dones) * self.gamma * next_q
        x = batch.observations.to(self.device, torch.float32).flatten(2)
        q, saved = self.mlp.forward(online_views, x, keep=True, workspace=ws["online"])
        actions = batch.actions.long()
        current = torch.gather(q, dim=2, index=actions)
        loss = F.smooth_l1_loss(current, target_q, reduction="none").mean(dim=(1, 2))
        # d mean(smooth_l1) / d current, scattered back onto the taken actions (gather's backward)
        delta = (current - target_q).clamp(-1.0, 1.0) * (1.0 / current.shape[1])
        d_q = torch.zeros_like(q).scatter_(2, actions, delta)
        self.mlp.backward(online_views, saved, d_q, self._grad_views, workspace=ws["backward"])
        grad: torch.Tensor = self.online.grad  # type: ignore[assignment]
        # clip_grad_norm_(max_grad_norm) per client, over that client's parameters only; a factor
        # of 1 changes nothing, so on the CPU the pass is skipped when no client is clipped
        coef = (self.max_grad_norm / (torch.linalg.vector_norm(grad, dim=1) + 1e-6)).clamp(max=1.0)
        if self.device.type != "cpu" or bool((coef < 1.0).any()):
            grad.mul_(coef.unsqueeze(1))
        if bool((prox_mu > 0).any()):
            mu = prox_mu.to(self.device, torch.float32).unsqueeze(1)
            grad.add_(mu * (self.online - prox_centre.to(self.device)))
        self.optimiser.step(mask)
        return {"loss": loss}

    def after_env_step(self, n_calls: torch.Tensor, mask: torch.Tensor) -> None:
        """SB3's ``DQN._on_step`` target update: ``polyak_update(q_net, q_net_target, tau)``.

        It updates every stepped client whose ``_n_calls`` is a multiple of ``target_update_interval``.
        """
        due = mask.cpu().numpy() & (n_calls.cpu().numpy() % self.target_interval == 0)
        if not due.any():
            return
        on = torch.from_numpy(due).to(self.device).unsqueeze(1)
        self.target.copy_(torch.where(on, self.target.mul(1 - self.tau).add(self.online, alpha=self.tau), self.target))
        self._low_target_stale = True

    def optimiser_state(self, i: int) -> dict[str, Any]:
        """Client ``i``'s Adam state (step count and moments; an independent copy)."""
        return {"adam": self.optimiser.state_of(i)}

    def load_optimiser_state(self, i: int, state: Mapping[str, Any] | None) -> None:
        """Restore client ``i``'s Adam state; ``None``: a fresh one."""
        if state is None:
            self.optimiser.reset(i)
        else:
            self.optimiser.load_state_of(i, state["adam"])
