"""What a run directory holds: a finished run, a stopped one, an unfinished one, or no run.

``metrics.json`` marks a finished run (written last). A run that a signal stops (Ctrl-C, SIGTERM:
:mod:`morlfed.core.interrupt`) writes ``stopped.json`` (:data:`STOPPED`): the signal, the rounds done
and configured, the checkpoint it keeps and the command that continues it; the resumed run removes
it when it starts. A later run reads this to refuse a directory that holds another run
(:func:`describe_run_dir`), and ``analysis`` to say what a partial run is.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

from morlfed.storage.rundir import atomic_write_text, to_json
from morlfed.storage.runlock import LOCK

#: The marker of a run stopped by a signal.
STOPPED = "stopped.json"
#: Files and folders that only a run writes into its directory.
RUN_FILES: tuple[str, ...] = ("config.yaml", "rounds.csv", "final.csv", "metrics.json", "checkpoints", STOPPED)


@dataclass
class StopRecord:
    """What ``stopped.json`` says.

    :param signal: the signal that stopped the run (``SIGINT``, ``SIGTERM``)
    :param rounds_done: the rounds completed and kept (the checkpoint's round; 0 before the first)
    :param rounds: the rounds configured
    :param checkpoint: the checkpoint kept, relative to the run directory (``None``: none yet; the
        resumed run starts from the beginning)
    :param resume: the command that continues the run
    """

    signal: str
    rounds_done: int
    rounds: int
    checkpoint: str | None
    resume: str

    def describe(self) -> str:
        """``stopped by SIGTERM after 4 of 20 rounds``."""
        return f"stopped by {self.signal} after {self.rounds_done} of {self.rounds} rounds"


def write_stopped(path: Path, record: StopRecord) -> None:
    """Mark the run directory ``path`` as stopped (atomically).

    :param path: the run directory
    :param record: what stopped it and how to continue
    """
    atomic_write_text(Path(path) / STOPPED, to_json(asdict(record), indent=2) + "\n")


def read_stopped(path: Path) -> StopRecord | None:
    """The stop record of the run directory ``path``; ``None`` if it has none (or an unreadable one).

    :param path: the run directory
    """
    try:
        return StopRecord(**json.loads((Path(path) / STOPPED).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def clear_stopped(path: Path) -> None:
    """Remove the stop record of the run directory ``path`` (the run goes on again).

    :param path: the run directory
    """
    (Path(path) / STOPPED).unlink(missing_ok=True)


def describe_run_dir(path: Path, ignore: Collection[str] = ()) -> str | None:
    """What the directory ``path`` holds, for a message refusing to write into it.

    ``None`` when it does not exist or holds nothing but ``ignore`` (and a lock file nobody holds), else ``a finished run
    (metrics.json)``, ``a run stopped by SIGTERM after 4 of 20 rounds``, ``an unfinished run ...``
    or ``files of its own (...)``.

    :param path: a directory
    :param ignore: names of entries to overlook
    """
    path = Path(path)
    entries = sorted(p.name for p in path.iterdir() if p.name not in {*ignore, LOCK}) if path.is_dir() else []
    if not entries:
        return None
    if "metrics.json" in entries:
        return "a finished run (metrics.json)"
    stopped = read_stopped(path)
    if stopped is not None:
        return f"a run {stopped.describe()}"
    if any(name in entries for name in RUN_FILES):
        return "an unfinished run (no metrics.json: still running, killed or failed)"
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    return f"files of its own ({shown})"
