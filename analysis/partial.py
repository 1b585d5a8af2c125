"""Runs that have not finished: the live view of ``python -m morlfed.analysis.plot``.

A run directory without ``metrics.json`` is still running, was stopped (Ctrl-C or SIGTERM: then its
``stopped.json`` says so, :mod:`morlfed.storage.runstatus`), was killed or failed. Its ``rounds.csv`` and
``clusters.jsonl`` are rewritten atomically after every round, so they always hold the rounds done
so far: enough for the learning curves and the cluster evolution, not for fronts or metrics (those
need the final evaluation). :func:`load_partial_run` reads one such directory into a
:class:`PartialRun`; :func:`partial_runs` picks them out of the directories
:func:`~morlfed.analysis.runs.load_runs` skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from omegaconf import OmegaConf

from morlfed.analysis.run_files import RunDirError, cluster_history, read_logs
from morlfed.storage.runstatus import read_stopped


@dataclass
class PartialRun:
    """An unfinished run directory: its configuration and the rounds logged so far.

    :param path: the directory
    :param config: ``config.yaml`` as a plain dict (resolved)
    :param rounds: ``rounds.csv``, one row per round done
    :param clusters: ``clusters.jsonl`` records
    :param weights: ``[n_clients, m]`` preferences from ``preferences.csv`` (RL), else ``None``
    """

    path: Path
    config: dict[str, Any]
    rounds: pd.DataFrame
    clusters: list[dict[str, Any]]
    weights: np.ndarray | None

    @property
    def env(self) -> str:
        """The environment (RL) or dataset (vision)."""
        return str((self.config.get("env") or self.config.get("data") or {}).get("name", "?"))

    @property
    def algo(self) -> str:
        """The strategy's ``algo=`` option: the module of its ``_target_`` (``fedpref``)."""
        target = str((self.config.get("algo") or {}).get("_target_", "?"))
        return target.rsplit(".", 2)[-2] if target.count(".") >= 2 else target

    @property
    def label(self) -> str:
        """The strategy with the "+FT" variant marked."""
        return self.algo + ("+FT" if self.config.get("finetune") else "")

    @property
    def dist(self) -> str:
        """The preference distribution (RL) or label partition (vision)."""
        node = self.config.get("partition") or self.config.get("dist")  # vision: partition (before 2026-11-27: dist)
        return str((node or {}).get("name", "?"))

    @property
    def seed(self) -> int:
        """The root seed."""
        return int(self.config.get("seed", 0))

    @property
    def rounds_done(self) -> int:
        """The last round logged (0 before the first)."""
        return int(self.rounds["round"].max()) if len(self.rounds) else 0

    @property
    def rounds_total(self) -> int | None:
        """The rounds configured (``config.yaml``), if known."""
        total = self.config.get("rounds")
        return total if isinstance(total, int) else None

    @property
    def status(self) -> str:
        """The run's state, as the figures' titles and the command say it.

        ``partial run: 2 of 4 rounds``, or ``partial run: stopped by SIGTERM after 2 of 4 rounds``
        when a signal stopped it.
        """
        stopped = read_stopped(self.path)
        if stopped is not None:
            return f"partial run: {stopped.describe()}"
        return f"partial run: {self.rounds_done} of {self.rounds_total or '?'} rounds"

    def cluster_history(self) -> dict[int, list[list[int]]]:
        """``{round: clusters}`` logged so far."""
        return cluster_history(self.clusters)


def load_partial_run(path: str | Path) -> PartialRun:
    """Load an unfinished run directory (``config.yaml`` and ``rounds.csv`` present, no ``metrics.json``).

    :class:`~morlfed.analysis.run_files.RunDirError` if it is not one.

    :param path: the run directory
    """
    path = Path(path)
    if (path / "metrics.json").is_file():
        raise RunDirError(path, "not partial: metrics.json is present (load it with load_run)")
    if not (path / "rounds.csv").is_file():
        raise RunDirError(path, "incomplete: no metrics.json and no rounds.csv (no round finished yet)")
    try:
        config = OmegaConf.to_container(OmegaConf.load(path / "config.yaml"), resolve=True)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise RunDirError(path, f"malformed config.yaml: {exc}") from None
    if not isinstance(config, dict):
        raise RunDirError(path, "malformed config.yaml: not a mapping")
    rounds, clusters = read_logs(path)
    weights = None
    if (path / "preferences.csv").is_file():
        prefs = pd.read_csv(path / "preferences.csv")
        weights = prefs[[c for c in prefs.columns if c.startswith("w_")]].to_numpy(dtype=float)
    return PartialRun(path, {str(k): v for k, v in config.items()}, rounds, clusters, weights)


def partial_runs(skipped: Sequence[tuple[str, str]]) -> tuple[list[PartialRun], list[tuple[str, str]]]:
    """Split skipped ``(path, reason)`` pairs into unfinished runs with rounds to show and the rest.

    The pairs are those :func:`~morlfed.analysis.runs.load_runs` skipped; the rest stay skipped,
    with why.

    :param skipped: the skipped paths and reasons
    """
    found: list[PartialRun] = []
    rest: list[tuple[str, str]] = []
    for path, reason in skipped:
        here = Path(path)
        if not (here.is_dir() and (here / "config.yaml").is_file() and not (here / "metrics.json").exists()):
            rest.append((path, reason))
            continue
        try:
            found.append(load_partial_run(here))
        except RunDirError as exc:
            rest.append((path, exc.reason))
    return found, rest
