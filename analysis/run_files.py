"""Reading the files of one run directory (README.md#a-run-directory), each checked.

Each reader takes the run directory and returns one file's content: ``metrics.json``
(:func:`read_info`), ``config.yaml`` (:func:`load_config`, :func:`read_config` with the
environment spec of an RL run), ``final.csv`` (:func:`read_final` for an RL run's weights, returns
and env steps, :func:`read_vision_final` for a vision run's accuracies), ``rounds.csv`` and
``clusters.jsonl`` (:func:`read_logs`). A file that is missing, unreadable or inconsistent raises
:class:`RunDirError` naming the directory and the problem. :mod:`morlfed.analysis.runs` assembles
them into the loaded runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import yaml
from omegaconf import OmegaConf

from morlfed.envs import EnvSpec
from morlfed.metrics import ACCURACIES, RETURN_KINDS, return_columns
from morlfed.storage.runstatus import read_stopped

#: Keys ``metrics.json`` must hold for a run to be compared.
INFO_KEYS: tuple[str, ...] = ("algo", "label", "env", "dist", "seed", "finetune")
#: Keys the ``metrics.json`` of a vision run must hold.
VISION_INFO_KEYS: tuple[str, ...] = ("task", "algo", "label", "data", "partition", "seed", "finetune")


class RunDirError(ValueError):
    """A run directory that is incomplete or malformed; the message names it and the problem.

    :param path: the run directory
    :param reason: what is wrong with it
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def read_info(path: Path) -> dict[str, Any]:
    """``metrics.json`` of the run directory ``path``, with the keys of its task.

    :class:`RunDirError` if it is absent (the run did not finish, or was stopped: then how to
    continue it), unreadable, not an object or lacks :data:`INFO_KEYS` (:data:`VISION_INFO_KEYS`
    for a vision run).

    :param path: the run directory
    """
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
    if info.get("task") == "vision" and "partition" not in info and "dist" in info:
        info["partition"] = info.pop("dist")  # a vision run from before the partition group had its own name
    missing = [k for k in (VISION_INFO_KEYS if info.get("task") == "vision" else INFO_KEYS) if k not in info]
    if missing:
        raise RunDirError(path, f"malformed metrics.json: missing key(s) {missing}")
    return info


def load_config(path: Path) -> object:
    """``config.yaml`` of the run directory ``path``, resolved into plain containers.

    :class:`RunDirError` if it cannot be read or parsed.

    :param path: the run directory
    """
    try:
        return OmegaConf.to_container(OmegaConf.load(path / "config.yaml"), resolve=True)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise RunDirError(path, f"malformed config.yaml: {exc}") from None


def read_config(path: Path) -> tuple[dict[str, Any], EnvSpec]:
    """``config.yaml`` of the RL run directory ``path`` and the environment spec of its ``env`` node.

    :class:`RunDirError` if it is absent, malformed or has no valid ``env`` section.

    :param path: the run directory
    """
    if not (path / "config.yaml").is_file():
        raise RunDirError(path, "malformed: no config.yaml")
    config = load_config(path)
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


def read_final(
    path: Path, spec: EnvSpec, n_clients: Any
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]:
    """The clients' weights, returns and env steps from ``final.csv`` of the RL run directory ``path``.

    :class:`RunDirError` if it lacks a weight or return column of ``spec``'s objectives, has not one
    row per client, or has non-numeric, non-finite or negative values.

    :param path: the run directory
    :param spec: the run's environment spec (its number of objectives)
    :param n_clients: ``config.yaml``'s ``n_clients`` (checked when it is an integer)

    :return: ``[n, m]`` weights, ``{kind: [n, m]}`` returns of every kind in
        :data:`morlfed.metrics.RETURN_KINDS`, and the ``[n]`` env steps and loss-evaluation env
        steps per client (each ``None`` for a run that did not record them); rows sorted by client
    """
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

    A cluster is a non-empty group of clients: a strategy with a fixed number of models (IFCA) logs
    one list per model, empty for a model no client deploys, and those are left out.

    :param records: the records, one per aggregated round
    """
    return {int(r["round"]): [[int(c) for c in cl] for cl in r["clusters"] if cl] for r in records if "clusters" in r}


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


def check_agreement(path: Path, info: dict[str, Any], clients: int, rounds: pd.DataFrame) -> None:
    """A finished run's files tell of the same run: ``final.csv``'s clients and ``rounds.csv``'s rounds are ``metrics.json``'s.

    ``final.csv`` has a row per client of ``n_clients`` and ``rounds.csv`` a row per round 1..``rounds``,
    in order; :class:`RunDirError` naming the file that disagrees (a truncated, stale or foreign file)
    otherwise. A ``metrics.json`` from before it recorded ``n_clients`` and ``rounds`` is not checked.

    :param path: the run directory
    :param info: its ``metrics.json``
    :param clients: the clients ``final.csv`` has
    :param rounds: its ``rounds.csv``
    """
    n_clients, n_rounds = info.get("n_clients"), info.get("rounds")
    if isinstance(n_clients, int) and clients != n_clients:
        raise RunDirError(path, f"final.csv has {clients} clients where metrics.json says n_clients={n_clients}")
    if isinstance(n_rounds, int):
        logged = pd.to_numeric(rounds["round"], errors="coerce").tolist() if "round" in rounds else []
        if logged != list(range(1, n_rounds + 1)):
            got = (
                f"rounds {int(logged[0])}-{int(logged[-1])}"
                if logged and all(r == r for r in logged)
                else "no usable rounds"
            )
            raise RunDirError(
                path,
                f"rounds.csv logs {got} ({len(logged)} rows) where metrics.json says rounds={n_rounds} "
                "(truncated, stale or another run's)",
            )


def read_vision_final(path: Path, n_clients: Any) -> pd.DataFrame:
    """``final.csv`` of the vision run directory ``path``, one row per client sorted by id.

    :class:`RunDirError` if it lacks an accuracy column, has not one row per client, or an
    accuracy is not a percentage in [0, 100].

    :param path: the run directory
    :param n_clients: ``config.yaml``'s ``n_clients`` (checked when it is an integer)
    """
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
