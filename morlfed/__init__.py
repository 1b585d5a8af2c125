"""morlfed: federated multi-objective reinforcement learning.

The framework package: parameter layouts, the client abstraction, the protocol's messages, the strategy interface, the federation loop,
the seed papers' strategies (``morlfed.strategies``), executors, run directories and the hydra CLI
(``python -m morlfed.run``).
"""

from morlfed.client import Client
from morlfed.params import ParamLayout
from morlfed.protocol import ClientFailure, Evaluation, FitResult, FitTask
from morlfed.strategy import Strategy

__all__ = [
    "Client",
    "ClientFailure",
    "Evaluation",
    "FitResult",
    "FitTask",
    "ParamLayout",
    "Strategy",
]
__version__ = "0.1.0"
