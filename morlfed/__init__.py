"""morlfed: federated multi-objective reinforcement learning.

The framework package: parameter layouts, the client abstraction, the protocol's messages, the
strategy interface, the federation loop, the seed papers' strategies (``morlfed.strategies``),
executors, run directories and the hydra CLI (``python -m morlfed.run``). From Python,
:func:`run_experiment` runs what the command line runs and returns an :class:`ExperimentResult`
(:mod:`morlfed.api`; docs/api.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import ClientFailure, Evaluation, FitResult, FitTask
from morlfed.core.provenance import package_version
from morlfed.metrics.indicators import hypervolume
from morlfed.runtime.client import Client
from morlfed.strategies.base import Strategy, make_strategy

if TYPE_CHECKING:
    from morlfed.api import ExperimentResult, run_experiment

__all__ = [
    "Client",
    "ClientFailure",
    "Evaluation",
    "ExperimentResult",
    "FitResult",
    "FitTask",
    "ParamLayout",
    "Strategy",
    "hypervolume",
    "make_strategy",
    "run_experiment",
]
__version__ = package_version()

#: what ``morlfed.<name>`` loads from :mod:`morlfed.api` on first use (hydra, pandas and
#: matplotlib are not imported by ``import morlfed`` or by worker processes)
_API = ("ExperimentResult", "run_experiment")


def __getattr__(name: str) -> Any:
    """``morlfed.run_experiment`` and ``morlfed.ExperimentResult``, imported when first used."""
    if name in _API:
        from morlfed import api

        return getattr(api, name)
    raise AttributeError(f"module 'morlfed' has no attribute {name!r}")
