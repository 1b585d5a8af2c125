"""A supervised-vision client: local SGD epochs of a classifier on its share of a label-skewed dataset.

It implements the same client protocol as :class:`morlfed.tasks.rl.client.RLClient`, so every
registered strategy runs on it unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation
from morlfed.core.proximal import install_proximal
from morlfed.core.seeding import generator, torch_generator
from morlfed.runtime.client import PERSONAL_SLOT, Client, TrainJob, TrainOutput
from morlfed.tasks.vision.data import VisionDataset, load_dataset
from morlfed.tasks.vision.models import build_model, model_layout
from morlfed.tasks.vision.partition import Partition

#: Samples per forward pass when measuring losses and accuracies (no gradients).
EVAL_CHUNK = 1024


@dataclass(frozen=True)
class TrainConfig:
    """Local SGD settings of a vision client.

    :param batch_size: minibatch size, >= 1
    :param lr: SGD learning rate, > 0
    :param momentum: SGD momentum in [0, 1); the optimiser starts afresh at every local training
        (no optimiser state is carried across rounds or between the K models of a round)
    """

    batch_size: int = 10
    lr: float = 0.05
    momentum: float = 0.0

    def __post_init__(self) -> None:
        """Raise ``ValueError`` naming the out-of-range ``data.*`` setting (batch size, lr, momentum)."""
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"data.batch_size must be a positive integer, got {self.batch_size!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and np.isfinite(self.lr)):
            raise ValueError(f"data.lr must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1):
            raise ValueError(f"data.momentum must be in [0, 1), got {self.momentum!r}")


def s_acc_clients(cid: int, n_clients: int, share: float, seed: int) -> np.ndarray:
    """The other clients whose test data enter client ``cid``'s S-acc, sorted.

    They are ``round((n - 1) * share)`` of them (halves up), drawn without replacement from
    ``generator(seed, "s-acc", cid)`` (FedPG's "c% of clients other than i that are randomly
    selected").
    """
    others = np.array([c for c in range(n_clients) if c != cid], dtype=np.int64)
    m = int(np.floor((n_clients - 1) * share + 0.5))
    return np.sort(generator(seed, "s-acc", cid).choice(others, size=m, replace=False))


class VisionClient(Client):
    """A federated classification client.

    **Local training.** ``local_steps`` is the number of local *epochs* of a fit: each epoch visits
    the client's training samples once in a random order, in minibatches of
    ``train.batch_size``, with plain SGD on the cross-entropy (``train.lr``, ``train.momentum``;
    a fresh optimiser per training). The order is drawn from a torch generator derived from
    ``(seed, "batches", cid, round[, k])``; the personal model's from ``(seed, "personal", cid,
    round)``. No global RNG is used.

    **Fit options** (:class:`~morlfed.core.protocol.FitTask`): interpreted by
    :class:`~morlfed.runtime.client.Client`; this class trains one model and measures a loss.

    **Loss of a model** (``report_losses``, ``train_best``; IFCA, FedFew, FedMHC, FedPG): the mean
    cross-entropy of the *received* model over all the client's training samples, measured in
    one pass without gradients before any training, i.e. the mean training loss a local epoch
    would start from. (FedFew's reference client averages the running minibatch losses of its
    local epoch instead; the protocol asks for the received models' losses, which IFCA and
    FedMHC need before training to choose a model and FedPG needs at the global model.)

    **Training metrics** (``FitResult.metrics``): ``train_loss`` and ``train_accuracy`` (%) are the
    running means over the local epochs' minibatches of the model serving this client (the
    trained one; with ``train_all`` the one with the lowest reported loss, else model 0);
    ``train_reward`` repeats ``train_accuracy`` (the quantity a classifier maximises, so that the
    loop's generic ``mean_train_reward`` curve is the training accuracy); the personal model
    adds ``personal_train_loss`` and ``personal_train_accuracy``.

    **FedProx** (``prox_mu > 0``): the SGD optimiser is wrapped by
    :func:`~morlfed.core.proximal.install_proximal`, adding ``mu * (theta - centre)`` to the gradients;
    the centre is ``task.prox_centre`` (``[d]`` or one row per model) or the starting model.

    **Personal model** (``personal_lambda``, FedMHC): a private ``[d]`` vector, initialised from
    the starting model of the first such task, trained after the shared model for the same
    epochs with ``lambda/2 ||theta - w||^2`` towards ``w`` = the model just trained (the same
    proximal wrapper with ``mu = lambda``). Evaluating ``None`` evaluates it (the shared
    initial model if the client never trained one); it never leaves the client.

    ``num_samples`` is the number of local training samples ``n_i`` (the FedAvg weight; each
    of them is used once per epoch).

    **Evaluation** (:meth:`evaluate_client`), accuracies in percent over pooled samples: ``l_acc`` on the
    client's own test data (L-acc), ``s_acc`` on its own test data together with the test data of
    the other clients drawn by :func:`s_acc_clients` (FedPG's S-acc with share ``c =
    s_share``), ``g_acc`` on every client's test data (G-acc), and ``test_loss``, the mean
    cross-entropy on its own test data. ``Evaluation.scalarised`` is ``l_acc``; the vector
    returns are empty.

    State carried across rounds (what :meth:`get_state` captures): only ``personal``; models and
    optimisers are rebuilt from each task.

    :param cid: client id
    :param dataset: the pooled dataset
    :param partition: every client's train/test indices (this client's, and the others' test
        data for S-acc and G-acc)
    :param model: the model name (:data:`~morlfed.tasks.vision.models.MODELS`)
    :param model_options: the model's hyper-parameters
    :param train: local SGD settings
    :param seed: the run's root seed
    :param local_steps: the local epochs of one fit
    :param s_share: FedPG's c, the share of the other clients whose test data enter S-acc, in [0, 1]
    :param torch_threads: torch intra-op threads while this client computes
    """

    def __init__(
        self,
        cid: int,
        dataset: VisionDataset,
        partition: Partition,
        model: str,
        model_options: dict[str, Any],
        train: TrainConfig,
        seed: int,
        local_steps: int,
        s_share: float = 0.5,
        torch_threads: int = 1,
    ) -> None:
        if not 0 <= cid < partition.n_clients:
            raise ValueError(f"client id {cid} is not in the partition's 0..{partition.n_clients - 1}")
        if not (isinstance(s_share, (int, float)) and 0 <= s_share <= 1):
            raise ValueError(f"s_share (FedPG's c) must be in [0, 1], got {s_share!r}")
        super().__init__([cid], seed, local_steps)
        self.cid, self.dataset, self.train_config = cid, dataset, train
        self.torch_threads = torch_threads
        torch.set_num_threads(torch_threads)
        # The same init seed for every client: all start from one shared initial model.
        self.model = build_model(
            model, dataset.input_shape, dataset.n_classes, torch_generator(seed, "init"), **model_options
        )
        self._layout = model_layout(self.model)
        self._train_idx = torch.as_tensor(partition.train[cid])
        # Every client's test data in client order; this client's and its S-acc clients' parts.
        self._pool = torch.as_tensor(np.concatenate(partition.test))
        bounds = np.cumsum([0, *(len(t) for t in partition.test)])
        owner = np.repeat(np.arange(partition.n_clients), np.diff(bounds))
        self._own = torch.as_tensor(owner == cid)
        self._s_mask = torch.as_tensor(np.isin(owner, [cid, *s_acc_clients(cid, partition.n_clients, s_share, seed)]))
        self._optimizer: torch.optim.Optimizer | None = None
        self._initial = self.initial_params()

    @property
    def layout(self) -> ParamLayout:
        """Layout of the federated vector: every model parameter, the ``head.*`` layers as head."""
        return self._layout

    @property
    def num_train(self) -> int:
        """Number of local training samples."""
        return int(self._train_idx.numel())

    @property
    def num_test(self) -> int:
        """Number of local test samples."""
        return int(self._own.sum())

    def initial_params(self) -> torch.Tensor:
        """The model as a ``[d]`` vector; before any fit, the shared initial model."""
        return self._layout.flatten(dict(self.model.named_parameters()))

    def _train(self, jobs: Mapping[int, TrainJob]) -> dict[int, TrainOutput]:
        """Train this client's model of the wave with local SGD epochs (batch order from the job's torch generator)."""
        return {cid: self._train_one(job) for cid, job in jobs.items()}

    def _train_one(self, job: TrainJob) -> TrainOutput:
        torch.set_num_threads(self.torch_threads)
        purpose = PERSONAL_SLOT if job.personal else "batches"
        batches = torch_generator(self.seed, purpose, self.cid, *job.keys)
        params, loss, accuracy = self._sgd(job.start, job.steps, batches, job.prox_mu, job.centre)
        return TrainOutput(params, {"loss": loss, "accuracy": accuracy})

    def _loss(self, cid: int, params: torch.Tensor, keys: tuple[int, int]) -> tuple[float, int | None]:
        return self.loss(params), None  # a pass over the training data: no env step to count

    def _fit_metrics(self, cid: int, outputs: list[TrainOutput], serving: int) -> dict[str, float]:
        loss, accuracy = outputs[serving].stats["loss"], outputs[serving].stats["accuracy"]
        return {"train_reward": accuracy, "train_accuracy": accuracy, "train_loss": loss}

    def _personal_metrics(self, cid: int, output: TrainOutput) -> dict[str, float]:
        return {"personal_train_loss": output.stats["loss"], "personal_train_accuracy": output.stats["accuracy"]}

    def _num_samples(self, cid: int, steps: int, trained: int) -> int:
        return self.num_train

    def loss(self, params: torch.Tensor) -> float:
        """Mean cross-entropy of the ``[d]`` model ``params`` over the client's training samples."""
        self._load(params)
        logits = self._logits(self._train_idx)
        return float(F.cross_entropy(logits, self.dataset.labels[self._train_idx]))

    def evaluate_client(self, cid: int, params: torch.Tensor | None, seed: int) -> Evaluation:
        """L-acc, S-acc, G-acc and the local test loss of ``params`` (``None``: the personal model).

        Evaluation is deterministic; ``seed`` is accepted for the protocol and unused.

        :param cid: this client's id
        :param params: the ``[d]`` model
        :param seed: unused
        """
        self._check_cid(cid)
        if params is None:
            personal = self.personal_model(cid)
            params = personal if personal is not None else self._initial
        torch.set_num_threads(self.torch_threads)
        self._load(params)
        logits = self._logits(self._pool)
        labels = self.dataset.labels[self._pool]
        correct = (logits.argmax(dim=1) == labels).double()
        l_acc = 100.0 * float(correct[self._own].mean())
        metrics = {
            "l_acc": l_acc,
            "s_acc": 100.0 * float(correct[self._s_mask].mean()),
            "g_acc": 100.0 * float(correct.mean()),
            "test_loss": float(F.cross_entropy(logits[self._own], labels[self._own])),
        }
        return Evaluation(
            vector_return=np.zeros(0),
            discounted_return=np.zeros(0),
            scalarised=l_acc,
            scalarised_discounted=l_acc,
            metrics=metrics,
        )

    def get_state(self, cid: int) -> dict[str, Any]:
        """What the client carries from one round to the next (an independent copy): its personal model.

        Models, optimisers and batch orders are rebuilt from every task.

        :param cid: this client's id
        """
        self._check_cid(cid)
        personal = self.personal_model(cid)
        return {"personal": None if personal is None else personal.clone()}

    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`get_state` (the client takes ownership of it).

        :param cid: this client's id
        :param state: the state
        """
        self._check_cid(cid)
        self.set_personal_model(cid, state["personal"])

    # ------------------------------------------------------------------------------------------
    def _sgd(
        self, start: torch.Tensor, epochs: int, batches: torch.Generator, mu: float, centre: torch.Tensor
    ) -> tuple[torch.Tensor, float, float]:
        """Train from ``start`` for ``epochs`` epochs.

        :return: the trained vector and the running mean loss and accuracy (%) of its minibatches
        """
        self._load(start)
        self.model.train()
        self._optimizer = torch.optim.SGD(
            self.model.parameters(), lr=self.train_config.lr, momentum=self.train_config.momentum
        )
        proximal: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if mu > 0:
            named = self._layout.unflatten(centre.float())
            centres: dict[torch.Tensor, torch.Tensor] = {p: named[name] for name, p in self.model.named_parameters()}
            proximal = install_proximal(self, "_optimizer", centres, mu)
        total_loss, correct, seen = 0.0, 0, 0
        with proximal:
            for _ in range(epochs):
                order = self._train_idx[torch.randperm(self.num_train, generator=batches)]
                for batch in order.split(self.train_config.batch_size):
                    x, y = self.dataset.inputs(batch), self.dataset.labels[batch]
                    self._optimizer.zero_grad()
                    logits = self.model(x)
                    loss = F.cross_entropy(logits, y)
                    loss.backward()
                    self._optimizer.step()
                    total_loss += loss.item() * len(batch)
                    correct += int((logits.argmax(dim=1) == y).sum())
                    seen += len(batch)
        self._optimizer = None
        return self.initial_params(), total_loss / seen, 100.0 * correct / seen

    def _logits(self, indices: torch.Tensor) -> torch.Tensor:
        """The current model's logits on ``indices``, in chunks, without gradients."""
        self.model.eval()
        with torch.no_grad():
            return torch.cat([self.model(self.dataset.inputs(chunk)) for chunk in indices.split(EVAL_CHUNK)])

    def _load(self, params: torch.Tensor) -> None:
        named = self._layout.unflatten(params.detach().float())
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(named[name])


@dataclass
class VisionClientFactory:
    """Builds vision clients by id; picklable, so worker processes build their own clients.

    The dataset is loaded once per process: :func:`~morlfed.tasks.vision.data.load_dataset` caches it.

    :param data: the dataset name
    :param root: the dataset folder (torchvision datasets)
    :param download: let torchvision download a missing dataset
    :param partition: every client's train/test indices
    :param model: the model name
    :param local_steps: the local epochs of one fit
    :param model_options: the model's hyper-parameters
    :param train: local SGD settings
    :param seed: root seed
    :param s_share: FedPG's c for S-acc
    :param torch_threads: torch threads per client computation
    """

    data: str
    root: str | None
    download: bool
    partition: Partition
    model: str
    local_steps: int
    model_options: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    s_share: float = 0.5
    torch_threads: int = 1

    def __call__(self, cid: int) -> VisionClient:
        """Client ``cid``, on the process's cached copy of the dataset."""
        dataset = load_dataset(self.data, self.root, self.download)
        return VisionClient(
            cid,
            dataset,
            self.partition,
            self.model,
            self.model_options,
            self.train,
            self.seed,
            self.local_steps,
            self.s_share,
            self.torch_threads,
        )
