"""Several runs as one batch: their clients train together in one host, each run still a run of its own.

The runs of a campaign on one environment (the seeds and variants of a sweep, an experiment's
cells) can share one batched computation when their engine allows it
(:class:`~morlfed.runtime.executors.shared.BatchFactory`: the vectorised engine). Each run keeps
its own federation, strategy, run directory, ``run.log`` and checkpoints, and gets exactly the
numbers it gets alone (:mod:`morlfed.runtime.executors.shared`); a run whose strategy raises fails
alone (its ``run.log`` error, no ``metrics.json``), the others go on.

* :func:`group_runs` puts compatible runs (equal :meth:`~morlfed.runtime.executors.shared.BatchFactory.batch_key`)
  into batches of at most :func:`runs_per_batch` runs; any other run is a batch of its own.
* :func:`carry_out_batch` runs one batch (the command line's and :func:`run_batch`'s core).
* :func:`run_batch` runs experiments built in Python as one batch into new run directories.

**How many runs share a batch** (:func:`runs_per_batch`): as many as fit in :data:`MEMORY_SHARE`
of the device's free memory (:func:`~morlfed.core.parallelism.free_memory`: ``MemAvailable`` on
the CPU, the GPU's free memory on CUDA), each run counted as its clients times the engine's
estimate of one client (:meth:`~morlfed.runtime.executors.shared.BatchFactory.client_bytes`:
replay buffer, networks, optimiser states); a user's ``max_runs`` overrides it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from morlfed.core.interrupt import RunStopped, StopNow, StopSignals
from morlfed.core.logscope import run_scope
from morlfed.core.parallelism import free_memory
from morlfed.core.progress import BatchProgress
from morlfed.core.settings import ConfigError
from morlfed.experiment.experiment import Experiment
from morlfed.experiment.runner import (
    Start,
    close_run,
    federation_of,
    log_failure,
    open_run,
    run_log,
    scope_name,
)
from morlfed.federation import Federation, FederationOutcome
from morlfed.federation.coordinator import Coordinator
from morlfed.federation.round import round_budgets
from morlfed.runtime.executors.shared import BatchFactory, RunView, shared_host
from morlfed.storage.runlock import LOCK, run_dir_lock
from morlfed.tracking import Tracker

#: The share of the device's free memory that a batch's clients may fill (the rest: envs, Python,
#: evaluation, the other processes of the machine, and the estimate's own error).
MEMORY_SHARE = 0.5

#: A run's result in a batch: its metrics (``metrics.json``), or the exception that failed it.
BatchResult = dict[str, Any] | Exception


@dataclass(frozen=True)
class BatchRun:
    """One run of a batch: what it runs, where, and from where.

    :param plan: the validated run
    :param out: its run directory (its lock held by the caller)
    :param start: where it starts (a resumed run from its checkpoint)
    """

    plan: Experiment
    out: Path
    start: Start = field(default_factory=Start)


def batch_factory(plan: Experiment) -> BatchFactory | None:
    """The run's client factory if its clients can share a batch with other runs', else ``None``.

    A run with injected faults (``faults=``) never shares: faults wrap one client at a time.

    :param plan: the validated run
    """
    if plan.faults:
        return None
    factory = plan.task.client_factory(plan.fed, plan.parallelism.torch_threads)
    return factory if isinstance(factory, BatchFactory) else None


def runs_per_batch(factory: BatchFactory, n_clients: int, max_runs: int | None = None) -> int:
    """How many runs of ``n_clients`` clients each share one batch (see the module docstring).

    :param factory: one run's client factory
    :param n_clients: the most clients a run of the batch has
    :param max_runs: the user's limit, which overrides the memory rule
    """
    if max_runs is not None:
        if isinstance(max_runs, bool) or max_runs < 1:
            raise ConfigError(f"the most runs per batch must be an integer >= 1, got {max_runs!r}")
        return int(max_runs)
    per_run = max(1, factory.client_bytes() * n_clients)
    return max(1, int(MEMORY_SHARE * free_memory(factory.device) // per_run))


def group_runs(plans: Sequence[Experiment], max_runs: int | None = None) -> list[list[int]]:
    """The runs' batches, as lists of indices into ``plans``, in the order of each batch's first run.

    Runs share a batch when their factories' batch keys are equal, at most :func:`runs_per_batch`
    of them; a run that cannot share (another engine, another task, injected faults) is a batch of
    its own. Incompatible runs never share a batch.

    :param plans: the validated runs
    :param max_runs: the most runs per batch (``None``: the memory rule)
    """
    keyed: dict[Any, list[int]] = {}
    factories: dict[int, BatchFactory] = {}
    for index, plan in enumerate(plans):
        factory = batch_factory(plan)
        if factory is None:
            keyed[("alone", index)] = [index]
        else:
            factories[index] = factory
            keyed.setdefault(factory.batch_key(), []).append(index)
    batches = []
    for members in keyed.values():
        if members[0] not in factories:
            batches.append(members)
            continue
        clients = max(plans[i].fed.n_clients for i in members)
        size = runs_per_batch(factories[members[0]], clients, max_runs)
        batches += [members[k : k + size] for k in range(0, len(members), size)]
    return batches


def carry_out_batch(
    runs: Sequence[BatchRun],
    stop: StopSignals,
    on_stop: Callable[[BatchRun, signal.Signals], None] | None = None,
) -> list[BatchResult]:
    """Run ``runs`` as one batch; each run's metrics, or the exception that failed it.

    Each run writes its own directory as :func:`~morlfed.experiment.runner.carry_out` does, its
    ``run.log`` taking its own lines only (:func:`~morlfed.core.logscope.run_scope`);
    ``metrics.json`` records ``executor: batched`` and the batch's size (``batch_runs``).

    :param runs: the runs (their directories' locks held)
    :param stop: the batch's signal handling (entered by the caller)
    :param on_stop: called for each run, in its scope, when a signal stops the batch (the command
        line marks it stopped)
    :raises ConfigError: runs that cannot share a batch (the message says what differs)
    :raises RunStopped: a signal stopped the batch; each run keeps its last checkpoint
    """
    plans = [r.plan for r in runs]
    factories = [p.task.client_factory(p.fed, p.parallelism.torch_threads) for p in plans]
    timeout = plans[0].executor.client_timeout
    try:
        with stop.interruptible():
            host, members = shared_host(factories, [p.fed.n_clients for p in plans], timeout)
    except ValueError as exc:
        raise ConfigError(f"these runs cannot train as one batch: {exc}") from exc
    results: dict[int, BatchResult] = {}
    trackers: dict[int, Tracker] = {}
    federations: dict[int, Federation] = {}
    with contextlib.ExitStack() as logs:
        for run in runs:
            logs.enter_context(run_log(run.out, scoped=True))
        for index, run in enumerate(runs):
            view = RunView(host, members[index], timeout)
            parallelism = replace(run.plan.parallelism, executor=view.name, workers=1)
            plan = replace(run.plan, executor=view, parallelism=parallelism)
            plan.run.parallelism = plan.run.parallelism | {"executor": view.name, "workers": 1, "batch_runs": len(runs)}
            with run_scope(scope_name(run.out)):
                try:
                    trackers[index] = open_run(plan, run.out, run.start)
                    federations[index] = federation_of(plan, run.out, run.start, trackers[index], stop)
                except Exception as exc:
                    log_failure(exc)
                    results[index] = exc
                    if index in trackers:
                        trackers.pop(index).close(failed=True)
        going = sorted(federations)
        progress = BatchProgress(
            [round_budgets(federations[i].cfg) for i in going],
            [federations[i].start_round for i in going],
            federations[going[0]].cfg.budget_unit if going else "",  # no run left: an empty bar
            any(federations[i].cfg.progress for i in going),
        )
        coordinator = Coordinator(
            [federations[i] for i in going], stop, lambda k: run_scope(scope_name(runs[going[k]].out)), progress
        )
        try:
            with progress:
                outcomes = coordinator.run()
        except (RunStopped, StopNow) as exc:
            for k, index in enumerate(going):  # a run that failed or finished before the signal is left as it is
                run, result = runs[index], coordinator.results.get(k)
                with run_scope(scope_name(run.out)):
                    trackers[index].close(failed=not isinstance(result, FederationOutcome))
                    if isinstance(result, FederationOutcome):
                        close_run(run.plan, run.out, result, federations[index].recorder.metrics)
                    elif result is None and on_stop is not None:
                        on_stop(run, exc.signal)
            raise
        for index, outcome in zip(going, outcomes, strict=True):
            run = runs[index]
            with run_scope(scope_name(run.out)):
                trackers[index].close(failed=isinstance(outcome, Exception))
                if isinstance(outcome, Exception):
                    log_failure(outcome)
                    results[index] = outcome
                else:
                    metrics = federations[index].recorder.metrics
                    close_run(run.plan, run.out, outcome, metrics)
                    results[index] = metrics
    return [results[i] for i in range(len(runs))]


def run_batch(experiments: Sequence[Experiment], run_dirs: Sequence[str | Path]) -> list[BatchResult]:
    """Run experiments built in Python as one batch, each into its new run directory.

    For example ``run_batch([build_experiment(RLTask.create("deep-sea-treasure", seed=s), FedPref(),
    Settings(seed=s, ...)) for s in range(4)], [f"runs/seed{s}" for s in range(4)])``. Each run gets
    the numbers that :func:`~morlfed.experiment.runner.run` gives it alone. SIGINT and SIGTERM stop
    the batch within seconds, each run keeping its latest checkpoint.

    :param experiments: the validated experiments (:func:`~morlfed.experiment.experiment.build_experiment`)
    :param run_dirs: a new or empty directory for each
    :return: each run's metrics, or the exception that failed it
    :raises ConfigError: a directory that already holds files, or runs that cannot share a batch
    """
    if len(experiments) != len(run_dirs):
        raise ConfigError(f"{len(experiments)} experiments but {len(run_dirs)} run directories")
    outs = [Path(d) for d in run_dirs]
    with StopSignals() as stop, contextlib.ExitStack() as locks:
        for out in outs:
            locks.enter_context(run_dir_lock(out))
            held = sorted(p.name for p in out.iterdir() if p.name != LOCK)
            if held:
                raise ConfigError(f"{out} already holds {', '.join(held)}: give a new run directory")
        return carry_out_batch([BatchRun(e, o) for e, o in zip(experiments, outs, strict=True)], stop)
