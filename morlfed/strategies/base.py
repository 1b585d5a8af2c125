"""The server-side strategy protocol and the name registry.

A strategy is task-agnostic: it sees parameter vectors, sample counts and reported losses, never
a client's preference or data, so the same class serves RL and vision clients. Strategies are
registered by name through the ``algo`` config group (``morlfed/conf/algo/<name>.yaml`` holds the
class path as ``_target_`` and the hyper-parameters), so ``morlfed`` never imports a strategy
module directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import FitResult, FitTask

ALGO_DIR = Path(__file__).parent.parent / "conf" / "algo"


class InertSettingWarning(UserWarning):
    """A hyper-parameter switches off part of a strategy for the run's rounds.

    E.g. FedPref's clustering with a patience longer than the run; the rest of the strategy still
    works. A setting that would make the whole strategy another one is a ``ValueError`` instead.
    """


class Strategy(ABC):
    """Base class of every server strategy.

    Life cycle: :meth:`setup` once, then per round :meth:`configure` (what each participant
    trains) and :meth:`aggregate` (fold the reported results into the server state); at the end
    :meth:`model_for` gives the model each client deploys. :meth:`diagnostics` exposes clusters,
    similarities and weights for logs and plots; :meth:`state_dict` / :meth:`load_state_dict`
    make a run resumable.
    """

    #: True when every client deploys its private personal model (FedMHC): the final evaluation
    #: then asks each client to evaluate ``None`` (its personal model) instead of :meth:`model_for`.
    deploys_personal: bool = False

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Prepare the server state for ``n_clients`` clients starting from ``init_params``.

        :param rng: the strategy's own generator (e.g. for clustering); never the global RNG
        """
        self.validate(n_clients)
        self.n_clients = n_clients
        self.layout = layout
        self.rng = rng

    def validate(self, n_clients: int, rounds: int | None = None) -> None:
        """Raise ``ValueError`` when the hyper-parameters cannot work with the run.

        That is, when they cannot work with ``n_clients``, or would leave the method inert within
        ``rounds`` (e.g. a warm-up no round gets past).

        :param n_clients: the number of clients
        :param rounds: the number of rounds that are aggregated (the run's rounds, less the last
            one of a "+FT" run); ``None`` when unknown (:meth:`setup`): only ``n_clients`` is checked
        """

    @abstractmethod
    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """The task of every participant this round."""

    @abstractmethod
    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Fold this round's (finite, successful) results into the server state."""

    @abstractmethod
    def model_for(self, cid: int) -> torch.Tensor:
        """The ``[d]`` model client ``cid`` deploys now."""

    #: what :meth:`model_id` means, the footnote of the console table's ``model`` column (the one
    #: global model by default: a strategy with clusters, server models or personal models says so)
    model_id_note: ClassVar[str] = "0: the one global model"

    def model_id(self, cid: int) -> int:
        """Which server model or cluster client ``cid`` deploys (for ``final.csv``; :attr:`model_id_note`)."""
        return 0

    def finetuned_model(self, cid: int, result: FitResult) -> torch.Tensor:
        """The ``[d]`` model client ``cid`` keeps from its own last local training in a "+FT" run.

        In a "+FT" run the last round is not aggregated; multi-model strategies pick one of the rows.
        """
        return result.params

    def diagnostics(self) -> dict[str, Any]:
        """JSON-serialisable round diagnostics (clusters, weights, norms)."""
        return {}

    def similarity(self) -> dict[tuple[int, ...], torch.Tensor]:
        """The similarity blocks computed in the last round, keyed by the clients they cover."""
        return {}

    def inert_warning(self) -> str | None:
        """After the last round: a sentence saying how the run left the method inert, or ``None``.

        E.g. a clustering that never split, so the method ran as FedAvg. The federation logs it as
        a warning; :meth:`validate` catches what can be known before training.
        """
        return None

    def split_events(self) -> list[dict[str, Any]] | None:
        """After the last round: every cluster split of the run, in order, or ``None``.

        One :func:`split_event` each (``[]``: none); ``None`` for a strategy that does not split
        clusters, or a run resumed from a checkpoint that predates the record. The run stores it in
        ``metrics.json`` (``split_events``).
        """
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the strategy (tensors, lists, RNG state)."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]


class PersonalisedStrategy(Strategy):
    """A strategy that keeps one model per client in an ``[n, d]`` matrix."""

    def setup(self, n_clients: int, init_params: torch.Tensor, layout: ParamLayout, rng: np.random.Generator) -> None:
        """Give every client a copy of ``init_params`` as its model (rows of ``self.models``)."""
        super().setup(n_clients, init_params, layout, rng)
        self.models = init_params.detach().float().clone().unsqueeze(0).repeat(n_clients, 1)

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """Send each participant a copy of its own model."""
        return {cid: FitTask(params=self.models[cid].clone()) for cid in participants}

    def model_for(self, cid: int) -> torch.Tensor:
        """A copy of client ``cid``'s own model."""
        return self.models[cid].clone()

    def state_dict(self) -> dict[str, Any]:
        """Add the ``[n, d]`` matrix of personal models to the base state."""
        return {**super().state_dict(), "models": self.models.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, the personal models included."""
        super().load_state_dict(state)
        self.models = state["models"].clone()


def split_event(round: int, sides: Sequence[Sequence[int]]) -> dict[str, Any]:
    """One split of a cluster, as ``metrics.json`` records it: ``{"round", "sizes", "sides"}``.

    ``sides`` holds each side's client ids, sorted (absent members included), and ``sizes`` their sizes.

    :param round: the round whose aggregation split the cluster
    :param sides: the client ids of each side
    """
    ordered = [sorted(int(c) for c in side) for side in sides]
    return {"round": int(round), "sizes": [len(side) for side in ordered], "sides": ordered}


def stack_results(results: dict[int, FitResult]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Client ids (sorted), their ``[N, d]`` parameters and ``[N]`` sample counts."""
    cids = sorted(results)
    params = torch.stack([results[c].params.float() for c in cids])
    samples = torch.tensor([float(results[c].num_samples) for c in cids])
    return cids, params, samples


def sample_shares(samples: torch.Tensor) -> torch.Tensor:
    """Each client's share ``n_i / sum n`` of a sample-weighted mean, from its ``[N]`` sample counts.

    When no client reports a sample, the weighted mean is undefined (0 / 0, NaN in every
    parameter); the shares are then equal, a plain mean, so the round's models stay finite.

    :param samples: the clients' sample counts ``n_i``, ``[N]``
    """
    total = samples.sum()
    return samples / total if total > 0 else torch.full_like(samples, 1.0 / len(samples))


def available_strategies() -> list[str]:
    """Names accepted by ``algo=`` (one config file each in ``morlfed/conf/algo``)."""
    return sorted(p.stem for p in ALGO_DIR.glob("*.yaml"))


def make_strategy(name: str, **params: Any) -> Strategy:
    """Instantiate the strategy registered as ``name`` with its config defaults, overridden by ``params``.

    Raises ``ValueError`` for a name that is not registered (:func:`available_strategies`).
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    if name not in available_strategies():
        raise ValueError(f"unknown strategy {name!r}; valid names: {', '.join(available_strategies())}")
    cfg = OmegaConf.merge(OmegaConf.load(ALGO_DIR / f"{name}.yaml"), params)
    return instantiate(cfg, _convert_="all")
