"""The task seam: what a kind of federated problem (RL, vision, ...) provides to the run.

A task is chosen by the ``task`` config group: ``morlfed/conf/task/<name>.yaml`` names its class
in ``task._target_``. The run (:mod:`morlfed.run`) validates the common settings, then asks the
task to build itself from the composed config (:meth:`Task.from_config`), to write its inputs
(``preferences.csv``, a label histogram, ...), to build its clients (:meth:`Task.client_factory`)
and, after the federation, to write and print its results. A new task is a new folder under
``morlfed/tasks/`` with such a class and a ``conf/task/<name>.yaml``; nothing else changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig

from morlfed.federation import FederationConfig, FederationOutcome
from morlfed.storage.rundir import RunDirectory


@dataclass
class RunInfo:
    """The identity of a run, shared by every task's ``metrics.json``.

    :param algo: the strategy's config name
    :param finetune: the "+FT" variant
    :param heterogeneity_group: the task's group that says how its clients differ (:attr:`Task.heterogeneity`)
    :param heterogeneity: that group's option (RL: the preference distribution, vision: the partition)
    :param fed: the loop's settings (seed, clients, rounds, local steps)
    :param branched_from: the run this one branched from, if any
    :param parallelism: the executor, workers, torch threads, cores and processor the run used
        (:meth:`morlfed.core.parallelism.Parallelism.record`)
    :param code: the code that ran (:func:`morlfed.core.provenance.code_version`)
    """

    algo: str
    finetune: bool
    heterogeneity_group: str
    heterogeneity: str
    fed: FederationConfig
    branched_from: Path | None = None
    parallelism: dict[str, Any] = field(default_factory=dict)
    code: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The variant's name in tables: ``fedavg`` or ``fedavg+FT``."""
        return self.algo + ("+FT" if self.finetune else "")

    def fields(self, **task_fields: Any) -> dict[str, Any]:
        """The identity as stored first in ``metrics.json``.

        In order: algo, finetune, label, the task's own fields (environment, dataset, ...), how the
        clients differ (``dist`` or ``partition``: :attr:`heterogeneity_group`), seed, clients, rounds, local steps, then the executor, workers, torch threads, cores and
        processor the run used, and the code that ran.
        """
        fed = self.fed
        out = {"algo": self.algo, "finetune": self.finetune, "label": self.label, **task_fields}
        out |= {
            self.heterogeneity_group: self.heterogeneity,
            "seed": fed.seed,
            "n_clients": fed.n_clients,
            "rounds": fed.rounds,
        }
        out["local_steps"] = fed.local_steps
        return out | self.parallelism | {"code": self.code}

    def branched(self) -> dict[str, str]:
        """``{"branched_from": path}`` for a branched run, else empty."""
        return {} if self.branched_from is None else {"branched_from": str(self.branched_from.absolute())}


class Task(ABC):
    """A kind of federated problem.

    Its config, ``conf/task/<name>.yaml``, brings the task's own groups (RL: ``env``, ``dist``,
    ``engine``; vision: ``data``, ``model``, ``partition``), so that no other task composes them.

    :cvar heterogeneity: the task's config group that says how its clients differ (``dist``: the
        preference distribution; ``partition``: the label partition); its option is part of the
        run's identity (``metrics.json``, the tables' rows)
    :cvar open_nodes: nodes of the task's config whose keys are keyword arguments passed on as they
        are (to stable-baselines3, to an environment's constructor): ``+`` may add keys below them
    :cvar round_metrics: client training metrics whose round mean goes to ``rounds.csv``
    :cvar budget_unit: what ``local_steps`` counts (``env steps``, ``epochs``), as the progress
        bar and the launch summary name it
    :cvar budget_rate: budget units a second that no run of the task beats, well above every
        measured run: the projection of a run's least time (:mod:`morlfed.core.projection`)
    """

    name: ClassVar[str]
    heterogeneity: ClassVar[str]
    open_nodes: ClassVar[tuple[str, ...]] = ()
    round_metrics: ClassVar[tuple[str, ...]] = ()
    budget_unit: ClassVar[str] = "steps"
    budget_rate: ClassVar[float] = 1e6

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: DictConfig, n_clients: int, seed: int) -> Task:
        """Validate this task's part of the composed config and build everything but the clients.

        Raises ``ValueError`` saying what is wrong and what is allowed.
        """

    @abstractmethod
    def describe(self) -> str:
        """What the run trains on, for the run directory's default name (the env or dataset)."""

    @property
    def gpu_batched(self) -> bool:
        """Whether the clients train as one batched computation on a GPU.

        Worker processes would only contend for that GPU: ``executor=auto`` then keeps the run in
        one process.
        """
        return False

    def describe_training(self) -> str:
        """How the clients train, for the run's launch summary (RL: the engine and device)."""
        return f"task={self.name}"

    @abstractmethod
    def write_inputs(self, run_dir: RunDirectory, run: RunInfo) -> None:
        """Write the run's inputs that are the task's ground truth (never seen by the server)."""

    @abstractmethod
    def client_factory(self, fed: FederationConfig, torch_threads: int) -> Any:
        """The picklable factory of the run's clients.

        ``factory(cid)`` builds one client; optionally ``factory.make_host(cids, timeout)`` builds the
        host of clients ``cids`` itself (see :mod:`morlfed.runtime.executors`).
        """

    def record(self) -> dict[str, Any]:
        """What ``config.yaml`` records of this task when it was built in Python, not composed.

        The keys of the task's part of a composed configuration: ``task`` (its name and class) and
        the task's own groups (RL: ``env``, ``dist``, ...), so that the analysis reads such a run as
        any other. The option of :attr:`heterogeneity` (its ``name``) becomes the run's identity.
        """
        return {"task": {"name": self.name, "_target_": f"{type(self).__module__}.{type(self).__qualname__}"}}

    def check_fault_injection(self) -> None:
        """Raise ``ValueError`` where injected faults (``faults=``) cannot reach this run's clients.

        Fault injection wraps the clients of per-client hosts; a task whose clients are trained
        as one batch says so here, before anything is written.
        """

    @abstractmethod
    def write_results(self, run_dir: RunDirectory, outcome: FederationOutcome, run: RunInfo) -> dict[str, Any]:
        """Write the per-client results, figures and (last) ``metrics.json``; return the metrics."""

    @abstractmethod
    def print_summary(self, outcome: FederationOutcome, metrics: dict[str, Any], path: Path) -> None:
        """Print the per-client table and the headline metrics."""
