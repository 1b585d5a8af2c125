"""The command line's run of a composed configuration: :func:`build_plan` and :func:`execute`.

Hydra composes the configuration (``python -m morlfed.run``, :mod:`morlfed.run`; or
:mod:`morlfed.cli.compose` from Python values); :func:`build_plan` validates it and builds the
task and strategy it names, handing them to :func:`~morlfed.experiment.build_experiment` (the
plain-Python core), and :func:`execute` runs the result with
:func:`~morlfed.experiment.carry_out` in the run directory hydra's configuration names, hydra's
part (the run directory, the groups' options) passed explicitly as a :class:`Job`. Bad input is a
:class:`~morlfed.core.settings.ConfigError` with one line, and no run directory is left behind.
"""

from __future__ import annotations

import errno
import logging
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from morlfed.cli.config_groups import help_groups, task_class
from morlfed.cli.overrides import check_creatable, check_new_run_dir
from morlfed.cli.resume import (
    branch_point,
    record_sweep_job,
    resume_command,
    resume_point,
    sibling_source,
)
from morlfed.cli.startstop import record_stop
from morlfed.core.interrupt import RunStopped, StopNow, StopSignals
from morlfed.core.settings import ConfigError, check_settings
from morlfed.experiment import Experiment, Settings, Start, build_experiment, carry_out
from morlfed.experiment.launch import remove_new_run_dir
from morlfed.storage.runlock import run_dir_lock
from morlfed.strategies.base import Strategy
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
    same config (:func:`~morlfed.cli.resume.sibling_source`), or ``(None, None)``. A resumed run
    that kept no checkpoint of its own starts again as it first started: a branch (its saved
    ``branch_from``, or a sibling) from its source's checkpoint. Raises :class:`ConfigError` for a
    command line or run directory that does not allow it.
    """
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
                where = f"continuing from {checkpoint}" if checkpoint is not None else "starting again"
                log.warning("checkpoint refused: %s; %s", why, where)  # (on the console too)
            if checkpoint is not None:
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
    SIGINT and SIGTERM stop it within seconds (:mod:`morlfed.core.interrupt`), keeping the last
    completed round's checkpoint.

    :param cfg: the composed configuration
    :param job: its directory, options and overrides (default: the current hydra config's)
    :param strategy: a strategy object that takes the place of ``cfg.algo``
    :raises ConfigError: bad input; the run directory made for the run is removed again
    :raises RunStopped: a signal stopped the run; its directory is marked stopped (a second signal
        raises :class:`~morlfed.core.interrupt.StopNow`, a ``SystemExit``)
    """
    job = Job.of(HydraConfig.get()) if job is None else job
    out = job.out
    with StopSignals() as stop, run_dir_lock(out):  # one writer per run directory
        plan, start = prepare(cfg, job, stop, strategy)
        try:
            stop.check()
            return carry_out(plan, out, start, stop)
        except (RunStopped, StopNow) as exc:
            record_stop(out, plan.fed.rounds, exc.signal)
            raise


def prepare(cfg: DictConfig, job: Job, stop: StopSignals, strategy: Strategy | None = None) -> tuple[Experiment, Start]:
    """Check the job's directory, build its plan and find where it starts; nothing trained yet.

    :param cfg: the composed configuration
    :param job: its directory (its lock held by the caller), options and overrides
    :param stop: the run's signal handling, entered by the caller
    :param strategy: a strategy object that takes the place of ``cfg.algo``
    :raises ConfigError: bad input; the run directory made for the run is removed again
    :raises RunStopped: a signal stopped the start-up (the directory is removed again)
    """
    out = job.out
    try:
        with stop.interruptible():  # a signal stops the start-up at once: nothing is written yet
            check_creatable(out)
            if not cfg.resume:  # a sweep's job folder that holds an earlier run (a hydra.run.dir is checked first)
                check_new_run_dir(out, job.dir_key, ignore={".hydra", "run.log"})
                if job.dir_key == "hydra.sweep.dir":
                    record_sweep_job(out)
            plan = build_plan(cfg, job.choices, strategy, " ".join(job.overrides))
            checkpoint, source = _start_point(cfg, out)
            if cfg.branch_from:  # a resumed branch continues in place, and is still a branch of its source
                plan.run.branched_from = Path(cfg.branch_from).absolute()
    except ConfigError:
        remove_new_run_dir(out)
        raise
    except (RunStopped, StopNow) as exc:
        remove_new_run_dir(out)
        print(f"morlfed: stopped by {exc.signal.name} while starting; no round ran", file=sys.stderr)
        raise
    return plan, Start(checkpoint, source, resumed=bool(cfg.resume), keep_before_last=cfg.branch_siblings)


# conf/config.yaml's help template calls it as ${morlfed_groups:}
OmegaConf.register_new_resolver("morlfed_groups", help_groups, replace=True)
# the default run and sweep directories end in ${morlfed_id:}: runs started in the same second get
# directories of their own; cached per configuration, so every job of a sweep shares its folder
OmegaConf.register_new_resolver("morlfed_id", lambda: secrets.token_hex(3), use_cache=True, replace=True)
