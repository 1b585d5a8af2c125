"""Running an :class:`~morlfed.experiment.experiment.Experiment` into its run directory.

:func:`run` is the whole of it for an experiment built in Python: the directory's lock, the signal
handling, then :func:`carry_out`. :func:`carry_out` is the run proper, which the command line
(:func:`morlfed.cli.execute.execute`) reaches once it has checked its directory and found its start point:
``config.yaml``, the task's inputs, the clients, the rounds, the results and (last) ``metrics.json``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from morlfed.core.interrupt import StopSignals
from morlfed.core.logscope import RunFilter
from morlfed.core.provenance import describe_code
from morlfed.core.settings import ConfigError
from morlfed.experiment.experiment import Experiment
from morlfed.experiment.launch import launch_summary, remove_new_run_dir
from morlfed.federation import Federation, FederationOutcome, Recorder
from morlfed.federation.checkpoint import Checkpointer, checkpoint_round
from morlfed.runtime.faults import FaultyClientFactory
from morlfed.storage.rundir import RunDirectory
from morlfed.storage.runlock import LOCK, run_dir_lock
from morlfed.storage.runstatus import clear_stopped
from morlfed.tracking import Tracker, flat_scalars

log = logging.getLogger("morlfed.run")  # the command line's logger: run.log names it whichever path started the run
#: ``run.log``'s line format where no logging configuration (the command line's) writes one
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


@dataclass(frozen=True)
class Start:
    """Where a run starts: from scratch, or from a checkpoint of its own or of another run.

    :param checkpoint: the checkpoint it starts from, if any
    :param source: the run it branches from, if any (``None``: a checkpoint of its own)
    :param resumed: it continues its own directory (``resume=``): it keeps its ``config.yaml`` and inputs
    :param keep_before_last: keep the checkpoint before the last round, for a sibling to branch from
    """

    checkpoint: Path | None = None
    source: Path | None = None
    resumed: bool = False
    keep_before_last: bool = False


def run(experiment: Experiment, run_dir: str | Path) -> dict[str, Any]:
    """Run ``experiment`` into a new run directory and return its metrics (``metrics.json``).

    The directory holds what the command line's run writes (``config.yaml``, the task's inputs,
    ``rounds.csv``, ``final.csv``, ``metrics.json``, ``run.log``, ...), so
    :meth:`morlfed.api.ExperimentResult.load` and the analysis read it as any other. SIGINT and
    SIGTERM stop it within seconds (:class:`~morlfed.core.interrupt.RunStopped`), its latest checkpoint kept.

    :param experiment: the validated experiment (:func:`~morlfed.experiment.experiment.build_experiment`)
    :param run_dir: its directory: new, or empty
    :raises ConfigError: the directory already holds files
    :raises morlfed.storage.runlock.RunDirBusy: another run holds the directory
    """
    out = Path(run_dir)
    with StopSignals() as stop, run_dir_lock(out):  # one writer per run directory
        held = sorted(p.name for p in out.iterdir() if p.name != LOCK)
        if held:
            raise ConfigError(f"{out} already holds {', '.join(held)}: give a new run directory")
        with run_log(out):
            return carry_out(experiment, out, Start(), stop)


@contextlib.contextmanager
def run_log(out: Path, scoped: bool = False) -> Iterator[None]:
    """``out/run.log`` at INFO while the body runs, unless the process's logging already writes it (the command line's does).

    The process's logging is as it was afterwards.

    :param out: the run directory
    :param scoped: the file takes only the lines logged in the run's :func:`~morlfed.core.logscope.run_scope`
        (named by :func:`scope_name`): several runs share the process (a batch)
    """
    root = logging.getLogger()
    target = (out / "run.log").absolute()
    if any(getattr(h, "baseFilename", None) == str(target) for h in root.handlers):
        yield
        return
    level = root.level
    handler = logging.FileHandler(target)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    if scoped:
        handler.addFilter(RunFilter(scope_name(out)))
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(level)


def scope_name(out: Path) -> str:
    """The name of run ``out``'s :func:`~morlfed.core.logscope.run_scope`: its absolute directory.

    :param out: the run directory
    """
    return str(Path(out).absolute())


def start_tracker(plan: Experiment, out: Path) -> Tracker:
    """The run's tracker (``logger=``), started for the run directory ``out``.

    A backend that cannot start (``logger=wandb`` online without a login, ...) is one error line,
    and what it created is removed.

    :param plan: the validated run
    :param out: its run directory
    :raises ConfigError: the backend cannot start
    """
    before = set(out.iterdir()) if out.is_dir() else set()
    config: dict[str, Any] = yaml.safe_load(plan.config_yaml) or {}
    try:
        return plan.tracker(out, plan.name, config, **plan.tracker_options)
    except Exception as exc:  # each backend raises its own errors (wandb.errors.UsageError, ...)
        for path in set(out.iterdir()) - before if out.is_dir() else ():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        remove_new_run_dir(out)
        raise ConfigError(f"logger={plan.tracker_label}: {first}") from exc


def _log_start(plan: Experiment, out: Path, start: Start) -> None:
    """The first lines of ``run.log``: what runs where, with which settings."""
    fed = plan.fed
    log.info("morlfed run %s in %s", plan.name, out.absolute())
    log.info("command line: %s", plan.command)
    log.info("code: %s", describe_code(plan.run.code))
    log.info(
        "task=%s algo=%s finetune=%s %s=%s seed=%d n_clients=%d rounds=%d local_steps=%d participation=%g "
        "eval_every=%d executor=%s workers=%s torch_threads=%d logger=%s",
        plan.task.name,
        plan.run.algo,
        fed.finetune,
        plan.run.heterogeneity_group,
        plan.run.heterogeneity,
        fed.seed,
        fed.n_clients,
        fed.rounds,
        fed.local_steps,
        fed.participation,
        fed.eval_every,
        plan.parallelism.executor,
        plan.parallelism.workers,
        plan.parallelism.torch_threads,
        plan.tracker_label,
    )
    if start.checkpoint is not None:
        how = "resumed in place" if start.source is None else f"branched from {start.source}"
        log.info("%s, starting from checkpoint %s", how, start.checkpoint)
    elif start.resumed:
        log.info("resumed in place from the start (it was stopped before it completed a round)")


def carry_out(plan: Experiment, out: Path, start: Start, stop: StopSignals) -> dict[str, Any]:
    """The run proper, once everything is validated: its files, clients, rounds and results.

    :param plan: the validated run
    :param out: the run directory (its lock held)
    :param start: where it starts
    :param stop: the run's signal handling
    """
    tracker = open_run(plan, out, start)
    completed = False
    try:
        factory = plan.task.client_factory(plan.fed, plan.parallelism.torch_threads)
        with stop.interruptible():
            plan.executor.start(
                FaultyClientFactory(factory, plan.faults) if plan.faults else factory, plan.fed.n_clients
            )
        federation = federation_of(plan, out, start, tracker, stop)
        outcome = federation.run()
        metrics = federation.recorder.metrics
        completed = True
    except Exception as exc:
        log_failure(exc)
        raise
    finally:
        plan.executor.close()
        tracker.close(failed=not completed)  # a failure or a stop (Ctrl-C, SIGTERM) is no finished run
    close_run(plan, out, outcome, metrics)
    return metrics


def open_run(plan: Experiment, out: Path, start: Start) -> Tracker:
    """A run's beginning: its tracker, the first lines of ``run.log``, ``config.yaml`` and the task's inputs.

    :param plan: the validated run
    :param out: the run directory (its lock held)
    :param start: where it starts
    :return: the run's started tracker
    """
    checkpoint, source = start.checkpoint, start.source
    if source is not None:
        plan.run.branched_from = source
    tracker = start_tracker(plan, out)
    _log_start(plan, out, start)
    for line in launch_summary(plan, out):
        log.info(line)
        print(f"morlfed: {line}", file=sys.stderr)
    if plan.warning is not None:
        log.warning(plan.warning)  # (on the console too)
    run_dir = RunDirectory(out)
    own_checkpoint = start.resumed and checkpoint is not None and source is None
    if not own_checkpoint:  # a run resumed from its own checkpoint keeps its config.yaml and inputs
        if not (out / "config.yaml").is_file():  # (one killed before its first checkpoint starts again)
            run_dir.write_text("config.yaml", plan.config_yaml)
        plan.task.write_inputs(run_dir, plan.run)
    if source is not None:  # the similarity matrices of the rounds the branch shares with its source
        assert checkpoint is not None, "a branch starts from a checkpoint of its source"
        shared = checkpoint_round(checkpoint)
        for path in sorted(source.glob("similarity_*.npy")):
            if int(path.stem.removeprefix("similarity_")) <= shared:
                run_dir.write_npy(path.name, np.load(path))
    return tracker


def federation_of(plan: Experiment, out: Path, start: Start, tracker: Tracker, stop: StopSignals) -> Federation:
    """The run's federation on its (started) executor, with its recorder, resumed from the start's checkpoint.

    :param plan: the validated run
    :param out: the run directory
    :param start: where it starts
    :param tracker: its tracker (:func:`open_run`)
    :param stop: the run's signal handling
    """
    before_last = (plan.fed.rounds - 1,) if start.keep_before_last else ()  # what a sibling branches from
    checkpointer = Checkpointer(out, plan.checkpoint_every, also=before_last)
    results = partial(plan.task.write_results, run=plan.run)
    recorder = Recorder(RunDirectory(out), checkpointer, tracker, results=results)
    federation = Federation(plan.strategy, plan.executor, plan.fed, recorder, stop)
    if start.checkpoint is not None:
        federation.resume(start.checkpoint, in_place=start.source is None)
    clear_stopped(out)  # it goes on (a resume that failed to load keeps its mark)
    return federation


def log_failure(exc: BaseException) -> None:
    """``run.log``'s lines for a run that failed: the error, then its traceback (``run.log`` only).

    :param exc: what failed it
    """
    log.error("the run failed: %s: %s", type(exc).__name__, exc)
    log.info("the failure's traceback", exc_info=exc)  # run.log only: hydra prints it on the console


def close_run(plan: Experiment, out: Path, outcome: FederationOutcome, metrics: dict[str, Any]) -> None:
    """A completed run's last ``run.log`` line and its console summary.

    :param plan: the run
    :param out: its directory
    :param outcome: what it produced
    :param metrics: its ``metrics.json``
    """
    shown = ", ".join(f"{k}={v:.4g}" for k, v in flat_scalars(metrics).items())
    log.info("finished in %.1f s; metrics.json: %s", outcome.seconds, shown)
    plan.task.print_summary(outcome, metrics, out)
