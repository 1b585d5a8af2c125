"""The one federated round both front-ends run (morlfed.federation.round), and the recorder that writes it down.

Planted outcomes: a failed client and one with non-finite parameters are left out of the
aggregate and reported; a "+FT" run's last round keeps each client's model instead of
aggregating; the round's state round-trips for checkpoints. The recorder writes a round's row and
the end's models and results into the run directory.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import ClientFailure, Evaluation, FitResult
from morlfed.federation import FederatedRound, FederationConfig, FederationOutcome, Recorder
from morlfed.federation.deployment import Deployment
from morlfed.storage.rundir import RunDirectory
from morlfed.strategies.base import make_strategy

LAYOUT = ParamLayout.from_shapes({"w": (3,)})


class NoPersonalModels:
    """A personal-model source for strategies that deploy none."""

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        assert not cids, "fedavg's clients deploy the global model"
        return {}


def deployed(fed: FederatedRound) -> dict[int, torch.Tensor]:
    """The clients' deployed models, none of them a personal one (fedavg)."""
    models = fed.deployed()
    assert all(model is not None for model in models.values())
    return {cid: model for cid, model in models.items() if model is not None}


def fedavg_round(**settings: Any) -> FederatedRound:
    cfg = FederationConfig(**{"n_clients": 4, "rounds": 2, "local_steps": 10, "progress": False, **settings})
    return FederatedRound(make_strategy("fedavg"), cfg, torch.zeros(3), LAYOUT)


def planted(value: float) -> dict[int, FitResult | ClientFailure]:
    """Round outcomes: clients 0 and 1 usable, 2 failed, 3 diverged."""
    return {
        0: FitResult(torch.full((3,), value), 10, metrics={"train_reward": 1.0}, steps_spent=10),
        1: FitResult(torch.full((3,), value + 2), 10, metrics={"train_reward": 3.0}, steps_spent=10),
        2: ClientFailure("exception RuntimeError: boom"),
        3: FitResult(torch.tensor([1.0, float("nan"), 0.0]), 10, steps_spent=10),
    }


def test_failed_and_non_finite_results_are_left_out_of_the_aggregate() -> None:
    fed = fedavg_round()
    tasks = fed.begin(1)
    assert sorted(tasks) == [0, 1, 2, 3] and all(task.round == 1 for task in tasks.values())
    report = fed.end(1, planted(1.0))
    assert sorted(report.ok) == [0, 1] and report.aggregated and report.participants == 4
    assert report.failed == {2: "exception RuntimeError: boom", 3: "non-finite parameters"}
    assert report.train_reward == 2.0
    assert all(torch.equal(model, torch.full((3,), 2.0)) for model in deployed(fed).values())  # mean of 1 and 3
    assert fed.steps_spent == {0: 10, 1: 10, 2: 0, 3: 0}  # only usable fits count


def test_a_participant_without_an_outcome_failed() -> None:
    fed = fedavg_round()
    fed.begin(1)
    report = fed.end(1, {0: FitResult(torch.ones(3), 10)})
    assert sorted(report.failed) == [1, 2, 3] and set(report.failed.values()) == {"no reply"}


def test_the_last_round_of_a_finetuned_run_keeps_the_models_instead_of_aggregating() -> None:
    fed = fedavg_round(finetune=True, participation=0.5)
    assert len(fed.begin(1)) == 2  # half the clients in an ordinary round
    fed.end(1, {cid: FitResult(torch.full((3,), 5.0), 10) for cid in fed.participants(1)})
    assert sorted(fed.begin(2)) == [0, 1, 2, 3]  # every client fine-tunes in the last round
    report = fed.end(2, planted(1.0))
    assert not report.aggregated and report.diagnostics == {}
    models = deployed(fed)
    assert torch.equal(models[0], torch.full((3,), 1.0)) and torch.equal(models[1], torch.full((3,), 3.0))
    # clients 2 and 3 had no usable last fit: they deploy the global model of round 1
    assert torch.equal(models[2], torch.full((3,), 5.0)) and torch.equal(models[3], torch.full((3,), 5.0))
    ids, note = fed.model_ids()
    assert ids == {0: -1, 1: -1, 2: 0, 3: 0} and "+FT" in note


def test_the_round_state_round_trips_for_checkpoints() -> None:
    fed = fedavg_round()
    fed.begin(1)
    fed.end(1, planted(1.0))
    state = fed.state_dict()
    again = fedavg_round()
    again.load_state_dict(state)
    assert again.completed == 1 and again.steps_spent == fed.steps_spent
    assert all(torch.equal(deployed(again)[c], deployed(fed)[c]) for c in range(4))


def test_the_recorder_writes_the_round_and_the_end(tmp_path: Path) -> None:
    written: list[FederationOutcome] = []

    def results(run_dir: RunDirectory, outcome: FederationOutcome) -> dict[str, Any]:
        written.append(outcome)
        run_dir.write_json("metrics.json", {"clients": len(outcome.evaluations)})
        return {"clients": len(outcome.evaluations)}

    fed = fedavg_round(rounds=1)
    recorder = Recorder(RunDirectory(tmp_path), results=results)
    recorder.attach(fed, NoPersonalModels())
    fed.begin(1)
    recorder.on_round(fed.end(1, planted(1.0)))
    with open(tmp_path / "rounds.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["round"], row["participants"], row["aggregated"]) == ("1", "4", "2")
    assert row["failed"] == "2:exception RuntimeError: boom;3:non-finite parameters"
    evaluation = Evaluation(torch.zeros(2).numpy(), torch.zeros(2).numpy(), 0.5, 0.5)
    outcome = fed.outcome(dict.fromkeys(range(4), evaluation), 1.0)
    recorder.on_end(outcome)
    assert written == [outcome] and recorder.metrics == {"clients": 4}
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"clients": 4}
    models = Deployment.read(tmp_path / "models")
    assert models.round == 1 and torch.equal(models.models[0], torch.full((3,), 2.0))


def test_a_checkpointing_recorder_needs_the_clients_executor(tmp_path: Path) -> None:
    from morlfed.federation.checkpoint import Checkpointer

    recorder = Recorder(RunDirectory(tmp_path), Checkpointer(tmp_path))
    with pytest.raises(ValueError, match="needs the executor"):
        recorder.attach(fedavg_round(), NoPersonalModels())
