"""morlfed as a Flower app that ``flwr run`` starts: the ServerApp and ClientApp read the run config.

A Flower app (``examples/flower/``) names a module-level ``ServerApp`` and ``ClientApp`` in its
``pyproject.toml`` (``[tool.flwr.app.components]``) and its settings in ``[tool.flwr.app.config]``;
``flwr run --run-config "..."`` overrides them, and each app finds them in ``context.run_config``.
:func:`server_app` and :func:`client_app` are those apps for morlfed: every run-config key but
:data:`RUN_DIR`, :data:`CLIENT_TIMEOUT` and :data:`OVERRIDES` is a setting of
``python -m morlfed.run`` with ``-`` for ``_`` (``n-clients = 4`` is ``n_clients=4``, ``env =
"deep-sea-treasure"`` is ``env=deep-sea-treasure``), and an empty string leaves the setting at its
default. The ServerApp writes the run directory of a native run (:func:`run_dir_of`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from morlfed.cli.compose import plan_composed
from morlfed.experiment import Experiment
from morlfed.flower import client_app as flower_client_app
from morlfed.flower import flower_apps

log = logging.getLogger(__name__)

#: the run-config key of the run directory (empty: :func:`run_dir_of`'s default)
RUN_DIR = "run-dir"
#: the run-config key of ``client_timeout`` in seconds (0: no limit)
CLIENT_TIMEOUT = "client-timeout"
#: the run-config key of further settings in command-line syntax, space-separated (``"lr=0.001 +faults=..."``)
OVERRIDES = "overrides"
#: the keys that are not settings of ``python -m morlfed.run``
APP_KEYS = (RUN_DIR, CLIENT_TIMEOUT, OVERRIDES)

RunConfig = Mapping[str, bool | int | float | str]


def settings_of(run_config: RunConfig) -> list[str]:
    """The run config's settings as ``python -m morlfed.run``'s ``key=value`` overrides.

    :param run_config: the app's run config (``context.run_config``)
    """

    def text(value: bool | int | float | str) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    settings = [
        f"{key.replace('-', '_')}={text(value)}"
        for key, value in sorted(run_config.items())
        if key not in APP_KEYS and value != ""
    ]
    return [*settings, *str(run_config.get(OVERRIDES, "")).split()]


def client_timeout_of(run_config: RunConfig) -> float | None:
    """The run config's ``client-timeout`` in seconds (``None``: no limit, also for 0 or an absent key).

    :param run_config: the app's run config
    """
    seconds = float(run_config.get(CLIENT_TIMEOUT, 0) or 0)
    return seconds if seconds > 0 else None


def run_dir_of(run_config: RunConfig, run_id: int, app_dir: Path) -> Path:
    """Where the run writes its run directory.

    The run config's ``run-dir``; a relative one is taken inside ``app_dir``, and an empty one is
    ``runs/<run id>`` there: the ServerApp runs in the SuperLink's processes, whose working
    directory is not the one ``flwr run`` was typed in.

    :param run_config: the app's run config
    :param run_id: Flower's run id (``context.run_id``)
    :param app_dir: the folder of the app's installed copy
    """
    given = str(run_config.get(RUN_DIR, ""))
    return app_dir / (given or f"runs/{run_id}")


def server_app(app_dir: Path) -> ServerApp:
    """A ServerApp that runs the federation its run config describes (see the module docstring).

    :param app_dir: the app's folder (a relative or empty ``run-dir`` lands in it)
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_dir = run_dir_of(context.run_config, context.run_id, app_dir)
        log.info("morlfed run directory: %s", run_dir)
        apps = flower_apps(
            overrides=settings_of(context.run_config),
            client_timeout=client_timeout_of(context.run_config),
            run_dir=run_dir,
        )
        apps.server_app(grid, context)

    return app


def client_app() -> ClientApp:
    """A ClientApp whose nodes run the clients of the federation their run config describes.

    It builds morlfed's ClientApp (:func:`morlfed.flower.client_app.client_app`) from the run
    config once per process and run, and hands it every message.
    """
    app = ClientApp()
    built: dict[tuple[int, tuple[tuple[str, bool | int | float | str], ...]], ClientApp] = {}

    def run(message: Message, context: Context) -> Message:
        key = (context.run_id, tuple(sorted(context.run_config.items())))
        if key not in built:
            plan = plan_of(context.run_config)
            factory = plan.task.client_factory(plan.fed, plan.parallelism.torch_threads)
            built.clear()  # one run's clients at a time
            built[key] = flower_client_app(factory, client_timeout_of(context.run_config))
        return built[key](message, context)

    app.query()(run)
    app.train()(run)
    app.evaluate()(run)
    return app


def plan_of(run_config: RunConfig) -> Experiment:
    """The experiment of the run config's settings, built as the command line builds it (:func:`morlfed.cli.compose.plan_composed`).

    :param run_config: the app's run config
    """
    return plan_composed({}, settings_of(run_config))
