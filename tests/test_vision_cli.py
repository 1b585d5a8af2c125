"""The vision path end to end: every registered strategy through the CLI, tables, and bad input.

Every registered strategy runs two rounds on digits through the CLI (one hydra multirun) and writes
a complete run directory, ``analysis.evaluate`` tables the runs, and bad input is one line, exit
status 2 and nothing left behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from morlfed.analysis.evaluate import main as evaluate_main
from morlfed.metrics import ACCURACIES, accuracy_summary
from morlfed.strategies.base import available_strategies

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = available_strategies()
TINY = ["task=vision", "rounds=2", "n_clients=4", "model.hidden=[16]", "data.batch_size=32", "progress=false"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, morlfed_cli) -> Path:
    """One hydra multirun: every strategy, two rounds, four clients, on digits.

    CFL runs apart, with a warm-up of 1 round: its default of 5 would never let two rounds split,
    which is refused.
    """
    out = tmp_path_factory.mktemp("vision") / "sweep"
    others = [s for s in STRATEGIES if s != "cfl"]
    proc = morlfed_cli(["-m", *TINY, f"algo={','.join(others)}", f"hydra.sweep.dir={out}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfl = [*TINY, "algo=cfl", "algo.warmup=1", f"hydra.run.dir={out / f'{len(others)}_cfl_dirichlet_seed0'}"]
    proc = morlfed_cli(cfl, ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def run_dir(sweep: Path, algo: str) -> Path:
    (found,) = [p for p in sweep.iterdir() if p.is_dir() and p.name.split("_")[1] == algo]
    return found


@pytest.mark.parametrize("algo", STRATEGIES)
def test_every_strategy_writes_a_complete_vision_run(sweep, algo):
    path = run_dir(sweep, algo)
    for name in (
        "config.yaml",
        "label_histogram.csv",
        "label_histogram.png",
        "rounds.csv",
        "final.csv",
        "metrics.json",
    ):
        assert (path / name).is_file() and (path / name).stat().st_size > 0, name
    assert (path / "label_histogram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    hist = pd.read_csv(path / "label_histogram.csv")
    classes = hist[[f"class_{c}" for c in range(10)]].to_numpy()
    assert len(hist) == 4 and classes.sum() == 1797  # digits, every sample on one client
    np.testing.assert_array_equal(classes.sum(axis=1), hist["n_train"] + hist["n_test"])
    rounds = pd.read_csv(path / "rounds.csv")
    assert rounds["round"].tolist() == [1, 2] and (rounds["aggregated"] == 4).all()
    assert rounds["mean_train_reward"].between(0, 100).all() and (rounds["mean_train_loss"] > 0).all()
    final = pd.read_csv(path / "final.csv")
    assert final["client"].tolist() == [0, 1, 2, 3]
    assert {"n_train", "n_test", "l_acc", "s_acc", "g_acc", "test_loss", "model"} <= set(final.columns)
    assert final[list(ACCURACIES)].stack().between(0, 100).all()
    np.testing.assert_array_equal(final["n_train"], hist["n_train"])
    metrics = json.loads((path / "metrics.json").read_text())
    assert (metrics["task"], metrics["algo"], metrics["data"], metrics["model"], metrics["partition"]) == (
        "vision",
        algo,
        "digits",
        "mlp",
        "dirichlet",
    )
    assert metrics["accuracy"] == pytest.approx(accuracy_summary({a: final[a] for a in ACCURACIES}))
    assert "name: vision" in (path / "config.yaml").read_text()


@pytest.mark.parametrize(
    ("algo", "warning", "inert"),
    [
        ("cfl", "cfl: no cluster split", True),
        ("fedpref", "fedpref: no cluster split", True),
        ("ifca", "ifca: every client ends on", False),
    ],
)
def test_a_run_that_left_its_strategy_inert_says_so_in_its_log(sweep, algo, warning, inert):
    """Two rounds are too few for CFL or FedPref (patience 2) to split (one cluster in ``clusters.jsonl``): logged.

    IFCA's clients spread over its models on digits: no warning.
    """
    path = run_dir(sweep, algo)
    last = json.loads((path / "clusters.jsonl").read_text().splitlines()[-1])
    assert (len([c for c in last["clusters"] if c]) == 1) is inert
    assert (warning in (path / "run.log").read_text()) is inert
    stored = json.loads((path / "metrics.json").read_text())["inert_warning"]
    assert (stored is not None and stored.startswith(warning)) is inert


def test_analysis_evaluate_tables_vision_runs(sweep, tmp_path):
    assert evaluate_main([str(sweep), "--out", str(tmp_path)]) == 0
    summary = pd.read_csv(tmp_path / "vision_summary.csv")
    assert sorted(summary["algo"]) == sorted(STRATEGIES) and (summary["data"] == "digits").all()
    fedavg = summary[summary["algo"] == "fedavg"].iloc[0]
    final = pd.read_csv(run_dir(sweep, "fedavg") / "final.csv")
    assert fedavg["l_acc_mean"] == pytest.approx(final["l_acc"].mean()) and fedavg["l_acc_min"] == pytest.approx(
        final["l_acc"].min()
    )
    text = (tmp_path / "comparison.md").read_text()
    assert (
        "# Vision comparison" in text
        and "## Partition: dirichlet" in text
        and "### Mean L-acc (%) (↑ higher is better)" in text
    )
    assert "| fedfew | 1 |" in text and "| algorithm | n | digits |" in text
    # CFL and FedPref never split in two rounds: their rows are marked and their runs listed with their warnings
    inert = summary[summary["inert_warning"].notna()].set_index("algo")
    assert sorted(inert.index) == ["cfl", "fedpref"]
    for algo in ("cfl", "fedpref"):
        assert inert.loc[algo, "inert_warning"].startswith(f"{algo}: no cluster split")
        assert f"| {algo} ⚠ 1/1 | 1 |" in text
        assert f"- `{inert.loc[algo, 'name']}` ({algo}, dirichlet, seed 0): {algo}: no cluster split" in text
    assert "| ifca | 1 |" in text
    assert (tmp_path / "vision_stats.csv").is_file()
    assert not (tmp_path / "summary.csv").exists()  # no RL run in this campaign


@pytest.mark.parametrize(
    "args, message",
    [
        # the RL task's groups are not in a vision run's configuration, and the other way round
        (["task=vision", "dist=equidistant"], "Could not override 'dist'. No match in the defaults list."),
        (["task=vision", "env=minecart"], "Could not override 'env'. No match in the defaults list."),
        (["partition=pathological"], "Could not override 'partition'. No match in the defaults list."),
        (["dist=pathological"], "unknown dist 'pathological'; valid: dirichlet, equidistant, fixed, gaussian, groups"),
        (
            ["task=vision", "data=mnist", "data.root=ROOT"],
            "dataset mnist not found: ROOT/MNIST/raw lacks train-images-idx3-ubyte",
        ),
        (
            ["task=vision", "n_clients=100", "partition.alpha=0.01", "data.min_samples=15", "data.max_retries=2"],
            "dirichlet: no draw in 2 attempts (data.max_retries) gave every one of 100 clients at least data.min_samples=15",
        ),
    ],
)
def test_bad_vision_input_is_one_line_exit_2_and_nothing_left(tmp_path, args, message, morlfed_cli):
    data_root = tmp_path / "datasets"
    args = [a.replace("ROOT", str(data_root)) for a in args]
    out = tmp_path / "runs" / "bad"
    proc = morlfed_cli([*args, f"hydra.run.dir={out}"], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("morlfed: error: ")
        and message.replace("ROOT", str(data_root)) in lines[0]
    )
    assert not out.exists() and not (tmp_path / "runs").exists() and not data_root.exists()
