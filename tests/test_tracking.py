"""Experiment tracking (``logger=``): TensorBoard and W&B logs, and a missing backend named in one line.

The scalars of a round, the SB3 client's own training scalars, TensorBoard event files that
TensorBoard's reader reads back, an offline W&B run, and a missing backend named by its extra in one
line.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import compose_config
from matplotlib.figure import Figure

from morlfed import envs
from morlfed.cli.execute import ConfigError, build_plan
from morlfed.core.protocol import FitResult, FitTask
from morlfed.metrics.figures import save_figure
from morlfed.tasks.rl.client import RLClient
from morlfed.tracking import Tracker, flat_scalars, round_line, round_scalars, tracker_class

TINY = ["n_clients=3", "rounds=2", "local_steps=300", "progress=false"]


def result(reward: float, **learner: float) -> FitResult:
    return FitResult(torch.zeros(2), 1, metrics={"train_reward": reward, "episodes": 2.0}, learner_stats=learner)


def test_round_scalars_and_the_run_log_line():
    ok = {0: result(1.0, loss=0.5, exploration_rate=0.9), 3: result(-2.0, loss=math.nan)}
    scalars = round_scalars(ok, {1: "exception: boom"}, 3, 2, n_clusters=2, evaluated=4.5, seconds=1.25)
    assert scalars == {
        "train/reward_mean": -0.5,
        "train/reward_min": -2.0,
        "train/reward_max": 1.0,
        "federation/participants": 3.0,
        "federation/aggregated": 2.0,
        "federation/failed": 1.0,
        "federation/seconds": 1.25,
        "federation/n_clusters": 2.0,
        "eval/mean_scalarised": 4.5,
        "client_0/train_reward": 1.0,
        "client_0/episodes": 2.0,
        "client_0/loss": 0.5,
        "client_0/exploration_rate": 0.9,
        "client_3/train_reward": -2.0,
        "client_3/episodes": 2.0,
    }  # the NaN loss is left out
    assert round_line(2, 5, scalars) == (
        "round 2/5: scalarised training reward mean -0.5 (min -2, max 1), 2/3 aggregated, 1 failed, 2 clusters, "
        "deployed models' mean scalarised evaluation 4.5, 1.2 s"
    )
    bare = round_scalars({}, {}, 3, 0, n_clusters=0, evaluated=None, seconds=0.5)
    assert sorted(bare) == [
        "federation/aggregated",
        "federation/failed",
        "federation/participants",
        "federation/seconds",
    ]
    assert round_line(1, 1, bare) == "round 1/1: 0/3 aggregated, 0 failed, 0.5 s"
    nested = {"algo": "fedpref", "finetune": False, "seed": 3, "discounted": {"hypervolume": 2.0, "igd": None}}
    assert flat_scalars(nested, "final/") == {"final/seed": 3.0, "final/discounted/hypervolume": 2.0}


@pytest.mark.parametrize("env", ["deep-sea-treasure", "mo-lunar-lander-continuous"])
def test_the_sb3_client_reports_its_training_losses_and_exploration_rate(env: str):
    spec = envs.get_spec(env)
    spec = dataclasses.replace(spec, agent_kwargs={**spec.agent_kwargs, "learning_starts": 50})
    m = len(spec.objectives)
    client = RLClient(0, spec, np.full(m, 1 / m), seed=0, local_steps=200, rounds=5)
    stats = client.fit(FitTask(params=client.initial_params(), round=1)).learner_stats
    if env == "deep-sea-treasure":  # DQN: epsilon after 200 of 1000 steps, decaying over the first half
        assert sorted(stats) == ["exploration_rate", "loss"]
        assert stats["exploration_rate"] == pytest.approx(1.0 - 0.9 * 200 / 500) and stats["loss"] > 0
    else:  # DDPG: no epsilon; the critic trains on every collected episode
        assert "exploration_rate" not in stats and stats["critic_loss"] > 0


def test_a_missing_backend_names_its_extra(monkeypatch):
    assert tracker_class("morlfed.tracking.Tracker", "csv") is Tracker
    assert build_plan(compose_config(["logger=tensorboard"])).tracker_options == {"subdir": "tensorboard"}
    monkeypatch.delitem(sys.modules, "morlfed.tracking.tensorboard", raising=False)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(ConfigError, match=r"^logger=tensorboard needs the optional package 'tensorboard' .*") as err:
        build_plan(compose_config(["logger=tensorboard"]))
    assert "pip install -e '.[tensorboard]'" in str(err.value) and "\n" not in str(err.value)


def test_tensorboard_event_files_read_back_by_tensorboard(tmp_path: Path, morlfed_cli):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    proc = morlfed_cli([*TINY, "logger=tensorboard", "eval_every=1", f"hydra.run.dir={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model: what the client deploys" in proc.stdout  # the console table explains its model column
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    rounds = pd.read_csv(out / "rounds.csv")

    def curve(tag: str) -> tuple[list[int], list[float]]:
        found = events.Scalars(tag)
        return [e.step for e in found], [e.value for e in found]

    steps, values = curve("train/reward_mean")
    assert steps == [1, 2]
    np.testing.assert_allclose(values, rounds["mean_train_reward"], rtol=1e-6)
    steps, values = curve("eval/mean_scalarised")
    assert steps == [1, 2]
    np.testing.assert_allclose(values, rounds["mean_eval_scalarised"], rtol=1e-6)
    assert curve("federation/n_clusters")[0] == [1, 2] and curve("federation/failed")[1] == [0.0, 0.0]
    tags = set(events.Tags()["scalars"])
    for cid in range(3):
        assert {f"client_{cid}/{k}" for k in ("train_reward", "loss", "exploration_rate")} <= tags
    final = pd.read_csv(out / "final.csv")
    steps, values = curve("final/undiscounted/mean_scalarised")
    assert steps == [2] and values[0] == pytest.approx(final["scalarised"].mean(), rel=1e-6)
    assert events.Tags()["images"] == ["figures/front"]


@pytest.mark.skipif(os.isatty(0), reason="wandb would ask for an API key on this terminal")
def test_wandb_online_without_a_login_is_one_error_line(tmp_path: Path, morlfed_cli, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc with a W&B key
    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "run"
    proc = morlfed_cli([*TINY, "logger=wandb", f"hydra.run.dir={out}"], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("morlfed: error: logger=wandb: "), lines
    assert not out.exists()


@pytest.mark.slow  # starts W&B's service process
def test_wandb_offline_run_in_the_run_directory(tmp_path: Path):
    pytest.importorskip("wandb")
    from morlfed.tracking.wandb import WandbTracker

    figure = save_figure(Figure(), tmp_path / "front", ["png"])
    tracker = WandbTracker(tmp_path, "dst/fedpref/equidistant/seed0", {"seed": 0}, mode="offline")
    try:
        tracker.log_round(1, {"train/reward_mean": 1.5, "client_0/loss": 0.25})
        tracker.log_final(1, {"final/discounted/hypervolume": 7.0}, figure)
        assert tracker.run.summary["final/discounted/hypervolume"] == 7.0
        assert tracker.run.config["seed"] == 0 and tracker.run.name == "dst/fedpref/equidistant/seed0"
    finally:
        tracker.close()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    assert any(p.stat().st_size > 0 for p in offline.glob("run-*.wandb"))
    with pytest.raises(ValueError, match=r"online, offline or disabled"):
        WandbTracker(tmp_path, "x", {}, mode="shared")


@pytest.mark.parametrize("failed, exit_code", [(False, 0), (True, 1)])
def test_wandb_records_a_failed_or_stopped_run_as_failed(tmp_path: Path, monkeypatch, failed: bool, exit_code: int):
    pytest.importorskip("wandb")
    from morlfed.tracking.wandb import WandbTracker

    tracker = WandbTracker(tmp_path, "x", {}, mode="disabled")
    codes: list[int | None] = []
    monkeypatch.setattr(tracker.run, "finish", lambda exit_code=None: codes.append(exit_code))
    tracker.close(failed=failed)
    assert codes == [exit_code]
