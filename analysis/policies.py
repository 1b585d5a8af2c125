"""A run's deployed policies as stable-baselines3 models, and rollouts of them.

A run keeps every client's deployed model in ``RUN_DIR/models/`` (:mod:`morlfed.federation.deployment`), in
the parameter layout both engines share (:func:`morlfed.tasks.rl.agent.layout_of`: the SB3
policy's own parameter names). :func:`sb3_model` builds the env spec's SB3 agent (DQN or DDPG,
the spec's policy, spaces and hyper-parameters, as a client builds it) and loads a client's
deployed model into its online networks and their targets, whichever engine trained it. The
result is an ordinary SB3 model: ``predict``, ``save``, ``DQN.load`` and SB3's
``evaluate_policy`` work on it.

:func:`rollout` runs a client's deployed policy greedily for some episodes on its evaluation env,
seeded as the run's final evaluation is (its first ``eval_episodes`` episodes are the ones behind
the client's row of ``final.csv``), optionally recording a video of each episode with gymnasium's
``RecordVideo`` (the ``video`` extra: moviepy). :func:`contact_sheet` draws frames of one episode
of every client's policy into one image.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
from matplotlib.figure import Figure
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from morlfed.analysis.run_files import RunDirError
from morlfed.analysis.runs import Run, load_run
from morlfed.core.commands import pip_install
from morlfed.core.seeding import derive_seed
from morlfed.envs import EnvSpec, make_eval_env, make_train_env, reset_env
from morlfed.federation.deployment import MODELS, Deployment
from morlfed.tasks.rl.agent import build_agent
from morlfed.tasks.rl.evaluation import load_networks

#: the online networks of each agent, as attributes of its SB3 policy (each has a ``<name>_target``)
ONLINE: dict[str, tuple[str, ...]] = {"dqn": ("q_net",), "ddpg": ("actor", "critic")}


def rl_run(run_dir: str | Path) -> Run:
    """The RL run at ``run_dir`` (finished).

    :raises RunDirError: not a finished run directory, or a run without policies (a vision run)
    """
    run = load_run(run_dir)
    if not isinstance(run, Run):
        raise RunDirError(Path(run_dir), f"a {run.info.get('task')} run has no RL policies")
    return run


def read_deployment(run: Run) -> Deployment:
    """The run's deployed models (``RUN_DIR/models/``).

    :raises RunDirError: the run kept none (it predates them)
    """
    try:
        return Deployment.read(run.path / MODELS)
    except FileNotFoundError as exc:
        raise RunDirError(run.path, f"no {MODELS}/ folder: the run kept no deployed models") from exc


def sb3_model(run: Run, cid: int, deployment: Deployment | None = None) -> OffPolicyAlgorithm:
    """Client ``cid``'s deployed policy as the SB3 model (DQN or DDPG) its spec trains.

    Its env is the client's training env (scalar reward ``w_i . r``), its online networks and
    their targets hold the deployed model.

    :param run: the run
    :param cid: the client
    :param deployment: the run's deployed models (default: read from ``RUN_DIR/models/``)
    :raises KeyError: the run has no client ``cid``
    """
    deployment = read_deployment(run) if deployment is None else deployment
    named = deployment.named(cid)
    env = make_train_env(run.spec, run.weights[cid], seed=derive_seed(run.seed, "train-env", cid))
    model = build_agent(run.spec, env, run.seed)
    networks = ONLINE[run.spec.agent]
    load_networks(model.policy, networks, named)
    for network in networks:
        getattr(model.policy, f"{network}_target").load_state_dict(getattr(model.policy, network).state_dict())
    model.policy.set_training_mode(False)
    return model


@dataclass(frozen=True)
class Rollout:
    """Episodes of one client's deployed policy.

    :param client: the client
    :param weights: its preference ``w_i``
    :param objectives: the objectives' names, as the spec names them
    :param returns: ``[episodes, m]`` undiscounted vector returns
    :param discounted: ``[episodes, m]`` discounted vector returns (the spec's gamma)
    :param steps: each episode's length
    """

    client: int
    weights: np.ndarray
    objectives: tuple[str, ...]
    returns: np.ndarray
    discounted: np.ndarray
    steps: tuple[int, ...]

    @property
    def scalarised(self) -> np.ndarray:
        """Each episode's scalarised return ``w_i . return``."""
        return self.returns @ self.weights

    def lines(self) -> list[str]:
        """One line per episode and one for the mean: the vector return and the scalarised score."""

        def vector(values: np.ndarray) -> str:
            return ", ".join(f"{name}={v:.4g}" for name, v in zip(self.objectives, values))

        rows = [
            f"client {self.client} episode {k}: {vector(r)}; scalarised {s:.4g} ({n} steps)"
            for k, (r, s, n) in enumerate(zip(self.returns, self.scalarised, self.steps))
        ]
        mean, w = self.returns.mean(axis=0), ", ".join(f"{v:.3g}" for v in self.weights)
        score = f"scalarised {mean @ self.weights:.4g} (w = [{w}])"
        return [*rows, f"client {self.client} mean of {len(self.steps)} episodes: {vector(mean)}; {score}"]


def rollout(
    run: Run,
    cid: int,
    episodes: int | None = None,
    video_dir: str | Path | None = None,
    deployment: Deployment | None = None,
) -> Rollout:
    """Run client ``cid``'s deployed policy greedily for ``episodes`` episodes on its evaluation env.

    Episode ``k`` is reset with the seed the run's final evaluation gave it, so the mean of the
    first ``eval_episodes`` episodes is the client's row of ``final.csv``.

    :param run: the run
    :param cid: the client
    :param episodes: how many (default: the spec's ``eval_episodes``)
    :param video_dir: record each episode into this folder (gymnasium's ``RecordVideo``; needs
        moviepy, the ``video`` extra)
    :param deployment: the run's deployed models (default: read from ``RUN_DIR/models/``)
    :raises ImportError: a video was asked for and moviepy is not installed
    :raises ValueError: ``episodes`` < 1
    """
    episodes = run.spec.eval_episodes if episodes is None else episodes
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    policy = sb3_model(run, cid, deployment).policy
    env = _eval_env(run, cid, render=video_dir is not None)
    if video_dir is not None:
        _require_moviepy()
        env = gym.wrappers.RecordVideo(
            env, str(video_dir), episode_trigger=lambda _: True, name_prefix=f"client_{cid}", disable_logger=True
        )
    seed, gamma = derive_seed(run.seed, "final-eval", cid), run.spec.gamma
    returns, discounted, steps = [], [], []
    try:
        for episode in range(episodes):
            obs, _ = reset_env(env, derive_seed(seed, "episode", episode))
            total, disc = np.zeros(len(run.spec.objectives)), np.zeros(len(run.spec.objectives))
            gamma_t, n, done = 1.0, 0, False
            while not done:  # as morlfed.tasks.rl.evaluation.evaluate_episodes accumulates them
                action, _ = policy.predict(obs, deterministic=True)
                obs, reward, terminated, truncated, _ = env.step(action)
                reward = np.asarray(reward, dtype=np.float64)
                total, disc, gamma_t, n = total + reward, disc + gamma_t * reward, gamma_t * gamma, n + 1
                done = terminated or truncated
            returns.append(total)
            discounted.append(disc)
            steps.append(n)
    finally:
        env.close()
    weights = np.asarray(run.weights[cid], dtype=np.float64)
    return Rollout(cid, weights, tuple(run.spec.objectives), np.array(returns), np.array(discounted), tuple(steps))


def contact_sheet(run: Run, frames: int = 6, deployment: Deployment | None = None) -> Figure:
    """Every client's deployed policy in one figure: a row per client, ``frames`` frames of its first evaluation episode.

    The frames are evenly spaced over the episode (its first and last included); each row is
    labelled with the client, its preference and the episode's vector return.

    :param run: the run
    :param frames: frames per client, >= 2
    :param deployment: the run's deployed models (default: read from ``RUN_DIR/models/``)
    :raises ValueError: ``frames`` < 2
    """
    if frames < 2:
        raise ValueError(f"frames must be >= 2, got {frames}")
    deployment = read_deployment(run) if deployment is None else deployment
    n = len(deployment.client_model)
    figure = Figure(figsize=(1.6 * frames, 1.7 * n), layout="constrained")
    axes = figure.subplots(n, frames, squeeze=False)
    for cid in range(n):
        policy = sb3_model(run, cid, deployment).policy
        env = _eval_env(run, cid, render=True)
        obs, _ = reset_env(env, derive_seed(derive_seed(run.seed, "final-eval", cid), "episode", 0))
        images, total, done = [env.render()], np.zeros(len(run.spec.objectives)), False
        while not done:
            action, _ = policy.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += np.asarray(reward, dtype=np.float64)
            images.append(env.render())
            done = terminated or truncated
        env.close()
        shown = np.unique(np.linspace(0, len(images) - 1, frames).round().astype(int))  # a short episode: fewer
        for ax, k in zip(axes[cid], shown):
            ax.imshow(images[k])
            ax.set_title(f"step {k}", fontsize=7)
        for k, ax in enumerate(axes[cid]):
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_frame_on(k < len(shown))
        w = ", ".join(f"{v:.2f}" for v in run.weights[cid])
        ret = ", ".join(f"{name}={v:.3g}" for name, v in zip(run.spec.objectives, total))
        axes[cid][0].set_ylabel(f"client {cid}\nw=[{w}]\n{ret}", fontsize=7)
    figure.suptitle(f"{run.env} / {run.label} / seed {run.seed}: deployed policies")
    return figure


def _eval_env(run: Run, cid: int, render: bool) -> gym.Env:
    """Client ``cid``'s evaluation env, as the run built it (rendering RGB frames if asked)."""
    spec: EnvSpec = run.spec
    if render:
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame renders; no sound card needed
        spec = dataclasses.replace(spec, env_kwargs={**spec.env_kwargs, "render_mode": "rgb_array"})
    return make_eval_env(spec, seed=derive_seed(run.seed, "eval-env", cid))


def _require_moviepy() -> None:
    if importlib.util.find_spec("moviepy") is None:  # RecordVideo's encoder, an optional extra
        raise ImportError(f"a video needs moviepy: {pip_install('morlfed[video]')}")
