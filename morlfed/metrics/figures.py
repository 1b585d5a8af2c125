"""The figure of a run directory (``front.png``) and the pieces campaign figures reuse.

Figures are built through matplotlib's object-oriented API (no pyplot, no global backend switch:
safe in scripts, servers and notebooks, where ``display(fig)`` shows it); :func:`save_figure`
writes one atomically as PNG, PDF and/or SVG (rendered by matplotlib's Agg, PDF and SVG canvases).

* :func:`front_figure` / :func:`plot_front`: one run's client returns against the known or
  campaign front, coloured by preference, non-dominated ones ringed; two objectives give one
  panel, three or more a pairwise grid.
* :func:`front_panel`, :func:`clients_panel`, :func:`preference_colorbar`: the panels it is made
  of, for figures of several runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from morlfed.metrics import non_dominated

#: Formats :func:`save_figure` writes by default.
FORMATS: tuple[str, ...] = ("png", "pdf")
#: Colour scale of a client's weight on the first objective.
PREFERENCE_NORM = Normalize(0.0, 1.0)


# --------------------------------------------------------------------------- saving


def _save_one(fig: Figure, path: Path, dpi: int) -> None:
    """Write ``fig`` to ``path`` (format from the suffix) through a temp file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_figure(fig: Figure, stem: str | Path, formats: Sequence[str] = FORMATS, dpi: int = 110) -> list[Path]:
    """Write ``fig`` as ``<stem>.<format>`` for each of ``formats``; return the paths written.

    :param fig: the figure
    :param stem: the path without suffix
    :param formats: a non-empty subset of ``png``, ``pdf``, ``svg``
    :param dpi: resolution of raster formats
    """
    allowed = ("png", "pdf", "svg")
    bad = [f for f in formats if f not in allowed]
    if bad or not formats:
        raise ValueError(f"formats must be a non-empty subset of {', '.join(allowed)}; got {list(formats)}")
    stem = Path(stem)
    paths = [stem.with_name(f"{stem.name}.{fmt}") for fmt in formats]
    for path in paths:
        _save_one(fig, path, dpi)
    return paths


# --------------------------------------------------------------------------- panels


def objective_names(m: int, objectives: Sequence[str] | None) -> list[str]:
    """Axis names of ``m`` objectives: ``objectives``, or ``objective 0 .. m-1``.

    :param m: number of objectives
    :param objectives: their names, if known (must be ``m`` of them)
    """
    names = list(objectives) if objectives is not None else [f"objective {k}" for k in range(m)]
    if len(names) != m:
        raise ValueError(f"objectives names {names} do not match the {m} objectives of the returns")
    return names


def returns_and_weights(returns: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``returns`` and ``weights`` as float arrays ``[n_clients, m]`` of one shape, ``m >= 2``.

    :param returns: the clients' vector returns
    :param weights: the clients' preferences
    """
    r = np.atleast_2d(np.asarray(returns, dtype=float))
    w = np.atleast_2d(np.asarray(weights, dtype=float))
    if r.shape != w.shape or r.shape[1] < 2:
        raise ValueError(f"returns and weights must both be [n_clients, m] with m >= 2; got {r.shape} and {w.shape}")
    return r, w


def objective_pairs(m: int) -> list[tuple[int, int]]:
    """The pairs ``(i, j)``, ``i < j``, of ``m`` objectives: one panel each.

    :param m: number of objectives
    """
    return [(i, j) for i in range(m) for j in range(i + 1, m)]


def non_dominated_mask(returns: np.ndarray) -> np.ndarray:
    """Which rows of ``returns`` (``[n, m]``, maximised) no other row dominates.

    :param returns: the clients' vector returns
    """
    nd = non_dominated(returns)
    return np.array([np.any(np.all(np.isclose(r, nd), axis=1)) for r in returns])


def front_panel(ax: Axes, front: np.ndarray | None, i: int, j: int, front_label: str) -> None:
    """Draw ``front`` (if any) in grey on objectives ``i`` and ``j`` of ``ax``.

    :param ax: the panel
    :param front: ``[k, m]`` reference-front points, or ``None``
    :param i: objective on the x axis
    :param j: objective on the y axis
    :param front_label: its legend entry (``known front``, ``campaign front``)
    """
    if front is None:
        return
    f = np.asarray(front, dtype=float)
    if f.shape[1] == 2:  # a 2-D front is a staircase of points: connect them in order
        order = np.argsort(f[:, i])
        ax.plot(f[order, i], f[order, j], "x--", color="grey", label=front_label, zorder=1)
    else:  # projections of a higher-dimensional front are not curves
        ax.scatter(f[:, i], f[:, j], marker="x", color="grey", label=front_label, zorder=1)


def clients_panel(
    ax: Axes,
    returns: np.ndarray,
    weights: np.ndarray,
    i: int,
    j: int,
    marker: str = "o",
    label: str = "clients",
    nd_label: str | None = "non-dominated",
) -> None:
    """Scatter the clients' returns on objectives ``i`` and ``j`` of ``ax``, non-dominated ones ringed in red.

    The points are coloured by the clients' weight on the first objective.

    :param ax: the panel
    :param returns: ``[n_clients, m]`` vector returns
    :param weights: ``[n_clients, m]`` preferences
    :param i: objective on the x axis
    :param j: objective on the y axis
    :param marker: marker shape
    :param label: legend entry of the points
    :param nd_label: legend entry of the rings (``None``: none)
    """
    ax.scatter(
        returns[:, i],
        returns[:, j],
        c=weights[:, 0],
        cmap="viridis",
        norm=PREFERENCE_NORM,
        marker=marker,
        zorder=2,
        label=label,
        edgecolors="black",
        linewidths=0.3,
    )
    nd = non_dominated_mask(returns)
    ax.scatter(returns[nd, i], returns[nd, j], s=140, facecolors="none", edgecolors="red", zorder=3, label=nd_label)


def preference_colorbar(fig: Figure, axes: np.ndarray, first_objective: str) -> None:
    """The colour bar of the clients' weight on the first objective, beside ``axes``.

    :param fig: the figure
    :param axes: the panels it applies to
    :param first_objective: the first objective's name
    """
    fig.colorbar(
        ScalarMappable(norm=PREFERENCE_NORM, cmap=colormaps["viridis"]),
        ax=list(np.ravel(axes)),
        label=f"client's weight on {first_objective}",
    )


# --------------------------------------------------------------------------- a run's front


def front_figure(
    returns: np.ndarray,
    weights: np.ndarray,
    front: np.ndarray | None = None,
    objectives: Sequence[str] | None = None,
    title: str = "",
    front_label: str = "known front",
) -> Figure:
    """One run's client returns (rows of ``returns``, maximised) against ``front``.

    Points are coloured by the client's weight on the first objective, non-dominated ones are
    ringed in red, ``front`` (known or campaign: say which in ``front_label``) is drawn in grey.
    Two objectives give one panel; ``m`` objectives a grid of the ``m (m - 1) / 2`` pairs.

    :param returns: ``[n_clients, m]`` vector returns
    :param weights: ``[n_clients, m]`` preferences
    :param front: ``[k, m]`` reference-front points, or ``None``
    :param objectives: the objectives' names
    :param title: the figure's title
    :param front_label: legend entry of the front
    """
    r, w = returns_and_weights(returns, weights)
    m = r.shape[1]
    names = objective_names(m, objectives)
    pairs = objective_pairs(m)
    cols = min(3, len(pairs))
    rows = int(np.ceil(len(pairs) / cols))
    fig = Figure(figsize=(4.5 * cols + 1, 4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (i, j) in zip(axes.flat, pairs):
        front_panel(ax, front, i, j, front_label)
        clients_panel(ax, r, w, i, j)
        ax.set_xlabel(names[i])
        ax.set_ylabel(names[j])
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(pairs) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    preference_colorbar(fig, axes, names[0])
    if title:
        fig.suptitle(title)
    return fig


def plot_front(
    returns: np.ndarray,
    weights: np.ndarray,
    front: np.ndarray | None,
    path: Path,
    objectives: Sequence[str] | None = None,
    title: str = "",
) -> None:
    """:func:`front_figure` written to ``path`` (PNG; a ``.pdf`` suffix gives PDF).

    :param returns: ``[n_clients, m]`` vector returns
    :param weights: ``[n_clients, m]`` preferences
    :param front: ``[k, m]`` known-front points, or ``None``
    :param path: the file to write
    :param objectives: the objectives' names
    :param title: the figure's title
    """
    _save_one(front_figure(returns, weights, front, objectives, title), Path(path), dpi=110)
