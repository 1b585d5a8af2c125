"""Flower interop (the ``flower`` extra: ``pip install -e ".[flower]"``, flwr 1.42).

* :class:`~morlfed.flower.strategy.FlowerStrategy`: any morlfed strategy as a Flower strategy
  (the personalised and clustered ones send each client its own model);
* :func:`~morlfed.flower.client_app.client_app`: morlfed's clients (both RL engines, vision) as a
  Flower ClientApp, one client per node;
* :func:`flower_apps`: both, built from the command line's settings (``env=``, ``algo=``, ...),
  with a ServerApp that runs Flower's round loop;
* :mod:`morlfed.flower.app`: the ServerApp and ClientApp of a Flower app that ``flwr run`` starts
  (on Flower's local simulation or a deployment), settings read from ``context.run_config``.

The Flower path and morlfed's own executors run the same round
(:class:`~morlfed.federation.round.FederatedRound`) and give the same final models for the same
seed (``tests/test_flower.py``). With ``run_dir`` a Flower run writes the run directory morlfed's
own run writes (:class:`~morlfed.federation.recorder.Recorder`): ``config.yaml``, the task's
inputs, ``rounds.csv``, ``clusters.jsonl``, ``models/``, ``final.csv``, ``metrics.json``, which
:meth:`morlfed.api.ExperimentResult.load` and ``morlfed.analysis`` read.
``examples/flower/`` is such a Flower app.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from morlfed.cli.compose import plan_composed
from morlfed.cli.overrides import check_creatable, check_new_run_dir, parse
from morlfed.core.protocol import Evaluation
from morlfed.core.settings import ConfigError
from morlfed.experiment import Experiment, run_log, start_tracker
from morlfed.federation import Recorder
from morlfed.flower.client_app import client_app
from morlfed.flower.strategy import FlowerStrategy
from morlfed.runtime.executors import make_host
from morlfed.storage.rundir import RunDirectory

__all__ = ["NEEDS_RUN_DIR", "RUN_ONLY", "FlowerApps", "FlowerStrategy", "client_app", "flower_apps"]

#: settings of morlfed's own run that the Flower path would silently not carry out, and why
RUN_ONLY = {
    "branch_from": "a branch starts from a checkpoint, and the clients' states live in the Flower nodes",
    "branch_siblings": "a branch starts from a checkpoint, and the clients' states live in the Flower nodes",
    "checkpoint_every": "checkpoints are written with the clients' states, which live in the Flower nodes",
    "executor": "Flower places the clients, one per node",
    "faults": "faults are injected by morlfed's executors",
    "resume": "a resumed run restores the clients' states, which live in the Flower nodes",
}
#: settings that the Flower path carries out only into a run directory (``run_dir``)
NEEDS_RUN_DIR = {
    "save_similarity": "similarity matrices are written into the run directory",
    "logger": "a tracker's files and run are named after the run directory",
}


@dataclass
class FlowerApps:
    """A morlfed federation as Flower apps.

    :param server_app: runs :attr:`strategy` with Flower's round loop (``Strategy.start``) for the
        run's rounds; its :class:`~flwr.serverapp.strategy.Result` lands in :attr:`result`
    :param client_app: one morlfed client per node (node ``partition-id`` = client id)
    :param num_supernodes: the nodes the federation needs: one per client
    :param strategy: the morlfed strategy behind Flower's interface (it holds the models)
    :param result: Flower's result once the server app has run
    """

    server_app: ServerApp
    client_app: ClientApp
    num_supernodes: int
    strategy: FlowerStrategy
    result: Result | None = field(default=None)

    def run_simulation(self, backend_config: dict[str, Any] | None = None) -> FlowerApps:
        """Run the federation on Flower's simulation engine (Ray), one CPU per node by default.

        The Ray instance it starts listens on 127.0.0.1 only, as ``executor=ray``'s does, unless
        ``backend_config["init_args"]`` says otherwise (``_node_ip_address``, or ``address`` to join
        a cluster): Ray's servers have no authentication. Usage statistics are off unless
        ``RAY_USAGE_STATS_ENABLED`` says otherwise.

        :param backend_config: Flower's simulation backend settings (default: ``client_resources``
            of one CPU and no GPU); its ``init_args`` go to ``ray.init``
        """
        from flwr.simulation import run_simulation

        config = dict(backend_config or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
        init_args = dict(config.get("init_args") or {})
        if "address" not in init_args:
            init_args.setdefault("_node_ip_address", "127.0.0.1")
        config["init_args"] = init_args
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        run_simulation(
            server_app=self.server_app,
            client_app=self.client_app,
            num_supernodes=self.num_supernodes,
            backend_config=config,
        )
        if self.result is None:
            raise RuntimeError("the Flower simulation ended before the federation finished (its log says why)")
        return self

    @property
    def final_models(self) -> dict[int, torch.Tensor | None]:
        """Each client's deployed model at the end (``None``: its private personal model)."""
        return self.strategy.deployed()

    @property
    def final_evaluations(self) -> dict[int, Evaluation]:
        """Each client's evaluation of its deployed model after the last round."""
        return self.strategy.evaluations.get(self.strategy.fed.rounds, {})


def flower_apps(
    *,
    overrides: Sequence[str] = (),
    client_timeout: float | None = None,
    run_dir: str | Path | None = None,
    **settings: Any,
) -> FlowerApps:
    """A federation configured as the command line configures it, as Flower apps.

    ``flower_apps(env="deep-sea-treasure", algo="fedpref", n_clients=4, rounds=2)`` is the
    federation ``python -m morlfed.run env=deep-sea-treasure algo=fedpref n_clients=4 rounds=2``
    runs, with Flower carrying the messages: the same preferences, clients, strategy and seeds.
    With ``run_dir`` the server writes the run directory that command writes (``config.yaml``, the
    task's inputs, ``rounds.csv``, ``clusters.jsonl``, ``models/``, ``final.csv``,
    ``metrics.json``, and ``run.log`` with morlfed's log lines), and its tracker (``logger=``) gets
    the rounds' scalars. Settings that only morlfed's own run carries out (its executor, checkpoints
    and resume, fault injection: :data:`RUN_ONLY`) are refused rather than ignored, and those that
    need a run directory (:data:`NEEDS_RUN_DIR`) are refused without one.

    :param overrides: further overrides in command-line syntax
    :param client_timeout: seconds a client's fit may take before it counts as failed (``None``: no limit)
    :param run_dir: the run directory to write (a new one); ``None``: none, the results stay in
        :class:`FlowerApps`
    :param settings: config groups and top-level settings, as for :func:`morlfed.run_experiment`
    :raises ConfigError: bad input, the command line's error, a setting of morlfed's own run
        (:data:`RUN_ONLY`) that the Flower path does not carry out, or a run directory that holds
        another run
    """
    given = {override.key_or_group.lstrip("+~") for override in parse([*overrides])} | set(settings)
    ignored = sorted(given & set(RUN_ONLY))
    if ignored:
        raise ConfigError(
            f"{', '.join(ignored)}: {RUN_ONLY[ignored[0]]}; the Flower path has no checkpoints or executor "
            "of morlfed's (run it with morlfed.run_experiment or python -m morlfed.run)"
        )
    unwritten = sorted(given & set(NEEDS_RUN_DIR)) if run_dir is None else []
    if unwritten:
        raise ConfigError(f"{', '.join(unwritten)}: {NEEDS_RUN_DIR[unwritten[0]]}: give flower_apps a run_dir")
    plan = plan_composed(settings, overrides)  # the core's Experiment, built as the command line builds it
    recorder = Recorder()
    if run_dir is not None:
        recorder = _run_directory(Path(run_dir), plan)
    factory = plan.task.client_factory(plan.fed, plan.parallelism.torch_threads)
    initial, layout = make_host(factory, [0], None).initial()
    strategy = FlowerStrategy(plan.strategy, plan.fed, initial, layout, recorder=recorder)
    server = ServerApp()
    apps = FlowerApps(server, client_app(factory, client_timeout), plan.fed.n_clients, strategy)

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            with contextlib.nullcontext() if run_dir is None else run_log(Path(run_dir)):
                apps.result = strategy.start(grid, strategy.deployed_arrays(), num_rounds=plan.fed.rounds)
        finally:
            if recorder.tracker is not None:  # a failure is no finished run
                recorder.tracker.close(failed=apps.result is None)

    return apps


def _run_directory(path: Path, plan: Experiment) -> Recorder:
    """Start the run directory at ``path`` as morlfed's own run starts it; the recorder that writes the rest.

    :param path: a new run directory
    :param plan: the validated run (its task writes the inputs and results; its tracker, ``logger=``,
        gets the rounds' scalars)
    :raises ConfigError: ``path`` cannot be created or holds another run, or the tracker cannot start
    """
    check_creatable(path)
    check_new_run_dir(path, "run_dir")
    run_dir = RunDirectory(path)
    run_dir.write_text("config.yaml", plan.config_yaml)
    plan.task.write_inputs(run_dir, plan.run)
    tracker = start_tracker(plan, path)
    return Recorder(run_dir, tracker=tracker, results=partial(plan.task.write_results, run=plan.run))


#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 9
