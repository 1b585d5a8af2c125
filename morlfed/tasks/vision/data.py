"""Image classification datasets for the vision path, as one pooled uint8 tensor each.

``digits`` is scikit-learn's ``load_digits`` (1797 8x8 grey images of 10 digits, shipped inside
scikit-learn: no download, the default). MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 are read
through torchvision from a local folder ``data.root`` in torchvision's own layout (see
:data:`DATASETS`); torchvision is the optional extra ``pip install -e .[vision]`` and is imported
only when one of them is asked for. Nothing is downloaded unless ``data.download=true``.

Federated partitions are drawn over *all* samples of a dataset (for torchvision datasets the
official train and test parts are pooled), then every client splits its own share into local
train and test data (:mod:`morlfed.tasks.vision.partition`), as in PFLlib, on which the FedFew and
FedMHC experiments ran.

Images stay uint8 (``[n, C, H, W]``) in memory, shared by every client of a process;
:meth:`VisionDataset.inputs` scales and normalises a batch when it is used. The normalisation is
per channel, with the mean and standard deviation of the pooled dataset.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from morlfed.core.commands import pip_install


class DatasetUnavailable(ValueError):
    """A dataset that cannot be loaded; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class DatasetInfo:
    """Where and how a torchvision dataset is found.

    :param name: the ``data=`` name
    :param torchvision_class: the class in ``torchvision.datasets``
    :param folder: the sub-folder of ``data.root`` torchvision reads
    :param files: files torchvision needs inside ``folder`` (extracted, not the archives)
    """

    name: str
    torchvision_class: str
    folder: str
    files: tuple[str, ...]


_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

#: The torchvision datasets ``data=`` accepts besides ``digits``.
DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo("mnist", "MNIST", "MNIST/raw", _MNIST_FILES),
    "fashion-mnist": DatasetInfo("fashion-mnist", "FashionMNIST", "FashionMNIST/raw", _MNIST_FILES),
    "cifar10": DatasetInfo(
        "cifar10",
        "CIFAR10",
        "cifar-10-batches-py",
        ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch", "batches.meta"),
    ),
    "cifar100": DatasetInfo("cifar100", "CIFAR100", "cifar-100-python", ("train", "test", "meta")),
}

#: Every name ``data=`` accepts.
DATASET_NAMES: tuple[str, ...] = ("digits", *DATASETS)


@dataclass(frozen=True)
class VisionDataset:
    """A pooled labelled image dataset.

    :param name: dataset name
    :param images: ``[n, C, H, W]`` uint8 pixel values
    :param labels: ``[n]`` int64 class labels in ``0..n_classes-1``
    :param n_classes: number of classes
    :param scale: the largest possible pixel value (16 for digits, 255 otherwise)
    :param mean: ``[C]`` per-channel mean of the scaled pixels (``images / scale``)
    :param std: ``[C]`` per-channel standard deviation of the scaled pixels
    """

    name: str
    images: torch.Tensor
    labels: torch.Tensor
    n_classes: int
    scale: float
    mean: torch.Tensor
    std: torch.Tensor

    def __len__(self) -> int:
        """The number of images in the pooled dataset."""
        return int(self.labels.shape[0])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        return tuple(int(s) for s in self.images.shape[1:])  # type: ignore[return-value]

    def inputs(self, indices: torch.Tensor) -> torch.Tensor:
        """The normalised float32 images ``[len(indices), C, H, W]`` at ``indices``."""
        x = self.images[indices].float().div_(self.scale)
        return x.sub_(self.mean.view(1, -1, 1, 1)).div_(self.std.view(1, -1, 1, 1))

    @classmethod
    def from_arrays(
        cls, name: str, images: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, scale: float
    ) -> VisionDataset:
        """Build a dataset from uint8 images and integer labels, computing the class count and normalisation.

        The images are ``[n, H, W]`` (grey) or ``[n, H, W, C]`` / ``[n, C, H, W]``.
        """
        images = torch.as_tensor(np.asarray(images))
        if images.ndim == 3:
            images = images.unsqueeze(1)
        elif images.ndim == 4 and images.shape[-1] in (1, 3) and images.shape[1] not in (1, 3):
            images = images.permute(0, 3, 1, 2)
        if images.ndim != 4:
            raise ValueError(f"{name}: images must be [n, H, W] or [n, H, W, C], got shape {tuple(images.shape)}")
        images = images.to(torch.uint8).contiguous()
        labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        if labels.shape != (images.shape[0],):
            raise ValueError(f"{name}: {images.shape[0]} images but labels of shape {tuple(labels.shape)}")
        scaled = images.double() / scale
        mean = scaled.mean(dim=(0, 2, 3)).float()
        std = scaled.std(dim=(0, 2, 3)).clamp_min(1e-6).float()
        return cls(name, images, labels, int(labels.max()) + 1, float(scale), mean, std)


def load_dataset(name: str, root: str | Path | None = None, download: bool = False) -> VisionDataset:
    """Load dataset ``name`` (cached per process: every client of a worker shares one copy).

    :param name: one of :data:`DATASET_NAMES`
    :param root: the folder holding torchvision datasets (unused for ``digits``)
    :param download: let torchvision download a missing dataset into ``root``
    :raises DatasetUnavailable: unknown name, no ``root``, missing files, or torchvision missing
    """
    if name not in DATASET_NAMES:
        raise DatasetUnavailable(f"unknown dataset {name!r}; valid: {', '.join(DATASET_NAMES)}")
    resolved = None if root is None else str(Path(root).expanduser().absolute())
    return _load_cached(name, resolved, bool(download))


@functools.lru_cache(maxsize=4)
def _load_cached(name: str, root: str | None, download: bool) -> VisionDataset:
    if name == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        return VisionDataset.from_arrays("digits", digits.images.astype(np.uint8), digits.target, scale=16.0)
    info = DATASETS[name]
    check_dataset_files(info, root, download)
    datasets = import_torchvision().datasets
    cls = getattr(datasets, info.torchvision_class)
    parts = [cls(root=root, train=train, download=download) for train in (True, False)]
    images = np.concatenate([np.asarray(p.data) for p in parts])
    labels = np.concatenate([np.asarray(p.targets) for p in parts])
    return VisionDataset.from_arrays(name, images, labels, scale=255.0)


def check_dataset_files(info: DatasetInfo, root: str | Path | None, download: bool) -> None:
    """Raise :class:`DatasetUnavailable` unless ``root`` holds every file of ``info``.

    ``download`` set with a ``root`` given also passes. Runs before torchvision is imported.
    """
    if root is None:
        raise DatasetUnavailable(
            f"data={info.name} is read from a local folder: set data.root=DIR, a folder holding "
            f"{info.folder}/ (torchvision's layout), or add data.download=true to download it there"
        )
    if download:
        return
    folder = Path(root) / info.folder
    missing = [f for f in info.files if not (folder / f).is_file()]
    if missing:
        raise DatasetUnavailable(
            f"dataset {info.name} not found: {folder} lacks {', '.join(missing)}. Put torchvision's "
            f"extracted {info.torchvision_class} files there (data.root={root} must hold {info.folder}/), "
            f"or add data.download=true to let torchvision download them into data.root"
        )


def import_torchvision() -> ModuleType:
    """``torchvision``, or :class:`DatasetUnavailable` naming the optional extra to install."""
    try:
        return importlib.import_module("torchvision")
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        raise DatasetUnavailable(
            f"MNIST, Fashion-MNIST and CIFAR need torchvision, which cannot be imported ({exc}); "
            f"install the optional extra: {pip_install('-e', '.[vision]')} (data=digits needs nothing extra)"
        ) from exc
