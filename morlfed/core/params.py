"""Models as flat float32 vectors plus a :class:`ParamLayout`.

A client's federated model travels as one ``[d]`` float32 tensor. The layout records, in order,
each layer's name, shape and slice of that vector, and which layers form the "head" (the last
layer(s), for body/head methods such as FedMHC). Strategies stack many vectors into an ``[N, d]``
matrix and use the layout to work layer by layer on column blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerSpec:
    """One named tensor of a model inside the flat vector.

    :param name: parameter name, e.g. ``q_net.q_net.0.weight``
    :param shape: the tensor's shape
    :param start: first index in the flat vector
    :param stop: one past the last index in the flat vector
    """

    name: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def size(self) -> int:
        """Number of entries of this layer."""
        return self.stop - self.start

    @property
    def slice(self) -> slice:
        """The layer's slice of the flat vector."""
        return slice(self.start, self.stop)


class ParamLayout:
    """Ordered layer names, shapes and slices of a flat parameter vector.

    :param layers: the layers in vector order (contiguous, starting at 0)
    :param head: names of the layers that form the model's head
    """

    def __init__(self, layers: Iterable[LayerSpec], head: Iterable[str] = ()) -> None:
        self.layers: tuple[LayerSpec, ...] = tuple(layers)
        self.head: tuple[str, ...] = tuple(head)
        expected = 0
        for layer in self.layers:
            if layer.start != expected or layer.stop - layer.start != _numel(layer.shape):
                raise ValueError(f"layer {layer.name!r} is not contiguous with the previous one")
            expected = layer.stop
        unknown = set(self.head) - {layer.name for layer in self.layers}
        if unknown:
            raise ValueError(f"head layers {sorted(unknown)} are not layers of this layout")

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], head: Iterable[str] = ()) -> ParamLayout:
        """Build a layout from ``{name: shape}`` in iteration order."""
        layers, start = [], 0
        for name, shape in shapes.items():
            stop = start + _numel(tuple(shape))
            layers.append(LayerSpec(name, tuple(int(s) for s in shape), start, stop))
            start = stop
        return cls(layers, head)

    @property
    def dim(self) -> int:
        """Total number of parameters ``d``."""
        return self.layers[-1].stop if self.layers else 0

    @property
    def names(self) -> list[str]:
        """Layer names in vector order."""
        return [layer.name for layer in self.layers]

    def flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Concatenate named tensors into one float32 ``[d]`` vector in layout order."""
        return torch.cat([tensors[layer.name].detach().reshape(-1).float().cpu() for layer in self.layers])

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a ``[d]`` vector into ``{name: tensor}`` views with the layers' shapes."""
        if vector.shape != (self.dim,):
            raise ValueError(f"expected a parameter vector of shape ({self.dim},), got {tuple(vector.shape)}")
        return {layer.name: vector[layer.slice].view(layer.shape) for layer in self.layers}

    def head_mask(self) -> torch.Tensor:
        """Boolean ``[d]`` mask that is True on the head layers' entries."""
        mask = torch.zeros(self.dim, dtype=torch.bool)
        for layer in self.layers:
            if layer.name in self.head:
                mask[layer.slice] = True
        return mask

    def to_dict(self) -> dict:
        """A JSON-serialisable description (for checkpoints and run directories)."""
        return {"layers": [[layer.name, list(layer.shape)] for layer in self.layers], "head": list(self.head)}

    @classmethod
    def from_dict(cls, data: Mapping) -> ParamLayout:
        """Inverse of :meth:`to_dict`."""
        return cls.from_shapes({name: tuple(shape) for name, shape in data["layers"]}, data["head"])

    def __eq__(self, other: object) -> bool:
        """Equal to another :class:`ParamLayout` with the same layers and the same head, in the same order."""
        return isinstance(other, ParamLayout) and self.layers == other.layers and self.head == other.head

    def __repr__(self) -> str:
        """A short summary: the dimension ``d``, the number of layers and the head layers' names."""
        return f"ParamLayout(d={self.dim}, layers={len(self.layers)}, head={list(self.head)})"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
