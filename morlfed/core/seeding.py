"""One root seed, one independent stream per purpose, client and round.

Every random draw in morlfed comes from a generator derived from ``(root_seed, purpose, *keys)``
through :class:`numpy.random.SeedSequence`, so results do not depend on the order in which
clients run, nor on the executor running them. Third-party code that draws from global RNGs
(SB3's exploration and replay sampling, torch's weight initialisation, minecart) is reseeded from
such a derived seed right before it runs.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def derive_seed(root: int, purpose: str, *keys: int) -> int:
    """A 32-bit seed for ``purpose`` (e.g. ``"fit"``) and integer keys (e.g. client, round)."""
    tag = zlib.crc32(purpose.encode())
    seq = np.random.SeedSequence([int(root), tag, *(int(k) for k in keys)])
    return int(seq.generate_state(1, dtype=np.uint32)[0])


def generator(root: int, purpose: str, *keys: int) -> np.random.Generator:
    """A numpy generator for ``purpose`` and keys."""
    return np.random.default_rng(derive_seed(root, purpose, *keys))


def torch_generator(root: int, purpose: str, *keys: int) -> torch.Generator:
    """A torch CPU generator for ``purpose`` and keys."""
    return torch.Generator().manual_seed(derive_seed(root, purpose, *keys))
