"""A vision experiment from its configuration, validated before any training, and its clients' factory.

The experiment is the dataset, partition, model and training settings.

Configuration (``task=vision``; see ``docs/vision.md``):

* ``data``: ``name``, ``root``, ``download``, ``test_fraction``, ``min_samples``, ``max_retries``,
  ``batch_size``, ``lr``, ``momentum``, ``s_share``;
* ``model``: ``name`` (``mlp`` | ``cnn``) and its hyper-parameters;
* ``partition``: the partition (``dirichlet`` with ``alpha``, ``pathological`` with
  ``classes_per_client``, ``iid``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morlfed.core.seeding import generator, torch_generator
from morlfed.tasks.vision.client import TrainConfig, VisionClientFactory
from morlfed.tasks.vision.data import VisionDataset, load_dataset
from morlfed.tasks.vision.models import build_model
from morlfed.tasks.vision.partition import Partition, make_partition

#: Keys of the ``data`` config node.
DATA_KEYS: frozenset[str] = frozenset(
    {
        "name",
        "root",
        "download",
        "test_fraction",
        "min_samples",
        "max_retries",
        "batch_size",
        "lr",
        "momentum",
        "s_share",
    }
)


@dataclass
class VisionSetup:
    """A validated vision experiment: everything built, nothing trained.

    :param dataset: the pooled dataset
    :param partition: every client's train/test indices
    :param root: the dataset folder (torchvision datasets), for the clients to reload it
    :param download: whether torchvision may download the dataset
    :param model: the model name
    :param model_options: the model's hyper-parameters
    :param train: local SGD settings
    :param s_share: FedPG's c for S-acc
    """

    dataset: VisionDataset
    partition: Partition
    root: str | None
    download: bool
    model: str
    model_options: dict[str, Any]
    train: TrainConfig
    s_share: float

    @classmethod
    def from_config(
        cls, data: dict[str, Any], model: dict[str, Any], split: dict[str, Any], n_clients: int, seed: int
    ) -> VisionSetup:
        """Load the dataset, draw the partition and check the model and training settings.

        The partition is drawn from ``generator(seed, "partition")``.

        :param data: the ``data`` node
        :param model: the ``model`` node (``name`` and hyper-parameters)
        :param split: the ``partition`` node (``name`` and the partition's options)
        :raises ValueError: any setting that cannot work (the message names it), a missing
            dataset (:class:`~morlfed.tasks.vision.data.DatasetUnavailable`) or an impossible partition
            (:class:`~morlfed.tasks.vision.partition.PartitionError`)
        """
        unknown = set(data) - DATA_KEYS
        if unknown:
            raise ValueError(f"data: unknown key(s) {sorted(unknown)}; allowed: {sorted(DATA_KEYS)}")
        options = dict(split)
        name = options.pop("name")
        s_share = data.get("s_share", 0.5)
        if not (isinstance(s_share, (int, float)) and not isinstance(s_share, bool) and 0 <= s_share <= 1):
            raise ValueError(f"data.s_share (FedPG's c) must be in [0, 1], got {s_share!r}")
        train = TrainConfig(data.get("batch_size", 10), data.get("lr", 0.05), data.get("momentum", 0.0))
        root = None if data.get("root") is None else str(Path(data["root"]).expanduser().absolute())
        download = bool(data.get("download", False))
        dataset = load_dataset(data["name"], root, download)
        model = dict(model)
        model_name = model.pop("name")
        build_model(model_name, dataset.input_shape, dataset.n_classes, torch_generator(seed, "init"), **model)
        partition = make_partition(
            name,
            dataset.labels.numpy(),
            n_clients,
            generator(seed, "partition"),
            test_fraction=data.get("test_fraction", 0.25),
            min_samples=data.get("min_samples", 10),
            max_retries=data.get("max_retries", 100),
            **options,
        )
        return cls(dataset, partition, root, download, model_name, model, train, float(s_share))

    def client_factory(self, seed: int, local_steps: int, torch_threads: int = 1) -> VisionClientFactory:
        """The picklable factory of this experiment's clients.

        :param seed: the run's root seed
        :param local_steps: the local epochs of one fit
        :param torch_threads: torch threads per client computation
        """
        return VisionClientFactory(
            data=self.dataset.name,
            root=self.root,
            download=self.download,
            partition=self.partition,
            model=self.model,
            local_steps=local_steps,
            model_options=self.model_options,
            train=self.train,
            seed=seed,
            s_share=self.s_share,
            torch_threads=torch_threads,
        )
