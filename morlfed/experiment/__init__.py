"""The plain-Python core of a run: an experiment built from objects, validated, and run into a run directory.

No configuration files and no command-line strings: a task object, a strategy object, the run's
settings, an executor and a tracker make an :class:`Experiment` (:func:`build_experiment`, which
validates each part and says what is wrong in one line, a :class:`~morlfed.core.settings.ConfigError`),
and :func:`run` runs it into a run directory the analysis reads like any other::

    from morlfed.experiment import Settings, build_experiment, run
    from morlfed.strategies.fedpref import FedPref
    from morlfed.tasks.rl.task import RLTask

    task = RLTask.create("deep-sea-treasure", n_clients=2)
    experiment = build_experiment(task, FedPref(top_r=0.5), Settings(n_clients=2, rounds=1, local_steps=200))
    metrics = run(experiment, "runs/my-run")

Several experiments train as one batch with :func:`run_batch` (:mod:`morlfed.experiment.batch`).

The command line (:mod:`morlfed.run`) is a front-end of this core: it composes its configuration
with hydra, builds the same objects and runs them here.
"""

from __future__ import annotations

from morlfed.experiment.batch import run_batch
from morlfed.experiment.experiment import Experiment, build_experiment
from morlfed.experiment.runner import Start, carry_out, run, run_log, start_tracker
from morlfed.experiment.settings import Settings
from morlfed.experiment.strategies import strategy_name, strategy_record

__all__ = [
    "Experiment",
    "Settings",
    "Start",
    "build_experiment",
    "carry_out",
    "run",
    "run_batch",
    "run_log",
    "start_tracker",
    "strategy_name",
    "strategy_record",
]

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 6
