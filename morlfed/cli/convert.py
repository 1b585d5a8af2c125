"""``python -m morlfed.cli.convert RUN_DIR...``: rewrite the pickled checkpoints of run directories you trust as data-only files.

Before checkpoints held data only (:mod:`morlfed.storage.safestate`), morlfed wrote them with
``torch.save``: ``checkpoints/round_<r>/server.pt`` and ``clients/client_<cid>.pt``. Reading such a
file runs whatever code its pickle names, so a run refuses them, with this command in its message.
For a run directory you trust (you wrote it, or know who did), this command reads each such file
once with pickle, turns the objects it holds into data (:func:`plain`: an SB3 replay buffer into its
arrays and position, a deque into a list, as today's clients save them), and writes the checkpoint
again as today's runs do: ``server.safetensors``, ``clients/client_<cid>.safetensors`` and, last,
its manifest. Each checkpoint is replaced atomically, under the run directory's lock. Never run it
on a directory from someone you do not trust: reading it runs their code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morlfed.core.settings import ConfigError
from morlfed.federation.checkpoint import CHECKPOINTS, PICKLED_SERVER, SERVER
from morlfed.runtime.executors import state_file
from morlfed.storage.manifest import write_manifest
from morlfed.storage.runlock import run_dir_lock
from morlfed.storage.safestate import plain_attributes, save_state

PROG = "python -m morlfed.cli.convert"


def plain(obj: Any) -> Any:
    """``obj`` as data only: dicts, lists, tuples, scalars, strings, tensors and arrays.

    A deque becomes a list, and an object of another class its data attributes
    (:func:`~morlfed.storage.safestate.plain_attributes`).

    :param obj: what an earlier morlfed pickled
    """
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, deque)):
        return [plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(plain(v) for v in obj)
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor, np.ndarray, np.generic)):
        return obj
    return {k: plain(v) for k, v in plain_attributes(obj).items()}


def convert_checkpoint(path: Path) -> None:
    """Rewrite the pickled checkpoint ``path`` (``checkpoints/round_<r>``) as data-only files, atomically.

    :param path: a checkpoint directory holding ``server.pt``
    """
    path = Path(path)
    new, old = path.with_name(f".tmp-convert-{path.name}"), path.with_name(f".tmp-old-{path.name}")
    for leftover in (new, old):
        shutil.rmtree(leftover, ignore_errors=True)
    (new / "clients").mkdir(parents=True)
    save_state(new / SERVER, plain(torch.load(path / PICKLED_SERVER, weights_only=False)))
    for pickled in sorted((path / "clients").glob("client_*.pt")):
        cid = int(pickled.stem.removeprefix("client_"))
        save_state(state_file(new / "clients", cid), plain(torch.load(pickled, weights_only=False)))
    write_manifest(new)
    os.rename(path, old)
    os.rename(new, path)
    shutil.rmtree(old)


def convert_run(run_dir: Path) -> list[Path]:
    """Convert every pickled checkpoint of the run directory ``run_dir``, holding its lock; the checkpoints converted.

    :param run_dir: a run directory
    :raises ConfigError: not a run directory, or another run holds it
    """
    run_dir = Path(run_dir)
    if not (run_dir / ".hydra" / "overrides.yaml").is_file():
        raise ConfigError(f"{run_dir}: not a morlfed run directory (no .hydra/overrides.yaml)")
    with run_dir_lock(run_dir):
        found = sorted(p.parent for p in (run_dir / CHECKPOINTS).glob(f"round_*/{PICKLED_SERVER}"))
        for path in found:
            convert_checkpoint(path)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 done, 2 not a run directory or in use).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories you trust")
    args = parser.parse_args(argv)
    for run in args.runs:
        try:
            done = convert_run(run)
        except ConfigError as exc:
            print(f"morlfed: error: {exc}", file=sys.stderr)
            return 2
        print(f"{run}: {len(done)} checkpoint(s) converted" + (f" ({', '.join(p.name for p in done)})" if done else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
