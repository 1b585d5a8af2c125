"""Checkpoints of a run, written atomically under ``RUN_DIR/checkpoints/``, checked and read back.

A checkpoint after round r is the directory ``checkpoints/round_<r>/`` with

* ``server.safetensors`` (:data:`SERVER`): the round, the strategy's ``state_dict`` (its RNG state
  included), the "+FT" models kept so far, the main process' global RNG states, the text of
  ``rounds.csv`` and ``clusters.jsonl`` up to round r, and the run's loop seconds until then;
* ``clients/client_<cid>.safetensors``: every client's ``get_state()`` (for an RL client: networks
  and optimiser(s), replay buffer arrays, step/update counters, exploration rate, episode records),
  written by the process that owns the client;
* ``models/``: every client's deployed model after round r, in the run's ``models/`` format
  (:mod:`morlfed.federation.deployment`), for those who want the models rather than the run's state;
* ``manifest.json`` (:mod:`morlfed.storage.manifest`): the SHA-256 and size of every other file below the
  checkpoint's directory, whatever wrote it, written last.

Every state file holds data only (:mod:`morlfed.storage.safestate`: tensors, numbers, strings, lists), so
reading a checkpoint never runs code, whoever wrote it. A checkpoint is assembled in a hidden
temporary directory and renamed into place, so a reader (or a resume after a crash, even SIGKILL in
the middle of writing) only ever sees complete checkpoints; older ones are deleted afterwards,
except those that ``checkpoint_every`` (or ``also``) keeps. Before a run starts from a checkpoint
(:meth:`Checkpointer.usable`), every file is checked against the manifest and every state file's
format is read: a damaged checkpoint is named and refused, and the latest complete one before it is
used instead. The federation writes one after every round but the last, so that a stop (Ctrl-C,
SIGTERM, a crash, even SIGKILL) loses at most the round in progress; those that
``checkpoint_every`` (or ``also``) did not ask for are removed when the run completes
(:meth:`Checkpointer.finish`). Client RNGs need no saving: a client reseeds every generator from
(seed, client, round) at each fit, so a resumed run repeats exactly what the uninterrupted run would
have done.

``python -m morlfed.run resume=RUN_DIR`` continues from the latest checkpoint and
``branch_from=RUN_DIR`` starts a new run from it (command lines and checks: :mod:`morlfed.cli.resume`);
a run stopped by a signal keeps its latest (:mod:`morlfed.core.interrupt`). Checkpoints that an earlier
morlfed pickled (``server.pt``) are refused with the command that converts them
(:mod:`morlfed.cli.convert`, for run directories the user trusts).
"""

from __future__ import annotations

import csv
import io
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morlfed.federation.deployment import MODELS, Deployment, check_models
from morlfed.runtime.executors import Executor
from morlfed.storage.manifest import MANIFEST, CorruptError, verify_manifest, write_manifest
from morlfed.storage.safestate import CONVERT, UnsafeStateError, check_state, load_state, save_state

CHECKPOINTS = "checkpoints"
#: The server state's file in a checkpoint.
SERVER = "server.safetensors"
#: What an earlier morlfed called it (a pickle).
PICKLED_SERVER = "server.pt"
_ROUND_DIR = re.compile(r"^round_(\d+)$")


class Checkpointer:
    """Writes checkpoints of one run and finds the latest.

    :param run_path: the run directory
    :param every: keep the one after every ``every``-th round once the run completes (0: none)
    :param also: rounds whose checkpoint is kept as well (``branch_siblings``: the round before the last)
    """

    def __init__(self, run_path: Path, every: int = 0, also: tuple[int, ...] = ()) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(
                f"checkpoint_every must be an integer >= 0 (0: none kept once the run completes), got {every!r}"
            )
        self.root = Path(run_path) / CHECKPOINTS
        self.every = every
        self.also = frozenset(also)

    def due(self, round: int) -> bool:
        """Whether the checkpoint after round ``round`` is one to keep (``every``, ``also``).

        :param round: a round (1-based)
        """
        return (self.every > 0 and round % self.every == 0) or round in self.also

    def save(
        self, round: int, server_state: dict[str, Any], executor: Executor, deployment: Deployment | None = None
    ) -> Path:
        """Write the checkpoint after ``round`` atomically and make it the executor's restore point.

        Every earlier checkpoint that is not one to keep (:meth:`due`), and any leftover temporary
        directory, is deleted afterwards.

        :param round: the round just completed
        :param server_state: what ``server.safetensors`` holds (see the module docstring)
        :param executor: the executor whose clients are saved
        :param deployment: the clients' deployed models after ``round``, written to ``models/`` (``None``: none)
        :return: the checkpoint's directory
        """
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-round_{round}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "clients").mkdir(parents=True)
        try:
            executor.save_clients(tmp / "clients")
            save_state(tmp / SERVER, server_state)
            if deployment is not None:
                deployment.write(tmp / MODELS)
            write_manifest(tmp)  # last: it lists every file written above
            _fsync_tree(tmp)
            final = self.root / f"round_{round}"
            if final.exists():  # left by an earlier attempt at the same round
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        executor.restore_dir = final / "clients"
        for other in self.root.iterdir():
            match = _ROUND_DIR.match(other.name)
            # the checkpoints of the rounds to keep (due) stay; any other was there only for a stop
            if other != final and (other.name.startswith(".tmp-") or (match and not self.due(int(match.group(1))))):
                shutil.rmtree(other, ignore_errors=True)
        return final

    def finish(self) -> None:
        """The run completed: remove its latest checkpoint unless it is one to keep (:meth:`due`).

        It was there only for a stop; the checkpoints folder goes too if that leaves it empty.
        """
        latest = self.latest()
        if latest is not None and not self.due(checkpoint_round(latest)):
            shutil.rmtree(latest)
            if not any(self.root.iterdir()):
                self.root.rmdir()

    def latest(self, before: int | None = None) -> Path | None:
        """The latest complete checkpoint (one with its manifest), or ``None``; its files are not checked here.

        :param before: only a checkpoint after a round earlier than this one counts (``None``: any)
        """
        found = self._complete(before)
        return found[0] if found else None

    def _complete(self, before: int | None) -> list[Path]:
        """The complete checkpoints (with a manifest), latest first."""
        if not self.root.is_dir():
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if (m := _ROUND_DIR.match(p.name)) and (p / MANIFEST).is_file()
        ]
        return [p for r, p in sorted(found, reverse=True) if before is None or r < before]

    def usable(self, before: int | None = None) -> tuple[Path | None, list[str]]:
        """The latest checkpoint whose files are intact, and why any later one was refused.

        Each complete checkpoint, latest first, is checked (:func:`check_checkpoint`); a damaged one
        is passed over, and the reason, which names the file, is returned with the one found.

        :param before: only a checkpoint after a round earlier than this one counts (``None``: any)
        :return: the checkpoint (``None``: none is intact) and the reasons for those refused
        :raises ValueError: the checkpoints were pickled by an earlier morlfed (the message says how to convert them)
        """
        refused = []
        for path in self._complete(before):
            try:
                check_checkpoint(path)
            except (CorruptError, UnsafeStateError) as exc:
                refused.append(str(exc))
                continue
            return path, refused
        if not refused and self.root.is_dir() and any(self.root.glob(f"round_*/{PICKLED_SERVER}")):
            raise ValueError(
                f"{self.root}: checkpoints pickled by an earlier morlfed, which can run code when read: refused; "
                f"if you trust this run directory, convert them with {CONVERT}"
            )
        return None, refused


def check_checkpoint(path: Path) -> None:
    """Check a checkpoint's files against its manifest and read each state and model file's format (no tensor data).

    :param path: a checkpoint directory
    :raises CorruptError: a file is missing, altered or unlisted (the message names it)
    :raises UnsafeStateError: a state file is not one that holds data only (a pickle, ...)
    """
    verify_manifest(path)
    check_state(Path(path) / SERVER)
    for client in sorted((Path(path) / "clients").glob("*.safetensors")):
        check_state(client)
    if (Path(path) / MODELS).is_dir():
        check_models(Path(path) / MODELS)


def checkpoint_round(path: Path) -> int:
    """The round after which the checkpoint ``.../round_<r>`` was written.

    :param path: a checkpoint directory
    :raises ValueError: ``path`` is not named ``round_<r>``
    """
    matched = _ROUND_DIR.match(Path(path).name)
    if matched is None:
        raise ValueError(f"{path} is not a checkpoint directory (round_<r>)")
    return int(matched.group(1))


def load_server_state(path: Path) -> dict[str, Any]:
    """The server state of the checkpoint at ``path`` (data only: :mod:`morlfed.storage.safestate`).

    :param path: a checkpoint directory
    :raises UnsafeStateError: the file is not a state file (the message names it)
    """
    state = load_state(Path(path) / SERVER)
    if not isinstance(state, dict) or not isinstance(state.get("round"), int):
        raise UnsafeStateError(f"{Path(path) / SERVER}: not a server state (no round)")
    return state


def global_rng_state() -> dict[str, Any]:
    """This process' global RNG states (python, numpy, torch)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_global_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`global_rng_state` returned.

    :param state: what :func:`global_rng_state` returned
    """
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def read_log(path: Path) -> str:
    """A log file's text (empty if it does not exist yet).

    :param path: the log file
    """
    return path.read_text() if path.is_file() else ""


def csv_rows(text: str) -> list[dict[str, str]]:
    """The rows of a CSV text.

    :param text: CSV with a header line
    """
    return list(csv.DictReader(io.StringIO(text)))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for sub in path.rglob("*"):
        if sub.is_file():
            with open(sub, "rb") as fh:
                os.fsync(fh.fileno())
    for sub in [path, *[p for p in path.rglob("*") if p.is_dir()]]:
        _fsync_dir(sub)
