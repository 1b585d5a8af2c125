"""Finding and loading run directories (README.md#a-run-directory) for analysis.

A run directory holds
``config.yaml preferences.csv rounds.csv clusters.jsonl final.csv metrics.json`` (+
``similarity_<round>.npy``). ``metrics.json`` is written last, only when the run completed, so a
directory without it is *incomplete*. :func:`load_run` reads one directory into a :class:`Run` (a
``task=vision`` run, whose ``metrics.json`` says ``"task": "vision"``, into a :class:`VisionRun`:
its ``final.csv`` holds per-client accuracies) and checks it; anything missing, unreadable or
inconsistent raises :class:`RunDirError` naming the directory and the problem. :func:`load_runs`
expands directories and globs (a hydra multirun folder, a campaign tree), loads every run directory
found below them and returns the valid runs together with the skipped ones and why, so that callers
report them and never average them in. :func:`load_runs` returns the runs of the tasks asked for (RL
runs by default) and lists the others among the skipped ones.
"""

from __future__ import annotations

import glob
import json
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
import yaml
from omegaconf import OmegaConf

from morlfed.envs import EnvSpec
from morlfed.metrics import ACCURACIES, RETURN_KINDS, return_columns
from morlfed.runstatus import read_stopped

#: Files whose presence marks a directory as a run directory (complete or not).
RUN_MARKERS: tuple[str, ...] = ("config.yaml", "final.csv", "metrics.json")
#: Keys ``metrics.json`` must hold for a run to be compared.
INFO_KEYS: tuple[str, ...] = ("algo", "label", "env", "dist", "seed", "finetune")
#: Keys the ``metrics.json`` of a vision run must hold.
VISION_INFO_KEYS: tuple[str, ...] = ("task", "algo", "label", "data", "dist", "seed", "finetune")
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
    "metrics.json",
    "run.log",
)
_GLOB_CHARS = re.compile(r"[*?\[]")


class RunDirError(ValueError):
    """A run directory that is incomplete or malformed; the message names it and the problem.

    :param path: the run directory
    :param reason: what is wrong with it
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


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
        """Preference distribution (RL) or label partition (vision) name."""
        return str(self.info["dist"])

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


def _read_info(path: Path) -> dict[str, Any]:
    file = path / "metrics.json"
    stopped = read_stopped(path)
    if not file.is_file() and stopped is not None:
        raise RunDirError(path, f"incomplete: {stopped.describe()} (continue it with: {stopped.resume})")
    if not file.is_file():
        raise RunDirError(path, "incomplete: no metrics.json (the run did not finish)")
    try:
        info = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(path, f"malformed metrics.json: {exc}") from None
    if not isinstance(info, dict):
        raise RunDirError(path, "malformed metrics.json: not a JSON object")
    missing = [k for k in (VISION_INFO_KEYS if info.get("task") == "vision" else INFO_KEYS) if k not in info]
    if missing:
        raise RunDirError(path, f"malformed metrics.json: missing key(s) {missing}")
    return info


def _load_config(path: Path) -> object:
    """``config.yaml`` of the run directory ``path``, resolved into plain containers.

    :class:`RunDirError` if it cannot be read or parsed.
    """
    try:
        return OmegaConf.to_container(OmegaConf.load(path / "config.yaml"), resolve=True)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise RunDirError(path, f"malformed config.yaml: {exc}") from None


def _read_config(path: Path) -> tuple[dict[str, Any], EnvSpec]:
    if not (path / "config.yaml").is_file():
        raise RunDirError(path, "malformed: no config.yaml")
    config = _load_config(path)
    if not isinstance(config, dict) or not isinstance(config.get("env"), dict):
        raise RunDirError(path, "malformed config.yaml: no env section")
    try:
        spec = EnvSpec.from_config(config["env"])
    except (ValueError, TypeError) as exc:
        raise RunDirError(path, f"malformed config.yaml env section: {exc}") from None
    return cast("dict[str, Any]", config), spec  # a YAML mapping's keys are strings


def _read_final_table(path: Path) -> pd.DataFrame:
    """``final.csv`` of the run directory ``path``, as written.

    :class:`RunDirError` if it is absent or unreadable.
    """
    file = path / "final.csv"
    if not file.is_file():
        raise RunDirError(path, "malformed: metrics.json present but no final.csv")
    try:
        return pd.read_csv(file)
    except (OSError, ValueError) as exc:
        raise RunDirError(path, f"malformed final.csv: {exc}") from None


def _check_client_rows(path: Path, table: pd.DataFrame, n_clients: Any) -> None:
    """Check that ``final.csv`` (``table``) has one row per client.

    :class:`RunDirError` unless it has ``n_clients`` rows (``config.yaml``'s, when it is an integer)
    with client ids ``0..n-1``, each once.
    """
    if isinstance(n_clients, int) and len(table) != n_clients:
        raise RunDirError(
            path, f"malformed final.csv: {len(table)} client rows but config.yaml has n_clients={n_clients}"
        )
    if sorted(table["client"].tolist()) != list(range(len(table))):
        raise RunDirError(path, "malformed final.csv: client ids are not 0..n-1, each once")


def _steps_column(table: pd.DataFrame, column: str) -> np.ndarray | None:
    """A ``final.csv`` column of env steps per client, ``None`` when absent or not all numbers."""
    if column not in table:
        return None
    steps = pd.to_numeric(table[column], errors="coerce").to_numpy()
    return steps if np.isfinite(steps).all() else None


def _read_final(
    path: Path, spec: EnvSpec, n_clients: Any
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]:
    table = _read_final_table(path)
    m = spec.n_objectives
    weight_cols = [f"w_{k}" for k in range(m)]
    needed = ["client", *weight_cols, *(c for kind in RETURN_KINDS for c in return_columns(m, kind))]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise RunDirError(path, f"malformed final.csv: missing column(s) {missing} ({spec.name} has {m} objectives)")
    _check_client_rows(path, table, n_clients)
    table = table.sort_values("client")
    try:
        values = table[needed[1:]].to_numpy(dtype=float)
    except (TypeError, ValueError) as exc:
        raise RunDirError(path, f"malformed final.csv: non-numeric weights or returns ({exc})") from None
    bad = sorted(set(table["client"].to_numpy()[~np.isfinite(values).all(axis=1)].tolist()))
    if bad:
        raise RunDirError(path, f"malformed final.csv: clients {bad} have non-finite weights or returns")
    weights = table[weight_cols].to_numpy(dtype=float)
    if (weights < 0).any():
        raise RunDirError(path, "malformed final.csv: negative preference weights")
    returns = {kind: table[return_columns(m, kind)].to_numpy(dtype=float) for kind in RETURN_KINDS}
    return weights, returns, _steps_column(table, "env_steps"), _steps_column(table, "loss_env_steps")


def cluster_history(records: Sequence[dict[str, Any]]) -> dict[int, list[list[int]]]:
    """``{round: clusters}`` of the ``clusters.jsonl`` records that hold clusters.

    :param records: the records, one per aggregated round
    """
    return {int(r["round"]): [[int(c) for c in cl] for cl in r["clusters"]] for r in records if "clusters" in r}


def read_logs(path: Path) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """A run directory's ``rounds.csv`` and ``clusters.jsonl`` records, checked.

    ``rounds.csv`` is empty if absent and the records none if absent; :class:`RunDirError` if
    malformed.

    :param path: the run directory
    """
    rounds_file, clusters_file = path / "rounds.csv", path / "clusters.jsonl"
    try:
        rounds = pd.read_csv(rounds_file) if rounds_file.is_file() else pd.DataFrame()
        lines = clusters_file.read_text().splitlines() if clusters_file.is_file() else []
        clusters = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and pandas errors are ValueErrors
        raise RunDirError(path, f"malformed rounds.csv or clusters.jsonl: {exc}") from None
    if len(rounds) and not {"round", "mean_train_reward"} <= set(rounds.columns):
        raise RunDirError(path, "malformed rounds.csv: needs columns round and mean_train_reward")
    if any(not isinstance(r, dict) or "round" not in r for r in clusters):
        raise RunDirError(path, "malformed clusters.jsonl: every line must be an object with a round")
    return rounds, clusters


def _read_vision_final(path: Path, n_clients: Any) -> pd.DataFrame:
    table = _read_final_table(path)
    missing = [c for c in ("client", *ACCURACIES) if c not in table.columns]
    if missing:
        raise RunDirError(path, f"malformed final.csv: missing column(s) {missing} of a vision run")
    _check_client_rows(path, table, n_clients)
    try:
        acc = table[list(ACCURACIES)].to_numpy(dtype=float)
    except (TypeError, ValueError) as exc:
        raise RunDirError(path, f"malformed final.csv: non-numeric accuracies ({exc})") from None
    if not (np.isfinite(acc) & (acc >= 0) & (acc <= 100)).all():
        raise RunDirError(path, "malformed final.csv: accuracies must be percentages in [0, 100]")
    return table.sort_values("client").reset_index(drop=True)


def _load_vision_run(path: Path, info: dict[str, Any]) -> VisionRun:
    config = _load_config(path)
    if not isinstance(config, dict) or not isinstance(config.get("data"), dict):
        raise RunDirError(path, "malformed config.yaml: a vision run needs a data section")
    if config["data"].get("name") != info["data"]:
        raise RunDirError(
            path,
            f"malformed: metrics.json says data {info['data']!r} but config.yaml says {config['data'].get('name')!r}",
        )
    clients = _read_vision_final(path, config.get("n_clients"))
    rounds, clusters = read_logs(path)
    # a YAML mapping's keys are strings
    return VisionRun(path, info, cast("dict[str, Any]", config), clients, rounds, clusters)


def run_task(run: Run | VisionRun) -> str:
    """``"vision"`` for a :class:`VisionRun`, ``"rl"`` for a :class:`Run`."""
    return "vision" if isinstance(run, VisionRun) else "rl"


def load_run(path: str | Path) -> Run | VisionRun:
    """Load and check one run directory (RL or vision).

    :class:`RunDirError` if incomplete or malformed.
    """
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(path, "not a directory")
    info = _read_info(path)
    if info.get("task") == "vision":
        return _load_vision_run(path, info)
    config, spec = _read_config(path)
    if info["env"] != spec.name:
        raise RunDirError(path, f"malformed: metrics.json says env {info['env']!r} but config.yaml says {spec.name!r}")
    weights, returns, env_steps, loss_env_steps = _read_final(path, spec, config.get("n_clients"))
    rounds, clusters = read_logs(path)
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
