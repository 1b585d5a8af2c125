"""The vectorised client engine: all DQN or DDPG clients of a worker trained as one batched computation.

:class:`VectorisedClients` is a :class:`~morlfed.runtime.client.Client` owning several clients. It
reproduces the SB3 client (:class:`~morlfed.tasks.rl.client.RLClient`) client by client: the same
env per client (``make_train_env(spec, w_i, seed=derive_seed(seed, "train-env", cid))``), the same
networks and shared initial parameters, SB3's ``learn`` loop (``train_freq`` in steps or episodes,
``gradient_steps`` including ``-1``, the overshoot of the last rollout), replay buffer, target
updates and ``train`` step (``DQN.train``, ``DDPG.train``), exploration (DQN: the budget-wide
epsilon schedule; DDPG: warm-up samples, then the actor plus ``NormalActionNoise``), per-slot
optimiser states, the proximal term, the seeds of every training (``derive_seed(seed, "fit" |
"personal", cid, *keys)``), losses and evaluations. What changes is how it runs: the clients of a
wave step their envs in lockstep and share one batched forward pass and batched gradient steps
(:mod:`.rollout`, :mod:`.explore`, :mod:`.dqn`, :mod:`.ddpg`, :mod:`.replay`). Randomness comes
from per-(client, training) generators instead of SB3's global RNGs, so a client's trajectory is
not bit-identical to the SB3 client's, but follows the same distribution; a model trained here
loads into the SB3 client and evaluates identically. Nothing in a client's training depends on the
other clients of its batch (bit for bit, on the CPU), so the results do not depend on how an
executor spreads the clients over workers, nor on which other runs' clients share the batch (a
batch of several runs: each client keeps its run's seeds, initial network and budget, ``streams``
and ``budgets``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from stable_baselines3 import DDPG, DQN
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation
from morlfed.core.seeding import derive_seed
from morlfed.envs import EnvSpec, make_eval_env, make_train_env
from morlfed.runtime.client import PERSONAL_SLOT, Client, TrainJob, TrainOutput
from morlfed.tasks.rl.agent import AGENTS
from morlfed.tasks.rl.clock import FitClock
from morlfed.tasks.rl.evaluation import evaluate_episodes, load_networks
from morlfed.tasks.rl.fit_report import RLFitReport
from morlfed.tasks.rl.state import CarriedState, finished_returns, use_slot
from morlfed.tasks.rl.vectorised.ddpg import StackedDDPG
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.explore import ActionNoise, EpsilonGreedy, Exploration
from morlfed.tasks.rl.vectorised.keywords import check_agent_kwargs
from morlfed.tasks.rl.vectorised.learner import StackedLearner
from morlfed.tasks.rl.vectorised.replay import StackedReplay
from morlfed.tasks.rl.vectorised.rollout import Counters, Lockstep, LoopSettings
from morlfed.tasks.rl.vectorised.template import template_agent


def stacked_algorithm(
    spec: EnvSpec, n: int, seed: int, total_steps: int | np.ndarray, device: str, precision: str = "fp32"
) -> tuple[OffPolicyAlgorithm, StackedLearner, Exploration]:
    """The SB3 client's agent for ``spec``, ``n`` stacked copies of its networks and its exploration.

    The agent is the one the SB3 client builds for ``spec``, the template: networks, initial
    parameters, hyper-parameters.

    :param spec: the environment spec (``agent: dqn`` or ``ddpg``)
    :param n: number of clients
    :param seed: the run's root seed (the shared init seed derives from it)
    :param total_steps: each client's whole budget (DQN's epsilon schedule): one for all, or ``[n]``
    :param device: torch device of the stacked networks
    :param precision: ``fp32``, or ``bf16`` for bfloat16 matrix products
    """
    if spec.agent not in AGENTS:
        raise ValueError(
            f"the vectorised engine trains {' and '.join(AGENTS)} agents; env {spec.name} uses {spec.agent}"
        )
    env = make_train_env(spec, np.full(len(spec.objectives), 1 / len(spec.objectives)), seed=None)
    agent = template_agent(spec, env, seed)
    if isinstance(agent, DQN):
        learner: StackedLearner = StackedDQN(n, agent, device, precision)
        return agent, learner, EpsilonGreedy.of(agent, learner, total_steps)
    assert isinstance(agent, DDPG), f"agent {spec.agent!r} built a {type(agent).__name__}"
    learner = StackedDDPG(n, agent, device, precision)
    return agent, learner, ActionNoise.of(agent, learner, spec.agent_kwargs.get("action_noise_std"))


def template_params(spec: EnvSpec, seed: int, networks: tuple[str, ...], layout: ParamLayout) -> torch.Tensor:
    """The initial network(s) of the SB3 client's agent for ``spec`` and root seed ``seed``, as a ``[d]`` vector.

    :param spec: the environment spec
    :param seed: a run's root seed (the shared init seed derives from it)
    :param networks: the policy's online networks, by attribute name (``q_net``; ``actor`` and ``critic``)
    :param layout: their layout in the federated vector
    """
    env = make_train_env(spec, np.full(len(spec.objectives), 1 / len(spec.objectives)), seed=None)
    policy = template_agent(spec, env, seed).policy
    named = {f"{net}.{name}": p for net in networks for name, p in getattr(policy, net).named_parameters()}
    return layout.flatten(named).detach().clone()


class VectorisedClients(RLFitReport, Client):
    """Several DQN or DDPG clients trained in lockstep (see the module docstring).

    **Fit options, seeds, losses, metrics**: those of the SB3 client
    (:class:`~morlfed.tasks.rl.client.RLClient`): ``num_samples`` is ``local_steps`` times the
    models trained; ``train_reward`` / ``episodes`` summarise the scalarised returns of the training
    episodes that finished during the fit; a loss is ``-(w_i . R) / spec.return_scale`` over
    ``spec.eval_episodes`` deterministic episodes seeded ``derive_seed(seed, "loss", cid, round,
    k)``.

    **State carried across rounds** (:meth:`get_state` / :meth:`set_state`, per client): the
    online network(s) (DQN's Q-network; DDPG's actor and critic), the active optimiser slot's Adam
    state(s) (DDPG: actor and critic), the replay buffer, ``num_timesteps``, ``_n_calls`` (DQN),
    and the :class:`~morlfed.tasks.rl.state.CarriedState` (the other slots' Adam states, the
    exploration clock's offset, the Monitor's episode records and ``episodes_seen``, and the
    personal model). Target networks are not part of it: as the SB3 client does, every training
    starts by loading its model into the online network(s) *and* the targets, so a target never
    outlives the training that moved it.

    A spec whose ``agent_kwargs`` hold an SB3 argument this engine does not implement is refused
    (:func:`~morlfed.tasks.rl.vectorised.keywords.check_agent_kwargs`, ``ValueError``).

    :param cids: the clients this object trains
    :param spec: the environment spec (``agent: dqn`` or ``ddpg``)
    :param preferences: ``[n, m]`` weights; row ``cid`` is client ``cid``'s ``w_i``
    :param seed: the run's root seed
    :param local_steps: the env steps of one fit
    :param rounds: the run's rounds (each client's whole budget, ``rounds x local_steps``, is the
        epsilon schedule's)
    :param torch_threads: torch intra-op threads
    :param device: ``"cpu"`` or ``"cuda"``: where the stacked networks, replay and updates live
        (envs and evaluation run on the CPU)
    :param precision: the gradient step's arithmetic: ``fp32`` or ``bf16`` (the hidden layers'
        matrix products in bfloat16; :class:`~morlfed.tasks.rl.vectorised.dqn.StackedDQN`)
    :param streams: for a batch whose clients belong to several runs
        (:meth:`~morlfed.tasks.rl.vectorised.factory.VectorisedClientFactory.batch_host`): client ``cid`` here is client ``streams[cid][1]``
        of the run whose root seed is ``streams[cid][0]``; its every seed and its initial network are
        that run's, its preference is still row ``cid``. By default every client is ``(seed, cid)``
    :param budgets: for such a batch, each client's whole budget in env steps (its run's ``rounds x
        local_steps``, the epsilon schedule's length); by default ``rounds x local_steps`` for all
    """

    def __init__(
        self,
        cids: list[int],
        spec: EnvSpec,
        preferences: np.ndarray,
        seed: int,
        local_steps: int,
        rounds: int,
        torch_threads: int = 1,
        device: str = "cpu",
        precision: str = "fp32",
        streams: Mapping[int, tuple[int, int]] | None = None,
        budgets: Mapping[int, int] | None = None,
    ) -> None:
        if not cids or len(set(cids)) != len(cids):
            raise ValueError(f"cids must be distinct client ids, at least one, got {cids}")
        super().__init__(cids, seed, local_steps)
        check_agent_kwargs(spec)
        self.spec = spec
        total_steps: int | np.ndarray = self.local_steps * rounds
        if budgets is not None:
            total_steps = np.array([budgets[cid] for cid in self.cids], dtype=np.int64)
        self.torch_threads, self.device = torch_threads, torch.device(device)
        torch.set_num_threads(torch_threads)
        self.index = {cid: i for i, cid in enumerate(self.cids)}
        #: each client's (root seed, client id) in its run
        self.streams = (
            {cid: (seed, cid) for cid in self.cids} if streams is None else {c: streams[c] for c in self.cids}
        )
        self.weights = {cid: np.asarray(preferences[cid], dtype=np.float64) for cid in self.cids}
        keys = [self.streams[cid] for cid in self.cids]
        #: each client's training env, SB3's ``Monitor`` outermost (its episode records are the metrics)
        self.train_envs = [
            make_train_env(spec, self.weights[cid], seed=derive_seed(root, "train-env", key))
            for cid, (root, key) in zip(self.cids, keys, strict=True)
        ]
        self.eval_envs = [make_eval_env(spec, seed=derive_seed(root, "eval-env", key)) for root, key in keys]
        n, first = len(self.cids), keys[0][0]
        agent, self.learner, self.exploration = stacked_algorithm(spec, n, first, total_steps, device, precision)
        obs_dim = int(np.prod(agent.observation_space.shape))  # type: ignore[arg-type]
        x = self.exploration
        self.replay = StackedReplay(n, int(agent.buffer_size), obs_dim, x.action_dim, x.discrete, device=device)
        self.settings = LoopSettings.of(agent)
        self.counters = Counters.zeros(n)
        self.lockstep = Lockstep(self.settings, x, self.learner, self.replay, self.train_envs, self.counters)
        self._eval_policy = copy.deepcopy(agent.policy)
        self._eval_policy.set_training_mode(False)
        #: the online networks, as the policy's attributes (``q_net``; ``actor`` and ``critic``)
        self._networks = ("q_net",) if isinstance(agent, DQN) else ("actor", "critic")
        #: each run's shared initial network(s), by root seed (a template agent per further seed)
        self._initials = {first: self.learner.read(0)}
        for root in sorted({root for root, _ in keys} - {first}):
            self._initials[root] = template_params(spec, root, self._networks, self.layout)
        self._clocks = [FitClock() for _ in range(n)]
        self.episodes_seen = np.zeros(n, dtype=np.int64)
        self.slots: list[dict[str, dict[str, Any]]] = [{} for _ in range(n)]
        self.active_slot = ["model-0"] * n

    @property
    def layout(self) -> ParamLayout:
        """The SB3 client's layout of the federated vector.

        DQN: ``q_net.q_net.<k>.weight`` / ``.bias``; DDPG: ``actor.mu.<k>.*`` then
        ``critic.qf0.<k>.*``; each network's last layer is head.
        """
        return self.learner.layout

    def initial_params(self) -> torch.Tensor:
        """The shared initial network(s) (the SB3 client's, same init seed) as a ``[d]`` vector.

        In a batch of several runs' clients, the first client's run's (:meth:`initial_of`).
        """
        return self.initial_of(self.cids[0])

    def initial_of(self, cid: int) -> torch.Tensor:
        """The initial network(s) of client ``cid``'s run as a ``[d]`` vector.

        :param cid: one of this object's clients
        """
        return self._initials[self.streams[cid][0]].clone()

    def stream_key(self, cid: int) -> tuple[int, int]:
        """Client ``cid``'s run's root seed and its client id in that run (``streams``).

        :param cid: one of this object's clients
        """
        return self.streams[cid]

    # ------------------------------------------------------------------------------------------
    # training
    def _train(self, jobs: Mapping[int, TrainJob]) -> dict[int, TrainOutput]:
        """Run one training job per client, all clients in lockstep."""
        torch.set_num_threads(self.torch_threads)
        n, dim = len(self.cids), self.layout.dim
        rows = np.array([self.index[cid] for cid in jobs], dtype=np.int64)
        steps = np.zeros(n, dtype=np.int64)
        prox_mu = torch.zeros(n, device=self.device)
        centre = torch.zeros(n, dim, device=self.device)
        seeds = []
        for cid, job in jobs.items():
            i = self.index[cid]
            self._begin_job(i, job)
            steps[i] = job.steps
            prox_mu[i] = job.prox_mu
            centre[i] = job.centre.float().to(self.device)
            root, key = self.streams[cid]
            seeds.append(derive_seed(root, PERSONAL_SLOT if job.personal else "fit", key, *job.keys))
        before = self.counters.num_timesteps.copy()
        self.lockstep.run(rows, seeds, steps, prox_mu, centre)
        spent = self.counters.num_timesteps - before
        return {cid: self._finish_job(self.index[cid], int(spent[self.index[cid]])) for cid in jobs}

    def _begin_job(self, i: int, job: TrainJob) -> None:
        """Optimiser slot, model and exploration clock of client ``i`` for ``job`` (as the SB3 client)."""
        c = self.counters
        c.offset[i] = self._clocks[i].offset(int(c.num_timesteps[i]), int(c.offset[i]), job.first)
        save = functools.partial(self.learner.optimiser_state, i)
        load = functools.partial(self.learner.load_optimiser_state, i)
        self.active_slot[i] = use_slot(self.slots[i], self.active_slot[i], job.slot, save, load)
        self.learner.load(i, job.start.float())

    def _finish_job(self, i: int, steps: int) -> TrainOutput:
        """Client ``i``'s trained model, the returns of the episodes that finished meanwhile, the env steps.

        ``steps`` are the env steps the training took: its budget, or more when SB3 finishes a rollout.
        """
        returns = finished_returns(self.train_envs[i], int(self.episodes_seen[i]))
        self.episodes_seen[i] += len(returns)
        # the learner's scalars, as the SB3 client reports them: mean losses, DQN's epsilon now
        learner = self.lockstep.take_losses(i)
        exploration = self.lockstep.exploration
        if isinstance(exploration, EpsilonGreedy):
            c = self.counters
            learner["exploration_rate"] = float(exploration.epsilon(c.num_timesteps, c.offset)[i])
        return TrainOutput(self.learner.read(i), {"rewards": returns, "steps": steps}, learner)

    # ------------------------------------------------------------------------------------------
    # evaluation
    def evaluate_client(self, cid: int, params: torch.Tensor | None, seed: int) -> Evaluation:
        """``spec.eval_episodes`` deterministic episodes of client ``cid`` on its evaluation env.

        They run exactly as the SB3 client's ``evaluate``: the model (``None``: its personal model, or
        the shared initial model if it never trained one) is loaded into a copy of the SB3 policy, so
        the deterministic actions are SB3's own.
        """
        if params is None:
            params = self.personal_models.get(cid, self._initials[self.streams[cid][0]])
        torch.set_num_threads(self.torch_threads)
        load_networks(self._eval_policy, self._networks, self.layout.unflatten(params.float()))
        env, weights = self.eval_envs[self.index[cid]], self.weights[cid]
        return evaluate_episodes(self._eval_policy, env, weights, self.spec.gamma, self.spec.eval_episodes, seed)

    # ------------------------------------------------------------------------------------------
    # state
    def get_state(self, cid: int) -> dict[str, Any]:
        """Everything client ``cid`` carries from one round to the next (see the class docstring).

        It is an independent CPU copy made of data only (:mod:`morlfed.storage.safestate`). RNG states are not part of it:
        every training reseeds from (seed, client, round).
        """
        i, c = self.index[cid], self.counters
        carried = CarriedState.capture(
            self.train_envs[i],
            self.episodes_seen[i],
            self.slots[i],
            self.active_slot[i],
            self.personal_models.get(cid),
            c.offset[i],
        )
        learner = {
            "online": self.learner.read(i),
            "optimiser": self.learner.optimiser_state(i),
            "replay": self.replay.state_of(i),
            "counters": {"num_timesteps": int(c.num_timesteps[i]), "n_calls": int(c.n_calls[i])},
        }
        return _to_cpu(learner | carried.as_dict())

    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        """Restore client ``cid`` from :meth:`get_state` (taking ownership of ``state``)."""
        i, c = self.index[cid], self.counters
        self.learner.load(i, state["online"])
        self.learner.load_optimiser_state(i, state["optimiser"])
        self.replay.load_state_of(i, state["replay"])
        c.num_timesteps[i] = state["counters"]["num_timesteps"]
        c.n_calls[i] = state["counters"]["n_calls"]
        carried = CarriedState.of(state)
        carried.restore_monitor(self.train_envs[i])
        self.episodes_seen[i] = carried.episodes_seen
        self.slots[i], self.active_slot[i] = carried.optimiser_slots, carried.active_slot
        c.offset[i] = carried.schedule_offset
        self.set_personal_model(cid, carried.personal)


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor (in nested dicts and lists) moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value
