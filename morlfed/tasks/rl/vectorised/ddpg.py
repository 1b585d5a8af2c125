"""N clients' SB3 DDPG actors and critics, stacked along a client dimension and updated as one computation.

:class:`StackedDDPG` mirrors ``stable_baselines3.DDPG`` (SB3's ``TD3`` with ``policy_delay=1`` and
no target policy noise). Its networks are the ones SB3 builds from the env spec, read off a real
SB3 agent (:func:`~morlfed.tasks.rl.vectorised.template.template_agent`, built with the same
arguments and init seed as the SB3 client, so the architectures and the shared initial parameters
are exactly the SB3 client's). The actor's ``mu`` and each critic's ``qf<k>`` MLP run as
:class:`~morlfed.tasks.rl.vectorised.mlp.StackedMLP` (one batched matrix product per layer over
the clients, backward pass written out; SB3's ``FlattenExtractor`` on a 1-d observation is the
identity and the critic's input is ``cat([obs, action])``). One
:meth:`StackedDDPG.gradient_step` is one iteration of ``TD3.train``'s loop for every masked
client:

1. ``next_a = clamp(actor_target(s'), -1, 1)``; ``y = r + (1 - done) * gamma * min_k
   critic_target_k(s', next_a)`` (no gradient);
2. critic loss ``sum_k mse(critic_k(s, a), y)`` (mean over the client's own batch), its gradient,
   FedProx's ``mu * (theta - centre)`` added (as :class:`~morlfed.core.proximal.ProximalOptimizer` adds
   it inside ``optimizer.step``), one Adam step of the critic;
3. actor loss ``-mean critic_0(s, actor(s))`` with the *updated* critic, its gradient (actor
   parameters only), the proximal term, one Adam step of the actor;
4. ``polyak_update`` of the critic target and the actor target with ``tau``.

Only the masked clients' rows are computed (every network, optimiser state and target of the
others is left as it is). DDPG clips no gradients. Nothing mixes clients: a NaN in one client's
batch stays in its slice.

With ``precision="bf16"`` the hidden layers of every network (the actor, the critics and their
targets) compute in bfloat16, as :class:`~morlfed.tasks.rl.vectorised.dqn.StackedDQN`'s do: mixed
precision, the parameters, gradients, each network's output layer (the actions, the Q-values),
the losses, the proximal term, Adam and the target updates stay float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3 import DDPG
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.torch_layers import FlattenExtractor
from torch import nn

from morlfed.core.params import ParamLayout
from morlfed.tasks.rl.agent import layout_of
from morlfed.tasks.rl.vectorised.learner import Batch, StackedLearner
from morlfed.tasks.rl.vectorised.low_precision import PRECISIONS, HiddenCopies
from morlfed.tasks.rl.vectorised.mlp import StackedMLP, Workspace, aligned_rows, select_rows
from morlfed.tasks.rl.vectorised.optim import MaskedAdam


def scale_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """SB3's ``BasePolicy.scale_action``: from the action space's ``[low, high]`` to ``[-1, 1]``.

    :param action: actions in the env's bounds (``[..., act_dim]``)
    :param low: the action space's lower bounds
    :param high: the action space's upper bounds
    """
    return 2.0 * ((action - low) / (high - low)) - 1.0


def unscale_action(scaled: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """SB3's ``BasePolicy.unscale_action``: from ``[-1, 1]`` to the action space's ``[low, high]``.

    :param scaled: actions in ``[-1, 1]`` (``[..., act_dim]``)
    :param low: the action space's lower bounds
    :param high: the action space's upper bounds
    """
    return low + (0.5 * (scaled + 1.0) * (high - low))


def explore_actions(
    unscaled: np.ndarray, noise: np.ndarray | None, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """SB3's ``OffPolicyAlgorithm._sample_action`` for a Box action space, after the action was chosen.

    Scale the action to ``[-1, 1]``, add the exploration noise and clip to ``[-1, 1]``.

    :param unscaled: actions in the env's bounds: a uniform sample of the action space during the
        warm-up, else what SB3's ``predict`` returns, ``unscale_action(actor(obs))``
    :param noise: the exploration noise (``NormalActionNoise()``'s draws), ``None``: none
    :param low: the action space's lower bounds
    :param high: the action space's upper bounds
    :return: the action for the env and the action stored in the replay buffer (scaled)
    """
    scaled = scale_action(unscaled, low, high)
    if noise is not None:
        scaled = np.clip(scaled + noise, -1, 1)
    return unscale_action(scaled, low, high), scaled


class StackedDDPG(StackedLearner):
    """N copies of an SB3 DDPG's actor, critic, their targets and their two Adam optimisers.

    Each network is stored as one ``[N, d_net]`` tensor in the SB3 client's layout order
    (:attr:`actor`, :attr:`actor_target`, :attr:`critic`, :attr:`critic_target`; client ``i``'s
    federated vector is ``cat(actor[i], critic[i])``), so the proximal term, Adam and the target
    updates are a few whole-tensor operations; :meth:`params` gives the stacked per-parameter
    views ``name -> [N, *shape]`` under the SB3 modules' parameter names.

    :param n: number of clients
    :param agent: the SB3 DDPG to mirror
        (:func:`~morlfed.tasks.rl.vectorised.template.template_agent`): its actor's and critic's
        architectures and parameters (every client starts from them), ``gamma``, ``tau`` and the
        optimisers' settings
    :param device: torch device of the stacked parameters and of every update (``"cpu"`` or
        ``"cuda"``)
    :param precision: ``fp32`` (SB3's arithmetic) or ``bf16``: the hidden layers' matrix products
        of a gradient step in bfloat16 (see the module docstring)
    """

    def __init__(self, n: int, agent: OffPolicyAlgorithm, device: str = "cpu", precision: str = "fp32") -> None:
        if not isinstance(agent, DDPG):
            raise TypeError(f"StackedDDPG mirrors an SB3 DDPG, got {type(agent).__name__}")
        _check_supported(agent)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.n, self.device, self.precision = n, torch.device(device), precision
        self.gamma, self.tau = float(agent.gamma), float(agent.tau)
        self._layout = layout_of({"actor": agent.actor, "critic": agent.critic})
        self._actor_layout = layout_of({"actor": agent.actor})
        self._critic_layout = layout_of({"critic": agent.critic})
        self._split = self._actor_layout.dim
        self._obs_dim = int(agent.observation_space.shape[0])  # type: ignore[index]
        self.actor_mlp = StackedMLP(agent.actor.mu, "actor.mu.", self._actor_layout)
        q_networks: list[nn.Sequential] = list(agent.critic.q_networks)  # type: ignore[arg-type]
        self.critic_mlps = [StackedMLP(q, f"critic.qf{k}.", self._critic_layout) for k, q in enumerate(q_networks)]
        actor = self._actor_layout.flatten({f"actor.{k}": p for k, p in agent.actor.named_parameters()})
        critic = self._critic_layout.flatten({f"critic.{k}": p for k, p in agent.critic.named_parameters()})
        actor, critic = actor.detach(), critic.detach()
        #: the online actors, ``[N, d_actor]`` (:func:`~morlfed.tasks.rl.vectorised.mlp.aligned_rows`, as the others)
        self.actor = aligned_rows(n, len(actor), self.device).copy_(actor)
        #: the online critics, ``[N, d_critic]``
        self.critic = aligned_rows(n, len(critic), self.device).copy_(critic)
        #: the target actors, ``[N, d_actor]``
        self.actor_target = aligned_rows(n, len(actor), self.device).copy_(actor)
        #: the target critics, ``[N, d_critic]``
        self.critic_target = aligned_rows(n, len(critic), self.device).copy_(critic)
        # every network and the gradient buffers (``[N, d_net]``, reused from step to step: a step of k
        # clients uses their first k rows, backward overwrites every entry, and once Adam has taken them
        # a GPU's target updates hold online * tau there), each with its stacked views, kept for the steps
        # of every client (they follow the in-place updates; a step of some clients views copies)
        flats = {
            "actor": self.actor,
            "actor_target": self.actor_target,
            "actor_grad": aligned_rows(n, len(actor), self.device),
            "critic": self.critic,
            "critic_target": self.critic_target,
            "critic_grad": aligned_rows(n, len(critic), self.device),
        }
        self._networks = {name: (flat, self._mlp_of(name).views(flat)) for name, flat in flats.items()}
        # buffers for the layers' outputs and the gradients between layers, reused from step to step: a
        # network's target pass and online pass share its forward buffers (the target's outputs are spent
        # before the online pass begins), one set per critic (the target critics' outputs meet in the min)
        # and one for the critics' inputs, which each use spends before the next is joined
        self._workspaces = {
            "actor": Workspace(),
            "actor_backward": Workspace(),
            "critic_backward": Workspace(),
            "critic_input": Workspace(),
        }
        self._critic_workspaces = [Workspace() for _ in self.critic_mlps]
        cpu = self.device.type == "cpu"
        # on the CPU the target updates and the proximal term run row by row through one row's
        # buffer, which stays in the core's cache between their passes (the same element-wise
        # operations, so the same bits); a GPU runs them on whole tensors
        self._row_buffer = aligned_rows(1, max(len(actor), len(critic)), self.device)[0] if cpu else None
        self._rows = {name: flat.unbind(0) for name, flat in flats.items()}
        #: bf16: the networks' hidden layers in bfloat16, as the gradient step computes with them; each
        #: output layer stays float32 (the critic's loss subtracts Q-values, the TD target and the
        #: actor's loss read them, the actions feed the critic)
        self._low: HiddenCopies | None = None
        if precision == "bf16":
            networks = ("actor", "actor_target", "critic", "critic_target")
            outputs = {
                name: {
                    k
                    for mlp in ([self.actor_mlp] if name.startswith("actor") else self.critic_mlps)
                    for k in mlp.output_names()
                }
                for name in networks
            }
            self._low = HiddenCopies({name: self._networks[name][1] for name in networks}, outputs)
        self._actor_numpy = {k: v.numpy() for k, v in self.actor_mlp.views(self.actor).items()} if cpu else None
        lr = float(agent.learning_rate)  # type: ignore[arg-type]
        self.actor_optimiser = _masked_adam("actor", self.actor, agent.actor.optimizer, lr)
        self.critic_optimiser = _masked_adam("critic", self.critic, agent.critic.optimizer, lr)

    @property
    def layout(self) -> ParamLayout:
        """The SB3 client's layout of the federated vector.

        ``actor.mu.<k>.weight`` / ``.bias`` then ``critic.qf<j>.<k>.weight`` / ``.bias``; each
        network's last layer is head.
        """
        return self._layout

    def params(self, network: str) -> dict[str, torch.Tensor]:
        """One network's stacked parameters ``{SB3 name: [N, *shape]}``.

        They are views of its ``[N, d]`` tensor, e.g. ``params("critic_target")["qf0.0.weight"]``.

        :param network: ``"actor"``, ``"actor_target"``, ``"critic"`` or ``"critic_target"``
        """
        flat: torch.Tensor = getattr(self, network)
        prefix = network.removesuffix("_target")
        layout = self._actor_layout if prefix == "actor" else self._critic_layout
        return {
            layer.name.removeprefix(f"{prefix}."): flat[:, layer.slice].view(self.n, *layer.shape)
            for layer in layout.layers
        }

    def read(self, i: int) -> torch.Tensor:
        """Client ``i``'s online actor and critic as a ``[d]`` vector."""
        return torch.cat([self.actor[i], self.critic[i]]).cpu()

    @torch.no_grad()
    def load(self, i: int, flat: torch.Tensor) -> None:
        """Load a ``[d]`` vector into client ``i``'s online actor and critic and their targets."""
        if flat.shape != (self._layout.dim,):
            raise ValueError(f"expected a parameter vector of shape ({self._layout.dim},), got {tuple(flat.shape)}")
        flat = flat.to(self.device, torch.float32)
        actor, critic = flat[: self._split], flat[self._split :]
        self.actor[i], self.actor_target[i] = actor, actor
        self.critic[i], self.critic_target[i] = critic, critic
        if self._low is not None:
            self._low.changed("actor", "actor_target", "critic", "critic_target")

    @torch.no_grad()
    def act(self, observations: torch.Tensor) -> torch.Tensor:
        """Every client's deterministic action for its observation (``[N, obs_dim]`` -> ``[N, act_dim]``).

        The action is the actor's ``tanh`` output, scaled to ``[-1, 1]``. On the CPU it is computed
        in numpy, cheaper for one observation per client.
        """
        if self._actor_numpy is None:
            obs = observations.to(self.device).float().unsqueeze(1)
            return self.actor_mlp.forward(self.actor_mlp.views(self.actor), obs)[0].squeeze(1)
        x = observations.float().numpy()[:, None, :]
        return torch.from_numpy(self.actor_mlp.forward_numpy(self._actor_numpy, x)[:, 0])

    @torch.no_grad()
    def gradient_step(
        self, batch: Batch, mask: torch.Tensor, prox_mu: torch.Tensor, prox_centre: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One iteration of ``TD3.train``'s loop for the clients where ``mask`` is true.

        The steps are listed in the module docstring. The other clients keep their networks,
        targets and optimiser states.

        :param batch: one minibatch per client (actions scaled to ``[-1, 1]``)
        :param mask: ``[N]`` bool, the clients that take the step
        :param prox_mu: ``[N]`` proximal coefficients (0: none)
        :param prox_centre: ``[N, d]`` proximal centres in the layout's order
        :return: per-client ``critic_loss`` and ``actor_loss`` (``[N]``, before the step's updates
            of the respective network; NaN for the clients outside ``mask``)
        """
        mask = mask.cpu()
        rows = None if bool(mask.all()) else torch.nonzero(mask).flatten().to(self.device)

        def pick(t: torch.Tensor) -> torch.Tensor:
            t = t.to(self.device)
            return t if rows is None else t.index_select(0, rows)

        obs, actions, next_obs = pick(batch.observations), pick(batch.actions), pick(batch.next_observations)
        rewards, dones = pick(batch.rewards), pick(batch.dones)
        mu = pick(prox_mu.to(self.device, torch.float32))
        centre = pick(prox_centre.to(self.device, torch.float32)) if bool((mu > 0).any()) else None
        # 1. the TD target
        ws, critic_ws = self._workspaces, self._critic_workspaces
        actor_target, critic_target = self._stepping("actor_target", rows)[1], self._stepping("critic_target", rows)[1]
        next_actions = self.actor_mlp.forward(actor_target, next_obs, workspace=ws["actor"])[0]
        target_in = self._critic_input(next_obs, next_actions, clamp=True)
        next_q = torch.cat(
            [mlp.forward(critic_target, target_in, workspace=w)[0] for mlp, w in zip(self.critic_mlps, critic_ws)],
            dim=2,
        )
        target_q = rewards + (1 - dones) * self.gamma * next_q.min(dim=2, keepdim=True).values
        # 2. the critic step
        (critic, views), (critic_grad, grad_views) = self._stepping("critic", rows), self._stepping("critic_grad", rows)
        critic_in = self._critic_input(obs, actions)
        critic_loss = torch.zeros(critic.shape[0], device=self.device)
        for mlp, w in zip(self.critic_mlps, critic_ws):
            q, saved = mlp.forward(views, critic_in, keep=True, workspace=w)
            critic_loss += ((q - target_q) ** 2).mean(dim=(1, 2))
            mlp.backward(views, saved, (q - target_q) * (2.0 / q.shape[1]), grad_views, ws["critic_backward"])
        if centre is not None:
            self._add_proximal(critic_grad, critic, mu, centre[:, self._split :])
        self.critic_optimiser.step(mask, {"critic": critic_grad})
        if self._low is not None:
            self._low.changed("critic")
        # 3. the actor step, through the updated critic (whose parameters it does not differentiate)
        (critic, critic_now), (actor, actor_views) = self._stepping("critic", rows), self._stepping("actor", rows)
        actor_grad, actor_grad_views = self._stepping("actor_grad", rows)
        new_actions, actor_saved = self.actor_mlp.forward(actor_views, obs, keep=True, workspace=ws["actor"])
        actor_in = self._critic_input(obs, new_actions)
        q, saved = self.critic_mlps[0].forward(critic_now, actor_in, keep=True, workspace=critic_ws[0])
        actor_loss = -q.mean(dim=(1, 2))
        d_q = torch.full_like(q, -1.0 / q.shape[1])
        d_in = self.critic_mlps[0].input_gradient(critic_now, saved, d_q, ws["critic_backward"])
        d_actions = d_in[..., self._obs_dim :].to(torch.float32)  # bf16: into the actor's float32 output layer
        self.actor_mlp.backward(actor_views, actor_saved, d_actions, actor_grad_views, ws["actor_backward"])
        if centre is not None:
            self._add_proximal(actor_grad, actor, mu, centre[:, : self._split])
        self.actor_optimiser.step(mask, {"actor": actor_grad})
        # 4. the target updates, from the updated networks (the critic is the one the actor's step read)
        self._update_target("critic", rows, critic_grad)
        self._update_target("actor", rows, actor_grad)
        if self._low is not None:
            self._low.changed("actor", "actor_target", "critic_target")
        return {"actor_loss": self._spread(actor_loss, rows), "critic_loss": self._spread(critic_loss, rows)}

    def _critic_input(self, obs: torch.Tensor, actions: torch.Tensor, clamp: bool = False) -> torch.Tensor:
        """``cat([obs, actions], dim=2)`` (``actions`` clamped to ``[-1, 1]`` if ``clamp``), in a reused buffer.

        The buffer is valid until the next call: the target pass, the critic step and the actor
        step each spend their input before the next is joined.
        """
        joined = self._workspaces["critic_input"].take(("input", 0), obs, obs.shape[1], obs.shape[2] + actions.shape[2])
        joined[..., : obs.shape[2]].copy_(obs)
        if clamp:
            torch.clamp(actions, -1, 1, out=joined[..., obs.shape[2] :])
        else:
            joined[..., obs.shape[2] :].copy_(actions)
        return joined

    def _add_proximal(self, grad: torch.Tensor, flat: torch.Tensor, mu: torch.Tensor, centre: torch.Tensor) -> None:
        """``grad += mu * (flat - centre)`` row by row.

        :param grad: a network's ``[k, d_net]`` gradient
        :param flat: its ``[k, d_net]`` parameters
        :param mu: ``[k]`` proximal coefficients
        :param centre: ``[k, d_net]`` the network's part of the proximal centres
        """
        if self._row_buffer is None:
            grad.add_(mu.unsqueeze(1) * (flat - centre))
            return
        row = self._row_buffer[: grad.shape[1]]
        for g, f, c, m in zip(grad.unbind(0), flat.unbind(0), centre.unbind(0), mu.unbind(0)):
            g.add_(torch.sub(f, c, out=row).mul_(m))

    def _update_target(self, name: str, rows: torch.Tensor | None, scratch: torch.Tensor) -> None:
        """SB3's ``polyak_update``: ``target = target * (1 - tau) + online * tau`` for the stepping clients.

        Rounded product by product (no fused multiply-add: a client's result never depends on its
        batch), in place.

        :param name: ``actor`` or ``critic``
        :param rows: the stepping clients (``None``: all)
        :param scratch: a spent ``[k, d_net]`` buffer (the network's gradient), for a GPU's whole-tensor update
        """
        online, target = self._networks[name][0], self._networks[f"{name}_target"][0]
        if self._row_buffer is not None:
            onlines, targets, row = self._rows[name], self._rows[f"{name}_target"], self._row_buffer[: online.shape[1]]
            for i in range(self.n) if rows is None else rows.tolist():
                targets[i].mul_(1 - self.tau).add_(torch.mul(onlines[i], self.tau, out=row))
            return
        moved = torch.mul(online if rows is None else select_rows(online, rows), self.tau, out=scratch)
        if rows is None:
            target.mul_(1 - self.tau).add_(moved)
        else:
            target.index_copy_(0, rows, select_rows(target, rows).mul_(1 - self.tau).add_(moved))

    def _mlp_of(self, name: str) -> StackedMLP:
        """The :class:`StackedMLP` that views network ``name`` (the critics' views span every critic)."""
        return self.actor_mlp if name.startswith("actor") else self.critic_mlps[0]

    def _stepping(self, name: str, rows: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The stepping clients' rows of a network or a gradient buffer, and their stacked views.

        :param name: ``actor``, ``actor_target``, ``actor_grad``, ``critic``, ``critic_target`` or
            ``critic_grad``
        :param rows: the stepping clients, ``None``: all (the kept views); else a network's rows are
            copied (:func:`~morlfed.tasks.rl.vectorised.mlp.select_rows`), a gradient buffer's first rows
            taken; with ``bf16``, a network's views hold its hidden layers' bfloat16 copies
        """
        flat, views = self._networks[name]
        if rows is not None:
            flat = flat[: rows.shape[0]] if name.endswith("_grad") else select_rows(flat, rows)
            views = self._mlp_of(name).views(flat)
        if self._low is not None and not name.endswith("_grad"):
            views = self._low.views(name, views, rows)
        return flat, views

    def _spread(self, values: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """``[k]`` values of the masked clients as an ``[N]`` tensor (NaN elsewhere)."""
        if rows is None:
            return values
        return torch.full((self.n,), float("nan"), device=self.device).index_copy_(0, rows, values)

    def optimiser_state(self, i: int) -> dict[str, Any]:
        """Client ``i``'s actor and critic Adam states (step counts and moments; a copy)."""
        return {"actor": self.actor_optimiser.state_of(i), "critic": self.critic_optimiser.state_of(i)}

    def load_optimiser_state(self, i: int, state: Mapping[str, Any] | None) -> None:
        """Restore client ``i``'s actor and critic Adam states; ``None``: fresh ones."""
        for name, optimiser in (("actor", self.actor_optimiser), ("critic", self.critic_optimiser)):
            if state is None:
                optimiser.reset(i)
            else:
                optimiser.load_state_of(i, state[name])


def _check_supported(agent: DDPG) -> None:
    """Raise ``ValueError`` unless ``agent`` is a DDPG the stacked learner reproduces exactly."""
    if agent.policy_delay != 1 or agent.target_noise_clip != 0:
        raise ValueError("StackedDDPG reproduces DDPG: policy_delay=1 and no target policy noise")
    if agent.n_steps != 1 or agent.n_envs != 1:
        raise ValueError("the vectorised DDPG supports n_steps=1 and one env per client")
    if not isinstance(agent.learning_rate, (int, float)):
        raise ValueError("the vectorised DDPG needs a constant learning_rate")
    space = agent.observation_space
    extractors = (agent.actor.features_extractor, agent.critic.features_extractor)
    if not (isinstance(space, spaces.Box) and len(space.shape) == 1) or not all(
        isinstance(e, FlattenExtractor) for e in extractors
    ):
        raise ValueError("the vectorised DDPG needs a 1-d Box observation space and SB3's MlpPolicy")
    for module in (agent.actor, agent.critic):
        if any(True for _ in module.buffers()):
            raise ValueError("the vectorised DDPG supports networks without buffers (no batch norm)")


def _masked_adam(name: str, flat: torch.Tensor, optimiser: torch.optim.Optimizer, lr: float) -> MaskedAdam:
    """A :class:`MaskedAdam` over ``flat`` with the settings of SB3's ``optimiser`` (plain Adam).

    :param name: the network's name (the optimiser state's key)
    :param flat: the network's stacked ``[N, d_net]`` parameters
    :param optimiser: the SB3 network's optimiser
    :param lr: the constant learning rate
    """
    defaults = optimiser.defaults
    if type(optimiser) is not torch.optim.Adam or defaults.get("weight_decay") or defaults.get("amsgrad"):
        raise ValueError("the vectorised DDPG supports SB3's default optimiser: Adam without weight decay or amsgrad")
    beta1, beta2 = defaults["betas"]
    return MaskedAdam({name: flat}, lr, (float(beta1), float(beta2)), float(defaults["eps"]))
