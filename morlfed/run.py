"""The command line: ``python -m morlfed.run [overrides]``.

Composes the hydra config (``task``, ``dist``, ``algo``, ``executor`` groups, the task's own
groups such as ``env``, and top-level fields), validates everything before any training starts,
runs the federation, and writes the run directory: ``config.yaml``, the task's inputs,
``rounds.csv clusters.jsonl``, the task's results and (last) ``metrics.json``. Bad input (an
unknown key, a value of the wrong type, a directory that holds another run:
:mod:`morlfed.cli.overrides`) is one line on stderr and exit status 2, with no run directory left
behind. Within seconds of its launch a run prints its directory, budget, engine, executor and
threads; SIGINT and SIGTERM stop it within seconds, marking its directory stopped
(:mod:`morlfed.core.interrupt`, :mod:`morlfed.storage.runstatus`). ``resume=RUN_DIR`` continues a stopped run
in place; ``branch_from=RUN_DIR finetune=true`` starts its "+FT" variant from its checkpoint
before the last round (:mod:`morlfed.cli.resume`), and ``branch_siblings=true`` does so by itself
within a sweep folder.

The task (``task=``, :mod:`morlfed.tasks`) builds the clients and reports their results; this
module knows nothing about environments or datasets. The command line is a front-end of the
plain-Python core, :mod:`morlfed.experiment`: :func:`~morlfed.cli.execute.build_plan` builds the task and strategy the
configuration names and hands them to :func:`~morlfed.experiment.build_experiment`, and
:func:`~morlfed.cli.execute.execute` runs the result with :func:`~morlfed.experiment.carry_out`, hydra's part (the run
directory, the groups' options) passed explicitly as a :class:`~morlfed.cli.execute.Job`.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from morlfed.cli.execute import EXIT_BAD_INPUT, STORAGE_ERRORS, execute
from morlfed.cli.overrides import precheck_argv, searchpath_argv
from morlfed.cli.resume import (
    resume_argv,
)
from morlfed.cli.startstop import early_lock
from morlfed.core.console import one_line_warnings
from morlfed.core.interrupt import RunStopped, StopNow, exit_status, leave
from morlfed.core.provenance import package_version
from morlfed.core.settings import ConfigError


# an absolute path: the installed ``morlfed`` script runs this module by name, not as a file
@hydra.main(config_path=str(Path(__file__).resolve().parent / "conf"), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    """The command line's run: :func:`execute`, with bad input as one error line and exit status 2.

    A stopped run exits with the signal's status (:func:`~morlfed.core.interrupt.exit_status`); a full
    disk, a read-only directory or a missing permission is one line too, naming the file (exit
    status 2), and the run keeps its latest checkpoint.
    """
    try:
        return execute(cfg)
    except ConfigError as exc:
        print(f"morlfed: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except (RunStopped, StopNow) as exc:
        leave(exc.signal)
    except OSError as exc:
        if exc.errno not in STORAGE_ERRORS:
            raise
        print(f"morlfed: error: {exc.filename}: {STORAGE_ERRORS[exc.errno]} ({exc.strerror})", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def cli() -> None:
    """Entry point (``morlfed``, ``python -m morlfed.run``): ``--version`` (morlfed's), the checks, the hydra app."""
    if sys.argv[1:] in (["--version"], ["-V"]):
        print(f"morlfed {package_version()}")
        sys.exit(0)
    one_line_warnings()
    try:
        sys.argv[1:] = searchpath_argv(resume_argv(sys.argv[1:]))
        precheck_argv(sys.argv[1:])
        held = early_lock(sys.argv[1:])  # before hydra writes into the run directory
    except ValueError as exc:
        print(f"morlfed: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    with held:
        try:
            main()
        except KeyboardInterrupt:  # Ctrl-C while starting up, before the run handles signals itself
            print("\nmorlfed: interrupted while starting; no run was started", file=sys.stderr)
            sys.exit(exit_status(signal.SIGINT))


if __name__ == "__main__":
    cli()
