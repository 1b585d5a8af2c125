"""Classifiers of the vision path, each a ``body`` (feature extractor) and a ``head`` (classifying layer).

The head is the last, classifying linear layer.

* ``mlp``: flatten, then ``Linear -> ReLU`` per hidden width, then the linear head; the default
  for ``digits``.
* ``cnn``: the 4-layer CNN of the FedAvg paper (McMahan et al., 2017) that FedFew and FedMHC use:
  two 5x5 convolutions (32 and 64 channels, "same" padding), each followed by ReLU and 2x2 max
  pooling, a fully connected layer of 512 units with ReLU, and the linear head. "Same" padding
  (the FedAvg paper's TensorFlow model) keeps the 8x8 digits usable: the feature map is
  ``H//4 x W//4`` (PFLlib's variant pads nothing, which needs images of at least 16x16).

The federated parameter vector holds every parameter in ``named_parameters`` order; the layout's
head is the ``head.*`` layers (FedMHC clusters those). Parameters are initialised as PyTorch's
defaults (Kaiming-uniform weights, uniform biases) but drawn from a given torch generator, never
the global RNG: every client builds the same initial model from the run's seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from morlfed.core.params import ParamLayout

#: Names ``model=`` accepts.
MODELS: tuple[str, ...] = ("mlp", "cnn")


class MLP(nn.Module):
    """A multi-layer perceptron classifier.

    :param input_shape: ``(C, H, W)`` of one image (flattened on input)
    :param n_classes: number of classes (the head's outputs)
    :param hidden: widths of the hidden layers (the body); empty gives a linear classifier
        whose body is only the flattening
    """

    def __init__(self, input_shape: Sequence[int], n_classes: int, hidden: Sequence[int] = (64,)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits ``[B, n_classes]`` of images ``[B, C, H, W]``."""
        return self.head(self.body(x))


class CNN(nn.Module):
    """The FedAvg paper's 4-layer CNN.

    :param input_shape: ``(C, H, W)``; H and W must be at least 4
    :param n_classes: number of classes
    :param channels: output channels of the two convolutions
    :param hidden: units of the fully connected layer before the head
    """

    def __init__(
        self, input_shape: Sequence[int], n_classes: int, channels: Sequence[int] = (32, 64), hidden: int = 512
    ) -> None:
        super().__init__()
        c, h, w = input_shape
        c1, c2 = channels
        self.body = nn.Sequential(
            nn.Conv2d(c, c1, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * (h // 4) * (w // 4), hidden),
            nn.ReLU(),
        )
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits ``[B, n_classes]`` of images ``[B, C, H, W]``."""
        return self.head(self.body(x))


def build_model(
    name: str, input_shape: Sequence[int], n_classes: int, generator: torch.Generator, **options: Any
) -> nn.Module:
    """A freshly initialised classifier.

    :param name: one of :data:`MODELS`
    :param input_shape: ``(C, H, W)`` of the dataset's images
    :param n_classes: number of classes
    :param generator: draws the initial parameters
    :param options: the model's hyper-parameters: ``hidden`` (mlp: list of widths; cnn: one width),
        ``channels`` (cnn: two convolution widths)
    :raises ValueError: unknown name or option, or a value that cannot work
    """
    cls: type[MLP | CNN]
    kwargs: dict[str, Any]
    if name == "mlp":
        _check_options(name, options, {"hidden"})
        hidden = options.get("hidden", [64])
        if not isinstance(hidden, (list, tuple)) or not all(_positive_int(h) for h in hidden):
            raise ValueError(f"model mlp: hidden must be a list of positive integer widths, got {hidden!r}")
        cls, kwargs = MLP, {"hidden": list(hidden)}
    elif name == "cnn":
        _check_options(name, options, {"channels", "hidden"})
        channels, hidden = options.get("channels", [32, 64]), options.get("hidden", 512)
        if not isinstance(channels, (list, tuple)) or len(channels) != 2 or not all(_positive_int(c) for c in channels):
            raise ValueError(f"model cnn: channels must be two positive integers, got {channels!r}")
        if not _positive_int(hidden):
            raise ValueError(f"model cnn: hidden must be a positive integer, got {hidden!r}")
        if min(input_shape[1:]) < 4:
            raise ValueError(f"model cnn needs images of at least 4x4 pixels, got {tuple(input_shape)}")
        cls, kwargs = CNN, {"channels": list(channels), "hidden": hidden}
    else:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    with torch.device("meta"):  # no parameter drawn from the global RNG
        model = cls(tuple(input_shape), n_classes, **kwargs)
    model = model.to_empty(device="cpu")
    init_parameters(model, generator)
    return model


def init_parameters(model: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialisation of every linear and convolution layer, drawn from ``generator``.

    Weights are Kaiming-uniform with ``a = sqrt(5)``, biases uniform in ``+-1/sqrt(fan_in)``.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
                if module.bias is not None:
                    bound = 1.0 / math.sqrt(module.weight[0].numel())
                    nn.init.uniform_(module.bias, -bound, bound, generator=generator)


def model_layout(model: nn.Module) -> ParamLayout:
    """The layout of ``model``'s parameters; the ``head.*`` layers form the head."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    return ParamLayout.from_shapes(shapes, [name for name in shapes if name.startswith("head.")])


def _check_options(name: str, options: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"model {name}: unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
