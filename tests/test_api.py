"""The programmatic API (morlfed/api.py, docs/api.md): the command line's run, checks and errors, from Python.

Known answers: the front of a planted final table; the run's numbers equal the command line's for
the same settings; bad input raises exactly the error line the command line prints; the process is
left as it was found (logging, hydra, torch threads).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from matplotlib.figure import Figure

import morlfed
from morlfed.api import ExperimentResult
from morlfed.cli.compose import override_value as _value
from morlfed.core.settings import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY: dict[str, Any] = {"n_clients": 4, "rounds": 2, "local_steps": 300, "progress": False}


def python_blocks(path: Path) -> list[str]:
    """The ```python code blocks of a Markdown file, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def planted_run(path: Path, returns: list[list[float]]) -> Path:
    """A finished run directory whose clients have the given discounted returns."""
    path.mkdir(parents=True)
    rows = [
        {"client": c, "w_0": 0.5, "w_1": 0.5, "disc_return_0": r[0], "disc_return_1": r[1], "model": 0}
        for c, r in enumerate(returns)
    ]
    pd.DataFrame(rows).to_csv(path / "final.csv", index=False)
    pd.DataFrame({"round": [1, 2], "mean_train_reward": [0.5, 1.5]}).to_csv(path / "rounds.csv", index=False)
    (path / "metrics.json").write_text(json.dumps({"label": "planted", "seed": 0}))
    return path


def test_the_front_is_the_clients_no_other_client_dominates(tmp_path: Path) -> None:
    result = ExperimentResult.load(planted_run(tmp_path / "run", [[1, 0], [0, 1], [0.5, 0.5], [0.2, 0.2], [0.5, 0.4]]))
    assert result.front is not None and result.front["client"].tolist() == [0, 1, 2]
    assert result.returns is not None and result.returns.columns.tolist() == [
        "client",
        "disc_return_0",
        "disc_return_1",
    ]
    with pytest.raises(ValueError, match=r"rounds\.csv has no column 'nope'; it has round, mean_train_reward"):
        result.plot_learning("nope")


def test_a_run_without_vector_returns_has_no_front(tmp_path: Path) -> None:
    path = planted_run(tmp_path / "run", [[1, 0]])
    pd.DataFrame([{"client": 0, "l_acc": 90.0}]).to_csv(path / "final.csv", index=False)  # a vision run's table
    result = ExperimentResult.load(path)
    assert result.returns is None and result.front is None
    with pytest.raises(ValueError, match="no vector returns to plot"):
        result.plot_front()


def test_an_unfinished_run_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"holds no finished run: no metrics\.json"):
        ExperimentResult.load(tmp_path)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (True, "true"),
        (None, "null"),
        (3, "3"),
        (np.int64(3), "3"),
        (0.25, "0.25"),
        ("mo-lunar-lander", "mo-lunar-lander"),
        ("a b", "'a b'"),
        ("1,2", "'1,2'"),
        ([1, "x"], "[1,x]"),
        ({"client": 1, "kind": "raise"}, "{client:1,kind:raise}"),
    ],
)
def test_python_values_are_written_in_the_command_lines_syntax(value: object, written: str) -> None:
    assert _value(value) == written


def test_sweeps_and_command_line_flags_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"seed=0,1 is a sweep; run_experiment runs one experiment"):
        morlfed.run_experiment(overrides=["seed=0,1"])
    with pytest.raises(ConfigError, match="--help is a command-line flag"):
        morlfed.run_experiment(overrides=["--help"])
    with pytest.raises(ConfigError, match="cannot write"):
        morlfed.run_experiment(seed=object())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [{"evn": "x"}, {"env": "nope"}, {"rounds": 0}, {"task": "vision", "env": "deep-sea-treasure"}, {"algo": "fedpre"}],
    ids=["unknown-key", "unknown-env", "bad-value", "group-of-another-task", "unknown-option"],
)
def test_bad_arguments_raise_the_command_lines_error(
    settings: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, morlfed_cli
) -> None:
    argv = [f"{key}={value}" for key, value in settings.items()]
    cli = morlfed_cli(argv, tmp_path)
    assert cli.returncode == 2
    line = cli.stderr.strip().splitlines()[-1].removeprefix("morlfed: error: ")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        morlfed.run_experiment(**settings)
    assert str(raised.value) == line
    assert list(tmp_path.iterdir()) == []  # nothing written, by either


@pytest.mark.slow
def test_two_calls_give_the_command_lines_numbers_and_leave_the_process_as_it_was(tmp_path: Path, morlfed_cli) -> None:
    root = logging.getLogger()
    handlers, threads = list(root.handlers), torch.get_num_threads()
    first = morlfed.run_experiment(**TINY, algo="fedpref", run_dir=tmp_path / "the first")  # a space: quoted
    second = morlfed.run_experiment(**TINY, algo="fedpref", run_dir=tmp_path / "second")
    cli = morlfed_cli(
        ["algo=fedpref", *(f"{k}={_value(v)}" for k, v in TINY.items()), f"hydra.run.dir={tmp_path / 'cli'}"]
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    by_cli = ExperimentResult.load(tmp_path / "cli")
    assert first.run_dir == tmp_path / "the first"
    for result in (first, second):
        pd.testing.assert_frame_equal(result.final, by_cli.final)
        assert result.metrics["discounted"] == by_cli.metrics["discounted"]
        assert result.rounds["mean_train_reward"].tolist() == by_cli.rounds["mean_train_reward"].tolist()
        assert sorted(p.name for p in result.run_dir.iterdir()) == sorted(p.name for p in (tmp_path / "cli").iterdir())
        assert (result.run_dir / "run.log").read_text().count("round 2/2") == 1
    assert root.handlers == handlers and torch.get_num_threads() == threads
    assert HydraConfig.instance().cfg is None and not GlobalHydra.instance().is_initialized()
    assert isinstance(first.plot_front(), Figure) and first.front is not None and len(first.front) >= 1


@pytest.mark.slow
def test_the_issues_one_liner_runs_in_a_fresh_interpreter(tmp_path: Path) -> None:
    code = "import morlfed; r = morlfed.run_experiment(rounds=2, local_steps=300, n_clients=4); print(r.metrics)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=None
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout.strip().splitlines()[-1]
    assert printed.startswith("{'algo': 'fedpref'") and "'discounted': {" in printed


@pytest.mark.slow
def test_the_api_docs_examples_run(tmp_path: Path) -> None:
    script = tmp_path / "docs_api.py"
    script.write_text("\n\n".join(python_blocks(ROOT / "docs" / "api.md")))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "unknown key evn (in evn=mo-lunar-lander); did you mean env?" in out
    assert "[[0, 1, 2], [3, 4, 5]]" in out  # FedPref recovers the planted groups
    assert "[0, 1, 2, 3] {0: " in out  # the federation driven by hand: four clients' final models
    assert "\n6.0\n" in out  # the hand-computed hypervolume
    assert (tmp_path / "front.png").is_file() and (tmp_path / "learning.png").is_file()
    assert (tmp_path / "my-runs" / "top-r-0.5" / "metrics.json").is_file()
    assert "[0, 1] batched" in out  # two runs as one batch


def test_load_refuses_run_files_that_are_malformed_or_disagree(tmp_path: Path) -> None:
    path = planted_run(tmp_path / "run", [[1, 0], [0, 1]])
    (path / "metrics.json").write_text(json.dumps({"label": "planted", "n_clients": 2, "rounds": 2}))
    assert ExperimentResult.load(path).metrics["rounds"] == 2
    pd.DataFrame({"round": [1], "mean_train_reward": [0.5]}).to_csv(path / "rounds.csv", index=False)  # truncated
    with pytest.raises(ValueError, match=r"rounds\.csv logs rounds 1-1 \(1 rows\) where metrics\.json says rounds=2"):
        ExperimentResult.load(path)
    (path / "metrics.json").write_text(json.dumps({"label": "planted", "n_clients": 3, "rounds": 1}))
    with pytest.raises(ValueError, match=r"final\.csv has 2 clients where metrics\.json says n_clients=3"):
        ExperimentResult.load(path)
    (path / "metrics.json").write_text(json.dumps([{"label": "planted"}]))
    with pytest.raises(ValueError, match=r"metrics\.json: not a JSON object"):
        ExperimentResult.load(path)
