"""The experiment as plain Python objects: :class:`Experiment`, and :func:`build_experiment`, which validates and assembles one.

An experiment is a task (a :class:`~morlfed.tasks.base.Task` instance: the RL task's environment and
preferences, the vision task's data and partition), a strategy (a
:class:`~morlfed.strategies.base.Strategy` instance), the run's settings (:class:`Settings`: budget, seed,
...), how its clients run (an executor) and what records it (a tracker). No configuration files
and no command-line strings are involved: the command line composes its configuration and then
builds the same objects through :func:`build_experiment`, so both paths validate with the same
code and fail with the same one-line :class:`~morlfed.core.settings.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from morlfed.core.parallelism import Parallelism
from morlfed.core.parallelism import resolve as resolve_parallelism
from morlfed.core.provenance import code_version
from morlfed.core.settings import ConfigError
from morlfed.experiment.settings import Settings
from morlfed.experiment.strategies import check_strategy, class_path, strategy_name, strategy_record
from morlfed.federation import FederationConfig
from morlfed.federation.checkpoint import Checkpointer
from morlfed.runtime.executors import Executor, make_executor
from morlfed.runtime.faults import Fault, parse_faults
from morlfed.strategies.base import Strategy
from morlfed.tasks.base import RunInfo, Task
from morlfed.tracking import Tracker


@dataclass
class Experiment:
    """A validated run: everything built, nothing trained yet.

    :param task: the task (its environment or dataset, preferences or partition)
    :param fed: the loop's settings
    :param strategy: the server strategy
    :param executor: how the clients run
    :param run: the run's identity (algo, dist, variant)
    :param faults: injected faults (chaos testing)
    :param checkpoint_every: keep the checkpoint of every k-th round once the run completes (0: none)
    :param tracker: the experiment tracker's class (``logger=``)
    :param tracker_options: its options (``conf/logger/<name>.yaml`` without ``_target_``)
    :param parallelism: the executor, workers and threads the run resolved (``auto`` settings)
    :param warning: what the projection of its size warns of (:mod:`morlfed.core.projection`), if anything
    :param config_yaml: the run's configuration as ``config.yaml`` records it
    :param command: how the run was asked for, as ``run.log`` says it (the command line's overrides)
    :param tracker_label: the tracker's name in messages (``logger=<label>: ...``)
    """

    task: Task
    fed: FederationConfig
    strategy: Strategy
    executor: Executor
    run: RunInfo
    faults: list[Fault] = field(default_factory=list)
    checkpoint_every: int = 0
    tracker: type[Tracker] = Tracker
    tracker_options: dict[str, Any] = field(default_factory=dict)
    parallelism: Parallelism = field(default_factory=lambda: Parallelism("sequential", 1, 1, 1))
    warning: str | None = None
    config_yaml: str = ""
    command: str = "(defaults)"
    tracker_label: str = "csv"

    @property
    def name(self) -> str:
        """The run's name for trackers and ``run.log``: ``<env or data>/<label>/<dist or partition>/seed<seed>``."""
        return f"{self.task.describe()}/{self.run.label}/{self.run.heterogeneity}/seed{self.fed.seed}"


def build_experiment(
    task: Task,
    strategy: Strategy,
    settings: Settings,
    *,
    executor: str = "auto",
    executor_options: Mapping[str, Any] | None = None,
    faults: Sequence[Any] = (),
    tracker: type[Tracker] = Tracker,
    tracker_options: Mapping[str, Any] | None = None,
    algo: str | None = None,
    heterogeneity: str | None = None,
    tracker_label: str | None = None,
    config_yaml: str | None = None,
    command: str = "(built in Python)",
) -> Experiment:
    """Validate the parts of a run and assemble them, nothing run or written.

    For example ``build_experiment(RLTask.create("deep-sea-treasure", n_clients=2), FedPref(top_r=0.5),
    Settings(n_clients=2, rounds=1, local_steps=200))``; :func:`~morlfed.experiment.runner.run`
    runs it into a run directory.

    :param task: the task, built for ``settings.n_clients`` clients
    :param strategy: the server strategy
    :param settings: the run's top-level settings
    :param executor: ``auto`` (every core this process may use), ``sequential``, ``process`` or ``ray``
    :param executor_options: the executor's options (``workers``, ``client_timeout``, ...:
        ``morlfed/conf/executor/<name>.yaml``); by default the executor's own defaults
    :param faults: injected faults, ``[{"client": 1, "round": 2, "kind": "raise"}]`` (:mod:`morlfed.runtime.faults`)
    :param tracker: the experiment tracker's class (the run directory alone: :class:`Tracker`)
    :param tracker_options: its keyword arguments
    :param algo: the strategy's name in the run's identity (default: :func:`strategy_name`)
    :param heterogeneity: the option of the task's heterogeneity group (default: the task's record's)
    :param tracker_label: the tracker's name in messages (default: ``csv`` for :class:`Tracker`,
        else the class name lowercased)
    :param config_yaml: what ``config.yaml`` records (default: the objects' record: settings,
        strategy class and parameters, the task's :meth:`~morlfed.tasks.base.Task.record`)
    :param command: how the run was asked for, for ``run.log``
    :raises ConfigError: a part that cannot work, with the command line's message
    """
    fed, warning = settings.federation(type(task))
    n, rounds, steps = fed.n_clients, fed.rounds, fed.local_steps
    algo = strategy_name(strategy) if algo is None else algo
    check_strategy(strategy, algo, n, rounds, fed.finetune)
    options = dict(executor_options or {})
    try:
        asked = (executor, options.get("workers"), settings.torch_threads, n, n * rounds * steps)  # budget last
        parallelism = resolve_parallelism(*asked, gpu_batched=task.gpu_batched)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if executor == "auto":  # auto carries the process executor's options
        options["workers"] = parallelism.workers
        if parallelism.executor == "sequential":
            options = {key: options[key] for key in ("client_timeout",) if key in options}
    try:
        built = make_executor(parallelism.executor, **options)
    except (ValueError, TypeError, ImportError) as exc:
        raise ConfigError(f"executor: {exc}") from exc
    try:
        injected = parse_faults(faults, n, rounds, parallelism.executor)
        if injected:
            task.check_fault_injection()
        Checkpointer(Path("."), settings.checkpoint_every)  # validates checkpoint_every
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    record = task.record()
    if heterogeneity is None:
        node = record.get(task.heterogeneity)
        heterogeneity = str(node["name"]) if isinstance(node, dict) and "name" in node else "custom"
    run = RunInfo(
        algo,
        fed.finetune,
        task.heterogeneity,
        heterogeneity,
        fed,
        parallelism=parallelism.record(),
        code=code_version(),
    )
    if config_yaml is None:
        objects = {
            "algo": strategy_record(strategy),
            "executor": {"name": executor, **(executor_options or {})},
            "logger": {"_target_": class_path(tracker), **(tracker_options or {})},
            **asdict(settings),
            "faults": [dict(f) for f in faults],
            "resume": None,  # the command line's keys, so that its runs and these compare key by key
            "branch_from": None,
            "branch_siblings": False,
        }
        config_yaml = yaml.safe_dump({**objects, **record}, sort_keys=False)
    if tracker_label is None:
        tracker_label = "csv" if tracker is Tracker else tracker.__name__.lower()
    experiment = Experiment(task, fed, strategy, built, run, injected, settings.checkpoint_every, tracker)
    experiment.tracker_options = dict(tracker_options or {})
    experiment.parallelism, experiment.warning = parallelism, warning
    experiment.config_yaml, experiment.command, experiment.tracker_label = config_yaml, command, tracker_label
    return experiment
