"""Figures of campaigns (matplotlib; PNG and PDF).

The library behind ``python -m morlfed.analysis.plot`` and the notebooks.

Every ``*_figure`` function builds and returns a :class:`matplotlib.figure.Figure` through the
object-oriented API (no pyplot, no global backend switch: safe in scripts, servers and
notebooks, where ``display(fig)`` shows it); :func:`morlfed.metrics.figures.save_figure` writes it
atomically as PNG and/or PDF. One run's front is :func:`morlfed.metrics.figures.front_figure`.

* :func:`fronts_comparison_figure`: client returns against the front for several algorithms
  (a panel each, seeds as marker shapes; parallel coordinates from three objectives on).
* :func:`similarity_figure`: client-similarity heatmaps at chosen rounds, ordered by cluster
  (the FedPref paper's Figure 11).
* :func:`cluster_evolution_figure`: cluster membership per round, clients coloured by
  preference (the paper's Figure 12).
* learning curves: :mod:`morlfed.analysis.curves`.
* :func:`metric_bars_figure`: mean +- std over seeds of chosen metrics per algorithm.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from morlfed.metrics import METRICS
from morlfed.metrics.figures import (
    PREFERENCE_NORM,
    clients_panel,
    front_panel,
    non_dominated_mask,
    objective_names,
    preference_colorbar,
    returns_and_weights,
)

_SEED_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_CATEGORICAL_MAX = 10  # at most this many distinct preferences get categorical colours


# --------------------------------------------------------------------------- fronts


def fronts_comparison_figure(
    sets: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]],
    front: np.ndarray | None = None,
    objectives: Sequence[str] | None = None,
    title: str = "",
    front_label: str = "known front",
    seeds: Mapping[str, Sequence[int]] | None = None,
) -> Figure:
    """Several algorithms' client returns against one reference front, one panel per algorithm.

    ``sets`` maps an algorithm label to its runs, each ``(returns [n, m], weights [n, m])``
    (e.g. one per seed). Two objectives give one scatter panel per label, in a grid of up to three
    columns on shared axes, the non-dominated points (within the run) ringed in red as in
    :func:`morlfed.metrics.figures.front_figure`.
    Three or more give parallel coordinates (:func:`_parallel_panel`), two panels to a row, so that
    the figure stays readable at its default size however many objectives there are. Seeds are
    told apart by marker shape; colours are the clients' weights on the first objective.

    :param sets: algorithm label -> its runs' ``(returns, weights)``
    :param front: ``[k, m]`` reference-front points, or ``None``
    :param objectives: the objectives' names
    :param title: the figure's title
    :param front_label: legend entry of the front
    :param seeds: algorithm label -> its runs' seeds, in the order of ``sets``: a seed keeps its
        marker in every panel and the legends say ``seed 3`` (without them: ``run 1``, ``run 2``, ...
        by position)
    """
    if not sets:
        raise ValueError("fronts_comparison_figure needs at least one algorithm")
    if seeds is not None and any(len(seeds.get(label, ())) != len(runs) for label, runs in sets.items()):
        raise ValueError("seeds must give one seed per run of every algorithm in sets")
    checked = {label: [returns_and_weights(r, w) for r, w in runs] for label, runs in sets.items()}
    m = next(iter(checked.values()))[0][0].shape[1]
    names = objective_names(m, objectives)
    every_seed = sorted({s for runs in (seeds or {}).values() for s in runs})

    def run_marker(label: str, k: int) -> tuple[str, str]:
        shape = every_seed.index(seeds[label][k]) if seeds is not None else k
        return _SEED_MARKERS[
            shape % len(_SEED_MARKERS)
        ], f"seed {seeds[label][k]}" if seeds is not None else f"run {k + 1}"

    if m == 2:  # a grid of at most three columns, on shared axes
        cols = min(3, int(np.ceil(np.sqrt(len(checked)))))
        rows = -(-len(checked) // cols)
        fig = Figure(figsize=(4.6 * cols + 1.0, 3.6 * rows + 0.5), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
        for ax in list(axes.flat)[len(checked) :]:
            ax.set_visible(False)
        for ax, (label, runs) in zip(axes.flat, checked.items()):
            front_panel(ax, front, 0, 1, front_label)
            for k, (r, w) in enumerate(runs):
                marker, name = run_marker(label, k)
                nd_label = "non-dominated" if k == 0 else None
                clients_panel(ax, r, w, 0, 1, marker=marker, label=name, nd_label=nd_label)
            ax.set_title(_wrapped(label, 60), fontsize=10)
            ax.set_xlabel(names[0])
            ax.set_ylabel(names[1])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes = axes.flat[: len(checked)]
    else:
        cols = min(2, len(checked))
        rows = -(-len(checked) // cols)
        fig = Figure(figsize=(5.4 * cols + 1.2, 3.9 * rows + 0.5), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False)
        points = [r for runs in checked.values() for r, _ in runs] + ([np.asarray(front)] if front is not None else [])
        lo, hi = np.min([p.min(0) for p in points], axis=0), np.max([p.max(0) for p in points], axis=0)
        for ax, (label, runs) in zip(axes.flat, checked.items()):
            _parallel_panel(
                ax, runs, front, names, (lo, hi), [run_marker(label, k) for k in range(len(runs))], front_label
            )
            ax.set_title(_wrapped(label, 50), fontsize=10)
        for ax in list(axes.flat)[len(checked) :]:
            ax.set_visible(False)
        axes = axes.flat[: len(checked)]
    preference_colorbar(fig, axes, names[0])
    if title:
        fig.suptitle(_wrapped(title, 90))
    return fig


def _wrapped(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (titles of narrow panels)."""
    return textwrap.fill(text, width, break_long_words=False)


def _parallel_panel(
    ax: Axes,
    runs: Sequence[tuple[np.ndarray, np.ndarray]],
    front: np.ndarray | None,
    names: Sequence[str],
    bounds: tuple[np.ndarray, np.ndarray],
    markers: Sequence[tuple[str, str]],
    front_label: str,
) -> None:
    """Parallel coordinates of one algorithm's runs.

    An x position per objective, each client a line through its returns scaled to ``bounds`` (0: the
    lowest shown, 1: the highest, the same in every panel; each tick says its objective's range),
    coloured by its weight on the first objective, solid when no client of its run dominates it and
    dotted otherwise; ``front`` in grey.

    :param ax: the panel
    :param runs: the algorithm's runs, ``(returns [n, m], weights [n, m])`` each
    :param front: ``[k, m]`` reference-front points, or ``None``
    :param names: the objectives' names
    :param bounds: the lowest and highest return of each objective over every panel
    :param markers: each run's marker shape and legend entry
    :param front_label: legend entry of the front
    """
    lo, hi = bounds
    span = np.where(hi > lo, hi - lo, 1.0)
    x = np.arange(len(names))
    if front is not None:
        for k, point in enumerate((np.asarray(front, dtype=float) - lo) / span):
            ax.plot(x, point, color="grey", lw=0.8, alpha=0.5, zorder=1, label=front_label if k == 0 else None)
    viridis = colormaps["viridis"]
    for (returns, weights), (marker, name) in zip(runs, markers):
        nd = non_dominated_mask(returns)
        for i, (point, weight) in enumerate(zip((returns - lo) / span, weights)):
            ax.plot(
                x,
                point,
                color=viridis(PREFERENCE_NORM(float(weight[0]))),
                ls="-" if nd[i] else ":",
                lw=1.2,
                marker=marker,
                ms=4,
                zorder=2,
                label=name if i == 0 else None,
            )
    ticks = [f"{_wrapped(n.replace('_', ' '), 12)}\n{lo[k]:.3g} .. {hi[k]:.3g}" for k, n in enumerate(names)]
    ax.set_xticks(x, ticks, fontsize=7)
    ax.set_xlim(-0.2, len(names) - 0.8)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("return, scaled to its range", fontsize=8)
    ax.grid(axis="x", alpha=0.5)
    handles, labels = ax.get_legend_handles_labels()
    dotted = Line2D([], [], color="black", ls=":", lw=1.2)
    ax.legend([*handles, dotted], [*labels, "dominated in its run"], fontsize=7, loc="lower left")


# --------------------------------------------------------------------------- clusters


def preference_groups(weights: np.ndarray, decimals: int = 9) -> np.ndarray:
    """Group id of each client's preference.

    Clients whose weights agree to ``decimals`` decimals share an id; ids follow the lexicographic
    order of the distinct weight vectors.

    :param weights: ``[n_clients, m]`` preferences
    :param decimals: decimals two preferences must agree to
    """
    w = np.atleast_2d(np.asarray(weights, dtype=float))
    _, groups = np.unique(np.round(w, decimals), axis=0, return_inverse=True)
    return groups.reshape(-1)


def cluster_order(clusters: Sequence[Sequence[int]], weights: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """A client order that keeps each cluster contiguous, for heatmaps and cluster plots.

    Within a cluster, clients are sorted by preference (lexicographic weights, then id); clusters
    are sorted by the position of their first such client, so clients with equal preferences sit
    together (as in the FedPref paper's Figure 11). Clients missing from ``clusters`` come last,
    as singletons. Returns ``(order, sizes)``: the permutation of client ids and the cluster sizes
    along it.

    :param clusters: lists of client ids
    :param weights: ``[n_clients, m]`` preferences
    """
    w = np.atleast_2d(np.asarray(weights, dtype=float))
    n = len(w)
    rank = np.empty(n, dtype=int)
    rank[np.lexsort((np.arange(n), *w.T[::-1]))] = np.arange(n)
    flat = [int(c) for cl in clusters for c in cl]
    if any(not 0 <= c < n for c in flat) or len(set(flat)) != len(flat):
        raise ValueError(f"clusters must hold distinct client ids in 0..{n - 1}; got {[list(c) for c in clusters]}")
    members = [sorted((int(c) for c in cl), key=lambda c: rank[c]) for cl in clusters if len(cl)]
    members += [[c] for c in sorted(set(range(n)) - set(flat), key=lambda c: rank[c])]
    members.sort(key=lambda cl: rank[cl[0]])
    return np.array([c for cl in members for c in cl], dtype=int), [len(cl) for cl in members]


def similarity_figure(
    matrices: Mapping[int, np.ndarray],
    clusters: Mapping[int, Sequence[Sequence[int]]],
    weights: np.ndarray,
    title: str = "",
) -> Figure:
    """Client-similarity heatmaps, one per round of ``matrices`` (``{round: [n, n]}``).

    Rows and columns are ordered by :func:`cluster_order` of ``clusters[round]`` (the clusters in
    force after that round); black lines separate clusters; NaN entries (pairs the strategy did
    not compare, e.g. across clusters) are white. Colour scale [-1, 1] (cosine-type similarity).

    :param matrices: round -> ``[n, n]`` client similarity
    :param clusters: round -> the clusters (lists of client ids) in force after it
    :param weights: ``[n_clients, m]`` preferences
    :param title: the figure's title
    """
    if not matrices:
        raise ValueError("similarity_figure needs at least one round")
    n = len(np.atleast_2d(weights))
    rounds = sorted(matrices)
    fig = Figure(figsize=(3.8 * len(rounds) + 1.2, 3.9), layout="constrained")
    axes = fig.subplots(1, len(rounds), squeeze=False)[0]
    cmap = colormaps["viridis"].with_extremes(bad="white")
    image = None
    for ax, rnd in zip(axes, rounds):
        sim = np.asarray(matrices[rnd], dtype=float)
        if sim.shape != (n, n):
            raise ValueError(f"round {rnd}: similarity matrix has shape {sim.shape}, expected ({n}, {n})")
        order, sizes = cluster_order(clusters.get(rnd, [list(range(n))]), weights)
        image = ax.imshow(np.ma.masked_invalid(sim[np.ix_(order, order)]), cmap=cmap, vmin=-1, vmax=1)
        for edge in np.cumsum(sizes)[:-1]:
            ax.axhline(edge - 0.5, color="black", lw=1.2)
            ax.axvline(edge - 0.5, color="black", lw=1.2)
        if n <= 40:
            ax.set_xticks(range(n), [str(c) for c in order], fontsize=7)
            ax.set_yticks(range(n), [str(c) for c in order], fontsize=7)
        ax.set_title(f"round {rnd} ({len(sizes)} cluster{'s' if len(sizes) != 1 else ''})", fontsize=10)
    assert image is not None, "matrices has at least one round (checked above)"
    fig.colorbar(image, ax=list(axes), label="client similarity (white: not computed)", shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig


def _client_colours(weights: np.ndarray) -> tuple[list, list[Rectangle] | None]:
    """A colour per client, and the legend's entries when the colours are categorical.

    Categorical by preference group when there are few distinct preferences (an entry per group,
    its weights), else by the weight on the first objective (``None``: a colour bar says it).
    """
    groups = preference_groups(weights)
    if groups.max() < _CATEGORICAL_MAX:
        tab = colormaps["tab10"]
        firsts = [int(np.flatnonzero(groups == g)[0]) for g in range(int(groups.max()) + 1)]
        entries = [
            Rectangle((0, 0), 1, 1, facecolor=tab(g), label=f"({', '.join(f'{v:.2f}' for v in weights[c])})")
            for g, c in enumerate(firsts)
        ]
        return [tab(int(g)) for g in groups], entries
    vir = colormaps["viridis"]
    return [vir(PREFERENCE_NORM(float(x))) for x in np.atleast_2d(weights)[:, 0]], None


def cluster_evolution_figure(
    history: Mapping[int, Sequence[Sequence[int]]],
    weights: np.ndarray,
    title: str = "",
    objectives: Sequence[str] | None = None,
) -> Figure:
    """Cluster membership over rounds (``{round: clusters}``), like the FedPref paper's Figure 12.

    One column per round; each client is a box coloured by its preference (clients with equal
    weights share a colour); the boxes of one cluster form a connected, outlined bar, clusters
    are separated by gaps. Clients are ordered by :func:`cluster_order` of the final clustering,
    so splits read from left to right.

    :param history: round -> the clusters (lists of client ids) in force after it
    :param weights: ``[n_clients, m]`` preferences
    :param title: the figure's title
    :param objectives: the objectives' names, as the env spec names them (default: ``objective k``);
        the legend of the preference groups, or the colour bar of the weight on the first, names them
    """
    if not history:
        raise ValueError("cluster_evolution_figure needs at least one round")
    w = np.atleast_2d(np.asarray(weights, dtype=float))
    n = len(w)
    rounds = sorted(history)
    final_order, _ = cluster_order(history[rounds[-1]], w)
    rank = np.empty(n, dtype=int)
    rank[final_order] = np.arange(n)
    colours, entries = _client_colours(w)
    names = objective_names(w.shape[1], objectives)
    gap = 0.6
    fig = Figure(figsize=(max(4.0, 0.55 * len(rounds) + 2), max(3.0, 0.28 * n + 1.5)), layout="constrained")
    ax = fig.subplots()
    height = 0.0
    for x, rnd in enumerate(rounds):
        order, sizes = cluster_order(history[rnd], rank[:, None].astype(float))  # by final position
        y, start = 0.0, 0
        for size in sizes:
            for k, cid in enumerate(order[start : start + size]):
                ax.add_patch(Rectangle((x - 0.35, y + k), 0.7, 0.9, facecolor=colours[cid], edgecolor="white", lw=0.5))
                if n <= 30:
                    ax.text(x, y + k + 0.45, str(cid), ha="center", va="center", fontsize=6)
            ax.add_patch(Rectangle((x - 0.4, y - 0.05), 0.8, size, fill=False, edgecolor="black", lw=1.0))
            y, start = y + size + gap, start + size
        height = max(height, y - gap)
    ax.set_xlim(-0.6, len(rounds) - 0.4)
    ax.set_ylim(height + 0.2, -0.3)
    ax.set_xticks(range(len(rounds)), [str(r) for r in rounds], fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("round")
    ax.set_title("clusters per round (a bar is a cluster; colour: the client's preference)", fontsize=9)
    if entries is None:
        preference_colorbar(fig, np.array([ax]), names[0])
    else:
        ax.legend(
            handles=entries,
            title=f"weights ({', '.join(names)})",
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=7,
            title_fontsize=7,
        )
    if title:
        fig.suptitle(title)
    return fig


def metric_bars_figure(summary: pd.DataFrame, metrics: Sequence[str], title: str = "") -> Figure:
    """Bars of mean +- std over seeds per algorithm ``variant``, one panel per metric.

    ``summary`` holds the ``summary.csv`` rows of one environment and preference distribution; each
    panel has its metric's direction in the title.

    :param summary: ``summary.csv`` rows
    :param metrics: keys of :data:`morlfed.metrics.METRICS`
    :param title: the figure's title
    """
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise ValueError(f"metrics must be a non-empty list of {', '.join(METRICS)}; got {list(metrics)}")
    fig = Figure(figsize=(3.2 * len(metrics), 3.6), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        values = summary.assign(value=pd.to_numeric(summary[metric], errors="coerce"))
        stats = values.groupby("variant", sort=True)["value"].agg(["mean", "std"])
        ax.bar(
            range(len(stats)),
            stats["mean"],
            yerr=stats["std"].fillna(0.0),
            capsize=3,
            color=[colormaps["tab10"](k % 10) for k in range(len(stats))],
        )
        ax.set_xticks(range(len(stats)), stats.index, rotation=30, ha="right", fontsize=8)
        info = METRICS[metric]
        ax.set_title(f"{info.title} ({'↑' if info.higher_is_better else '↓'})", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig
