"""The ``sequential`` executor: every client in this process, one after another."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation, FitTask
from morlfed.runtime.executors.base import ClientFactory, Executor, FitOutcome, StepSink, make_host


class SequentialExecutor(Executor):
    """All clients in this process, in one host (``client_timeout`` via ``SIGALRM``).

    :param client_timeout: seconds a fit may take (``None``/0: no limit)
    """

    name = "sequential"

    def start(self, factory: ClientFactory, n_clients: int) -> None:
        """Build clients ``0..n_clients-1`` in this process, in one host.

        The host comes from :func:`~morlfed.runtime.executors.base.make_host`.
        """
        self.host = make_host(factory, range(n_clients), self.client_timeout)

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The shared initial model and its layout, as the host reports it."""
        return self.host.initial()

    def fit(
        self,
        tasks: dict[int, FitTask],
        on_result: Callable[[int], None] | None = None,
        on_steps: StepSink | None = None,
    ) -> dict[int, FitOutcome]:
        """Fit the clients one after another in this process, through the host's ``fit_many``.

        ``on_result`` is called as each outcome comes back (for a ``batched`` host, only once the
        whole batch is done); ``on_steps`` goes to the host. ``client_timeout`` is enforced with
        ``SIGALRM``, so only when this is called from the main thread. The outcomes are returned in
        the order of ``tasks``.
        """
        out = {}
        for cid, outcome in self.host.fit_many(list(tasks.items()), on_steps):
            out[cid] = outcome
            if on_result is not None:
                on_result(cid)
        return {cid: out[cid] for cid in tasks}

    def evaluate(self, models: Mapping[int, torch.Tensor | None], seeds: Mapping[int, int]) -> dict[int, Evaluation]:
        """Evaluate the models in this process, in one call to the host, in the order of ``models``."""
        out = self.host.evaluate_many([(cid, params, seeds[cid]) for cid, params in models.items()])
        return {cid: out[cid] for cid in models}

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """Ask the host for the clients' personal models."""
        return self.host.personal_models(cids)

    def save_clients(self, directory: Path) -> None:
        """Have the host write every client's state into ``directory``."""
        self.host.save(directory)

    def load_clients(self, directory: Path) -> None:
        """Have the host restore every client from ``directory``, and remember it as ``restore_dir``."""
        self.host.load(directory)
        self.restore_dir = Path(directory)
