"""The supervised-vision task (``task=vision``): the same strategies on label-skewed image classification.

``data=`` picks the dataset, ``model=`` the classifier, ``partition=`` the label partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from morlfed.federation import FederationConfig, FederationOutcome
from morlfed.storage.rundir import RunDirectory
from morlfed.tasks.base import RunInfo, Task
from morlfed.tasks.vision import report
from morlfed.tasks.vision.client import VisionClientFactory
from morlfed.tasks.vision.experiment import VisionSetup


class VisionTask(Task):
    """Federated image classification.

    :param setup: the validated experiment (dataset, partition, model, local SGD settings)
    :param nodes: the ``data``, ``model`` and ``partition`` settings it was built from, as
        ``config.yaml`` records them (by default the dataset's and model's names, the model's
        options and a ``custom`` partition)
    """

    name = "vision"
    heterogeneity = "partition"
    round_metrics = ("train_loss",)
    budget_unit = "epochs"
    budget_rate = 1e4  # client epochs a second: far above any measured run (docs/vision.md)

    def __init__(self, setup: VisionSetup, nodes: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.setup = setup
        model = {"name": setup.model, **setup.model_options}
        #: what ``config.yaml`` records of the data, model and partition
        self.nodes = dict(
            nodes or {"data": {"name": setup.dataset.name}, "model": model, "partition": {"name": "custom"}}
        )

    @classmethod
    def from_config(cls, cfg: DictConfig, n_clients: int, seed: int) -> VisionTask:
        """Load the dataset, draw the partition and check the model (:class:`VisionSetup`)."""

        def node(key: str) -> dict[str, Any]:
            return OmegaConf.to_container(cfg[key], resolve=True)  # type: ignore[return-value]

        nodes = {key: node(key) for key in ("data", "model", "partition")}
        return cls(VisionSetup.from_config(nodes["data"], nodes["model"], nodes["partition"], n_clients, seed), nodes)

    def record(self) -> dict[str, Any]:
        """``task``, ``data``, ``model`` and ``partition``, as composed runs record them."""
        return super().record() | self.nodes

    def describe(self) -> str:
        """The dataset's name (``digits``, ``mnist``, ...)."""
        return self.setup.dataset.name

    def write_inputs(self, run_dir: RunDirectory, run: RunInfo) -> None:
        """``label_histogram.csv`` and ``label_histogram.png``: each client's labels."""
        title = f"{self.setup.dataset.name}, partition={run.heterogeneity}, {run.fed.n_clients} clients"
        report.write_partition(run_dir, self.setup.dataset, self.setup.partition, title)

    def client_factory(self, fed: FederationConfig, torch_threads: int) -> VisionClientFactory:
        """The experiment's picklable :class:`VisionClientFactory`, seeded with the run's root seed."""
        return self.setup.client_factory(fed.seed, fed.local_steps, torch_threads)

    def write_results(self, run_dir: RunDirectory, outcome: FederationOutcome, run: RunInfo) -> dict[str, Any]:
        """Write ``final.csv`` and (last) ``metrics.json``; return the metrics.

        ``metrics.json`` starts with ``task: vision`` and the run's identity, with the dataset and
        model as the task's fields and, for a branched run, the run it branched from.
        """
        info = {"task": "vision", **run.fields(data=self.setup.dataset.name, model=self.setup.model)}
        return report.write_results(run_dir, self.setup.partition, outcome, {**info, **run.branched()})

    def print_summary(self, outcome: FederationOutcome, metrics: dict[str, Any], path: Path) -> None:
        """Print each client's L-acc, S-acc, G-acc and model, then every accuracy's mean, std, min and max."""
        report.print_summary(outcome, metrics, path)
