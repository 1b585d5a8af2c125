"""The vectorised engine's low-precision arithmetic: networks' hidden layers copied to bfloat16.

A gradient step in ``bf16`` computes every hidden layer of a network in bfloat16 (mixed
precision): the parameters, the gradients, the output layer, the loss and the optimiser stay
float32, and each step computes with dense bfloat16 copies of the hidden layers' parameters.
:class:`HiddenCopies` keeps those copies for the DDPG learner, made again only after their network
changed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: The arithmetic of a gradient step: float32 throughout, or bfloat16 matrix products.
PRECISIONS = ("fp32", "bf16")


class HiddenCopies:
    """Dense low-precision copies of some stacked networks' hidden layers.

    A copy is a ``[N, *shape]`` tensor per parameter, laid out densely (oneDNN's bfloat16 products
    copy an operand whose clients are not laid out densely), refreshed from the float32 parameters
    at its first use after :meth:`changed` named its network.

    :param networks: each network's float32 stacked views ``{layout name: [N, *shape]}``, which
        follow the in-place updates of its parameters
    :param outputs: each network's output layers' layout names, which stay float32
    :param dtype: the copies' element type
    """

    def __init__(
        self,
        networks: Mapping[str, Mapping[str, torch.Tensor]],
        outputs: Mapping[str, set[str]],
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self._sources = networks
        self._copies = {
            name: {
                k: v.to(dtype, memory_format=torch.contiguous_format)
                for k, v in views.items()
                if k not in outputs[name]
            }
            for name, views in networks.items()
        }
        self._stale: set[str] = set()

    def changed(self, *names: str) -> None:
        """Mark networks whose float32 parameters changed: their copies are made again at their next use."""
        self._stale.update(names)

    def views(self, name: str, views: dict[str, torch.Tensor], rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """A network's parameters as the step computes with them: its output layers float32, the rest copies.

        :param name: the network
        :param views: its float32 stacked views, of the stepping clients
        :param rows: the stepping clients (``None``: all)
        """
        copies = self._copies[name]
        if name in self._stale:
            sources = self._sources[name]
            for k, copy in copies.items():
                copy.copy_(sources[k])
            self._stale.discard(name)
        if rows is not None:
            copies = {k: v.index_select(0, rows) for k, v in copies.items()}
        return views | copies
