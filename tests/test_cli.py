"""The command line end to end: complete run directories, the same numbers again, bad input refused.

A tiny run writes a complete run directory, the same seed gives the same numbers, and bad input is
one specific line, a non-zero exit and nothing left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from morlfed.analysis.evaluate import main as evaluate
from morlfed.analysis.runs import LOG_FILES

ROOT = Path(__file__).resolve().parents[1]
TINY = ["n_clients=3", "rounds=2", "local_steps=300", "progress=false"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, morlfed_cli) -> Path:
    """One tiny FedPref run on deep-sea-treasure."""
    out = tmp_path_factory.mktemp("cli") / "run"
    proc = morlfed_cli([*TINY, "save_similarity=true", f"hydra.run.dir={out}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_smoke_run_writes_every_file(smoke: Path):
    logs = [name for name in LOG_FILES if name != "evaluations.csv"]  # that one needs eval_every
    for name in (*logs, "front.png", "similarity_1.npy", "models/deployment.json", "models/model_0.safetensors"):
        assert (smoke / name).is_file() and (smoke / name).stat().st_size > 0, name  # the logs: what archives keep
    prefs = pd.read_csv(smoke / "preferences.csv")
    np.testing.assert_allclose(prefs[["w_0", "w_1"]].to_numpy(), [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]])
    rounds = pd.read_csv(smoke / "rounds.csv")
    assert rounds["round"].tolist() == [1, 2] and (rounds["aggregated"] == 3).all()
    clusters = [json.loads(line) for line in (smoke / "clusters.jsonl").read_text().splitlines()]
    assert [c["round"] for c in clusters] == [1, 2]
    assert sorted(i for cl in clusters[-1]["clusters"] for i in cl) == [0, 1, 2]
    final = pd.read_csv(smoke / "final.csv")
    assert len(final) == 3
    expected = {
        "client",
        "w_0",
        "w_1",
        "return_0",
        "return_1",
        "disc_return_0",
        "disc_return_1",
        "scalarised",
        "scalarised_discounted",
        "model",
    }
    assert expected <= set(final.columns)
    np.testing.assert_allclose(
        final["scalarised"],
        (final[["w_0", "w_1"]].to_numpy() * final[["return_0", "return_1"]].to_numpy()).sum(1),
        atol=1e-5,
    )
    metrics = json.loads((smoke / "metrics.json").read_text())
    assert metrics["algo"] == "fedpref" and metrics["env"] == "deep-sea-treasure" and metrics["rounds"] == 2
    assert metrics["engine"] == "vectorised"  # engine=auto: the engine validated on deep-sea-treasure
    assert metrics["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # device=auto, resolved
    assert metrics["undiscounted"]["mean_scalarised"] == pytest.approx(final["scalarised"].mean())
    assert metrics["discounted"]["igd"] is not None  # DST has a known front
    assert (final["env_steps"] == 600).all()  # the env steps each client took: 2 rounds x 300
    assert (final["loss_env_steps"] == 0).all()  # FedPref measures no loss
    assert metrics["env_steps_per_client"] == {"mean": 600.0, "min": 600, "max": 600}
    assert metrics["env_steps_by_purpose"] == {
        "training": {"mean": 600.0, "min": 600, "max": 600},
        "loss_evaluation": {"mean": 0.0, "min": 0, "max": 0},
    }
    # FedPref reports itself inert exactly when no cluster ever split
    assert (metrics["inert_warning"] is None) == bool(metrics["split_events"])
    # every split of the run, as clusters.jsonl logged them round by round
    logged = [(c["round"], sorted(side)) for c in clusters for split in c["splits"] for side in split]
    recorded = [(e["round"], side) for e in metrics["split_events"] for side in e["sides"]]
    assert recorded == logged and all(e["sizes"] == [len(s) for s in e["sides"]] for e in metrics["split_events"])
    assert (smoke / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sim = np.load(smoke / "similarity_1.npy")
    assert sim.shape == (3, 3) and np.allclose(np.diag(sim), 1, atol=1e-5)
    saved = (smoke / "config.yaml").read_text()
    assert "gym_id: deep-sea-treasure-v0" in saved and "agent_kwargs" in saved  # the env spec is saved with the run


def test_a_fedpref_run_that_never_splits_warns_and_records_it(tmp_path: Path, morlfed_cli):
    """A threshold of 0 can never be crossed: the run ends with the inert warning, on the console and in metrics.json."""
    out = tmp_path / "run"
    proc = morlfed_cli([*TINY, "algo.eps=0", f"hydra.run.dir={out}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["split_events"] == []
    warning = metrics["inert_warning"]
    assert warning.startswith("fedpref: no cluster split, so this run was FedPref's weighting-only ablation")
    assert "would have split at round 2" in warning and warning in proc.stdout + proc.stderr


def test_the_env_steps_of_loss_evaluations_are_counted(tmp_path: Path, morlfed_cli, capsys):
    """The env steps of IFCA's loss evaluations are counted apart from the training's.

    IFCA evaluates each of its 2 server models on every client every round before training
    (``spec.eval_episodes`` episodes each): those env steps are counted apart from the training's,
    in final.csv, metrics.json and the evaluated summary's budget table.
    """
    out = tmp_path / "ifca"
    proc = morlfed_cli([*TINY, "algo=ifca", "algo.n_models=2", f"hydra.run.dir={out}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = pd.read_csv(out / "final.csv")
    loss = final["loss_env_steps"].to_numpy()
    # 2 rounds x 2 models x 1 episode (deep-sea-treasure's eval_episodes) of 1 to 100 steps each
    assert ((loss >= 4) & (loss <= 400)).all()
    assert (final["env_steps"] == 600 + loss).all()  # training (2 rounds x 300) plus the loss episodes
    metrics = json.loads((out / "metrics.json").read_text())
    purpose = metrics["env_steps_by_purpose"]
    assert purpose["training"] == {"mean": 600.0, "min": 600, "max": 600}
    assert purpose["loss_evaluation"] == {"mean": loss.mean(), "min": loss.min(), "max": loss.max()}
    assert metrics["env_steps_per_client"]["mean"] == pytest.approx(600 + loss.mean())
    assert "split_events" not in metrics  # IFCA's K models are fixed: no cluster to split
    assert evaluate([str(out), "--out", str(tmp_path / "eval")]) == 0
    summary = pd.read_csv(tmp_path / "eval" / "summary.csv")
    assert summary["loss_env_steps_per_client"].tolist() == [loss.mean()]
    lines = (tmp_path / "eval" / "comparison.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| environment | preferences |"))
    assert "| training env steps per client | loss-evaluation env steps per client |" in header
    row = f"| deep-sea-treasure | equidistant | all | 3 | 2 | 300 | 600 | {loss.mean():.0f} | {3 * (600 + loss.mean()):.0f} |"
    assert any(line.startswith(row) for line in lines)


def test_run_log_tells_the_story(smoke: Path):
    """Hydra's run.log gets morlfed's log: the start, the settings, one line per round, the end."""
    log = (smoke / "run.log").read_text()
    assert "morlfed run deep-sea-treasure/fedpref/equidistant/seed0" in log
    assert "algo=fedpref finetune=False dist=equidistant seed=0 n_clients=3 rounds=2 local_steps=300" in log
    for rnd in (1, 2):
        assert f"round {rnd}/2: scalarised training reward mean " in log
    assert "3/3 aggregated, 0 failed" in log and "finished in" in log


def test_same_seed_same_numbers(smoke: Path, tmp_path: Path, morlfed_cli):
    proc = morlfed_cli([*TINY, "save_similarity=true", f"hydra.run.dir={tmp_path / 'again'}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "again" / "final.csv").read_text() == (smoke / "final.csv").read_text()


def test_eval_every_logs_a_learning_curve_and_changes_nothing(smoke: Path, tmp_path: Path, morlfed_cli):
    """Evaluating the deployed models after every round leaves training untouched.

    The evaluations run here in worker processes: the same final.csv as the smoke run, and the
    curve's last point is its final mean.
    """
    out = tmp_path / "curve"
    proc = morlfed_cli(
        [
            *TINY,
            "save_similarity=true",
            "eval_every=1",
            "executor=process",
            "executor.workers=2",
            f"hydra.run.dir={out}",
        ],
        ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "final.csv").read_text() == (smoke / "final.csv").read_text()
    rounds = pd.read_csv(out / "rounds.csv")
    assert rounds["mean_eval_scalarised"].notna().all() and len(rounds) == 2
    assert rounds["mean_eval_scalarised"].iloc[-1] == pytest.approx(pd.read_csv(out / "final.csv")["scalarised"].mean())
    assert "mean_eval_scalarised" not in pd.read_csv(smoke / "rounds.csv").columns
    evaluations = pd.read_csv(out / "evaluations.csv")  # every client's, every round, the last one final.csv's
    assert evaluations[["round", "client"]].values.tolist() == [[r, c] for r in (1, 2) for c in range(3)]
    final = pd.read_csv(out / "final.csv")
    assert evaluations["scalarised"].iloc[3:].tolist() == pytest.approx(final["scalarised"].tolist())
    assert not (smoke / "evaluations.csv").exists()


BAD_INPUTS = [
    (["env=atari"], "unknown env 'atari'; valid: deep-sea-treasure"),
    (["dist=uniform"], "unknown dist 'uniform'; valid: dirichlet"),
    (["algo=fedsgd"], "unknown algo 'fedsgd'; valid: "),
    (["n_clients=0"], "n_clients must be a positive integer, got 0"),
    (["rounds=-2"], "rounds must be a positive integer, got -2"),
    (["local_steps=0"], "local_steps must be a positive integer, got 0"),
    (["dist=dirichlet", "dist.alpha=0"], "alpha"),
    (["dist=fixed", "dist.weights=[[0.2,0.3,0.5]]"], "3 entries"),
    (["participation=0"], "participation must be in (0, 1]"),
    (["participation=1.5"], "participation must be in (0, 1]"),
    (["algo.top_r=0"], "top_r must be in (0, 1]"),
    (["eval_every=-1"], "eval_every must be an integer >= 0 (0: only the final evaluation), got -1"),
    (["logger=mlflow"], "unknown logger 'mlflow'; valid: csv, tensorboard, wandb"),
    (["engine=jax"], "unknown engine 'jax'; valid: auto, sb3, vectorised"),
    (["faults=[{client:0,round:1,kind:raise}]"], "engine=vectorised trains a worker's clients as one batch"),
    (["algo=cfl"], "algo=cfl: cfl: warmup (5) must be below the number of aggregated rounds (2)"),
    (["algo=cfl", "algo.warmup=1", "finetune=true"], "warmup (1) must be below the number of aggregated rounds (1)"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_leaves_nothing(args: list[str], message: str, tmp_path: Path, morlfed_cli):
    out = tmp_path / "runs" / "x"
    proc = morlfed_cli([*TINY, *args, f"hydra.run.dir={out}"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("morlfed: error: "), proc.stderr
    assert message in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unwritable_output_directory(tmp_path: Path, morlfed_cli):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        proc = morlfed_cli([*TINY, f"hydra.run.dir={locked / 'run'}"], tmp_path)
        assert proc.returncode == 2 and "is not a writable directory" in proc.stderr
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_output_directory_under_a_file(tmp_path: Path, morlfed_cli):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = morlfed_cli([*TINY, f"hydra.run.dir={blocker / 'run'}"], tmp_path)
    assert proc.returncode == 2 and "is not a writable directory" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


PSEUDO_DIRS = [
    ["hydra.run.dir=/proc/x"],
    ["hydra.run.dir=/sys/morlfed-x/run"],
    ["-m", "hydra.sweep.dir=/proc/x"],
]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("args", PSEUDO_DIRS, ids=[" ".join(a) for a in PSEUDO_DIRS])
def test_output_directory_on_a_pseudo_filesystem(args: list[str], tmp_path: Path, morlfed_cli):
    """An output directory on a pseudo-filesystem is refused in one line, before anything is created.

    Hydra would try to create the directory first (a 15-line trace); os.access says yes to root
    there, so morlfed must actually try to create one.
    """
    proc = morlfed_cli([*TINY, *args], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("morlfed: error: ") and "cannot be created" in lines[0]
    assert not Path(args[-1].partition("=")[2]).exists() and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_default_run_directory_below_an_unwritable_current_directory(morlfed_cli):
    proc = morlfed_cli(TINY, Path("/proc"))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("morlfed: error: the default hydra.run.dir /proc/runs/... cannot be created")
    assert lines[0].endswith("; set hydra.run.dir=...")


def test_help_lists_every_config_group(morlfed_cli):
    proc = morlfed_cli(["--help"])
    assert proc.returncode == 0, proc.stderr
    assert "\nenv: deep-sea-treasure, deep-sea-treasure-v0, minecart" in proc.stdout
    assert "\nlogger: csv, tensorboard, wandb\n" in proc.stdout and "\nalgo: cfl, fedavg" in proc.stdout
