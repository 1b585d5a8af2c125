"""``hydra/launcher=batched``: a ``-m`` sweep's compatible runs train as one batch (:mod:`morlfed.cli.launcher`).

Hydra accepts a launcher only from the ``hydra_plugins`` namespace package, which it scans at every
start; this module is the registration and a thin class, and imports morlfed's machinery only when
a sweep is launched. (No ``from __future__ import annotations``: hydra executes the module without
registering it in ``sys.modules``, where dataclasses look string annotations up.)
"""

from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class BatchedLauncherConf:
    """``hydra/launcher=batched``'s options.

    :param max_runs: the most runs per batch (``None``: as many as the memory rule allows)
    :param resume: continue the campaign in its sweep folder: finished jobs are skipped, started
        ones resume from their latest checkpoint
    """

    _target_: str = "hydra_plugins.morlfed_launcher.batched_launcher.BatchedLauncher"
    max_runs: int | None = None
    resume: bool = False


ConfigStore.instance().store(group="hydra/launcher", name="batched", node=BatchedLauncherConf, provider="morlfed")


class BatchedLauncher(Launcher):
    """Runs a sweep's compatible jobs as batches (:func:`morlfed.cli.launcher.launch`).

    :param max_runs: the most runs per batch (``None``: the memory rule)
    :param resume: continue a stopped campaign in its sweep folder
    """

    def __init__(self, max_runs: int | None = None, resume: bool = False) -> None:
        self.max_runs, self.resume = max_runs, resume
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep the sweep's config and hydra's context (the task function is not called: the jobs run as batches).

        :param hydra_context: hydra's context (config loader, callbacks)
        :param task_function: the command line's run of one job (unused)
        :param config: the sweep's configuration
        """
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Every job's return, the jobs run batch by batch (:func:`morlfed.cli.launcher.launch`).

        :param job_overrides: each job's overrides
        :param initial_job_idx: the first job's number
        """
        from morlfed.cli.launcher import launch

        assert self.config is not None and self.hydra_context is not None, "setup() comes first"
        return launch(self.config, self.hydra_context, job_overrides, initial_job_idx, self.max_runs, self.resume)
