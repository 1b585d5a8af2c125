"""A Flower run writes morlfed's run directory (morlfed.flower.flower_apps(run_dir=...)).

Run on Flower's simulation engine (3 deep-sea-treasure clients, 2 rounds), a federation writes
the run directory of morlfed's own run: ``ExperimentResult.load`` and ``analysis.evaluate`` read
it, and its ``final.csv`` and deployed models are the sequential executor's. A strategy whose
clients deploy private personal models (FedMHC) gets them from the Flower nodes: ``models/``
holds the same weights as morlfed's own run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra (pip install -e '.[flower]')")

from morlfed.analysis.evaluate import main as evaluate
from morlfed.api import ExperimentResult, run_experiment
from morlfed.federation.deployment import Deployment

ROOT = Path(__file__).resolve().parents[1]
TINY = ["env=deep-sea-treasure", "n_clients=3", "rounds=2", "local_steps=300", "seed=4", "progress=false"]
#: a Flower run in a process of its own (Ray's, as examples/flower/run_simulation.py runs it)
FLOWER = "import sys; from morlfed.flower import flower_apps; flower_apps(overrides=sys.argv[2:], run_dir=sys.argv[1]).run_simulation()"


def flower_run(run_dir: Path, settings: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FLOWER, str(run_dir), *settings],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_models(a: Path, b: Path) -> None:
    flower, native = Deployment.read(a / "models"), Deployment.read(b / "models")
    assert flower.model_ids == native.model_ids
    for cid in flower.model_ids:
        mine, theirs = flower.models[flower.client_model[cid]], native.models[native.client_model[cid]]
        assert torch.equal(mine, theirs), f"client {cid}'s deployed model differs"


@pytest.mark.slow
def test_a_flower_run_writes_the_run_directory_of_morlfeds_own_run(tmp_path: Path) -> None:
    settings = [*TINY, "algo=fedpref", "save_similarity=true", "logger=tensorboard"]
    flower_run(tmp_path / "flower", settings)
    native = run_experiment(overrides=[*settings, "executor=sequential"], run_dir=tmp_path / "native")
    result = ExperimentResult.load(tmp_path / "flower")
    assert len(result.final) == 3 and list(result.rounds["round"]) == [1, 2]
    pd.testing.assert_frame_equal(result.final, native.final)
    columns = ["round", "participants", "aggregated", "failed", "mean_train_reward", "n_clusters"]
    pd.testing.assert_frame_equal(result.rounds[columns], native.rounds[columns])
    for name in ("config.yaml", "preferences.csv", "clusters.jsonl", "similarity_1.npy", "similarity_2.npy"):
        assert (tmp_path / "flower" / name).is_file(), name
    assert (tmp_path / "flower" / "clusters.jsonl").read_text() == (tmp_path / "native" / "clusters.jsonl").read_text()
    assert list((tmp_path / "flower" / "tensorboard").glob("events.out.tfevents.*")), "the tracker wrote nothing"
    log = (tmp_path / "flower" / "run.log").read_text()
    assert "round 1/2" in log and "round 2/2" in log, log  # the round lines, as the command line's run.log has them
    assert_same_models(tmp_path / "flower", tmp_path / "native")
    assert evaluate([str(tmp_path / "flower"), "--out", str(tmp_path / "eval")]) == 0


@pytest.mark.slow
def test_a_personal_model_strategy_under_flower_writes_the_clients_real_models(tmp_path: Path) -> None:
    settings = [*TINY, "algo=fedmhc", "algo.n_groups=2"]
    flower_run(tmp_path / "flower", settings)
    run_experiment(overrides=[*settings, "executor=sequential"], run_dir=tmp_path / "native")
    assert_same_models(tmp_path / "flower", tmp_path / "native")
    deployed = Deployment.read(tmp_path / "flower" / "models")
    assert len(deployed.models) == 3  # three personal models, none the shared initial one
