"""A run's first and last words about its directory: the launch summary, and removing a directory made for nothing.

:func:`launch_summary` is what a run prints within seconds of its launch;
:func:`remove_new_run_dir` removes the directory made for a run that bad input refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from morlfed.core.progress import counted
from morlfed.federation import round_budgets
from morlfed.storage.runlock import LOCK

if TYPE_CHECKING:
    from morlfed.experiment.experiment import Experiment


def launch_summary(plan: Experiment, out: Path) -> list[str]:
    """The lines the run prints within seconds of its launch.

    Its directory, budget, engine, executor, threads and cores (the settings as the run resolved
    them).

    :param plan: the validated run
    :param out: its directory
    """
    fed = plan.fed
    total = round_budgets(fed).total()
    clients = counted(fed.n_clients, "client") + (
        f" (participation {fed.participation:g})" if fed.participation < 1 else ""
    )
    return [
        f"run directory {out}",
        f"{plan.name}: {counted(fed.rounds, 'round')} x {clients} x {fed.local_steps} {fed.budget_unit} = "
        f"{total:,} {fed.budget_unit}",
        f"{plan.task.describe_training()}; {plan.executor.describe(fed.n_clients)}; "
        f"torch_threads={plan.parallelism.torch_threads}; {plan.parallelism.cores} cores",
    ]


def remove_new_run_dir(path: Path) -> None:
    """Remove the directory made for this run, if it holds nothing but hydra's own files (and the lock).

    Empty folders above it go too, up to the working directory.

    :param path: the run directory
    """
    if path.is_dir() and all(p.name in {".hydra", "run.log", LOCK} for p in path.iterdir()):
        shutil.rmtree(path)
        parent = path.parent
        while parent != parent.parent and parent.is_dir() and not any(parent.iterdir()) and parent != Path.cwd():
            parent.rmdir()
            parent = parent.parent
