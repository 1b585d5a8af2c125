"""A run at the edges of its life: its directory held before hydra writes into it, its launch summary, its directory removed when bad input made it for nothing or marked when a signal stops the run.

:func:`early_lock` takes the run directory's lock (:mod:`morlfed.runlock`) for a command line that
names it (``hydra.run.dir=``, ``resume=``) before hydra writes its ``.hydra/`` and ``run.log``
there, so a second run or resume of it is refused before it touches anything.
:func:`launch_summary` is what a run prints within seconds of its launch.
:func:`remove_new_run_dir` removes the directory made for a run that bad input refused, and
:func:`record_stop` writes ``stopped.json`` (:mod:`morlfed.runstatus`) for a run that a signal stopped.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from morlfed.checkpoint import Checkpointer, checkpoint_round
from morlfed.federation import round_budgets
from morlfed.overrides import SHOW_FLAGS, check_new_run_dir, parse
from morlfed.progress import counted
from morlfed.resume import resume_command
from morlfed.runlock import LOCK, run_dir_lock
from morlfed.runstatus import StopRecord, write_stopped

if TYPE_CHECKING:
    from morlfed.run import Plan

log = logging.getLogger("morlfed.run")


def early_lock(argv: list[str]) -> contextlib.ExitStack:
    """The run directory's lock, held, for a command line that runs one job in a directory it names.

    The directory is checked again once the lock is held (a run that ended between the command
    line's checks and now has left its files there), and removed again at the exit if it was made
    here and is still empty. Nothing is held for a sweep, a default directory or ``--help``: each
    run takes its own lock when it starts (:func:`morlfed.run.execute`).

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


def launch_summary(plan: Plan, out: Path) -> list[str]:
    """The lines the run prints within seconds of its launch.

    Its directory, budget, engine, executor, threads and cores (the settings as the run resolved
    them).

    :param plan: the validated run
    :param out: its directory
    """
    fed = plan.fed
    total = round_budgets(fed).total()
    clients = counted(fed.n_clients, "client") + (
        f" (participation {fed.participation:g})" if fed.participation < 1 else ""
    )
    return [
        f"run directory {out}",
        f"{plan.name}: {counted(fed.rounds, 'round')} x {clients} x {fed.local_steps} {fed.budget_unit} = "
        f"{total:,} {fed.budget_unit}",
        f"{plan.task.describe_training()}; {plan.executor.describe(fed.n_clients)}; "
        f"torch_threads={plan.parallelism.torch_threads}; {plan.parallelism.cores} cores",
    ]


def remove_new_run_dir(path: Path) -> None:
    """Remove the directory hydra made for this run, if it holds nothing but hydra's own files (and the lock).

    Empty folders above it go too, up to the working directory.

    :param path: the run directory
    """
    if path.is_dir() and all(p.name in {".hydra", "run.log", LOCK} for p in path.iterdir()):
        shutil.rmtree(path)
        parent = path.parent
        while parent != parent.parent and parent.is_dir() and not any(parent.iterdir()) and parent != Path.cwd():
            parent.rmdir()
            parent = parent.parent


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
