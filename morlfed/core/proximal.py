"""A proximal term for any torch optimiser, without touching the training code that uses it.

FedProx (Li et al., 2020) minimises ``f(theta) + mu/2 ||theta - theta_centre||^2`` locally; the
gradient of the extra term is ``mu * (theta - theta_centre)``. :class:`ProximalOptimizer` wraps an
optimiser and adds that term to every parameter's ``.grad`` in ``step()`` before delegating, so an
SB3 agent's own ``train()`` (DQN: ``policy.optimizer``; DDPG: ``actor.optimizer`` and
``critic.optimizer``) runs unchanged. :func:`install_proximal` swaps the wrapper in for the length
of a ``with`` block and always puts the original optimiser object back.

The same wrapper with ``mu = lambda`` and centre ``w`` gives the pFedMe/Ditto regulariser
``lambda/2 ||theta - w||^2`` of a client's personal model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch


class ProximalOptimizer:
    """Wraps a torch optimiser and adds ``mu * (theta - centre)`` to each gradient in ``step()``.

    Everything else (``param_groups``, ``state``, ``zero_grad``, ``state_dict``, learning-rate
    updates) is the wrapped optimiser's, so code written for the original keeps working and the
    wrapped optimiser's state (e.g. Adam moments) is the one that evolves.

    A parameter without a gradient in a step (not reached by the loss) gets the proximal term
    alone as its gradient: the regularised objective still pulls it towards the centre.

    :param optimizer: the optimiser to wrap
    :param centres: the centre of every parameter the optimiser updates, keyed by the parameter
        object itself (same shape); parameters not in the optimiser are ignored
    :param mu: the proximal coefficient, ``>= 0`` and finite
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, centres: Mapping[torch.Tensor, torch.Tensor], mu: float
    ) -> None:
        if not (math.isfinite(mu) and mu >= 0):
            raise ValueError(f"proximal coefficient mu must be a finite number >= 0, got {mu}")
        by_id = {id(p): c for p, c in centres.items()}
        self.optimizer, self.mu = optimizer, float(mu)
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in by_id:
                    raise ValueError(
                        f"no proximal centre for a parameter of shape {tuple(p.shape)} that the wrapped "
                        "optimiser updates: give a centre for every optimised parameter"
                    )
                centre = by_id[id(p)]
                if centre.shape != p.shape:
                    raise ValueError(f"proximal centre has shape {tuple(centre.shape)}, its parameter {tuple(p.shape)}")
                self._pairs.append((p, centre.detach().to(dtype=p.dtype, device=p.device)))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimiser's parameter groups (SB3 sets learning rates through them)."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimiser's per-parameter state."""
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Delegate to the wrapped optimiser."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Add ``mu * (theta - centre)`` to every gradient, then step the wrapped optimiser."""
        with torch.no_grad():
            for p, centre in self._pairs:  # one tensor per layer
                term = (p - centre).mul_(self.mu)
                if p.grad is None:
                    p.grad = term
                else:
                    p.grad.add_(term)
        return self.optimizer.step(closure)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimiser's state dict (the wrapper itself has no state)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load into the wrapped optimiser."""
        self.optimizer.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        """Delegate any other attribute to the wrapped optimiser; ``AttributeError`` before it is set."""
        # Only reached for attributes not defined above: defaults, hooks, ... of the wrapped one.
        optimizer = self.__dict__.get("optimizer")
        if optimizer is None:  # during copy/unpickling, before __init__ ran
            raise AttributeError(name)
        return getattr(optimizer, name)


@contextlib.contextmanager
def install_proximal(
    owner: object, attribute: str, centres: Mapping[torch.Tensor, torch.Tensor], mu: float
) -> Iterator[ProximalOptimizer]:
    """Replace ``owner.<attribute>`` (an optimiser) by a :class:`ProximalOptimizer` inside the block.

    The original object is restored on exit, also when the block raises. Raises ``ValueError`` if
    the attribute already holds a :class:`ProximalOptimizer`.

    Example: ``with install_proximal(agent.policy, "optimizer", centres, mu): agent.learn(...)``.

    :param owner: the object holding the optimiser (an SB3 policy, actor or critic)
    :param attribute: the attribute name, usually ``"optimizer"``
    :param centres: ``{parameter: centre}``, see :class:`ProximalOptimizer`
    :param mu: the proximal coefficient
    """
    original = getattr(owner, attribute)
    if isinstance(original, ProximalOptimizer):
        raise ValueError(f"{type(owner).__name__}.{attribute} already has a proximal term installed")
    wrapper = ProximalOptimizer(original, centres, mu)
    setattr(owner, attribute, wrapper)
    try:
        yield wrapper
    finally:
        setattr(owner, attribute, original)
