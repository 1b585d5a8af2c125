"""Finding and loading run directories (README.md#a-run-directory) for analysis.

A run directory holds
``config.yaml preferences.csv rounds.csv clusters.jsonl final.csv metrics.json`` (+
``similarity_<round>.npy``). ``metrics.json`` is written last, only when the run completed, so a
directory without it is *incomplete*. :func:`load_run` reads one directory into a :class:`Run` (a
``task=vision`` run, whose ``metrics.json`` says ``"task": "vision"``, into a :class:`VisionRun`:
its ``final.csv`` holds per-client accuracies) and checks it; its files are read by
:mod:`morlfed.analysis.run_files`, and anything missing, unreadable or inconsistent raises
:class:`~morlfed.analysis.run_files.RunDirError` naming the directory and the problem. :func:`load_runs`
expands directories and globs (a hydra multirun folder, a campaign tree), loads every run directory
found below them and returns the valid runs together with the skipped ones and why, so that callers
report them and never average them in. :func:`load_runs` returns the runs of the tasks asked for (RL
runs by default) and lists the others among the skipped ones.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from morlfed.analysis.run_files import (
    RunDirError,
    check_agreement,
    cluster_history,
    load_config,
    read_config,
    read_final,
    read_info,
    read_logs,
    read_vision_final,
)
from morlfed.envs import EnvSpec
from morlfed.metrics import RETURN_KINDS

#: Files whose presence marks a directory as a run directory (complete or not).
RUN_MARKERS: tuple[str, ...] = ("config.yaml", "final.csv", "metrics.json")
#: The tasks a run directory can belong to (``task=`` of ``morlfed.run``).
TASKS: tuple[str, ...] = ("rl", "vision")
#: The files of a run directory that :func:`archive_runs` keeps: every log a run writes, none of
#: its checkpoints, similarity matrices or hydra's own files. A copy is itself a run directory.
LOG_FILES: tuple[str, ...] = (
    "config.yaml",
    "preferences.csv",
    "rounds.csv",
    "clusters.jsonl",
    "final.csv",
    "evaluations.csv",
    "metrics.json",
    "run.log",
)
_GLOB_CHARS = re.compile(r"[*?\[]")


class RunIdentity:
    """What identifies a run in a comparison, read from its ``metrics.json`` (``info``)."""

    info: dict[str, Any]

    @property
    def algo(self) -> str:
        """Strategy name (``fedpref``)."""
        return str(self.info["algo"])

    @property
    def label(self) -> str:
        """Strategy name with the "+FT" variant marked (``fedpref+FT``)."""
        return str(self.info["label"])

    @property
    def dist(self) -> str:
        """How the clients differ: the preference distribution (RL, ``dist``) or label partition (vision)."""
        return str(self.info["partition"] if self.info.get("task") == "vision" else self.info["dist"])

    @property
    def seed(self) -> int:
        """Root seed."""
        return int(self.info["seed"])

    @property
    def finetune(self) -> bool:
        """Whether this is the "+FT" variant."""
        return bool(self.info["finetune"])


@dataclass
class Run(RunIdentity):
    """One completed run directory, loaded and checked.

    :param path: the directory
    :param info: ``metrics.json`` (run information and the stored ``discounted`` /
        ``undiscounted`` metric dicts)
    :param config: ``config.yaml`` as a plain dict (resolved)
    :param spec: the environment spec the run used (``config.yaml``'s ``env`` node)
    :param weights: ``[n_clients, m]`` client preferences, from ``final.csv``
    :param returns: ``{"discounted": [n, m], "undiscounted": [n, m]}`` client vector returns
    :param rounds: ``rounds.csv`` (one row per round), empty if the file is absent
    :param clusters: ``clusters.jsonl`` records (one per aggregated round), empty if absent
    :param name: a short unique name for tables and file names (set by :func:`load_runs`)
    :param env_steps: ``[n_clients]`` env steps each client took, from ``final.csv``'s
        ``env_steps``; ``None`` for a run that did not record them
    :param loss_env_steps: ``[n_clients]`` of those spent measuring the losses of received
        models, from ``final.csv``'s ``loss_env_steps``; ``None`` for a run that did not record them
    """

    path: Path
    info: dict[str, Any]
    config: dict[str, Any]
    spec: EnvSpec
    weights: np.ndarray
    returns: dict[str, np.ndarray]
    rounds: pd.DataFrame
    clusters: list[dict[str, Any]] = field(default_factory=list)
    name: str = ""
    env_steps: np.ndarray | None = None
    loss_env_steps: np.ndarray | None = None

    @property
    def env(self) -> str:
        """Canonical environment name."""
        return self.spec.name

    def returns_of(self, kind: str = "discounted") -> np.ndarray:
        """The clients' ``[n, m]`` returns of ``kind`` (``discounted`` or ``undiscounted``)."""
        if kind not in RETURN_KINDS:
            raise ValueError(f"returns kind must be one of {', '.join(RETURN_KINDS)}; got {kind!r}")
        return self.returns[kind]

    def similarity_rounds(self) -> list[int]:
        """Rounds with a saved similarity matrix (``similarity_<round>.npy``), ascending."""
        found = (re.fullmatch(r"similarity_(\d+)\.npy", p.name) for p in self.path.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def similarity(self, round: int) -> np.ndarray:
        """The ``[n, n]`` client similarity matrix of ``round`` (NaN where not computed)."""
        path = self.path / f"similarity_{round}.npy"
        if not path.is_file():
            raise ValueError(
                f"{self.path}: no similarity matrix for round {round}; saved rounds: "
                f"{self.similarity_rounds() or 'none (run with save_similarity=true)'}"
            )
        sim = np.load(path)
        n = len(self.weights)
        if sim.shape != (n, n):
            raise ValueError(f"{path}: similarity matrix has shape {sim.shape}, expected ({n}, {n})")
        return sim

    def cluster_history(self) -> dict[int, list[list[int]]]:
        """``{round: clusters}`` from ``clusters.jsonl``, for strategies that log clusters."""
        return cluster_history(self.clusters)

    def clusters_at(self, round: int) -> list[list[int]]:
        """The clusters in force after ``round``.

        The latest record at or before it; one cluster of every client before the first record.
        """
        history = {r: c for r, c in self.cluster_history().items() if r <= round}
        return history[max(history)] if history else [list(range(len(self.weights)))]


@dataclass
class VisionRun(RunIdentity):
    """One completed vision run directory (``task=vision``), loaded and checked.

    :param path: the directory
    :param info: ``metrics.json`` (run information and the stored ``accuracy`` section)
    :param config: ``config.yaml`` as a plain dict (resolved)
    :param clients: ``final.csv``, one row per client sorted by id: ``client, n_train, n_test,
        l_acc, s_acc, g_acc, test_loss, model`` (accuracies in percent)
    :param rounds: ``rounds.csv`` (one row per round), empty if the file is absent
    :param clusters: ``clusters.jsonl`` records, empty if absent
    :param name: a short unique name for tables (set by :func:`load_runs`)
    """

    path: Path
    info: dict[str, Any]
    config: dict[str, Any]
    clients: pd.DataFrame
    rounds: pd.DataFrame
    clusters: list[dict[str, Any]] = field(default_factory=list)
    name: str = ""

    @property
    def data(self) -> str:
        """Dataset name."""
        return str(self.info["data"])

    @property
    def env(self) -> str:
        """The dataset: what the environment is for an RL run (the columns of comparison tables)."""
        return self.data


def _load_vision_run(path: Path, info: dict[str, Any]) -> VisionRun:
    config = load_config(path)
    if not isinstance(config, dict) or not isinstance(config.get("data"), dict):
        raise RunDirError(path, "malformed config.yaml: a vision run needs a data section")
    if config["data"].get("name") != info["data"]:
        raise RunDirError(
            path,
            f"malformed: metrics.json says data {info['data']!r} but config.yaml says {config['data'].get('name')!r}",
        )
    clients = read_vision_final(path, config.get("n_clients"))
    rounds, clusters = read_logs(path)
    check_agreement(path, info, len(clients), rounds)
    # a YAML mapping's keys are strings
    return VisionRun(path, info, cast("dict[str, Any]", config), clients, rounds, clusters)


def run_task(run: Run | VisionRun) -> str:
    """``"vision"`` for a :class:`VisionRun`, ``"rl"`` for a :class:`Run`."""
    return "vision" if isinstance(run, VisionRun) else "rl"


def load_run(path: str | Path) -> Run | VisionRun:
    """Load and check one run directory (RL or vision).

    :class:`~morlfed.analysis.run_files.RunDirError` if incomplete or malformed.
    """
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(path, "not a directory")
    info = read_info(path)
    if info.get("task") == "vision":
        return _load_vision_run(path, info)
    config, spec = read_config(path)
    if info["env"] != spec.name:
        raise RunDirError(path, f"malformed: metrics.json says env {info['env']!r} but config.yaml says {spec.name!r}")
    weights, returns, env_steps, loss_env_steps = read_final(path, spec, config.get("n_clients"))
    rounds, clusters = read_logs(path)
    check_agreement(path, info, len(weights), rounds)
    return Run(
        path, info, config, spec, weights, returns, rounds, clusters, env_steps=env_steps, loss_env_steps=loss_env_steps
    )


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds any of :data:`RUN_MARKERS` (a run directory, complete or not)."""
    return any((path / marker).is_file() for marker in RUN_MARKERS)


def find_run_dirs(paths: Iterable[str | Path]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Run directories at or below ``paths`` (directories or glob patterns).

    A directory is a run directory when it holds ``config.yaml``, ``final.csv`` or
    ``metrics.json``; the search does not descend into run directories nor into hidden ones
    (hydra's ``.hydra/config.yaml`` is not a run). Returns the sorted, de-duplicated run
    directories and ``(path, reason)`` for arguments that matched nothing usable.
    """
    found: dict[Path, None] = {}
    problems: list[tuple[str, str]] = []
    for arg in paths:
        arg = str(arg)
        matches = sorted(glob.glob(arg, recursive=True)) if _GLOB_CHARS.search(arg) else [arg]
        if not matches:
            problems.append((arg, "no file or directory matches this pattern"))
        for match in map(Path, matches):
            if not match.exists():
                problems.append((str(match), "no such file or directory"))
            elif not match.is_dir():
                problems.append((str(match), "not a directory"))
            else:
                top = match.resolve()
                for root, dirs, _ in os.walk(top):
                    here = Path(root)
                    if is_run_dir(here):
                        found[here] = None
                        dirs.clear()
                    else:
                        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                if not any(p == top or top in p.parents for p in found):
                    problems.append(
                        (str(match), "no run directory (config.yaml, final.csv or metrics.json) at or below it")
                    )
    return sorted(found), problems


def _short_names(paths: Sequence[Path]) -> list[str]:
    """Unique short names: paths relative to their common parent, ``/`` replaced by ``-``."""
    if not paths:
        return []
    if len(paths) == 1:
        return [paths[0].name]
    common = Path(os.path.commonpath([str(p) for p in paths]))
    return [str(p.relative_to(common)).replace(os.sep, "-") for p in paths]


def load_runs(
    paths: Iterable[str | Path], tasks: Sequence[str] = ("rl",)
) -> tuple[list[Run | VisionRun], list[tuple[str, str]]]:
    """Load every run directory at or below ``paths`` (directories or globs).

    Returns ``(runs, skipped)``: the valid runs of ``tasks`` (each with a unique short ``name``;
    :class:`Run` for ``rl``, :class:`VisionRun` for ``vision``) and ``(path, reason)`` for every
    argument or run directory that was incomplete, malformed, of another task or matched
    nothing. Skipped directories are never part of ``runs``.
    """
    unknown = set(tasks) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown task(s) {sorted(unknown)}; valid: {', '.join(TASKS)}")
    dirs, skipped = find_run_dirs(paths)
    runs: list[Run | VisionRun] = []
    for d in dirs:
        try:
            run = load_run(d)
        except RunDirError as exc:
            skipped.append((str(exc.path), exc.reason))
            continue
        if run_task(run) in tasks:
            runs.append(run)
        else:
            skipped.append((str(d), f"a task={run_task(run)} run (this analysis covers task={'|'.join(tasks)})"))
    for run, name in zip(runs, _short_names([r.path for r in runs])):
        run.name = name
    return runs, skipped


def archive_runs(runs: Sequence[Run | VisionRun], dest: Path) -> None:
    """Copy the logs (:data:`LOG_FILES`) of each run into ``dest/<run name>/``, replacing ``dest`` as a whole.

    The copy is built beside it and swapped in, so an interrupted call leaves the old ``dest`` (or
    none), never a half-written one.

    The copies are run directories that ``analysis.evaluate`` and ``analysis.plot`` read like the
    originals, small enough to commit next to a study's ``summary.csv`` (no checkpoints).

    :param runs: loaded runs with unique ``name`` s (:func:`load_runs`)
    :param dest: the archive folder; created, or replaced if it exists
    """
    names = [run.name for run in runs]
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"archive_runs needs unique, non-empty run names, got {names}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for run in runs:
            (staging / run.name).mkdir()
            for file in LOG_FILES:
                if (run.path / file).is_file():
                    shutil.copy2(run.path / file, staging / run.name / file)
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
            os.replace(dest, old / dest.name)
            os.replace(staging, dest)
            shutil.rmtree(old)
        else:
            os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
