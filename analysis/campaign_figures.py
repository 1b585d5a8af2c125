"""Every figure of a campaign written to a folder: the library behind ``python -m morlfed.analysis.plot``.

:func:`write_figures` draws, for a set of loaded runs (:mod:`morlfed.analysis.charts`, :mod:`morlfed.analysis.curves`,
:func:`morlfed.metrics.figures.front_figure`), each run's front, similarity heatmaps and cluster evolution,
and per environment and preference distribution the fronts of all algorithms and the learning
curves (:func:`learning_curves`; with planted preference groups, ``agreement``: the adjusted Rand
index of the clusters with the groups after each round, and ``separability``: that of the saved
similarity matrix clustered into as many groups, :func:`~morlfed.analysis.clustering.similarity_ari_by_round`); :func:`default_rounds` picks the heatmaps' rounds. For an
unfinished run (:mod:`morlfed.analysis.partial`) it draws what the run already has
(:func:`partial_figures`): its learning curves and cluster evolution.

A figure of one run is named and titled by environment, variant (the settings that set it apart,
as the command line writes them: ``fedpref_engine=vectorised``), preference distribution and seed
(:func:`run_stem`, :func:`run_title`); where two runs, finished or partial, would share a name, each
gets its run directory's name (or a short hash of its path) as well (:func:`unique_stems`), so
that no figure overwrites another.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from morlfed.analysis.campaign import reference_fronts, returns_gamma
from morlfed.analysis.charts import (
    cluster_evolution_figure,
    fronts_comparison_figure,
    similarity_figure,
)
from morlfed.analysis.clustering import planted_ari_by_round, similarity_ari_by_round
from morlfed.analysis.curves import learning_curves_figure
from morlfed.analysis.partial import PartialRun
from morlfed.analysis.runs import Run
from morlfed.analysis.variants import variant_labels
from morlfed.metrics import ReferencePointWarning, hypervolume
from morlfed.metrics.figures import FORMATS, front_figure, save_figure


def _safe(name: str) -> str:
    """``name`` as a file-name part: ``fedpref (algo.top_r=0.5, rounds=2)`` -> ``fedpref_algo.top_r=0.5,rounds=2``."""
    return re.sub(r"[^A-Za-z0-9_.+=,-]+", "_", name.replace(", ", ",")).strip("_")


def default_rounds(available: Sequence[int], k: int = 3) -> list[int]:
    """Up to ``k`` rounds spread over ``available``.

    First, middle and last for ``k = 3``; the last for ``k = 1``.

    :param available: the rounds saved
    :param k: the number of rounds wanted
    """
    if k < 1:
        raise ValueError(f"k (number of rounds) must be >= 1, got {k}")
    rounds = sorted(available)
    if len(rounds) <= k:
        return rounds
    if k == 1:
        return rounds[-1:]
    picks = [rounds[round(i * (len(rounds) - 1) / (k - 1))] for i in range(k)]
    return sorted(set(picks))


#: Learning-curve figures: ``rounds.csv`` column (or ``hypervolume``: of ``evaluations.csv``'s
#: discounted returns, for runs with ``eval_every``) -> (file name prefix, y-axis label).
CURVES: dict[str, tuple[str, str]] = {
    "mean_train_reward": ("learning", "mean scalarised training reward"),
    "mean_eval_scalarised": ("evaluation", "mean scalarised return of the deployed models"),
    "hypervolume": ("hypervolume", "hypervolume of the deployed models (discounted returns)"),
    "planted_ari": ("agreement", "adjusted Rand index with the planted groups"),
    "similarity_ari": ("separability", "ARI with the planted groups of the similarity, clustered"),
}
#: Curves that are not a ``rounds.csv`` column: each is computed from the run's other files.
_DERIVED = ("hypervolume", "planted_ari", "similarity_ari")

#: Every kind of figure, by file name prefix: per run its front, similarity heatmaps and cluster
#: evolution; per environment and distribution the fronts of all variants and the learning curves.
FIGURE_KINDS: tuple[str, ...] = ("front", "similarity", "clusters", "fronts", *(p for p, _ in CURVES.values()))


def check_kinds(kinds: Collection[str]) -> None:
    """Refuse a figure kind that is not one of :data:`FIGURE_KINDS`.

    :param kinds: the kinds asked for
    """
    unknown = sorted(set(kinds) - set(FIGURE_KINDS))
    if unknown:
        raise ValueError(f"unknown figure kind(s) {', '.join(unknown)}; valid: {', '.join(FIGURE_KINDS)}")


def run_stem(run: Run | PartialRun, label: str) -> str:
    """A file-name stem for one run's figures: ``<env>_<label>_<dist>_seed<seed>``.

    :param run: the run
    :param label: its variant label (:func:`~morlfed.analysis.variants.variant_labels`)
    """
    return "_".join(_safe(part) for part in (run.env, label, run.dist, f"seed{run.seed}"))


def unique_stems(runs: Sequence[Run | PartialRun], labels: Sequence[str]) -> list[str]:
    """A file-name stem per run, none shared.

    Each is :func:`run_stem`, and for runs that would share one (a stopped run beside a finished one
    of the same configuration) a short run id after it: the run directory's name, or the first 6 hex
    digits of the SHA-1 of its path where those are equal.

    :param runs: the runs, finished or partial
    :param labels: their variant labels
    """
    stems = [run_stem(run, label) for run, label in zip(runs, labels)]
    shared = Counter(stems)
    unique = []
    for run, stem in zip(runs, stems):
        if shared[stem] > 1:
            names = [other.path.name for other, s in zip(runs, stems) if s == stem]
            digest = hashlib.sha1(str(Path(run.path).resolve()).encode()).hexdigest()[:6]
            stem = f"{stem}_{_safe(run.path.name) if names.count(run.path.name) == 1 else digest}"
        unique.append(stem)
    return unique


def run_title(run: Run | PartialRun, label: str) -> str:
    """A title naming one run: ``<env> / <label> / <dist> / seed <seed>``.

    :param run: the run
    :param label: its variant label
    """
    return f"{run.env} / {label} / {run.dist} / seed {run.seed}"


def learning_curves(
    runs: Sequence[Run | PartialRun], labels: Sequence[str], column: str = "mean_train_reward"
) -> pd.DataFrame:
    """Long table ``label, seed, round, env_steps, value`` of ``rounds.csv``'s ``column``.

    ``env_steps`` is the training budget each client has spent by the end of the round, on average:
    the participants of the rounds so far times ``local_steps``, over ``n_clients`` (what a fit
    budgets; an SB3 rollout may run a few steps past it). Rounds without a value, and runs without
    the column, are left out.

    :param runs: loaded runs (finished or not)
    :param labels: each run's label (runs sharing one are seeds of a curve)
    :param column: the ``rounds.csv`` column, a key of :data:`CURVES`
    """
    parts = [
        pd.DataFrame(
            {
                "label": label,
                "seed": run.seed,
                "round": run.rounds["round"],
                "env_steps": _env_steps(run),
                "value": _values(run, column),
            }
        )
        for run, label in zip(runs, labels)
        if len(run.rounds) and (column in run.rounds.columns or column in _DERIVED)
    ]
    if not parts:
        return pd.DataFrame(columns=["label", "seed", "round", "env_steps", "value"])
    return pd.concat(parts, ignore_index=True).dropna(subset=["value"])


def _values(run: Run | PartialRun, column: str) -> pd.Series:
    """A curve's values, one per ``rounds.csv`` row (NaN where there is none)."""
    if column == "hypervolume":
        return run.rounds["round"].map(deployed_hypervolume(run)).astype(float)
    if column in ("planted_ari", "similarity_ari"):  # a finished run with planted groups (none: no curve)
        score = planted_ari_by_round if column == "planted_ari" else similarity_ari_by_round
        return run.rounds["round"].map(score(run) if isinstance(run, Run) else {}).astype(float)
    return pd.to_numeric(run.rounds[column], errors="coerce")


def deployed_hypervolume(run: Run | PartialRun) -> pd.Series:
    """The hypervolume of the deployed models' discounted returns after each evaluated round, by round.

    From ``evaluations.csv`` (runs with ``eval_every``; empty without it), against the spec's
    reference point, as ``metrics.json``'s hypervolume of the final returns is.

    :param run: a run (finished or not)
    """
    path = Path(run.path) / "evaluations.csv"
    if not path.is_file():
        return pd.Series(dtype=float)
    table = pd.read_csv(path)
    columns = sorted(
        (c for c in table.columns if c.startswith("discounted_return_")), key=lambda c: int(c.rsplit("_", 1)[1])
    )
    ref = np.asarray(run.config["env"]["ref_point"], dtype=float)
    with warnings.catch_warnings():  # a point below the reference adds nothing: the curve shows it
        warnings.simplefilter("ignore", ReferencePointWarning)
        return table.groupby("round").apply(lambda g: hypervolume(g[columns].to_numpy(float), ref))


def _env_steps(run: Run | PartialRun) -> pd.Series:
    """Each logged round's budgeted training env steps per client so far (:func:`learning_curves`)."""
    participants = pd.to_numeric(run.rounds.get("participants", pd.Series(np.nan, index=run.rounds.index)))
    return participants.cumsum() * float(run.config["local_steps"]) / float(run.config["n_clients"])


def write_figures(
    runs: Sequence[Run],
    out: Path,
    returns: str = "discounted",
    rounds: Sequence[int] | None = None,
    formats: Sequence[str] = FORMATS,
    kinds: Collection[str] = FIGURE_KINDS,
    partial: Sequence[PartialRun] = (),
    x: str = "round",
) -> list[Path]:
    """Write the figures of ``runs`` (and of the unfinished runs ``partial``) into ``out``.

    The files written are returned, each once (no two runs share a file name: :func:`unique_stems`).

    :param runs: loaded RL runs
    :param out: the output folder
    :param returns: one of :data:`morlfed.metrics.RETURN_KINDS`
    :param rounds: the similarity heatmaps' rounds (default: :func:`default_rounds` of those saved)
    :param formats: file formats (``png``, ``pdf``, ``svg``)
    :param kinds: the kinds of figure to write (default: all, :data:`FIGURE_KINDS`)
    :param partial: unfinished runs (:func:`partial_figures`)
    :param x: the learning curves' x axis: ``round`` or ``env_steps`` (:data:`~morlfed.analysis.curves.CURVE_AXES`)
    """
    check_kinds(kinds)
    fronts = reference_fronts(runs, returns)
    every_label = variant_labels([*runs, *partial])
    every_stem = unique_stems([*runs, *partial], every_label)
    labels, stems = every_label[: len(runs)], every_stem[: len(runs)]
    written: list[Path] = []
    for run, label, stem in zip(runs, labels, stems):
        ref = fronts[run.env, returns_gamma(run.spec, returns)]
        title = run_title(run, label)
        if "front" in kinds:
            fig = front_figure(
                run.returns_of(returns),
                run.weights,
                ref.points,
                run.spec.objectives,
                title=f"{title} ({returns} returns)",
                front_label=f"{ref.source} front",
            )
            written += save_figure(fig, out / f"front_{stem}", formats)
        saved = run.similarity_rounds() if "similarity" in kinds else []
        chosen = [r for r in rounds if r in saved] if rounds else default_rounds(saved)
        if chosen:
            fig = similarity_figure(
                {r: run.similarity(r) for r in chosen},
                {r: run.clusters_at(r) for r in chosen},
                run.weights,
                title=f"{title}: client similarity",
            )
            written += save_figure(fig, out / f"similarity_{stem}", formats)
        history = run.cluster_history() if "clusters" in kinds else {}
        if history:
            fig = cluster_evolution_figure(history, run.weights, f"{title}: clusters", run.spec.objectives)
            written += save_figure(fig, out / f"clusters_{stem}", formats)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault((run.env, run.dist), []).append(i)
    for (env, dist), members in sorted(groups.items()):
        if "fronts" in kinds:
            first = runs[members[0]]
            ref = fronts[env, returns_gamma(first.spec, returns)]
            sets: dict[str, list] = {}
            seeds: dict[str, list[int]] = {}
            for i in sorted(members, key=lambda i: (runs[i].algo, runs[i].finetune, labels[i], runs[i].seed)):
                sets.setdefault(labels[i], []).append((runs[i].returns_of(returns), runs[i].weights))
                seeds.setdefault(labels[i], []).append(runs[i].seed)
            fig = fronts_comparison_figure(
                sets,
                ref.points,
                first.spec.objectives,
                title=f"{env} / {dist} ({returns} returns)",
                front_label=f"{ref.source} front",
                seeds=seeds,
            )
            written += save_figure(fig, out / f"fronts_{_safe(env)}_{_safe(dist)}", formats)
        for column, (prefix, ylabel) in CURVES.items():
            if prefix not in kinds:
                continue
            curves = learning_curves([runs[i] for i in members], [labels[i] for i in members], column)
            if len(curves):
                fig = learning_curves_figure(curves, title=f"{env} / {dist}", ylabel=ylabel, x=x)
                written += save_figure(fig, out / f"{prefix}_{_safe(env)}_{_safe(dist)}", formats)
    for unfinished, label, stem in zip(partial, every_label[len(runs) :], every_stem[len(runs) :]):
        for name, fig in partial_figures(unfinished, kinds, label, stem).items():
            written += save_figure(fig, out / name, formats)
    return written


def partial_figures(
    run: PartialRun, kinds: Collection[str] = FIGURE_KINDS, label: str | None = None, stem: str | None = None
) -> dict[str, Figure]:
    """What an unfinished run already shows, by file name.

    Its learning curves (``learning_<run>``; ``evaluation_<run>`` and ``hypervolume_<run>`` with ``eval_every``) over the
    rounds configured and its cluster evolution (``clusters_<run>``), each titled as a partial run
    with its rounds done.

    :param run: the unfinished run
    :param kinds: the kinds of figure wanted (:data:`FIGURE_KINDS`; those an unfinished run lacks
        are skipped)
    :param label: its variant label (default: its strategy, ``run.label``)
    :param stem: its file-name stem (default: :func:`run_stem`)
    """
    check_kinds(kinds)
    label = label or run.label
    stem, title = stem or run_stem(run, label), f"{run_title(run, label)}: {run.status}"
    figures: dict[str, Figure] = {}
    for column, (prefix, ylabel) in CURVES.items():
        if prefix not in kinds:
            continue
        curves = learning_curves([run], [label], column)
        if len(curves):
            fig = learning_curves_figure(curves, title=title, ylabel=ylabel)
            fig.axes[0].set_xlim(0.5, (run.rounds_total or run.rounds_done) + 0.5)  # the rounds still to come
            figures[f"{prefix}_{stem}"] = fig
    history = run.cluster_history() if "clusters" in kinds else {}
    if history and run.weights is not None:
        objectives = (run.config.get("env") or {}).get("objectives")
        figures[f"clusters_{stem}"] = cluster_evolution_figure(history, run.weights, f"{title}: clusters", objectives)
    return figures
