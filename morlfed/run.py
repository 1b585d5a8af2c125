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
module knows nothing about environments or datasets.
"""

from __future__ import annotations

import errno
import logging
import secrets
import shutil
import signal
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from morlfed.checkpoint import Checkpointer, checkpoint_round
from morlfed.config_groups import help_groups, task_class
from morlfed.console import one_line_warnings
from morlfed.executors import Executor, make_executor
from morlfed.faults import Fault, FaultyClientFactory, parse_faults
from morlfed.federation import Federation, FederationConfig, Recorder, round_budgets
from morlfed.interrupt import RunStopped, StopNow, StopSignals, exit_status, leave
from morlfed.overrides import check_creatable, check_new_run_dir, precheck_argv, searchpath_argv
from morlfed.parallelism import Parallelism
from morlfed.parallelism import resolve as resolve_parallelism
from morlfed.projection import Projection, physical_memory
from morlfed.provenance import code_version, describe_code, package_version
from morlfed.resume import (
    RESUME_OR_BRANCH,
    branch_point,
    record_sweep_job,
    resume_argv,
    resume_command,
    resume_point,
    sibling_source,
)
from morlfed.rundir import RunDirectory
from morlfed.runlock import run_dir_lock
from morlfed.runstatus import clear_stopped
from morlfed.settings import ConfigError, check_settings
from morlfed.startstop import early_lock, launch_summary, record_stop, remove_new_run_dir
from morlfed.strategy import Strategy
from morlfed.tasks.base import RunInfo, Task
from morlfed.tracking import Tracker, flat_scalars, tracker_class

EXIT_BAD_INPUT = 2
#: Storage failures a run reports in words, by errno (the latest checkpoint stays for ``resume=``).
STORAGE_ERRORS = {
    errno.ENOSPC: "the disk is full; free space, then continue the run with resume=",
    errno.EDQUOT: "the disk quota is used up; free space, then continue the run with resume=",
    errno.EACCES: "permission denied: the run may not write there",
    errno.EROFS: "the file system is read-only: the run cannot write there",
}
log = logging.getLogger("morlfed.run")  # also when run as __main__


@dataclass
class Plan:
    """A validated run: everything built, nothing trained yet.

    :param task: the task (its environment or dataset, preferences or partition)
    :param fed: the loop's settings
    :param strategy: the server strategy
    :param executor: how the clients run
    :param run: the run's identity (algo, dist, variant)
    :param faults: injected faults (chaos testing)
    :param checkpoint_every: keep the checkpoint of every k-th round once the run completes (0: none)
    :param tracker: the experiment tracker's class (``logger=``)
    :param tracker_options: its options (``conf/logger/<name>.yaml`` without ``_target_``)
    :param parallelism: the executor, workers and threads the run resolved (``auto`` settings)
    :param warning: what the projection of its size warns of (:mod:`morlfed.projection`), if anything
    """

    task: Task
    fed: FederationConfig
    strategy: Strategy
    executor: Executor
    run: RunInfo
    faults: list[Fault] = field(default_factory=list)
    checkpoint_every: int = 0
    tracker: type[Tracker] = Tracker
    tracker_options: dict[str, Any] = field(default_factory=dict)
    parallelism: Parallelism = field(default_factory=lambda: Parallelism("sequential", 1, 1, 1))
    warning: str | None = None

    @property
    def name(self) -> str:
        """The run's name for trackers and ``run.log``: ``<env or data>/<label>/<dist or partition>/seed<seed>``."""
        return f"{self.task.describe()}/{self.run.label}/{self.run.heterogeneity}/seed{self.fed.seed}"


def build_plan(cfg: DictConfig) -> Plan:
    """Validate the composed config and build the run's parts (raises :class:`ConfigError`)."""
    choices = HydraConfig.get().runtime.choices
    try:
        check_settings(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    n, rounds, steps = cfg.n_clients, cfg.rounds, cfg.local_steps
    try:
        kind = task_class(cfg.task.name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    fed = FederationConfig(
        n_clients=n,
        rounds=rounds,
        local_steps=steps,
        seed=cfg.seed,
        participation=float(cfg.participation),
        finetune=cfg.finetune,
        save_similarity=cfg.save_similarity,
        progress=cfg.progress,
        eval_every=cfg.eval_every,
        round_metrics=kind.round_metrics,
        budget_unit=kind.budget_unit,
    )
    projection = Projection(rounds, round_budgets(fed).total(), kind.budget_unit, kind.budget_rate)
    try:  # before anything is built: no budget holds up the start
        warning = projection.check(physical_memory())
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        task = kind.from_config(cfg, n, cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from exc
    try:
        strategy = instantiate(cfg.algo, _convert_="all")
        strategy.validate(n, rounds - 1 if cfg.finetune else rounds)  # a "+FT" run's last round is not aggregated
    except Exception as exc:  # hydra wraps constructor errors in InstantiationException
        cause = exc.__cause__ or exc
        raise ConfigError(f"algo={choices['algo']}: {cause}") from exc
    options = {k: v for k, v in cfg.executor.items() if k != "name"}
    try:
        asked = (cfg.executor.name, options.get("workers"), cfg.torch_threads, n, n * rounds * steps)  # budget last
        parallelism = resolve_parallelism(*asked, gpu_batched=task.gpu_batched)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if cfg.executor.name == "auto":  # auto carries the process executor's options
        options["workers"] = parallelism.workers
        if parallelism.executor == "sequential":
            options = {"client_timeout": options["client_timeout"]}
    try:
        executor = make_executor(parallelism.executor, **options)
    except (ValueError, TypeError, ImportError) as exc:
        raise ConfigError(f"executor: {exc}") from exc
    try:
        faults = parse_faults(OmegaConf.to_container(cfg.faults, resolve=True), n, rounds, parallelism.executor)
        if faults:
            task.check_fault_injection()
        Checkpointer(Path("."), cfg.checkpoint_every)  # validates checkpoint_every
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    run = RunInfo(
        choices["algo"],
        fed.finetune,
        kind.heterogeneity,
        choices[kind.heterogeneity],
        fed,
        parallelism=parallelism.record(),
        code=code_version(),
    )
    tracker_options: dict[str, Any] = OmegaConf.to_container(cfg.logger, resolve=True)  # type: ignore[assignment]
    try:
        tracker = tracker_class(tracker_options.pop("_target_"), choices["logger"])
    except ImportError as exc:
        raise ConfigError(str(exc)) from exc
    plan = Plan(task, fed, strategy, executor, run, faults, cfg.checkpoint_every, tracker, tracker_options, parallelism)
    plan.warning = warning
    return plan


def _start_tracker(plan: Plan, cfg: DictConfig, out: Path) -> Tracker:
    """The run's tracker (``logger=``).

    A backend that cannot start (``logger=wandb`` online without a login, ...) is one error line,
    and what it created is removed.
    """
    before = set(out.iterdir()) if out.is_dir() else set()
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    try:
        return plan.tracker(out, plan.name, config, **plan.tracker_options)
    except Exception as exc:  # each backend raises its own errors (wandb.errors.UsageError, ...)
        for path in set(out.iterdir()) - before if out.is_dir() else ():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        remove_new_run_dir(out)
        raise ConfigError(f"logger={HydraConfig.get().runtime.choices['logger']}: {first}") from exc


def _log_start(plan: Plan, cfg: DictConfig, out: Path, checkpoint: Path | None, source: Path | None) -> None:
    """The first lines of ``run.log``: what runs where, with which settings."""
    hydra_cfg, fed = HydraConfig.get(), plan.fed
    log.info("morlfed run %s in %s", plan.name, out.absolute())
    log.info("command line: %s", " ".join(hydra_cfg.overrides.task) or "(defaults)")
    log.info("code: %s", describe_code(plan.run.code))
    log.info(
        "task=%s algo=%s finetune=%s %s=%s seed=%d n_clients=%d rounds=%d local_steps=%d participation=%g "
        "eval_every=%d executor=%s workers=%s torch_threads=%d logger=%s",
        cfg.task.name,
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
        hydra_cfg.runtime.choices["logger"],
    )
    if checkpoint is not None:
        how = "resumed in place" if source is None else f"branched from {source}"
        log.info("%s, starting from checkpoint %s", how, checkpoint)
    elif cfg.resume:
        log.info("resumed in place from the start (it was stopped before it completed a round)")


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


def _dir_key() -> str:
    """How the command line names this run's directory: ``hydra.run.dir``, or ``hydra.sweep.dir`` in a sweep.

    In a sweep the run's directory is the job's folder below ``hydra.sweep.dir``.
    """
    return "hydra.sweep.dir" if HydraConfig.get().mode == RunMode.MULTIRUN else "hydra.run.dir"


def execute(cfg: DictConfig) -> dict[str, Any]:
    """Run one federated experiment as composed, in the output directory hydra's config names; return its metrics.

    It is the command line's run (:func:`main`) and the programmatic API's
    (:func:`morlfed.api.run_experiment`): both compose the configuration with hydra and run it here,
    with :class:`~hydra.core.hydra_config.HydraConfig` set. SIGINT and SIGTERM stop it within
    seconds (:mod:`morlfed.interrupt`), keeping the last completed round's checkpoint.

    :param cfg: the composed configuration
    :raises ConfigError: bad input; the run directory made for the run is removed again
    :raises RunStopped: a signal stopped the run; its directory is marked stopped (a second signal
        raises :class:`~morlfed.interrupt.StopNow`, a ``SystemExit``)
    """
    out = Path(HydraConfig.get().runtime.output_dir)
    with StopSignals() as stop, run_dir_lock(out):  # one writer per run directory
        try:
            with stop.interruptible():  # a signal stops the start-up at once: nothing is written yet
                check_creatable(out)
                if not cfg.resume:  # a sweep's job folder that holds an earlier run (a hydra.run.dir is checked first)
                    check_new_run_dir(out, _dir_key(), ignore={".hydra", "run.log"})
                    if _dir_key() == "hydra.sweep.dir":
                        record_sweep_job(out)
                plan = build_plan(cfg)
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
            return _run(plan, cfg, out, checkpoint, source, stop)
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


def _run(
    plan: Plan, cfg: DictConfig, out: Path, checkpoint: Path | None, source: Path | None, stop: StopSignals
) -> dict[str, Any]:
    """The run proper, once everything is validated: its files, clients, rounds and results.

    :param plan: the validated run
    :param cfg: the composed config
    :param out: the run directory
    :param checkpoint: the checkpoint it starts from, if any
    :param source: the run it branches from, if any
    :param stop: the run's signal handling
    """
    plan.run.branched_from = source
    tracker = _start_tracker(plan, cfg, out)
    completed = False
    _log_start(plan, cfg, out, checkpoint, source)
    for line in launch_summary(plan, out):
        log.info(line)
        print(f"morlfed: {line}", file=sys.stderr)
    if plan.warning is not None:
        log.warning(plan.warning)  # (on the console too)
    run_dir = RunDirectory(out)
    if not (cfg.resume and checkpoint is not None):  # a resumed run keeps its config.yaml and inputs
        if not (out / "config.yaml").is_file():  # (one killed before its first checkpoint starts again)
            run_dir.write_text("config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        plan.task.write_inputs(run_dir, plan.run)
    if source is not None:  # the similarity matrices of the rounds the branch shares with its source
        assert checkpoint is not None, "a branch starts from a checkpoint of its source"
        shared = checkpoint_round(checkpoint)
        for path in sorted(source.glob("similarity_*.npy")):
            if int(path.stem.removeprefix("similarity_")) <= shared:
                run_dir.write_npy(path.name, np.load(path))
    try:
        factory = plan.task.client_factory(plan.fed, plan.parallelism.torch_threads)
        with stop.interruptible():
            plan.executor.start(
                FaultyClientFactory(factory, plan.faults) if plan.faults else factory, plan.fed.n_clients
            )
        before_last = (plan.fed.rounds - 1,) if cfg.branch_siblings else ()  # what a sibling branches from
        checkpointer = Checkpointer(out, plan.checkpoint_every, also=before_last)
        recorder = Recorder(run_dir, checkpointer, tracker, results=partial(plan.task.write_results, run=plan.run))
        federation = Federation(plan.strategy, plan.executor, plan.fed, recorder, stop)
        if checkpoint is not None:
            federation.resume(checkpoint, in_place=source is None)
        clear_stopped(out)  # it goes on (a resume that failed to load keeps its mark)
        outcome = federation.run()
        metrics = recorder.metrics
        completed = True
    except Exception as exc:
        log.error("the run failed: %s: %s", type(exc).__name__, exc)
        log.info("the failure's traceback", exc_info=True)  # run.log only: hydra prints it on the console
        raise
    finally:
        plan.executor.close()
        tracker.close(failed=not completed)  # a failure or a stop (Ctrl-C, SIGTERM) is no finished run
    shown = ", ".join(f"{k}={v:.4g}" for k, v in flat_scalars(metrics).items())
    log.info("finished in %.1f s; metrics.json: %s", outcome.seconds, shown)
    plan.task.print_summary(outcome, metrics, out)
    return metrics


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
