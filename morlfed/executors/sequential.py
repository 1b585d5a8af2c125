"""The ``sequential`` executor: every client in this process, one after another."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from morlfed.executors.base import ClientFactory, Executor, FitOutcome, StepSink, make_host
from morlfed.params import ParamLayout
from morlfed.protocol import Evaluation, FitTask


class SequentialExecutor(Executor):
    """All clients in this process, in one host (``client_timeout`` via ``SIGALRM``).

    :param client_timeout: seconds a fit may take (``None``/0: no limit)
    """

    name = "sequential"

    def start(self, factory: ClientFactory, n_clients: int) -> None:
        self.host = make_host(factory, range(n_clients), self.client_timeout)

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        return self.host.initial()

    def fit(
        self,
        tasks: dict[int, FitTask],
        on_result: Callable[[int], None] | None = None,
        on_steps: StepSink | None = None,
    ) -> dict[int, FitOutcome]:
        out = {}
        for cid, outcome in self.host.fit_many(list(tasks.items()), on_steps):
            out[cid] = outcome
            if on_result is not None:
                on_result(cid)
        return {cid: out[cid] for cid in tasks}

    def evaluate(self, models: Mapping[int, torch.Tensor | None], seeds: Mapping[int, int]) -> dict[int, Evaluation]:
        out = self.host.evaluate_many([(cid, params, seeds[cid]) for cid, params in models.items()])
        return {cid: out[cid] for cid in models}

    def save_clients(self, directory: Path) -> None:
        self.host.save(directory)

    def load_clients(self, directory: Path) -> None:
        self.host.load(directory)
        self.restore_dir = Path(directory)
