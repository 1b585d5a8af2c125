"""The Das-Dennis lattice on the probability simplex, built by this project's own code.

The lattice of ``p`` partitions on the ``m``-simplex is every point whose coordinates are
multiples of ``1/p`` (Das and Dennis, 1998): integer compositions of ``p``, divided by ``p``. No
random numbers and no third-party construction, so the points are the same with every version of
numpy or pymoo: the expected utility's weights (:func:`morlfed.metrics.equally_spaced_weights`)
and the lattice of the ``equidistant`` preferences (:func:`morlfed.tasks.rl.preferences.equidistant`)
depend on nothing else.
"""

from __future__ import annotations

import math

import numpy as np


def das_dennis(m: int, p: int) -> np.ndarray:
    """The Das-Dennis lattice of ``p`` partitions on the ``m``-simplex, ``[C(p + m - 1, m - 1), m]``.

    ``float64``, rows sum to 1, in pymoo's ``das-dennis`` order (the first coordinate ascending,
    then the second, ...) and with its values (each coordinate ``k / p``).

    :param m: number of objectives (>= 2)
    :param p: number of partitions (>= 1)
    """
    if m < 2 or p < 1:
        raise ValueError(f"das_dennis needs m >= 2 and p >= 1, got m={m}, p={p}")
    rows: list[list[int]] = []

    def split(prefix: list[int], left: int) -> None:
        if len(prefix) == m - 1:
            rows.append([*prefix, left])
            return
        for part in range(left + 1):
            split([*prefix, part], left - part)

    split([], p)
    return np.array(rows, dtype=np.float64) / p


def lattice_size(m: int, p: int) -> int:
    """The number of points of the Das-Dennis lattice of ``p`` partitions on the ``m``-simplex.

    :param m: number of objectives (>= 2)
    :param p: number of partitions (>= 0)
    """
    return math.comb(p + m - 1, m - 1)


def das_dennis_partitions(n: int, m: int) -> int | None:
    """``p`` whose lattice on the ``m``-simplex has exactly ``n`` points, else ``None``.

    :param n: number of points (>= 1)
    :param m: number of objectives (>= 2)
    """
    p = fewest_partitions(n, m)
    return p if lattice_size(m, p) == n else None


def fewest_partitions(n: int, m: int) -> int:
    """The fewest partitions whose lattice on the ``m``-simplex has at least ``n`` points.

    :param n: number of points (>= 1)
    :param m: number of objectives (>= 2)
    """
    p = 0
    while lattice_size(m, p) < n:
        p += 1
    return p
