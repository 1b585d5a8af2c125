"""No communication: every client trains on its own.

The server only relays each client's own model back to it. The lower bound that federation has
to beat.
"""

from __future__ import annotations

from morlfed.core.protocol import FitResult
from morlfed.strategies.base import PersonalisedStrategy


class Local(PersonalisedStrategy):
    """No-communication baseline.

    Client-side duties: train locally; the model it receives is its own from the last round.
    """

    def aggregate(self, round: int, results: dict[int, FitResult]) -> None:
        """Store each participant's trained model as its own; nothing is averaged."""
        for cid, result in results.items():
            self.models[cid] = result.params.float()

    model_id_note = "its own id: every model is personal"

    def model_id(self, cid: int) -> int:
        """The client's own id: every model is personal."""
        return cid
