"""Evaluating a campaign of runs: every metric recomputed from the clients' stored returns.

The library behind ``python -m morlfed.analysis.evaluate`` (and the notebooks). Every metric is
recomputed from the clients' returns (``final.csv``) and the environment spec of each run
(``config.yaml``: the reference point of the returns evaluated, gamma, known front). IGD and IGD+
use the environment's known front (``pareto_front(gamma)``; gamma 1 for undiscounted returns) or,
where it has none, the *campaign front*: the non-dominated union of the returns of every run being
evaluated on that environment (:func:`reference_fronts`). Runs that differ in a configuration
setting get distinct labels (:func:`~morlfed.analysis.variants.variant_labels`), repeated runs are
dropped (:func:`select_runs`), and recomputed values that differ from a run's stored
``metrics.json`` are collected as mismatches.

Vision runs (``task=vision``): every accuracy statistic (:data:`VISION_METRICS`: mean / std / min /
max over clients of L-acc, S-acc and G-acc) is recomputed from ``final.csv``
(:func:`evaluate_vision_runs`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from morlfed.analysis.clustering import CLUSTER_METRICS, final_clusters, planted_ari
from morlfed.analysis.runs import Run, VisionRun
from morlfed.analysis.variants import split_duplicates, variant_labels
from morlfed.envs import EnvSpec, known_front
from morlfed.metrics import (
    ACCURACIES,
    ACCURACY_METRICS,
    FRONT_TOL,
    METRICS,
    RETURN_KINDS,
    MetricInfo,
    ReferencePointWarning,
    accuracy_summary,
    campaign_front,
    check_reference_point,
    compute_metrics,
    eu_weights,
)

#: The identity columns an RL and a vision summary share, after the environment or dataset
#: columns (:func:`_variant_cells`), ending with the run's ``inert_warning`` (its strategy's
#: report that it stayed inert, :meth:`morlfed.strategies.base.Strategy.inert_warning`; empty if none).
_VARIANT_COLUMNS: tuple[str, ...] = (
    "dist",
    "algo",
    "label",
    "variant",
    "finetune",
    "seed",
    "n_clients",
    "rounds",
    "local_steps",
    "inert_warning",
)
#: Identity columns of ``summary.csv`` (metric columns follow, in ``METRICS`` order).
SUMMARY_COLUMNS: tuple[str, ...] = (
    "run",
    "name",
    "env",
    *_VARIANT_COLUMNS,
    "env_steps_per_client",
    "loss_env_steps_per_client",
    "wall_time_s",
    "returns",
    "gamma",
    "front",
    "front_size",
    "outside_ref",
)
#: The accuracy statistics of vision runs, in table order, with their directions.
VISION_METRICS: dict[str, MetricInfo] = {
    key: MetricInfo(title, higher, False, definition) for key, (title, higher, definition) in ACCURACY_METRICS.items()
}
#: Identity columns of ``vision_summary.csv`` (the :data:`VISION_METRICS` columns follow).
VISION_SUMMARY_COLUMNS: tuple[str, ...] = ("run", "name", "data", "model", *_VARIANT_COLUMNS)


@dataclass(frozen=True)
class ReferenceFront:
    """The front IGD / IGD+ of one environment are measured against.

    :param env: environment name
    :param gamma: discount of the returns it applies to (1.0 for undiscounted returns)
    :param source: ``"known"`` (the environment's own front) or ``"campaign"`` (the
        non-dominated union of the evaluated runs' returns)
    :param points: ``[k, m]`` front points (maximisation)
    :param n_runs: number of evaluated runs on this environment
    """

    env: str
    gamma: float
    source: str
    points: np.ndarray
    n_runs: int


@dataclass
class Campaign:
    """The evaluation of a set of runs.

    :param summary: one row per run: :data:`SUMMARY_COLUMNS` then every metric
    :param fronts: the reference front of each ``(env, gamma)``
    :param returns: which returns were evaluated (``discounted`` or ``undiscounted``)
    :param skipped: ``(path, reason)`` of run directories left out
    :param mismatches: recomputed metrics that differ from a run's ``metrics.json``
    """

    summary: pd.DataFrame
    fronts: dict[tuple[str, float], ReferenceFront]
    returns: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it, else absolute.

    Relative so that a committed summary does not carry one machine's absolute paths.

    :param path: a run directory
    """
    try:
        return str(Path(path).relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def returns_gamma(spec: EnvSpec, returns: str) -> float:
    """The discount of ``returns`` of a run on ``spec``: ``spec.gamma``, or 1 if undiscounted.

    :param spec: the run's environment spec
    :param returns: one of :data:`morlfed.metrics.RETURN_KINDS`
    """
    if returns not in RETURN_KINDS:
        raise ValueError(f"returns must be one of {', '.join(RETURN_KINDS)}; got {returns!r}")
    return spec.gamma if returns == "discounted" else 1.0


def reference_fronts(runs: Sequence[Run], returns: str = "discounted") -> dict[tuple[str, float], ReferenceFront]:
    """The reference front of every ``(env, gamma)`` among ``runs``: known, else campaign.

    A known front is checked against the environment's reference point of ``returns``
    (:func:`morlfed.metrics.check_reference_point`: a ``ValueError`` for a sign error).

    :param runs: loaded runs
    :param returns: one of :data:`morlfed.metrics.RETURN_KINDS`
    """
    groups: dict[tuple[str, float], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.env, returns_gamma(run.spec, returns)), []).append(run)
    fronts = {}
    for (env, gamma), members in groups.items():
        spec = members[0].spec
        known = known_front(spec, gamma=gamma)
        if known is not None:
            check_reference_point(spec.reference_point(returns), known)
            fronts[env, gamma] = ReferenceFront(env, gamma, "known", known, len(members))
        else:
            points = campaign_front([r.returns_of(returns) for r in members])
            fronts[env, gamma] = ReferenceFront(env, gamma, "campaign", points, len(members))
    return fronts


def select_runs(runs: Sequence[Run], returns: str = "discounted") -> tuple[list[Run], list[tuple[str, str]]]:
    """The runs fit to compare, and the runs left out as ``(path, reason)``.

    Duplicates (:func:`~morlfed.analysis.variants.split_duplicates`) and runs whose known front does
    not dominate their reference point (:func:`reference_fronts`) are returned separately as
    ``(path, reason)``.

    :param runs: loaded RL runs
    :param returns: one of :data:`morlfed.metrics.RETURN_KINDS`
    """
    kept, skipped = split_duplicates(runs)
    valid = []
    for run in kept:
        try:
            reference_fronts([run], returns)
        except ValueError as exc:
            skipped.append((str(run.path), f"environment spec: {exc}"))
        else:
            valid.append(run)
    return valid, skipped


def _variant_cells(run: Run | VisionRun, variant: str, n_clients: int) -> dict[str, Any]:
    """The :data:`_VARIANT_COLUMNS` cells of ``run``'s summary row.

    :param run: an RL or a vision run
    :param variant: its label with the settings that set it apart
        (:func:`~morlfed.analysis.variants.variant_labels`)
    :param n_clients: its number of clients
    """
    return {
        "dist": run.dist,
        "algo": run.algo,
        "label": run.label,
        "variant": variant,
        "finetune": run.finetune,
        "seed": run.seed,
        "n_clients": n_clients,
        "rounds": run.config.get("rounds"),
        "local_steps": run.config.get("local_steps"),
        # the strategy's own report that the run left it inert (metrics.json; None when it did
        # not, or for a run that predates the check)
        "inert_warning": run.info.get("inert_warning"),
    }


def _mismatches(run: Run, returns: str, recomputed: dict[str, Any], rel: float = 1e-6) -> list[str]:
    stored = run.info.get(returns)
    if not isinstance(stored, dict):
        return [f"{run.path}: metrics.json has no {returns!r} metrics to cross-check"]
    out = []
    for key, value in recomputed.items():
        old = stored.get(key)
        if old is None or value is None:
            continue
        if not math.isclose(float(old), float(value), rel_tol=rel, abs_tol=1e-9):
            out.append(
                f"{run.path}: recomputed {returns} {key} = {value:.6g} but metrics.json has "
                f"{float(old):.6g} (was the metrics code changed since the run?)"
            )
    return out


def evaluate_runs(runs: Sequence[Run], returns: str = "discounted", tol: float = FRONT_TOL) -> Campaign:
    """Recompute every metric of every run and build the campaign's summary table.

    :param runs: loaded runs (:func:`morlfed.analysis.runs.load_runs`)
    :param returns: ``"discounted"`` (default, MORL convention) or ``"undiscounted"``
    :param tol: relative tolerance of front points reached and zero regret
    """
    if not runs:
        raise ValueError("evaluate_runs needs at least one run")
    fronts = reference_fronts(runs, returns)
    labels = variant_labels(runs)
    rows, mismatches = [], []
    for run, variant in zip(runs, labels):
        gamma = returns_gamma(run.spec, returns)
        ref = fronts[run.env, gamma]
        points = run.returns_of(returns)
        ref_point = np.asarray(run.spec.reference_point(returns))
        with warnings.catch_warnings():  # counted in outside_ref instead
            warnings.simplefilter("ignore", ReferencePointWarning)
            values = compute_metrics(
                run.weights,
                points,
                ref_point,
                front=ref.points if ref.source == "known" else None,
                tol=tol,
                campaign=ref.points if ref.source == "campaign" else None,
            )
        mismatches += _mismatches(run, returns, values)
        rows.append(
            {
                "run": shown_path(run.path),
                "name": run.name,
                "env": run.env,
                **_variant_cells(run, variant, len(run.weights)),
                "env_steps_per_client": np.nan if run.env_steps is None else float(np.mean(run.env_steps)),
                "loss_env_steps_per_client": (
                    np.nan if run.loss_env_steps is None else float(np.mean(run.loss_env_steps))
                ),
                "wall_time_s": run.info.get("wall_time_s"),
                "returns": returns,
                "gamma": gamma,
                "front": ref.source,
                "front_size": len(ref.points),
                "outside_ref": int(np.sum(~np.all(points > ref_point, axis=1))),
                **values,
                # the clusters in force after the last round (strategies that log clusters)
                "final_clusters": np.nan if (final := final_clusters(run)) is None else len(final),
                "planted_ari": planted_ari(run),
            }
        )
    summary = pd.DataFrame(rows, columns=[*SUMMARY_COLUMNS, *METRICS, *CLUSTER_METRICS])
    summary = summary.sort_values(["env", "dist", "algo", "finetune", "variant", "seed"], kind="stable")
    return Campaign(summary.reset_index(drop=True), fronts, returns, mismatches=mismatches)


def eu_weights_table(objectives: Sequence[int]) -> pd.DataFrame:
    """``eu_weights.csv``: the weights the expected utility of ``summary.csv`` was computed with.

    They are :func:`morlfed.metrics.eu_weights`, for each number of objectives among the evaluated
    environments: columns ``objectives``, ``index`` and ``w_0 .. w_{M-1}`` (``M`` the most
    objectives; an environment with fewer leaves the rest empty).

    :param objectives: the numbers of objectives of the evaluated environments
    """
    rows = [
        {"objectives": m, "index": k, **{f"w_{j}": float(x) for j, x in enumerate(w)}}
        for m in sorted(set(objectives))
        for k, w in enumerate(eu_weights(m))
    ]
    width = max(objectives, default=0)
    return pd.DataFrame(rows, columns=["objectives", "index", *(f"w_{j}" for j in range(width))])


def evaluate_vision_runs(runs: Sequence[VisionRun]) -> tuple[pd.DataFrame, list[str]]:
    """Recompute the accuracy statistics of every vision run from its ``final.csv``.

    :param runs: loaded vision runs

    :return: the summary table (:data:`VISION_SUMMARY_COLUMNS`, then :data:`VISION_METRICS`),
        sorted, and the recomputed values that differ from a run's ``metrics.json``
    """
    if not runs:
        raise ValueError("evaluate_vision_runs needs at least one run")
    rows, mismatches = [], []
    for run, variant in zip(runs, variant_labels(runs)):
        values = accuracy_summary({acc: run.clients[acc].to_numpy(dtype=float) for acc in ACCURACIES})
        stored = run.info.get("accuracy")
        if not isinstance(stored, dict):
            mismatches.append(f"{run.path}: metrics.json has no 'accuracy' metrics to cross-check")
        else:
            mismatches += [
                f"{run.path}: recomputed {key} = {value:.6g} but metrics.json has {float(stored[key]):.6g}"
                for key, value in values.items()
                if key in stored and not math.isclose(float(stored[key]), value, rel_tol=1e-6, abs_tol=1e-9)
            ]
        rows.append(
            {
                "run": shown_path(run.path),
                "name": run.name,
                "data": run.data,
                "model": run.info.get("model"),
                **_variant_cells(run, variant, len(run.clients)),
                **values,
            }
        )
    summary = pd.DataFrame(rows, columns=[*VISION_SUMMARY_COLUMNS, *VISION_METRICS])
    summary = summary.sort_values(["data", "dist", "algo", "finetune", "variant", "seed"], kind="stable")
    return summary.reset_index(drop=True), mismatches
