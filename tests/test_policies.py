"""A run's deployed models (morlfed/federation/deployment.py) and its policies (morlfed/analysis/policies.py, rollout.py).

Known answers: a client's SB3 model, built from ``RUN_DIR/models/``, returns on the evaluation
seeds exactly what ``final.csv`` says it returned, on either engine, for shared (FedAvg), own
(local) and private personal (FedMHC) models; a shared model is written once; SB3's own
save/load keeps its actions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from stable_baselines3 import DQN

import morlfed
from morlfed.analysis import rollout as rollout_cli
from morlfed.analysis.run_files import RunDirError
from morlfed.core.params import ParamLayout
from morlfed.federation.deployment import MAP_FILE, Deployment

TINY: dict[str, Any] = {"n_clients": 4, "rounds": 2, "progress": False}
#: every cell of deep-sea-treasure's 11 x 11 grid, as the env observes it
GRID = np.array([[r, c] for r in range(11) for c in range(11)], dtype=np.float32)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three DST runs: own models (local, vectorised), personal ones (FedMHC, vectorised), one shared (FedAvg, SB3)."""
    root = tmp_path_factory.mktemp("policies")
    made: dict[str, dict[str, Any]] = {
        "local": dict(algo="local", local_steps=2000, checkpoint_every=1),
        "fedmhc": dict(algo="fedmhc", local_steps=1000),
        "fedavg": dict(algo="fedavg", local_steps=500, engine="sb3"),
    }
    for name, settings in made.items():
        morlfed.run_experiment(**TINY, **settings, run_dir=root / name)
    return {name: root / name for name in made}


@pytest.mark.parametrize("name", ["local", "fedmhc", "fedavg"])
def test_each_clients_policy_returns_its_row_of_final_csv(runs: dict[str, Path], name: str) -> None:
    result = morlfed.ExperimentResult.load(runs[name])
    final = result.final.set_index("client")
    for cid in range(4):
        rolled = result.rollout(cid)
        assert np.array_equal(rolled.returns.mean(axis=0), final.loc[cid, ["return_0", "return_1"]].to_numpy(float))
        discounted = final.loc[cid, ["disc_return_0", "disc_return_1"]].to_numpy(float)
        assert np.allclose(rolled.discounted.mean(axis=0), discounted, rtol=0, atol=1e-6)
        assert rolled.scalarised.mean() == pytest.approx(final.loc[cid, "scalarised"])
    if name == "local":  # the clients learned different things: a wrong model would show
        assert final[["return_0", "return_1"]].drop_duplicates().shape[0] >= 2


def test_the_policy_is_an_sb3_model_that_saves_and_loads(runs: dict[str, Path], tmp_path: Path) -> None:
    result = morlfed.ExperimentResult.load(runs["local"])
    model = result.policy(1)
    assert isinstance(model, DQN) and model.observation_space.shape == (2,)
    deployed = Deployment.read(runs["local"] / "models").named(1)
    online, target = dict(model.policy.q_net.named_parameters()), dict(model.policy.q_net_target.named_parameters())
    assert torch.equal(online["q_net.0.weight"].detach(), deployed["q_net.q_net.0.weight"])
    assert torch.equal(target["q_net.4.bias"].detach(), deployed["q_net.q_net.4.bias"])
    model.save(tmp_path / "client_1.zip")
    loaded = DQN.load(tmp_path / "client_1.zip")
    assert np.array_equal(model.predict(GRID, deterministic=True)[0], loaded.predict(GRID, deterministic=True)[0])
    policies = result.policies()
    assert sorted(policies) == [0, 1, 2, 3]
    actions = {cid: tuple(p.predict(GRID, deterministic=True)[0]) for cid, p in policies.items()}
    assert len(set(actions.values())) >= 2  # own models: not one policy four times


def test_a_shared_model_is_written_once_with_the_client_map(runs: dict[str, Path]) -> None:
    record = json.loads((runs["fedavg"] / "models" / MAP_FILE).read_text())
    assert record["format"] == "morlfed-deployed-models" and record["round"] == 2
    assert record["models"] == [{"file": "model_0.safetensors", "clients": [0, 1, 2, 3]}]
    assert [c["file"] for c in record["clients"]] == ["model_0.safetensors"] * 4
    assert sorted(p.name for p in (runs["fedavg"] / "models").iterdir()) == [MAP_FILE, "model_0.safetensors"]
    own = json.loads((runs["local"] / "models" / MAP_FILE).read_text())
    assert [m["clients"] for m in own["models"]] == [[0], [1], [2], [3]]


def test_every_checkpoint_keeps_the_models_deployed_after_its_round(runs: dict[str, Path]) -> None:
    first = Deployment.read(runs["local"] / "checkpoints" / "round_1" / "models")
    last = Deployment.read(runs["local"] / "checkpoints" / "round_2" / "models")
    final = Deployment.read(runs["local"] / "models")
    assert (first.round, last.round) == (1, 2)
    assert all(torch.equal(last.model(c), final.model(c)) for c in range(4))
    assert not torch.equal(first.model(0), final.model(0))


def test_a_deployment_groups_equal_models_and_reads_back(tmp_path: Path) -> None:
    layout = ParamLayout.from_shapes({"a.weight": (2, 2), "a.bias": (2,)})
    shared, own = torch.arange(6.0), torch.ones(6)
    deployment = Deployment.of(3, layout, {0: shared, 1: own, 2: shared.clone()}, {0: 0, 1: -1, 2: 0}, "cluster")
    assert len(deployment.models) == 2 and deployment.client_model == {0: 0, 1: 1, 2: 0}
    deployment.write(tmp_path / "models")
    back = Deployment.read(tmp_path / "models")
    assert back.round == 3 and back.layout == layout and back.model_ids == {0: 0, 1: -1, 2: 0}
    assert torch.equal(back.named(2)["a.weight"], torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
    with pytest.raises(KeyError, match="no client 5"):
        back.model(5)


def test_the_same_deployment_is_written_as_the_same_bytes(tmp_path: Path) -> None:
    layout = ParamLayout.from_shapes({"a.weight": (2, 2), "a.bias": (2,)})
    deployment = Deployment.of(3, layout, {0: torch.arange(6.0), 1: torch.ones(6)}, {0: 0, 1: 1}, "cluster")
    written = []
    for k in range(5):  # safetensors' metadata map has a new order at every write: five chances to differ
        deployment.write(tmp_path / f"models_{k}")
        written.append({p.name: p.read_bytes() for p in (tmp_path / f"models_{k}").iterdir()})
    assert all(files == written[0] for files in written[1:])


def test_the_rollout_command_prints_returns_and_draws_every_client(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sheet = tmp_path / "sheet.png"
    assert (
        rollout_cli.main([str(runs["local"]), "--client", "3", "--episodes", "2", "--contact-sheet", str(sheet)]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    final = pd.read_csv(runs["local"] / "final.csv").set_index("client")
    assert out[0].startswith("client 3 episode 0: treasure=") and "; scalarised " in out[0]
    assert out[2].startswith("client 3 mean of 2 episodes:")
    assert f"scalarised {final.loc[3, 'scalarised']:.4g} " in out[2]
    assert sheet.stat().st_size > 10_000


def test_the_rollout_command_records_videos(runs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("moviepy")
    assert rollout_cli.main([str(runs["local"]), "--client", "0", "--episodes", "1", "--video", str(tmp_path)]) == 0
    assert [p.suffix for p in (tmp_path / "client_0").iterdir()] == [".mp4"]


def test_a_run_without_models_is_named(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old = tmp_path / "old"
    old.mkdir()
    for path in runs["fedavg"].iterdir():  # a run from before models/ was written
        if path.is_file():
            (old / path.name).write_bytes(path.read_bytes())
    with pytest.raises(RunDirError, match="kept no deployed models"):
        morlfed.ExperimentResult.load(old).policy(0)
    assert rollout_cli.main([str(old)]) == 2
    assert "kept no deployed models" in capsys.readouterr().err
