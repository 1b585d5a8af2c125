"""The command line: ``python -m morlfed.run [overrides]``.

Composes the hydra config (``task``, ``dist``, ``algo``, ``executor`` groups, the task's own
groups such as ``env``, and top-level fields), validates everything before any training starts,
runs the federation, and writes the run directory: ``config.yaml``, the task's inputs,
``rounds.csv clusters.jsonl``, the task's results and (last) ``metrics.json``. Bad input is one
line on stderr and exit status 2, with no run directory left behind. ``resume=RUN_DIR`` continues
a stopped run in place; ``branch_from=RUN_DIR finetune=true`` starts its "+FT" variant from its
checkpoint before the last round (:mod:`morlfed.resume`), and ``branch_siblings=true`` does so by
itself within a sweep folder.

The task (``task=``, :mod:`morlfed.tasks`) builds the clients and reports their results; this
module knows nothing about environments or datasets.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from morlfed.checkpoint import Checkpointer, checkpoint_round
from morlfed.executors import Executor, make_executor
from morlfed.faults import Fault, FaultyClientFactory, parse_faults
from morlfed.federation import Federation, FederationConfig
from morlfed.interrupt import RunInterrupted
from morlfed.parallelism import Parallelism
from morlfed.parallelism import resolve as resolve_parallelism
from morlfed.resume import RESUME_OR_BRANCH, branch_point, resume_argv, resume_point, sibling_source
from morlfed.rundir import RunDirectory
from morlfed.strategy import Strategy
from morlfed.tasks.base import RunInfo, Task
from morlfed.tracking import Tracker, flat_scalars, tracker_class

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C after writing a checkpoint
CONF_DIR = Path(__file__).parent / "conf"
log = logging.getLogger("morlfed.run")  # also when run as __main__


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says what and what is allowed."""


@dataclass
class Plan:
    """A validated run: everything built, nothing trained yet.

    :param task: the task (its environment or dataset, preferences or partition)
    :param fed: the loop's settings
    :param strategy: the server strategy
    :param executor: how the clients run
    :param run: the run's identity (algo, dist, variant)
    :param faults: injected faults (chaos testing)
    :param checkpoint_every: write a checkpoint after every k-th round (0: only on Ctrl-C)
    :param tracker: the experiment tracker's class (``logger=``)
    :param tracker_options: its options (``conf/logger/<name>.yaml`` without ``_target_``)
    :param parallelism: the executor, workers and threads the run resolved (``auto`` settings)
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

    @property
    def name(self) -> str:
        """The run's name for trackers and ``run.log``: ``<env or data>/<label>/<dist>/seed<seed>``."""
        return f"{self.task.describe()}/{self.run.label}/{self.run.dist}/seed{self.fed.seed}"


def _positive_int(cfg: DictConfig, key: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


@cache
def task_class(name: str) -> type[Task]:
    """The class of task ``name``, named by ``_target_`` in ``conf/task/<name>.yaml``."""
    node = OmegaConf.load(CONF_DIR / "task" / f"{name}.yaml")
    return get_class(node.task._target_ if "task" in node else node._target_)


def default_task() -> str:
    """The ``task`` option of ``conf/config.yaml``'s defaults list."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml").defaults)
    return next(d["task"] for d in defaults if isinstance(d, dict) and "task" in d)  # type: ignore[union-attr]


def check_dist(task: type[Task], dist: str) -> None:
    """Reject a ``dist`` option that belongs to another task, naming both tasks' options."""
    if dist in task.dists:
        return
    owners = [task_class(o) for o in group_options("task") if dist in task_class(o).dists]
    what = f"a {owners[0].dist_kind} of task={owners[0].name}" if owners else "not a known option"
    raise ConfigError(f"dist={dist} is {what}; task={task.name} {task.dist_use} dist={' | '.join(task.dists)}")


def build_plan(cfg: DictConfig) -> Plan:
    """Validate the composed config and build the run's parts (raises :class:`ConfigError`)."""
    choices = HydraConfig.get().runtime.choices
    n, rounds, steps = (_positive_int(cfg, k) for k in ("n_clients", "rounds", "local_steps"))
    if isinstance(cfg.eval_every, bool) or not isinstance(cfg.eval_every, int) or cfg.eval_every < 0:
        raise ConfigError(f"eval_every must be an integer >= 0 (0: only the final evaluation), got {cfg.eval_every!r}")
    participation = float(cfg.participation)
    if not 0.0 < participation <= 1.0:
        raise ConfigError(f"participation must be in (0, 1], got {cfg.participation!r}")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {cfg.seed!r}")
    kind = task_class(cfg.task.name)
    check_dist(kind, cfg.dist.name)
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
        parallelism = resolve_parallelism(
            cfg.executor.name, options.get("workers"), cfg.torch_threads, n, n * rounds * steps
        )
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
    fed = FederationConfig(
        n_clients=n,
        rounds=rounds,
        local_steps=steps,
        seed=cfg.seed,
        participation=participation,
        finetune=bool(cfg.finetune),
        save_similarity=bool(cfg.save_similarity),
        progress=bool(cfg.progress),
        eval_every=cfg.eval_every,
        round_metrics=kind.round_metrics,
    )
    run = RunInfo(choices["algo"], fed.finetune, choices["dist"], fed, parallelism=parallelism.record())
    tracker_options: dict[str, Any] = OmegaConf.to_container(cfg.logger, resolve=True)  # type: ignore[assignment]
    try:
        tracker = tracker_class(tracker_options.pop("_target_"), choices["logger"])
    except ImportError as exc:
        raise ConfigError(str(exc)) from exc
    return Plan(task, fed, strategy, executor, run, faults, cfg.checkpoint_every, tracker, tracker_options, parallelism)


def _remove_new_run_dir(path: Path) -> None:
    """Remove the directory hydra made for this run, if it holds nothing but hydra's own files."""
    if path.is_dir() and all(p.name in {".hydra", "run.log"} for p in path.iterdir()):
        shutil.rmtree(path)
        parent = path.parent
        while parent != parent.parent and parent.is_dir() and not any(parent.iterdir()) and parent != Path.cwd():
            parent.rmdir()
            parent = parent.parent


def _fail(out: Path, exc: ConfigError) -> NoReturn:
    """Bad input: remove the run directory hydra made, print one line, exit with status 2."""
    _remove_new_run_dir(out)
    print(f"morlfed: error: {exc}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def _start_tracker(plan: Plan, cfg: DictConfig, out: Path) -> Tracker:
    """The run's tracker (``logger=``); a backend that cannot start (``logger=wandb`` online
    without a login, ...) is one error line, and what it created is removed."""
    before = set(out.iterdir()) if out.is_dir() else set()
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    try:
        return plan.tracker(out, plan.name, config, **plan.tracker_options)
    except Exception as exc:  # each backend raises its own errors (wandb.errors.UsageError, ...)
        for path in set(out.iterdir()) - before if out.is_dir() else ():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _fail(out, ConfigError(f"logger={HydraConfig.get().runtime.choices['logger']}: {first}"))


def _log_start(plan: Plan, cfg: DictConfig, out: Path, checkpoint: Path | None, source: Path | None) -> None:
    """The first lines of ``run.log``: what runs where, with which settings."""
    hydra_cfg, fed = HydraConfig.get(), plan.fed
    log.info("morlfed run %s in %s", plan.name, out.absolute())
    log.info("command line: %s", " ".join(hydra_cfg.overrides.task) or "(defaults)")
    log.info(
        "task=%s algo=%s finetune=%s dist=%s seed=%d n_clients=%d rounds=%d local_steps=%d participation=%g "
        "eval_every=%d executor=%s workers=%s torch_threads=%d logger=%s",
        cfg.task.name,
        plan.run.algo,
        fed.finetune,
        plan.run.dist,
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


def _start_point(cfg: DictConfig, out: Path) -> tuple[Path | None, Path | None]:
    """The checkpoint this run starts from and, for a branch, the run it branches from:
    ``resume=RUN_DIR``'s latest (the run continues in place), ``branch_from=RUN_DIR``'s latest
    before its last round, with ``branch_siblings=true`` that of a finished sibling run with the
    same config (:func:`~morlfed.resume.sibling_source`), or ``(None, None)``
    (raises :class:`ConfigError`)."""
    if cfg.resume and cfg.branch_from:
        raise ConfigError(RESUME_OR_BRANCH)
    if cfg.resume and Path(cfg.resume).absolute() != out.absolute():
        raise ConfigError(
            f"resume={cfg.resume} writes into the run directory itself; run it as "
            f"`python -m morlfed.run resume={cfg.resume}` (the saved overrides are reapplied)"
        )
    if cfg.branch_from and Path(cfg.branch_from).absolute() == out.absolute():
        raise ConfigError(f"branch_from={cfg.branch_from} writes a new run directory; give another hydra.run.dir")
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    try:
        if cfg.resume:
            return resume_point(out, config_yaml), None
        source = Path(cfg.branch_from) if cfg.branch_from else None
        if source is None and cfg.branch_siblings:
            source = sibling_source(out, config_yaml)
        return (branch_point(source, config_yaml), source) if source is not None else (None, None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    """Run one federated experiment as configured."""
    out = Path(HydraConfig.get().runtime.output_dir)
    try:
        check_creatable(out)
        plan = build_plan(cfg)
        checkpoint, source = _start_point(cfg, out)
    except ConfigError as exc:
        _fail(out, exc)
    plan.run.branched_from = source
    tracker = _start_tracker(plan, cfg, out)
    _log_start(plan, cfg, out, checkpoint, source)
    run_dir = RunDirectory(out)
    if not cfg.resume:  # a resumed run keeps its config.yaml and inputs
        run_dir.write_text("config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        plan.task.write_inputs(run_dir, plan.run)
    if source is not None:  # the similarity matrices of the rounds the branch shares with its source
        assert checkpoint is not None, "a branch starts from a checkpoint of its source"
        shared = checkpoint_round(checkpoint)
        for path in sorted(source.glob("similarity_*.npy")):
            if int(path.stem.removeprefix("similarity_")) <= shared:
                run_dir.write_npy(path.name, np.load(path))
    factory = plan.task.client_factory(plan.fed, plan.parallelism.torch_threads)
    plan.executor.start(FaultyClientFactory(factory, plan.faults) if plan.faults else factory, plan.fed.n_clients)
    try:
        before_last = (plan.fed.rounds - 1,) if cfg.branch_siblings else ()  # what a sibling branches from
        checkpointer = Checkpointer(out, plan.checkpoint_every, also=before_last)
        federation = Federation(plan.strategy, plan.executor, plan.fed, run_dir, checkpointer, tracker)
        if checkpoint is not None:
            federation.resume(checkpoint)
        outcome = federation.run()
        metrics = plan.task.write_results(run_dir, outcome, plan.run)
        tracker.log_final(plan.fed.rounds, flat_scalars(metrics, "final/"), sorted(out.glob("*.png")))
    except RunInterrupted as exc:
        log.info(  # run.log only: the console gets the lines below
            "stopped after round %d, checkpoint %s; continue with: python -m morlfed.run resume=%s",
            exc.round,
            exc.path,
            out,
        )
        print(
            f"morlfed: stopped after round {exc.round}, checkpoint {exc.path}\n"
            f"continue with: python -m morlfed.run resume={out}",
            file=sys.stderr,
        )
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        log.error("the run failed: %s: %s", type(exc).__name__, exc)
        log.info("the failure's traceback", exc_info=True)  # run.log only: hydra prints it on the console
        raise
    finally:
        plan.executor.close()
        tracker.close()
    shown = ", ".join(f"{k}={v:.4g}" for k, v in flat_scalars(metrics).items())
    log.info("finished in %.1f s; metrics.json: %s", outcome.seconds, shown)
    plan.task.print_summary(outcome, metrics, out)
    return metrics


#: The config groups on morlfed's search path (``env`` lives in envs/conf/env, the others in conf/).
GROUPS = ("algo", "data", "dist", "engine", "env", "executor", "experiment", "logger", "model", "task", "variant")


def group_options(group: str) -> list[str]:
    """The options of a config group (one of :data:`GROUPS`) on morlfed's search path."""
    from morlfed.envs import ENV_CONF_DIR

    folder = ENV_CONF_DIR if group == "env" else CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


def precheck_argv(argv: list[str]) -> None:
    """Reject, in one line, what hydra would otherwise report as a multi-line trace: an unknown
    option of a config group or ``+experiment``/``+variant`` (conf/experiment/, conf/variant/), a
    group that belongs to another task than the selected one (its ``Task.groups``), and an output
    directory that cannot be created."""
    chosen = [v for k, _, v in (a.partition("=") for a in argv) if k == "task"]
    selected = chosen[-1] if chosen and chosen[-1] in group_options("task") else default_task()
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            continue
        group = key.removeprefix("+")
        if group in GROUPS:
            valid = group_options(group)
            for option in value.split(","):
                if option not in valid:
                    raise ConfigError(f"unknown {group} {option!r}; valid: {', '.join(valid)}")
        owners = [t for t in group_options("task") if key in task_class(t).groups]
        if owners and selected not in owners:
            owner = owners[0]
            raise ConfigError(
                f"{key}= is a setting of task={owner}; task={selected} takes "
                f"{', '.join(g + '=' for g in task_class(selected).groups)} (or add task={owner}: task={owner} {arg})"
            )
        if key in ("hydra.run.dir", "hydra.sweep.dir"):
            check_creatable(Path(value), f"{key}={value}")
    key, default = ("hydra.sweep.dir", "multirun") if {"-m", "--multirun"} & set(argv) else ("hydra.run.dir", "runs")
    if not any(a.startswith(f"{key}=") for a in argv):  # the default: runs/... or multirun/... here
        check_creatable(Path.cwd() / default, f"the default {key} {Path.cwd() / default}/...", f"; set {key}=...")


def check_creatable(path: Path, what: str = "", hint: str = "") -> None:
    """Raise :class:`ConfigError` unless directories can be made at ``path``: a probe directory is
    created in its nearest existing ancestor and removed again (``os.access`` cannot tell: it says
    yes to root everywhere, also on /proc and /sys, where nothing can be created).

    :param path: the directory to be created (or an existing one to write into)
    :param what: how the message names it (default: ``output directory PATH``)
    :param hint: appended to the message (what to do instead)
    """
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file")
        os.rmdir(tempfile.mkdtemp(prefix=".morlfed-probe-", dir=existing))
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(
            f"{what or f'output directory {path}'} cannot be created: {existing} is not a writable directory ({why}){hint}"
        ) from exc


def help_groups() -> str:
    """The ``--help`` list of config groups, one ``group: options`` line each (hydra's own list
    misses ``env``, whose configs come in through the search path)."""
    return "\n".join(f"{group}: {', '.join(group_options(group))}" for group in GROUPS)


# conf/config.yaml's help template calls it as ${morlfed_groups:}
OmegaConf.register_new_resolver("morlfed_groups", help_groups, replace=True)


def cli() -> None:
    """Entry point: one-line checks of the command line, then the hydra app."""
    try:
        sys.argv[1:] = resume_argv(sys.argv[1:])
        precheck_argv(sys.argv[1:])
    except ValueError as exc:
        print(f"morlfed: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    main()


if __name__ == "__main__":
    cli()
