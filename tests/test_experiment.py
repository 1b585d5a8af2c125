"""The plain-Python core (morlfed/experiment/): an experiment from objects, the same as from the command line's strings.

Known answers: an experiment built from objects gives the numbers of the same settings given as
strings, whether it runs through ``run_experiment`` or through the core alone; a bad value is the
command line's one-line error whichever path meets it; the run directory of an object-built run
is read by ``ExperimentResult.load`` and by ``python -m morlfed.analysis.evaluate``; no private
hydra module is imported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from conftest import compose_config

import morlfed
from morlfed.baselines.ifca import IFCA
from morlfed.core.settings import ConfigError
from morlfed.experiment import Settings, build_experiment, run, strategy_name, strategy_record
from morlfed.strategies.fedpref import FedPref
from morlfed.tasks.rl.task import RLTask

ROOT = Path(__file__).resolve().parents[1]
TINY: dict[str, Any] = {"n_clients": 2, "rounds": 1, "local_steps": 200, "progress": False}
RUN_FILES = ("metrics.json", "final.csv", "rounds.csv", "config.yaml")


class MyFedPref(FedPref):
    """A strategy of one's own: no config in morlfed/conf/algo names its class."""


def test_no_module_imports_a_private_hydra_module() -> None:
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "morlfed").rglob("*.py") if "hydra._internal" in p.read_text()]
    assert not found, found


def test_a_strategy_object_is_named_for_its_config_and_records_its_parameters() -> None:
    assert strategy_name(FedPref(top_r=0.5)) == "fedpref"
    assert strategy_name(IFCA(n_models=2)) == "ifca"
    assert strategy_name(MyFedPref()) == "myfedpref"
    record = strategy_record(FedPref(top_r=0.5))
    assert record["_target_"] == "morlfed.strategies.fedpref.FedPref"
    assert record["top_r"] == 0.5 and record["eps_mode"] == "relative" and record["clustering"] is True


@pytest.mark.parametrize("dist", ["equidistant", "dirichlet", "gaussian", "groups"])
def test_the_rl_task_from_python_values_draws_the_command_lines_preferences(dist: str) -> None:
    cfg = compose_config([f"dist={dist}", "n_clients=6", "seed=3", "device=cpu"])
    composed = RLTask.from_config(cfg, 6, 3)
    built = RLTask.create("deep-sea-treasure", n_clients=6, seed=3, dist=dist, device="cpu")
    assert (composed.preferences == built.preferences).all()
    assert composed.dist == built.dist and composed.spec == built.spec and composed.engine == built.engine


def test_an_override_below_an_object_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"algo\.top_r=0\.5: algo is given as an object"):
        morlfed.run_experiment(algo=FedPref(), overrides=["algo.top_r=0.5"])
    with pytest.raises(ConfigError, match="cannot write"):
        morlfed.run_experiment(dist=FedPref())  # a strategy stands for algo only
    assert list(tmp_path.iterdir()) == []


def test_the_issues_call_runs_and_its_run_directory_is_complete(tmp_path: Path) -> None:
    result = morlfed.run_experiment(
        env="deep-sea-treasure", algo=FedPref(top_r=0.5), n_clients=2, rounds=1, local_steps=200, run_dir=tmp_path / "r"
    )
    assert all((result.run_dir / name).is_file() for name in RUN_FILES)
    assert morlfed.ExperimentResult.load(result.run_dir).metrics["algo"] == "fedpref"
    config = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert config["algo"]["_target_"] == "morlfed.strategies.fedpref.FedPref" and config["algo"]["top_r"] == 0.5
    done = subprocess.run(
        [sys.executable, "-m", "morlfed.analysis.evaluate", str(result.run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_objects_give_the_numbers_of_the_strings(tmp_path: Path) -> None:
    """``algo=FedPref()`` and ``algo="fedpref"`` (its config's defaults are the class's on DST), and the core alone."""
    by_strings = morlfed.run_experiment(algo="fedpref", **TINY, run_dir=tmp_path / "strings")
    by_object = morlfed.run_experiment(algo=FedPref(), **TINY, run_dir=tmp_path / "object")
    task = RLTask.create("deep-sea-treasure", n_clients=2)
    run(build_experiment(task, FedPref(), Settings(**TINY)), tmp_path / "core")
    by_core = morlfed.ExperimentResult.load(tmp_path / "core")
    for result in (by_object, by_core):
        pd.testing.assert_frame_equal(result.final, by_strings.final)
        assert result.metrics["discounted"] == by_strings.metrics["discounted"]
        assert result.metrics["label"] == "fedpref" and result.metrics["dist"] == "equidistant"
    core_files = {p.name for p in (tmp_path / "core").iterdir()}
    assert core_files == {p.name for p in by_strings.run_dir.iterdir()} - {".hydra"}
    assert "morlfed run deep-sea-treasure/fedpref/equidistant/seed0" in (tmp_path / "core" / "run.log").read_text()


@pytest.mark.parametrize(
    ("objects", "strings"),
    [
        ({"algo": FedPref(), "n_clients": 0}, ["n_clients=0"]),
        ({"algo": IFCA(n_models=5), "n_clients": 2}, ["algo=ifca", "algo.n_models=5", "n_clients=2"]),
        ({"algo": FedPref(), "participation": 1.5}, ["participation=1.5"]),
    ],
    ids=["n_clients", "strategy-validate", "participation"],
)
def test_a_bad_value_is_the_command_lines_error_from_objects(
    objects: dict, strings: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, morlfed_cli
) -> None:
    cli = morlfed_cli(strings, tmp_path)
    assert cli.returncode == 2
    line = cli.stderr.strip().splitlines()[-1].removeprefix("morlfed: error: ")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        morlfed.run_experiment(**objects)
    assert str(raised.value) == line
    settings = {"n_clients": 2, "rounds": 1, "local_steps": 10} | {k: v for k, v in objects.items() if k != "algo"}
    task = RLTask.create("deep-sea-treasure", n_clients=2)
    with pytest.raises(ConfigError) as raised:
        build_experiment(task, objects["algo"], Settings(**settings))
    assert str(raised.value) == line
    assert list(tmp_path.iterdir()) == []


def test_a_strategys_own_check_is_the_command_lines_message(tmp_path: Path, morlfed_cli) -> None:
    """``FedPref(top_r=2.0)`` refuses itself when built; the command line names the config before that message."""
    with pytest.raises(ValueError) as raised:
        FedPref(top_r=2.0)
    cli = morlfed_cli(["algo.top_r=2.0"], tmp_path)
    assert cli.stderr.strip().splitlines()[-1] == f"morlfed: error: algo=fedpref: {raised.value}"
