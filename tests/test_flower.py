"""Flower interop (morlfed/flower/, examples/flower/): morlfed's strategies and clients on Flower.

The records carry every message unchanged; a federation run on Flower's simulation engine (4
deep-sea-treasure clients, 2 rounds) ends with the final models and evaluations of morlfed's own
sequential executor, bit for bit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra (pip install -e '.[flower]')")

from morlfed.api import plan_experiment
from morlfed.core.protocol import ClientFailure, Evaluation, FitResult, FitTask
from morlfed.federation import Federation
from morlfed.flower.records import (
    evaluation_from_record,
    evaluation_from_request,
    evaluation_request,
    evaluation_to_record,
    outcome_from_record,
    outcome_to_record,
    task_from_record,
    task_to_record,
)
from morlfed.runtime.executors import SequentialExecutor

ROOT = Path(__file__).resolve().parents[1]
TINY = ["env=deep-sea-treasure", "n_clients=4", "rounds=2", "local_steps=300"]


def test_every_message_crosses_flower_unchanged() -> None:
    params = torch.randn(3, 5)
    task = FitTask(params, round=2, train_best=True, report_losses=True, prox_mu=0.1, prox_centre=params[0])
    task = FitTask(**{**task.__dict__, "personal_lambda": 0.5, "split_budget": True})
    back = task_from_record(task_to_record(task))
    assert torch.equal(back.params, task.params) and torch.equal(back.prox_centre, task.prox_centre)  # type: ignore[arg-type]
    assert {k: v for k, v in back.__dict__.items() if "params" not in k and "centre" not in k} == {
        k: v for k, v in task.__dict__.items() if "params" not in k and "centre" not in k
    }
    plain = task_from_record(task_to_record(FitTask(params[0])))
    assert plain.prox_centre is None and plain.personal_lambda is None and plain.round == 0

    result = FitResult(params[1], 300, torch.tensor([0.5, 0.25]), 1, {"train_reward": 1.5}, {"loss": 0.1}, 304, 12)
    again = outcome_from_record(outcome_to_record(result))
    assert isinstance(again, FitResult) and torch.equal(again.params, result.params)
    assert torch.equal(again.losses, result.losses)  # type: ignore[arg-type]
    assert (again.num_samples, again.model_index, again.steps_spent, again.loss_steps_spent) == (300, 1, 304, 12)
    assert (again.metrics, again.learner_stats) == (result.metrics, result.learner_stats)
    bare = outcome_from_record(outcome_to_record(FitResult(params[1], 7)))
    assert isinstance(bare, FitResult) and bare.losses is None and bare.model_index is None and bare.steps_spent is None
    assert outcome_from_record(outcome_to_record(ClientFailure("non-finite parameters"))) == ClientFailure(
        "non-finite parameters"
    )

    evaluation = Evaluation(np.array([8.2, -3.0]), np.array([7.1, -2.9]), 1.5, 1.25, {"x": 2.0}, 30)
    seen = evaluation_from_record(evaluation_to_record(evaluation))
    assert np.array_equal(seen.vector_return, evaluation.vector_return) and seen.env_steps == 30
    assert (seen.scalarised, seen.scalarised_discounted, seen.metrics) == (1.5, 1.25, {"x": 2.0})
    model, seed = evaluation_from_request(evaluation_request(params[2], 11))
    assert model is not None and torch.equal(model, params[2]) and seed == 11
    assert evaluation_from_request(evaluation_request(None, 3)) == (None, 3)


def sequential(settings: list[str]) -> tuple[dict[int, torch.Tensor | None], dict[int, Evaluation]]:
    """The same federation on morlfed's sequential executor: final deployed models and evaluations."""
    plan = plan_experiment(overrides=[*settings, "progress=false"])
    executor = SequentialExecutor()
    executor.start(plan.task.client_factory(plan.fed, 1), plan.fed.n_clients)
    federation = Federation(plan.strategy, executor, plan.fed)
    outcome = federation.run()
    return federation.deployed_models(), outcome.evaluations


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [["algo=fedpref"], ["algo=ifca", "engine=sb3", "finetune=true"]],
    ids=["fedpref-vectorised", "ifca-ft-sb3"],
)
def test_the_flower_simulation_gives_the_sequential_executors_models(settings: list[str], tmp_path: Path) -> None:
    saved = tmp_path / "flower.pt"
    example = Path(__file__).with_name("flower_simulation.py")
    done = subprocess.run(
        [sys.executable, str(example), *TINY, *settings, "--save", str(saved)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "client  scalarised  discounted" in done.stdout
    flower: dict[str, Any] = torch.load(saved, weights_only=False)
    models, evaluations = sequential([*TINY, *settings])
    assert sorted(flower["models"]) == sorted(models) == [0, 1, 2, 3]
    for cid, model in models.items():
        assert model is not None and torch.equal(flower["models"][cid], model), f"client {cid}'s final model differs"
        got, want = flower["evaluations"][cid], evaluations[cid]
        assert np.array_equal(got.vector_return, want.vector_return) and got.scalarised == want.scalarised


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"executor": "process"}, "executor: Flower places the clients, one per node"),
        (
            {"overrides": ["+faults=[{client:0,round:1,kind:raise}]"]},
            "faults: faults are injected by morlfed's executors",
        ),
        ({"checkpoint_every": 1}, "checkpoint_every: checkpoints are written"),
        ({"logger": "tensorboard"}, "logger: a tracker's files and run are named after the run directory: give"),
    ],
)
def test_settings_the_flower_path_would_not_carry_out_are_refused(settings: dict, message: str) -> None:
    from morlfed.core.settings import ConfigError
    from morlfed.flower import flower_apps

    with pytest.raises(ConfigError, match=re.escape(message)):
        flower_apps(**settings)


def test_bad_settings_are_the_command_lines_errors() -> None:
    example = Path(__file__).with_name("flower_simulation.py")
    done = subprocess.run([sys.executable, str(example), "evn=x"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "error: unknown key evn (in evn=x); did you mean env?"


@pytest.mark.parametrize(
    ("given", "address"),
    [(None, "127.0.0.1"), ({"init_args": {"_node_ip_address": "10.1.2.3"}}, "10.1.2.3")],
    ids=["default", "asked-otherwise"],
)
def test_the_flower_simulation_keeps_ray_on_localhost_unless_asked_otherwise(
    monkeypatch: pytest.MonkeyPatch, given: dict | None, address: str
) -> None:
    import flwr.simulation

    from morlfed.flower import flower_apps

    seen: dict[str, Any] = {}
    monkeypatch.setattr(flwr.simulation, "run_simulation", lambda **kwargs: seen.update(kwargs["backend_config"]))
    with pytest.raises(RuntimeError, match="ended before the federation finished"):  # nothing ran
        flower_apps(overrides=TINY).run_simulation(given)
    assert seen["init_args"]["_node_ip_address"] == address
