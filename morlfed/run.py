"""The command line: ``python -m morlfed.run [overrides]``.

Composes the hydra config (``task``, ``dist``, ``algo``, ``executor`` groups, the task's own
groups such as ``env``, and top-level fields), validates everything before any training starts,
runs the federation, and writes the run directory: ``config.yaml``, the task's inputs,
``rounds.csv clusters.jsonl``, the task's results and (last) ``metrics.json``. Bad input (an
unknown key, a value of the wrong type, a directory that holds another run:
:mod:`morlfed.overrides`) is one line on stderr and exit status 2, with no run directory left
behind. Within seconds of its launch a run prints its directory, budget, engine, executor and
threads; SIGINT and SIGTERM stop it within seconds, marking its directory stopped
(:mod:`morlfed.interrupt`, :mod:`morlfed.runstatus`). ``resume=RUN_DIR`` continues a stopped run
in place; ``branch_from=RUN_DIR finetune=true`` starts its "+FT" variant from its checkpoint
before the last round (:mod:`morlfed.resume`), and ``branch_siblings=true`` does so by itself
within a sweep folder.

The task (``task=``, :mod:`morlfed.tasks`) builds the clients and reports their results; this
module knows nothing about environments or datasets. The command line is a front-end of the
plain-Python core, :mod:`morlfed.experiment`: :func:`build_plan` builds the task and strategy the
configuration names and hands them to :func:`~morlfed.experiment.build_experiment`, and
:func:`execute` runs the result with :func:`~morlfed.experiment.carry_out`, hydra's part (the run
directory, the groups' options) passed explicitly as a :class:`Job`.
"""

from __future__ import annotations

import errno
import logging
import secrets
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import hydra
from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from morlfed.config_groups import help_groups, task_class
from morlfed.console import one_line_warnings
from morlfed.experiment import Experiment, Settings, Start, build_experiment, carry_out
from morlfed.experiment.launch import remove_new_run_dir
from morlfed.interrupt import RunStopped, StopNow, StopSignals, exit_status, leave
from morlfed.overrides import check_creatable, check_new_run_dir, precheck_argv, searchpath_argv
from morlfed.provenance import package_version
from morlfed.resume import (
    RESUME_OR_BRANCH,
    branch_point,
    record_sweep_job,
    resume_argv,
    resume_command,
    resume_point,
    sibling_source,
)
from morlfed.runlock import run_dir_lock
from morlfed.settings import ConfigError, check_settings
from morlfed.startstop import early_lock, record_stop
from morlfed.strategy import Strategy
from morlfed.tracking import tracker_class

EXIT_BAD_INPUT = 2
#: Storage failures a run reports in words, by errno (the latest checkpoint stays for ``resume=``).
STORAGE_ERRORS = {
    errno.ENOSPC: "the disk is full; free space, then continue the run with resume=",
    errno.EDQUOT: "the disk quota is used up; free space, then continue the run with resume=",
    errno.EACCES: "permission denied: the run may not write there",
    errno.EROFS: "the file system is read-only: the run cannot write there",
}
log = logging.getLogger("morlfed.run")  # also when run as __main__


@dataclass(frozen=True)
class Job:
    """What hydra says of this run, passed explicitly: its directory, its config groups' options, its overrides.

    :param out: the run directory (hydra's ``runtime.output_dir``)
    :param choices: each config group's option (``{"algo": "fedpref", "dist": "equidistant", ...}``)
    :param dir_key: how the command line names the directory: ``hydra.run.dir``, or
        ``hydra.sweep.dir`` for a sweep's job (its folder below that)
    :param overrides: the command line's overrides, as ``run.log`` shows them
    """

    out: Path
    choices: Mapping[str, Any]
    dir_key: str = "hydra.run.dir"
    overrides: tuple[str, ...] = ()

    @classmethod
    def of(cls, hydra_cfg: DictConfig | HydraConf) -> Job:
        """The job that hydra's node of a composed configuration describes (``HydraConfig.get()``, ``cfg.hydra``).

        :param hydra_cfg: the ``hydra`` node, its ``runtime.output_dir`` set
        """
        sweep = hydra_cfg.mode == RunMode.MULTIRUN
        return cls(
            Path(hydra_cfg.runtime.output_dir),
            dict(hydra_cfg.runtime.choices),
            "hydra.sweep.dir" if sweep else "hydra.run.dir",
            tuple(hydra_cfg.overrides.task),
        )


def build_plan(
    cfg: DictConfig, choices: Mapping[str, Any] | None = None, strategy: Strategy | None = None, command: str = ""
) -> Experiment:
    """Validate the composed config and build the run's objects (raises :class:`ConfigError`).

    The task, strategy, executor, faults and tracker the configuration names, assembled by the
    core (:func:`~morlfed.experiment.build_experiment`), which validates them as it validates an
    experiment built in Python.

    :param cfg: the composed configuration
    :param choices: each config group's option (default: the current hydra config's)
    :param strategy: a strategy object that takes the place of ``cfg.algo`` (its name: ``choices["algo"]``)
    :param command: the command line's overrides, as ``run.log`` shows them
    """
    choices = HydraConfig.get().runtime.choices if choices is None else choices
    try:
        check_settings(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        kind = task_class(cfg.task.name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    settings = Settings(**{f.name: cfg[f.name] for f in fields(Settings)})
    settings.federation(kind)  # the budget's projection, before the task is built: no budget holds up the start
    try:
        task = kind.from_config(cfg, cfg.n_clients, cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from exc
    if strategy is None:
        try:
            strategy = instantiate(cfg.algo, _convert_="all")
        except Exception as exc:  # hydra wraps constructor errors in InstantiationException
            raise ConfigError(f"algo={choices['algo']}: {exc.__cause__ or exc}") from exc
    tracker_options: dict[str, Any] = OmegaConf.to_container(cfg.logger, resolve=True)  # type: ignore[assignment]
    try:
        tracker = tracker_class(tracker_options.pop("_target_"), choices["logger"])
    except ImportError as exc:
        raise ConfigError(str(exc)) from exc
    return build_experiment(
        task,
        strategy,
        settings,
        executor=cfg.executor.name,
        executor_options={k: v for k, v in cfg.executor.items() if k != "name"},
        faults=OmegaConf.to_container(cfg.faults, resolve=True),  # type: ignore[arg-type]
        tracker=tracker,
        tracker_options=tracker_options,
        algo=choices["algo"],
        heterogeneity=choices[kind.heterogeneity],
        tracker_label=choices["logger"],
        config_yaml=OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"]), resolve=True),
        command=command or "(defaults)",
    )


def _start_point(cfg: DictConfig, out: Path) -> tuple[Path | None, Path | None]:
    """The checkpoint this run starts from and, for a branch, the run it branches from.

    ``resume=RUN_DIR``'s latest (the run continues in place), ``branch_from=RUN_DIR``'s latest
    before its last round, with ``branch_siblings=true`` that of a finished sibling run with the
    same config (:func:`~morlfed.resume.sibling_source`), or ``(None, None)``. Raises
    :class:`ConfigError` for a command line or run directory that does not allow it.
    """
    if cfg.resume and cfg.branch_from:
        raise ConfigError(RESUME_OR_BRANCH)
    if cfg.resume and Path(cfg.resume).absolute() != out.absolute():
        raise ConfigError(
            f"resume={cfg.resume} writes into the run directory itself; run it as "
            f"`{resume_command(Path(cfg.resume))}` (the saved overrides are reapplied)"
        )
    if cfg.branch_from and Path(cfg.branch_from).absolute() == out.absolute():
        raise ConfigError(f"branch_from={cfg.branch_from} writes a new run directory; give another hydra.run.dir")
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    try:
        if cfg.resume:
            checkpoint, refused = resume_point(out, config_yaml)
            for why in refused:  # a damaged later checkpoint: the run goes on from an earlier one
                where = f"continuing from {checkpoint}" if checkpoint is not None else "starting from the beginning"
                log.warning("checkpoint refused: %s; %s", why, where)  # (on the console too)
            return checkpoint, None
        source = Path(cfg.branch_from) if cfg.branch_from else None
        if source is None and cfg.branch_siblings:
            source = sibling_source(out, config_yaml)
        return (branch_point(source, config_yaml), source) if source is not None else (None, None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def execute(cfg: DictConfig, job: Job | None = None, strategy: Strategy | None = None) -> dict[str, Any]:
    """Run one federated experiment as composed, in the job's directory; return its metrics.

    It is the command line's run (:func:`main`) and the programmatic API's
    (:func:`morlfed.api.run_experiment`): both compose the configuration with hydra, build its
    objects (:func:`build_plan`) and run them with the core (:func:`morlfed.experiment.carry_out`).
    SIGINT and SIGTERM stop it within seconds (:mod:`morlfed.interrupt`), keeping the last
    completed round's checkpoint.

    :param cfg: the composed configuration
    :param job: its directory, options and overrides (default: the current hydra config's)
    :param strategy: a strategy object that takes the place of ``cfg.algo``
    :raises ConfigError: bad input; the run directory made for the run is removed again
    :raises RunStopped: a signal stopped the run; its directory is marked stopped (a second signal
        raises :class:`~morlfed.interrupt.StopNow`, a ``SystemExit``)
    """
    job = Job.of(HydraConfig.get()) if job is None else job
    out = job.out
    with StopSignals() as stop, run_dir_lock(out):  # one writer per run directory
        try:
            with stop.interruptible():  # a signal stops the start-up at once: nothing is written yet
                check_creatable(out)
                if not cfg.resume:  # a sweep's job folder that holds an earlier run (a hydra.run.dir is checked first)
                    check_new_run_dir(out, job.dir_key, ignore={".hydra", "run.log"})
                    if job.dir_key == "hydra.sweep.dir":
                        record_sweep_job(out)
                plan = build_plan(cfg, job.choices, strategy, " ".join(job.overrides))
                checkpoint, source = _start_point(cfg, out)
        except ConfigError:
            remove_new_run_dir(out)
            raise
        except (RunStopped, StopNow) as exc:
            remove_new_run_dir(out)
            print(f"morlfed: stopped by {exc.signal.name} while starting; no round ran", file=sys.stderr)
            raise
        try:
            stop.check()
            start = Start(checkpoint, source, resumed=bool(cfg.resume), keep_before_last=cfg.branch_siblings)
            return carry_out(plan, out, start, stop)
        except (RunStopped, StopNow) as exc:
            record_stop(out, plan.fed.rounds, exc.signal)
            raise


# an absolute path: the installed ``morlfed`` script runs this module by name, not as a file
@hydra.main(config_path=str(Path(__file__).resolve().parent / "conf"), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    """The command line's run: :func:`execute`, with bad input as one error line and exit status 2.

    A stopped run exits with the signal's status (:func:`~morlfed.interrupt.exit_status`); a full
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


# conf/config.yaml's help template calls it as ${morlfed_groups:}
OmegaConf.register_new_resolver("morlfed_groups", help_groups, replace=True)
# the default run and sweep directories end in ${morlfed_id:}: runs started in the same second get
# directories of their own; cached per configuration, so every job of a sweep shares its folder
OmegaConf.register_new_resolver("morlfed_id", lambda: secrets.token_hex(3), use_cache=True, replace=True)


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
