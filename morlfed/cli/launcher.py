"""The command line's batched sweep: ``python -m morlfed.run -m ... hydra/launcher=batched``.

Hydra hands a launcher every job of a ``-m`` sweep at once (the launcher's registration is the
plugin ``hydra_plugins.morlfed_launcher``, since hydra takes plugins from that namespace only).
:func:`launch` composes each
job as a single run would be composed (hydra's job directory and ``.hydra/`` files, then
:func:`~morlfed.cli.execute.prepare`: the checks, :func:`~morlfed.cli.execute.build_plan` and the
start point), groups the jobs whose clients can train as one batch
(:func:`~morlfed.experiment.batch.group_runs`), and runs each group in this process with
:func:`~morlfed.experiment.batch.carry_out_batch`; a job that cannot share a batch (another engine,
another task, injected faults) runs alone, as with hydra's own launcher. Every job still writes its
own run directory, with its own numbers.

``hydra.launcher.max_runs=N`` caps the runs per batch (default: as many as the memory rule allows,
:mod:`morlfed.experiment.batch`). ``hydra.launcher.resume=true`` continues a stopped campaign in its
sweep folder (``resume=SWEEP_DIR`` writes that command line: :func:`~morlfed.cli.resume.campaign_argv`):
a finished job is skipped, a started one goes on from its latest checkpoint, the rest start.
"""

from __future__ import annotations

import contextlib
import logging.config
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from morlfed.cli.execute import Job, prepare
from morlfed.cli.startstop import record_stop
from morlfed.core.commands import python
from morlfed.core.interrupt import RunStopped, StopNow, StopSignals, leave
from morlfed.core.settings import ConfigError
from morlfed.experiment import carry_out, run_log
from morlfed.experiment.batch import BatchRun, carry_out_batch, group_runs
from morlfed.storage.runlock import run_dir_lock


def _collect(cfg: DictConfig) -> tuple[DictConfig, Job]:
    """The task function hydra's ``run_job`` calls for each job here: the job's config and directory, nothing run.

    :param cfg: the job's composed configuration
    """
    return cfg, Job.of(HydraConfig.get())


def launch(
    config: DictConfig,
    hydra_context: HydraContext,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    max_runs: int | None = None,
    resume: bool = False,
) -> list[JobReturn]:
    """Compose every job, then run them batch by batch; each job's return (see the module docstring).

    A signal stops the sweep: each run of the batch in progress is marked stopped and keeps its
    latest checkpoint, the command that continues the campaign is printed, and the process exits
    with the signal's status.

    :param config: the sweep's configuration
    :param hydra_context: hydra's context (config loader, callbacks)
    :param job_overrides: each job's overrides
    :param initial_job_idx: the first job's number
    :param max_runs: the most runs per batch (``None``: the memory rule)
    :param resume: continue a stopped campaign in its sweep folder
    """
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    _console_logging(config)
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    returns = [_compose(config, hydra_context, list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
    with StopSignals() as stop, contextlib.ExitStack() as locks:
        try:
            _run(returns, stop, locks, max_runs, resume)
        except (RunStopped, StopNow) as exc:
            folder = Path(str(config.hydra.sweep.dir)).absolute()
            print(
                f"morlfed: continue the campaign with: {python('-m', 'morlfed.run', f'resume={folder}')}",
                file=sys.stderr,
            )
            leave(exc.signal)
    return returns


def _compose(config: DictConfig, hydra_context: HydraContext, overrides: list[str], idx: int) -> JobReturn:
    """One job's config and directory, through hydra's own ``run_job`` (its ``.hydra/`` files).

    :param config: the sweep's configuration
    :param hydra_context: hydra's context
    :param overrides: the job's overrides
    :param idx: the job's number
    """
    sweep_config = hydra_context.config_loader.load_sweep_config(config, overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = idx
        sweep_config.hydra.job.num = idx
    return run_job(
        hydra_context=hydra_context,
        task_function=_collect,
        config=sweep_config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
        configure_logging=False,
    )


def _run(
    returns: list[JobReturn], stop: StopSignals, locks: contextlib.ExitStack, max_runs: int | None, resume: bool
) -> None:
    """Prepare every job (its lock held until the end), then run the batches.

    :param returns: each job's return, its config and directory in it; each gets its outcome
    :param stop: the sweep's signal handling
    :param locks: holds every job's run directory lock until the sweep ends
    :param max_runs: the most runs per batch (``None``: the memory rule)
    :param resume: continue a stopped campaign: skip finished jobs, resume started ones
    """
    prepared: list[tuple[int, BatchRun]] = []
    for index, ret in enumerate(returns):
        cfg, job = ret.return_value
        if resume and (job.out / "metrics.json").is_file():
            print(f"morlfed: {job.out} completed already; skipped", file=sys.stderr)
            _finished(ret, {"skipped": str(job.out)})
            continue
        if resume and (job.out / "config.yaml").is_file():
            with open_dict(cfg):
                cfg.resume = str(job.out)
        locks.enter_context(run_dir_lock(job.out))
        try:
            plan, start = prepare(cfg, job, stop)
        except ConfigError as exc:
            print(f"morlfed: error: {job.out}: {exc}", file=sys.stderr)
            _failed(ret, exc)
            continue
        prepared.append((index, BatchRun(plan, job.out, start)))
    for group in group_runs([run.plan for _, run in prepared], max_runs):
        runs = [prepared[k] for k in group]
        if len(runs) == 1:  # nothing to share: the job runs as composed, on its own executor
            _alone(returns[runs[0][0]], runs[0][1], stop)
            continue
        batch = [run for _, run in runs]
        for (index, _), result in zip(runs, carry_out_batch(batch, stop, _mark_stopped), strict=True):
            if isinstance(result, Exception):
                _failed(returns[index], result)
            else:
                _finished(returns[index], result)


def _alone(ret: JobReturn, run: BatchRun, stop: StopSignals) -> None:
    """A job that shares no batch: the single run's :func:`~morlfed.experiment.carry_out`.

    :param ret: the job's return, which gets its outcome
    :param run: the job's run
    :param stop: the sweep's signal handling
    """
    try:
        with run_log(run.out):
            _finished(ret, carry_out(run.plan, run.out, run.start, stop))
    except (RunStopped, StopNow) as exc:
        record_stop(run.out, run.plan.fed.rounds, exc.signal)
        raise
    except Exception as exc:
        _failed(ret, exc)


def _mark_stopped(run: BatchRun, sig: signal.Signals) -> None:
    """A signal stopped the batch: mark ``run`` stopped (:func:`~morlfed.cli.startstop.record_stop`).

    :param run: a run of the batch
    :param sig: the signal
    """
    record_stop(run.out, run.plan.fed.rounds, sig)


def _finished(ret: JobReturn, value: Any) -> None:
    """Hydra's return of a job that completed (its metrics) or was skipped.

    :param ret: the job's return
    :param value: its metrics
    """
    ret.return_value, ret.status = value, JobStatus.COMPLETED


def _failed(ret: JobReturn, exc: Exception) -> None:
    """Hydra's return of a job that failed; the sweep re-raises it once every job has run.

    :param ret: the job's return
    :param exc: what failed it
    """
    ret.return_value, ret.status = exc, JobStatus.FAILED


def _console_logging(config: DictConfig) -> None:
    """The jobs' console logging (``hydra.job_logging`` without its file: each run writes its own ``run.log``).

    :param config: the sweep's configuration
    """
    job_logging: dict[str, Any] = OmegaConf.to_container(config.hydra.job_logging, resolve=False)  # type: ignore[assignment]
    job_logging.get("handlers", {}).pop("file", None)
    root = job_logging.get("root", {})
    root["handlers"] = [h for h in root.get("handlers", []) if h != "file"]
    logging.config.dictConfig(job_logging)
