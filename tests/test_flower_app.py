"""examples/flower/ is a Flower app: ``flwr run`` trains it on Flower's local simulation.

Flower's home and state live in the test's temporary folder (``FLWR_HOME``), the local SuperLink
that ``flwr run`` starts listens on free ports and is stopped at the end, and nothing calls the
network (no telemetry, update check or dependency installation). The run writes the run directory
of a native run, which :meth:`morlfed.api.ExperimentResult.load` reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_bench

pytest.importorskip("flwr", reason="the flower extra (pip install -e '.[flower]')")

from morlfed.api import ExperimentResult
from morlfed.flower.app import client_timeout_of, run_dir_of, settings_of

ROOT = Path(__file__).resolve().parents[1]


def test_the_app_names_its_components_and_settings() -> None:
    from flwr.cli.config_utils import load_and_validate

    project, warnings = load_and_validate(ROOT / "examples" / "flower" / "pyproject.toml", check_module=False)
    assert warnings == []  # what flwr run checks and warns about
    app = project["tool"]["flwr"]["app"]
    assert app["components"] == {
        "serverapp": "morlfed_app.server_app:app",
        "clientapp": "morlfed_app.client_app:app",
    }
    assert {"env", "algo", "n-clients", "rounds", "local-steps", "run-dir"} <= set(app["config"])
    # flwr 1.42 moves [tool.flwr.federations] into Flower's own config and rewrites pyproject.toml
    assert "federations" not in project["tool"]["flwr"]


def test_the_run_config_becomes_the_command_lines_settings(tmp_path: Path) -> None:
    run_config: dict[str, bool | int | float | str] = {
        "env": "deep-sea-treasure",
        "n-clients": 2,
        "finetune": True,
        "engine": "",
        "run-dir": "",
        "client-timeout": 0,
        "overrides": "lr=0.001 +experiment=dst-comparison",
    }
    assert settings_of(run_config) == [
        "env=deep-sea-treasure",
        "finetune=true",
        "n_clients=2",
        "lr=0.001",
        "+experiment=dst-comparison",
    ]
    assert client_timeout_of(run_config) is None and client_timeout_of({"client-timeout": 30}) == 30.0
    assert run_dir_of(run_config, 7, tmp_path) == tmp_path / "runs" / "7"
    assert run_dir_of({"run-dir": "mine"}, 7, tmp_path) == tmp_path / "mine"
    assert run_dir_of({"run-dir": "/abs/run"}, 7, tmp_path) == Path("/abs/run")


@pytest.mark.slow
def test_flwr_run_trains_the_app_and_writes_its_run_directory(tmp_path: Path) -> None:
    bench = load_bench("flower_overhead")
    home, run_dir = tmp_path / "flwr-home", tmp_path / "run"
    settings = {"env": "deep-sea-treasure", "algo": "fedpref", "n-clients": 2, "rounds": 2, "local-steps": 200}
    try:
        run = bench.flwr_run(bench.flwr_env(home), bench.run_config({**settings, "run-dir": str(run_dir)}), 2, 300)
    finally:
        stopped = bench.stop_local_superlink(home)
    assert stopped and not bench.local_superlinks(home), "the local SuperLink is still running"
    assert run.returncode == 0, run.output[-3000:]
    assert "[ROUND 2/2]" in run.output and "Strategy execution finished" in run.output, run.output[-3000:]
    assert "DEPRECATED" not in run.output and "Traceback" not in run.output, run.output[-3000:]
    result = ExperimentResult.load(run_dir)
    assert sorted(result.final["client"]) == [0, 1]
