"""A run at the edges of its life: its directory held before hydra writes into it, or marked when a signal stops the run.

:func:`early_lock` takes the run directory's lock (:mod:`morlfed.storage.runlock`) for a command line that
names it (``hydra.run.dir=``, ``resume=``) before hydra writes its ``.hydra/`` and ``run.log``
there, so a second run or resume of it is refused before it touches anything.
:func:`record_stop` writes ``stopped.json`` (:mod:`morlfed.storage.runstatus`) for a run that a signal stopped.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from pathlib import Path

from morlfed.cli.overrides import SHOW_FLAGS, check_new_run_dir, parse
from morlfed.cli.resume import resume_command
from morlfed.experiment.launch import remove_new_run_dir
from morlfed.federation.checkpoint import Checkpointer, checkpoint_round
from morlfed.storage.runlock import run_dir_lock
from morlfed.storage.runstatus import StopRecord, write_stopped

log = logging.getLogger("morlfed.run")


def early_lock(argv: list[str]) -> contextlib.ExitStack:
    """The run directory's lock, held, for a command line that runs one job in a directory it names.

    The directory is checked again once the lock is held (a run that ended between the command
    line's checks and now has left its files there), and removed again at the exit if it was made
    here and is still empty. Nothing is held for a sweep, a default directory or ``--help``: each
    run takes its own lock when it starts (:func:`morlfed.cli.execute.execute`).

    :param argv: the command line's arguments (after ``resume=`` expansion and its checks)
    :return: an exit stack that releases the lock
    :raises RunDirBusy: another run holds the directory
    :raises ConfigError: the directory holds another run by now
    """
    stack = contextlib.ExitStack()
    if {"-m", "--multirun"} & set(argv) or any(a.split("=")[0] in SHOW_FLAGS for a in argv):
        return stack
    overrides = parse(argv)
    named = [str(o.value()) for o in overrides if o.key_or_group == "hydra.run.dir"]
    if not named:
        return stack
    path = Path(named[-1])
    made = not path.exists()
    stack.enter_context(run_dir_lock(path))
    if made:
        stack.callback(_remove_if_empty, path)
    if not any(o.key_or_group == "resume" for o in overrides):
        try:
            check_new_run_dir(path, "hydra.run.dir")
        except BaseException:
            stack.close()
            raise
    return stack


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def record_stop(out: Path, rounds: int, sig: signal.Signals) -> None:
    """A signal stopped the run: mark its directory stopped, log it and print the command that continues it.

    The mark is ``stopped.json`` (a stopped run never looks finished); the log is ``run.log``. A run
    stopped before it wrote anything of its own leaves no directory; one that completed before the
    signal could stop it is left as it is.

    :param out: the run directory
    :param rounds: the rounds configured
    :param sig: the signal
    """
    if (out / "metrics.json").is_file():
        return  # it completed before the signal could stop it
    if not (out / "config.yaml").is_file():
        remove_new_run_dir(out)
        print(f"morlfed: stopped by {sig.name} before the run started; nothing was kept", file=sys.stderr)
        return
    latest = Checkpointer(out).latest()
    command = resume_command(out)
    done = checkpoint_round(latest) if latest is not None else 0
    record = StopRecord(sig.name, done, rounds, str(latest.relative_to(out)) if latest else None, command)
    write_stopped(out, record)
    kept = f"checkpoint {latest}" if latest is not None else "no round completed: it continues from the start"
    log.info("%s (%s); continue with: %s", record.describe(), kept, command)
    print(f"morlfed: {record.describe()} ({kept})\ncontinue with: {command}", file=sys.stderr)
