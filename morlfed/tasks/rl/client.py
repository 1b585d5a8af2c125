"""An RL client: a stable-baselines3 DQN or DDPG agent on an MO-Gymnasium environment.

The agent is trained on the client's private linear scalarisation ``w_i . r``. The federated model
is the agent's online network(s): DQN's ``q_net``; DDPG's ``actor`` and ``critic``. On receiving a
model the client loads it and copies it into the target network(s). Replay buffer, optimiser state
and the personal model stay local across rounds. Evaluation runs deterministic, seeded episodes on
the vector-reward env.
"""

from __future__ import annotations

import contextlib
import copy
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from stable_baselines3 import DDPG, DQN
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.noise import NormalActionNoise

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation
from morlfed.core.proximal import install_proximal
from morlfed.core.seeding import derive_seed
from morlfed.envs import EnvSpec, make_eval_env, make_train_env
from morlfed.runtime.client import PERSONAL_SLOT, Client, TrainJob, TrainOutput
from morlfed.storage.safestate import plain_attributes
from morlfed.tasks.rl.agent import build_agent, layout_of
from morlfed.tasks.rl.clock import BudgetExplorationSchedule, EpsilonDecay, FitClock
from morlfed.tasks.rl.evaluation import evaluate_episodes, load_networks
from morlfed.tasks.rl.factory import RLFactory
from morlfed.tasks.rl.fit_report import RLFitReport
from morlfed.tasks.rl.state import CarriedState, finished_returns, use_slot


class TrainingLog(Logger):
    """An SB3 logger without outputs that also keeps every training loss SB3 records, until :meth:`take`.

    The losses are ``train/loss`` for DQN, ``train/actor_loss`` and ``train/critic_loss`` for DDPG:
    one value per training phase, each the mean over its gradient steps.
    """

    def __init__(self) -> None:
        super().__init__(folder=None, output_formats=[])
        self._losses: dict[str, list[float]] = {}

    def record(self, key: str, value: Any, exclude: str | tuple[str, ...] | None = None) -> None:
        """Record ``value`` as SB3's :class:`Logger` does, and keep it when it is a training loss."""
        super().record(key, value, exclude)
        if key.startswith("train/") and key.endswith("loss"):
            self._losses.setdefault(key.removeprefix("train/"), []).append(float(value))

    def take(self) -> dict[str, float]:
        """The mean of each loss kept since the last call (``loss``, ``actor_loss``, ...), then forget them."""
        means = {key: float(np.mean(values)) for key, values in self._losses.items()}
        self._losses = {}
        return means


class RLClient(RLFitReport, Client):
    """A federated client around an SB3 agent.

    **Fit options** (:class:`~morlfed.core.protocol.FitTask`): interpreted by
    :class:`~morlfed.runtime.client.Client` (which models to train, losses, proximal centres, the
    personal model); this class trains one model with SB3 and measures a loss. Each fit trains
    for ``local_steps`` env steps.
    ``num_samples`` counts the env steps that trained the returned model(s); ``steps_spent`` the
    env steps of every training of the fit (personal model included), read from SB3's counter.

    **Loss of a model** (IFCA, FedFew, FedMHC's head choice): ``-(w_i . R) / spec.return_scale``,
    where ``R`` is the mean undiscounted vector return of ``spec.eval_episodes`` deterministic
    episodes run by :meth:`evaluate` with seed ``derive_seed(seed, "loss", cid, round, k)``.
    Lower is better; dividing by the spec's return scale makes loss temperatures mean the same
    across environments.

    **Several models, one agent.** Model k is loaded into the online network(s) with a target
    sync, trained with ``learn(local_steps, reset_num_timesteps=False)`` and read out. The replay
    buffer is shared by all models: it is the client's data (transitions rewarded with its own
    scalarisation; DQN and DDPG learn off-policy, so any model may learn from any transition).
    The optimiser state is *not* shared: the client keeps one optimiser state per model slot and
    swaps it into the SB3 optimiser(s) before training that model
    (:func:`~morlfed.tasks.rl.state.use_slot`).
    Randomness: a ``[d]`` fit reseeds SB3 from ``derive_seed(seed, "fit", cid, round)``; model k
    of a ``[K, d]`` fit from ``derive_seed(seed, "fit", cid, round, k)``; the personal model from
    ``derive_seed(seed, "personal", cid, round)``. Every training starts a fresh episode. DQN's
    exploration schedule is :class:`~morlfed.tasks.rl.clock.BudgetExplorationSchedule`: it
    advances by one round's budget per fit, whatever the number of models (with
    ``split_budget``, by the env steps of all its trainings, which share that budget).

    **FedProx** (``prox_mu > 0``): the SB3 optimiser(s) (DQN ``policy.optimizer``; DDPG
    ``actor.optimizer`` and ``critic.optimizer``) are wrapped by
    :class:`~morlfed.core.proximal.ProximalOptimizer` for the fit, adding ``mu * (theta - centre)`` to
    the gradients; the centre is ``task.prox_centre`` (``[d]``, or one row per model ``[K, d]``)
    or else the starting model.

    **Personal model** (``personal_lambda``): trained after the shared model(s) with the same
    proximal wrapper (``mu = lambda``) and its own optimiser slot; evaluating ``None``
    evaluates it (the shared initial model if the client never trained one).

    State carried across rounds (what a checkpoint of the client must hold): the agent (networks,
    replay buffer, the active slot's optimiser state, step counters) and the
    :class:`~morlfed.tasks.rl.state.CarriedState` (``_optimiser_slots`` and ``_active_slot``,
    ``personal``, the exploration clock ``_schedule.offset`` (DQN), the Monitor's records and
    ``_episodes_seen``). :meth:`get_state` / :meth:`set_state` capture and restore exactly that
    (checkpoints, rollback of a failed fit).

    :param cid: client id
    :param spec: the environment spec (gym id, agent, SB3 hyper-parameters, gamma, ...)
    :param weights: the client's private preference ``w_i`` (``[m]``, on the simplex)
    :param seed: the run's root seed; every draw derives from (seed, purpose, client, round)
    :param local_steps: the env steps of one fit
    :param rounds: the run's rounds: with ``local_steps``, the client's whole budget
        ``rounds x local_steps``, over which the exploration schedule runs
    :param torch_threads: torch intra-op threads while this client computes
    :param device: the torch device of the agent's networks (parameter vectors are always on the CPU)
    """

    def __init__(
        self,
        cid: int,
        spec: EnvSpec,
        weights: np.ndarray,
        seed: int,
        local_steps: int,
        rounds: int,
        torch_threads: int = 1,
        device: str = "cpu",
    ) -> None:
        super().__init__([cid], seed, local_steps)
        self.cid, self.spec = cid, spec
        total_steps = self.local_steps * rounds
        self.weights = np.asarray(weights, dtype=np.float64)
        self.torch_threads = torch_threads
        torch.set_num_threads(torch_threads)
        noise_std = spec.agent_kwargs.get("action_noise_std")
        self.train_env = make_train_env(spec, self.weights, seed=derive_seed(seed, "train-env", cid))
        noise = None
        if noise_std is not None:
            action_shape = self.train_env.action_space.shape
            assert action_shape is not None, "action_noise_std needs a continuous (Box) action space"
            n_act = action_shape[0]
            noise = NormalActionNoise(np.zeros(n_act), noise_std * np.ones(n_act))
        self.agent = build_agent(spec, self.train_env, seed, device, noise)
        # A logger with no outputs (otherwise SB3 makes a new /tmp/SB3-<time> folder at every learn())
        # that keeps SB3's training losses for FitResult.learner_stats.
        self._training_log = TrainingLog()
        self.agent.set_logger(self._training_log)
        self._schedule: BudgetExplorationSchedule | None = None
        if isinstance(self.agent, DQN):
            self._schedule = BudgetExplorationSchedule(self.agent, EpsilonDecay.of(self.agent, total_steps))
            self.agent.exploration_schedule = self._schedule
            self._online: dict[str, torch.nn.Module] = {"q_net": self.agent.q_net}
            self._targets: list[tuple[torch.nn.Module, torch.nn.Module]] = [(self.agent.q_net, self.agent.q_net_target)]
            self._optimiser_owners: dict[str, Any] = {"policy": self.agent.policy}
        else:
            assert isinstance(self.agent, DDPG), f"agent {spec.agent!r} is neither DQN nor DDPG"
            self._online = {"actor": self.agent.actor, "critic": self.agent.critic}
            self._targets = [(self.agent.actor, self.agent.actor_target), (self.agent.critic, self.agent.critic_target)]
            self._optimiser_owners = {"actor": self.agent.actor, "critic": self.agent.critic}
        self._layout = layout_of(self._online)
        self.eval_env = make_eval_env(spec, seed=derive_seed(seed, "eval-env", cid))
        self._eval_policy = copy.deepcopy(self.agent.policy)
        self._eval_policy.set_training_mode(False)
        self._episodes_seen = 0
        # Optimiser state per model slot; the active slot's state lives in the SB3 optimiser(s).
        self._fresh_optimiser = self._optimiser_state()
        self._optimiser_slots: dict[str, dict[str, dict[str, Any]]] = {}
        self._active_slot = "model-0"
        self._initial = self.initial_params()
        self._fit_clock = FitClock()

    @property
    def layout(self) -> ParamLayout:
        """Layout of the federated vector (online network parameters, last layers as head)."""
        return self._layout

    def initial_params(self) -> torch.Tensor:
        """The online network(s) as a ``[d]`` vector; before any fit, the shared initial model."""
        return self._layout.flatten({k: p.cpu() for k, p in self._named_online().items()})

    def _train(self, jobs: Mapping[int, TrainJob]) -> dict[int, TrainOutput]:
        """Train this client's model of the wave with SB3 (see the class docstring for seeds and the exploration clock)."""
        return {cid: self._train_one(job) for cid, job in jobs.items()}

    def _train_one(self, job: TrainJob) -> TrainOutput:
        torch.set_num_threads(self.torch_threads)
        seed = derive_seed(self.seed, PERSONAL_SLOT if job.personal else "fit", self.cid, *job.keys)
        before = self.agent.num_timesteps
        params, rewards = self._learn(job, seed)
        learner = self._training_log.take()
        if isinstance(self.agent, DQN):
            learner["exploration_rate"] = float(self.agent.exploration_rate)
        return TrainOutput(params, {"rewards": rewards, "steps": self.agent.num_timesteps - before}, learner)

    def evaluate_client(self, cid: int, params: torch.Tensor | None, seed: int) -> Evaluation:
        """Run ``spec.eval_episodes`` deterministic episodes with ``params`` (``None``: the personal model).

        The model is loaded into a separate copy of the policy (the training agent is untouched).

        :param cid: this client's id
        :param params: the ``[d]`` model
        :param seed: the evaluation seed
        """
        self._check_cid(cid)
        if params is None:
            # A client that never trained a personal model (never sampled) deploys the shared
            # initial model, which is what its personal model would have started from.
            personal = self.personal_model(cid)
            params = personal if personal is not None else self._initial
        torch.set_num_threads(self.torch_threads)
        load_networks(self._eval_policy, self._online, self._layout.unflatten(params.float()))
        return evaluate_episodes(
            self._eval_policy, self.eval_env, self.weights, self.spec.gamma, self.spec.eval_episodes, seed
        )

    def get_state(self, cid: int) -> dict[str, Any]:
        """Everything the client carries from one round to the next, as a copy that a state file can hold.

        The copy is independent of the client. It holds the agent's networks and active optimiser
        state(s) (``get_parameters``), its replay buffer's arrays and position, its scalar attributes (``num_timesteps``,
        ``_n_calls``, ``_n_updates``, ``_episode_num``, ``exploration_rate``, ...), its episode-info
        buffers, the training Monitor's episode records, and the client's own ``_episodes_seen``,
        optimiser slots, personal model and exploration clock. RNG states are not part of it:
        every training reseeds them from (seed, client, round).

        :param cid: this client's id
        """
        self._check_cid(cid)
        agent = self.agent
        learner = copy.deepcopy(
            {
                "agent": agent.get_parameters(),
                "replay_buffer": plain_attributes(agent.replay_buffer),
                "attributes": {k: v for k, v in vars(agent).items() if isinstance(v, (bool, int, float, np.number))},
                "episode_info": [
                    None if b is None else list(b) for b in (agent.ep_info_buffer, agent.ep_success_buffer)
                ],
            }
        )
        offset = self._schedule.offset if self._schedule is not None else 0
        carried = CarriedState.capture(
            self.train_env,
            self._episodes_seen,
            self._optimiser_slots,
            self._active_slot,
            self.personal_model(cid),
            offset,
        )
        return learner | carried.as_dict()

    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`get_state` (the client takes ownership of it).

        :param cid: this client's id
        :param state: the state
        """
        self._check_cid(cid)
        agent = self.agent
        agent.set_parameters(state["agent"], exact_match=True, device=self.agent.device)
        for name, value in state["replay_buffer"].items():  # its arrays, position and sizes
            setattr(agent.replay_buffer, name, value)
        for name, value in state["attributes"].items():
            setattr(agent, name, value)
        window = agent._stats_window_size
        agent.ep_info_buffer, agent.ep_success_buffer = (
            None if b is None else deque(b, maxlen=window) for b in state["episode_info"]
        )
        carried = CarriedState.of(state)
        carried.restore_monitor(self.train_env)
        self._episodes_seen = carried.episodes_seen
        self._optimiser_slots, self._active_slot = carried.optimiser_slots, carried.active_slot
        self.set_personal_model(cid, carried.personal)
        if self._schedule is not None:
            self._schedule.offset = carried.schedule_offset

    # ------------------------------------------------------------------------------------------
    def _learn(self, job: TrainJob, seed: int) -> tuple[torch.Tensor, list[float]]:
        """Train one model from ``job.start`` for ``job.steps`` env steps with the random seed ``seed``.

        :return: the trained ``[d]`` model and the finished training episodes' scalarised returns
        """
        self._active_slot = use_slot(
            self._optimiser_slots, self._active_slot, job.slot, self._optimiser_state, self._load_optimiser_state
        )
        self._load(job.start)
        if self._schedule is not None:
            offset = self._fit_clock.offset(self.agent.num_timesteps, self._schedule.offset, job.first)
            self._schedule.offset = offset
            assert isinstance(self.agent, DQN), "only a DQN agent has an exploration schedule"
            self.agent.exploration_rate = self._schedule(1.0)
        # SB3 draws exploration and replay samples from the global RNGs: reseed them, the action
        # space and the env (applied at the next reset) from this training's own seed.
        self.agent.set_random_seed(seed)
        # Every training starts a fresh episode: the client's state between rounds is then only
        # networks, optimiser and replay buffer (no env mid-episode), which makes checkpoints exact.
        self.agent._last_obs = None
        with self._proximal(job.centre, job.prox_mu):
            self.agent.learn(total_timesteps=job.steps, reset_num_timesteps=False, progress_bar=False)
        rewards = finished_returns(self.train_env, self._episodes_seen)
        self._episodes_seen += len(rewards)
        return self.initial_params(), rewards

    def _proximal(self, centre: torch.Tensor, mu: float) -> contextlib.ExitStack:
        """Install ``mu * (theta - centre)`` on every SB3 optimiser (nothing when ``mu == 0``)."""
        stack = contextlib.ExitStack()
        if mu > 0:
            named = self._layout.unflatten(centre.float())
            centres = {p: named[name].to(p.device) for name, p in self._named_online().items()}
            for owner in self._optimiser_owners.values():
                stack.enter_context(install_proximal(owner, "optimizer", centres, mu))
        return stack

    def _optimiser_state(self) -> dict[str, dict[str, Any]]:
        return {name: copy.deepcopy(owner.optimizer.state_dict()) for name, owner in self._optimiser_owners.items()}

    def _load_optimiser_state(self, state: dict[str, dict[str, Any]] | None) -> None:
        """Load a state from :meth:`_optimiser_state` into the SB3 optimiser(s); ``None``: a fresh one."""
        state = self._fresh_optimiser if state is None else state
        for name, owner in self._optimiser_owners.items():
            owner.optimizer.load_state_dict(copy.deepcopy(state[name]))

    def _named_online(self) -> dict[str, torch.Tensor]:
        return {f"{prefix}.{n}": p for prefix, m in self._online.items() for n, p in m.named_parameters()}

    def _load(self, params: torch.Tensor) -> None:
        named = self._layout.unflatten(params.float())
        with torch.no_grad():
            for name, p in self._named_online().items():
                p.copy_(named[name])
            for online, target in self._targets:
                target.load_state_dict(online.state_dict())


class RLClientFactory(RLFactory):
    """The SB3 engine's factory (``engine=sb3``): one :class:`RLClient` per client id.

    Each client is built from the fields of :class:`~morlfed.tasks.rl.factory.RLFactory`.
    """

    def __call__(self, cid: int) -> RLClient:
        """Client ``cid``, trained on its own SB3 agent.

        :param cid: the client id
        """
        w = self.preferences[cid]
        return RLClient(cid, self.spec, w, self.seed, self.local_steps, self.rounds, self.torch_threads, self.device)
