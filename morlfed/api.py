"""Run experiments from Python: :func:`run_experiment`, and read any run back as an :class:`ExperimentResult`.

``run_experiment(env="mo-lunar-lander", dist="dirichlet", algo="fedavg", rounds=2)`` is the
command line ``python -m morlfed.run env=mo-lunar-lander dist=dirichlet algo=fedavg rounds=2``
run in this process: the same checks of the overrides (:func:`morlfed.cli.overrides.precheck_argv`),
the same composition (hydra's compose API on the same configuration), the same run
(:func:`morlfed.cli.execute.execute`) and the same run directory. Bad input raises the
:class:`~morlfed.core.settings.ConfigError` whose message the command line prints. Nothing is left
behind in the process: hydra's global state, the logging configuration and torch's thread count
are restored, so two calls give the numbers two command-line runs give (:mod:`morlfed.cli.compose`).
A config group may also be given as an object: ``run_experiment(algo=FedPref(top_r=0.5))``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from morlfed.analysis.campaign import reference_fronts, returns_gamma
from morlfed.analysis.campaign_figures import CURVES, learning_curves, run_title
from morlfed.analysis.curves import learning_curves_figure
from morlfed.analysis.policies import Rollout, contact_sheet, rl_run, rollout, sb3_model
from morlfed.analysis.run_files import check_agreement
from morlfed.analysis.runs import Run, load_run
from morlfed.cli.compose import plan_composed, run_composed
from morlfed.experiment import Experiment
from morlfed.metrics.figures import front_figure, non_dominated_mask


@dataclass(frozen=True)
class ExperimentResult:
    """A finished run, read from its run directory.

    :param run_dir: the run directory
    :param metrics: ``metrics.json``: the headline metrics and the run's record (engine, budget,
        wall time, ...)
    :param final: ``final.csv``: one row per client (preference, returns or accuracies, model id,
        env steps)
    :param rounds: ``rounds.csv``: one row per round (training reward, aggregation, failures,
        evaluation when ``eval_every`` asked for it)
    """

    run_dir: Path
    metrics: dict[str, Any]
    final: pd.DataFrame
    rounds: pd.DataFrame

    @classmethod
    def load(cls, run_dir: str | Path) -> ExperimentResult:
        """Read a finished run directory (one written by :func:`run_experiment` or by the command line).

        :param run_dir: the run directory
        :raises FileNotFoundError: it holds no finished run (no ``metrics.json``)
        :raises ValueError: a file is unreadable or malformed, or the files disagree on the run's rounds
            and clients (:func:`~morlfed.analysis.run_files.check_agreement`); the message names the file
        """
        path = Path(run_dir)
        if not (path / "metrics.json").is_file():
            raise FileNotFoundError(f"{path} holds no finished run: no metrics.json")
        try:
            metrics = json.loads((path / "metrics.json").read_text())
            final, rounds = pd.read_csv(path / "final.csv"), pd.read_csv(path / "rounds.csv")
        except (OSError, ValueError) as exc:  # json's and pandas' parse errors are ValueErrors
            raise ValueError(f"{path}: unreadable run files: {str(exc).strip().splitlines()[0]}") from exc
        if not isinstance(metrics, dict):
            raise ValueError(f"{path / 'metrics.json'}: not a JSON object (a run's metrics are one)")
        check_agreement(path, metrics, len(final), rounds)
        return cls(path, metrics, final, rounds)

    @property
    def returns(self) -> pd.DataFrame | None:
        """Each client's discounted vector return (``disc_return_<k>`` columns), ``None`` for a task without returns."""
        columns = sorted((c for c in self.final.columns if c.startswith("disc_return_")), key=_objective)
        return self.final[["client", *columns]] if columns else None

    @property
    def front(self) -> pd.DataFrame | None:
        """The clients whose discounted returns no other client's dominate: the run's front.

        The rows of :attr:`final` (preference, returns, model) of those clients; ``None`` for a
        task without vector returns (vision).
        """
        returns = self.returns
        if returns is None:
            return None
        keep = non_dominated_mask(returns.drop(columns="client").to_numpy(dtype=float))
        return self.final[keep].reset_index(drop=True)

    def plot_front(self) -> Figure:
        """The clients' discounted returns, coloured by preference, against the env's reference front.

        The reference is the env's known front when it has one (the front the run's metrics are
        measured against), else the run's own; non-dominated clients are ringed. It is the figure
        the Pareto-front notebook draws for a run.

        :raises ValueError: the run's task has no vector returns
        """
        if self.returns is None:
            raise ValueError(f"{self.run_dir} has no vector returns to plot (a vision run?)")
        run = load_run(self.run_dir)
        assert isinstance(run, Run), "a run with vector returns is an RL run"
        reference = reference_fronts([run])[run.env, returns_gamma(run.spec, "discounted")]
        return front_figure(
            run.returns_of("discounted"),
            run.weights,
            reference.points,
            run.spec.objectives,
            f"{run_title(run, run.label)} (discounted returns)",  # the command line's title
            f"{reference.source} front",
        )

    def policy(self, cid: int) -> OffPolicyAlgorithm:
        """Client ``cid``'s deployed policy as a stable-baselines3 model (DQN or DDPG, as the env spec trains).

        It holds the model the client deploys (``RUN_DIR/models/``), whichever engine trained it:
        ``predict``, ``save`` and SB3's own ``load`` work on it (:func:`morlfed.analysis.policies.sb3_model`).

        :param cid: the client
        :raises KeyError: the run has no client ``cid``
        """
        return sb3_model(rl_run(self.run_dir), cid)

    def policies(self) -> dict[int, OffPolicyAlgorithm]:
        """Every client's deployed policy (:meth:`policy`), by client id."""
        run = rl_run(self.run_dir)
        return {cid: sb3_model(run, cid) for cid in range(len(run.weights))}

    def rollout(self, cid: int, episodes: int | None = None, video_dir: str | Path | None = None) -> Rollout:
        """Run client ``cid``'s deployed policy greedily, seeded as the final evaluation (:func:`~morlfed.analysis.policies.rollout`).

        :param cid: the client
        :param episodes: how many episodes (default: the spec's ``eval_episodes``: those of ``final.csv``)
        :param video_dir: record each episode there (gymnasium's ``RecordVideo``; the ``video`` extra)
        """
        return rollout(rl_run(self.run_dir), cid, episodes, video_dir)

    def contact_sheet(self, frames: int = 6) -> Figure:
        """Frames of every client's deployed policy in one figure (:func:`~morlfed.analysis.policies.contact_sheet`).

        :param frames: frames per client
        """
        return contact_sheet(rl_run(self.run_dir), frames)

    def plot_learning(self, column: str = "mean_train_reward", x: str = "round") -> Figure:
        """One of ``rounds.csv``'s columns over the rounds (default: the mean scalarised training reward).

        Titled and labelled as ``python -m morlfed.analysis.plot`` titles and labels it.

        :param column: the column, e.g. ``mean_eval_scalarised`` for a run with ``eval_every``, or
            ``hypervolume``: of the deployed models' discounted returns (``evaluations.csv``)
        :param x: ``round``, or ``env_steps``: the training env steps each client has spent
        :raises ValueError: ``rounds.csv`` has no such column
        """
        if column not in [*self.rounds.columns, "hypervolume"]:
            raise ValueError(f"rounds.csv has no column {column!r}; it has {', '.join(self.rounds.columns)}")
        run = load_run(self.run_dir)
        assert isinstance(run, Run), "a run with learning curves is an RL run"  # vision: no curves to plot
        curves = learning_curves([run], [run.label], column)
        ylabel = CURVES[column][1] if column in CURVES else column
        return learning_curves_figure(curves, title=run_title(run, run.label), ylabel=ylabel, x=x)


def run_experiment(
    *, overrides: Sequence[str] = (), run_dir: str | Path | None = None, **settings: Any
) -> ExperimentResult:
    """Run one experiment as the command line would, in this process, and return its result.

    ``run_experiment(env="mo-lunar-lander", rounds=2, local_steps=300)`` is
    ``python -m morlfed.run env=mo-lunar-lander rounds=2 local_steps=300``: keyword arguments are
    config groups (``env``, ``dist``, ``algo``, ``executor``, ``task``, ...) and top-level settings
    (``n_clients``, ``rounds``, ``seed``, ``finetune``, ...), written as the command line writes
    them (``True`` as ``true``, ``None`` as ``null``, lists and mappings in hydra's syntax).

    The rule for objects: a config group may be given as the object it stands for, and the
    object is used as it is, in place of the group's config. ``algo=`` takes a
    :class:`~morlfed.strategies.base.Strategy` (``algo=FedPref(top_r=0.5)``: its parameters are the
    object's, not ``conf/algo``'s; the run is named for the config whose ``_target_`` is its
    class, else for the class, and ``config.yaml`` records its class and parameters); ``env=``
    takes an :class:`~morlfed.envs.EnvSpec` (its defaults of clients, rounds and local steps
    included). Everything else is composed from the plain values as the command line composes it,
    and checked with the same one-line errors; an override below an object's group
    (``algo.top_r=`` beside ``algo=FedPref()``) is refused. To build a run from objects alone,
    without the command line's configuration, see :mod:`morlfed.experiment`.

    :param overrides: further overrides in command-line syntax, for nested keys and additions
        (``"algo.top_r=0.5"``, ``"env.agent_kwargs.learning_rate=0.001"``)
    :param run_dir: the run directory (``hydra.run.dir``); by default a new one under ``runs/``,
        as the command line's
    :param settings: config groups (values or objects) and top-level settings
    :raises ConfigError: bad input (an unknown key or option, a value of the wrong type, a run
        directory that holds another run): the command line's error, and nothing is written
    :raises morlfed.core.interrupt.RunStopped: SIGINT or SIGTERM stopped the run (it can be resumed)
    """
    return ExperimentResult.load(run_composed(settings, overrides, run_dir))


def plan_experiment(*, overrides: Sequence[str] = (), **settings: Any) -> Experiment:
    """The validated parts of an experiment, built as :func:`run_experiment` builds them, nothing run or written.

    The task (its clients' factory: ``plan.task.client_factory(plan.fed, threads)``), the
    strategy, the federation's settings and the executor: what another framework needs to run
    morlfed's strategies and clients its own way (:mod:`morlfed.flower`).

    :param overrides: further overrides in command-line syntax
    :param settings: config groups (values or objects) and top-level settings, as for :func:`run_experiment`
    :raises ConfigError: bad input, the command line's error
    """
    return plan_composed(settings, overrides)


def _objective(column: str) -> int:
    return int(column.rsplit("_", 1)[1])
