"""Learning curves of campaigns: one line per variant over rounds or env steps, a labelled band per line.

The figure behind ``learning_*`` and ``evaluation_*`` of ``python -m morlfed.analysis.plot``, and
:meth:`morlfed.api.ExperimentResult.plot_learning`; the table it draws is
:func:`morlfed.analysis.campaign_figures.learning_curves`.
"""

from __future__ import annotations

import textwrap

import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

#: the x axes of learning curves: a column of the curves' table -> its axis label
CURVE_AXES: dict[str, str] = {"round": "round", "env_steps": "training env steps per client (budgeted)"}
_STYLES, _MARKERS = ("-", "--", ":", "-."), ("o", "s", "^", "D", "v", "P")


def learning_curves_figure(
    curves: pd.DataFrame, title: str = "", ylabel: str = "mean scalarised training reward", x: str = "round"
) -> Figure:
    """Learning curves: one line per label, the mean over seeds at each point, a +- std band where there are seeds to spread.

    ``curves`` has columns ``label, seed, round, value`` (one row per run and round), and
    ``env_steps`` for ``x="env_steps"``. Up to three labels share one panel, each with its own
    colour, line style and marker, its band outlined in them. More labels get a panel each (small
    multiples on shared axes), every other label's mean drawn faintly behind for reference.

    :param curves: the long table of values per run and round
    :param title: the figure's title
    :param ylabel: the y-axis label
    :param x: the x axis, a key of :data:`CURVE_AXES`
    """
    missing = {"label", "seed", "round", "value", x} - set(curves.columns)
    if missing or x not in CURVE_AXES:
        raise ValueError(f"curves needs columns label, seed, round, value and {x}; missing {sorted(missing)}")
    if curves.empty:
        raise ValueError("curves is empty")
    stats = curves.groupby(["label", x])["value"].agg(["mean", "std", "count"]).reset_index()
    labels = sorted(stats["label"].unique())
    cols = 1 if len(labels) <= 3 else min(3, len(labels))
    rows = 1 if len(labels) <= 3 else -(-len(labels) // cols)
    fig = Figure(figsize=(6.5, 4) if cols == 1 else (4.2 * cols, 3.2 * rows + 0.4), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).flat
    for k, label in enumerate(labels):
        part, ax = stats[stats["label"] == label], axes[0 if cols == 1 else k]
        colour, style, marker = colormaps["tab10"](k % 10), _STYLES[k % 4], _MARKERS[k % 6]
        n_seeds = curves.loc[curves["label"] == label, "seed"].nunique()
        name = f"{label} ({n_seeds} seed{'s' if n_seeds != 1 else ''})"
        for rest in (stats[stats["label"] == o] for o in labels if cols > 1 and o != label):  # the others, faintly
            ax.plot(rest[x], rest["mean"], color="0.8", lw=0.8, zorder=1)
        if cols > 1:
            ax.set_title(textwrap.fill(name, 45, break_long_words=False), fontsize=9)
        ax.plot(part[x], part["mean"], ls=style, marker=marker, ms=3, color=colour, label=name, zorder=3)
        band = part[part["count"] > 1]
        if len(band):
            low, high = band["mean"] - band["std"], band["mean"] + band["std"]
            ax.fill_between(band[x], low, high, facecolor=colour, edgecolor=colour, ls=style, alpha=0.15, lw=1)
    for k, ax in enumerate(axes):
        ax.set_visible(k < (1 if cols == 1 else len(labels)))
        ax.set_xlabel(CURVE_AXES[x])
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if x == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if cols == 1:
        axes[0].legend(fontsize=8, title="mean, +- std over seeds", title_fontsize=7)
    if title:
        fig.suptitle(textwrap.fill(title, 90, break_long_words=False), fontsize=10)
    return fig
