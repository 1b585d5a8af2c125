"""A run directory, written atomically.

Layout (README.md#a-run-directory): ``config.yaml preferences.csv rounds.csv clusters.jsonl final.csv
metrics.json front.png clusters.png similarity_<round>.npy checkpoints/``. Every file is written
to a temporary file in the same directory and renamed into place, so a reader never sees half a
file; ``metrics.json`` is written last, only when the run completed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morlfed.core.protocol import Evaluation

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give them the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically."""
    atomic_write_bytes(path, text.encode())


def csv_text(rows: Sequence[Mapping[str, Any]], fieldnames: Sequence[str] | None = None) -> str:
    """Rows of dicts as CSV text (header from the first row unless given)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fieldnames or (rows[0].keys() if rows else [])))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def to_json(obj: Any, indent: int | None = None) -> str:
    """JSON text that accepts numpy scalars and arrays."""
    return json.dumps(obj, indent=indent, default=_json_default)


class RunDirectory:
    """Writes one run's files.

    :param path: the directory (created if missing)
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._rounds: list[dict[str, Any]] = []
        self._clusters: list[str] = []

    def write_text(self, name: str, text: str) -> None:
        """Write a text file atomically."""
        atomic_write_text(self.path / name, text)

    def write_csv(self, name: str, rows: Sequence[Mapping[str, Any]], fieldnames: Sequence[str] | None = None) -> None:
        """Write rows as CSV atomically."""
        self.write_text(name, csv_text(rows, fieldnames))

    def write_json(self, name: str, obj: Any) -> None:
        """Write JSON atomically."""
        self.write_text(name, to_json(obj, indent=2) + "\n")

    def write_similarity(self, round: int, n_clients: int, blocks: Mapping[tuple[int, ...], torch.Tensor]) -> None:
        """Write ``similarity_<round>.npy``: the ``[n, n]`` matrix of a round's similarity blocks, NaN elsewhere.

        :param round: the round the blocks were computed in
        :param n_clients: the run's number of clients
        :param blocks: ``{client ids: [k, k] similarities}``, one per cluster with participants
        """
        full = np.full((n_clients, n_clients), np.nan, dtype=np.float32)
        for cids, block in blocks.items():
            full[np.ix_(cids, cids)] = block.numpy()
        self.write_npy(f"similarity_{round}.npy", full)

    def write_npy(self, name: str, array: np.ndarray) -> None:
        """Write a ``.npy`` array atomically."""
        buf = io.BytesIO()
        np.save(buf, array)
        atomic_write_bytes(self.path / name, buf.getvalue())

    def log_round(self, row: Mapping[str, Any]) -> None:
        """Append a row to ``rounds.csv`` (the whole file is rewritten atomically)."""
        self._rounds.append(dict(row))
        self.write_csv("rounds.csv", self._rounds)

    def update_last_round(self, values: Mapping[str, Any]) -> None:
        """Set columns of the last ``rounds.csv`` row (rewritten atomically)."""
        self._rounds[-1].update(values)
        self.write_csv("rounds.csv", self._rounds)

    def log_clusters(self, record: Mapping[str, Any]) -> None:
        """Append a JSON line to ``clusters.jsonl`` (rewritten atomically)."""
        self._clusters.append(to_json(record))
        self.write_text("clusters.jsonl", "\n".join(self._clusters) + "\n")

    def log_evaluations(self, round: int, evaluations: Mapping[int, Evaluation]) -> None:
        """Add the deployed models' evaluations after ``round`` to ``evaluations.csv`` (rewritten atomically).

        One row per client: ``round, client, scalarised, scalarised_discounted``, then each entry of
        its ``vector_return_<k>`` and ``discounted_return_<k>``. Rows of this round or a later one,
        written before a run resumed from an earlier checkpoint, are replaced.

        :param round: the round after which the models were evaluated
        :param evaluations: each client's evaluation
        """
        path = self.path / "evaluations.csv"
        earlier = csv.DictReader(io.StringIO(path.read_text())) if path.is_file() else []
        kept: list[dict[str, Any]] = [dict(r) for r in earlier if int(r["round"]) < round]
        new: list[dict[str, Any]] = [
            {
                "round": round,
                "client": cid,
                "scalarised": ev.scalarised,
                "scalarised_discounted": ev.scalarised_discounted,
            }
            | {f"vector_return_{k}": float(v) for k, v in enumerate(np.atleast_1d(ev.vector_return))}
            | {f"discounted_return_{k}": float(v) for k, v in enumerate(np.atleast_1d(ev.discounted_return))}
            for cid, ev in sorted(evaluations.items())
        ]
        self.write_csv("evaluations.csv", kept + new)

    def restore_logs(self, rounds: Iterable[Mapping[str, Any]], clusters: Iterable[str]) -> None:
        """Reload earlier rows (when resuming a run)."""
        self._rounds = [dict(r) for r in rounds]
        self._clusters = list(clusters)
