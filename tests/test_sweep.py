"""The documented campaign workflow, end to end: a hydra multirun, then ``analysis.evaluate`` on its folder.

The multirun is over two algorithms and two seeds on Deep Sea Treasure (tiny budgets), the
evaluation ``python -m morlfed.analysis.evaluate``. Every number of comparison.md must match the
per-run metrics.json files (seeds, mean and sample std over them, the marks of stats.csv's paired
tests against fedpref), and summary.csv must reproduce each run's metrics.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from morlfed.analysis.evaluate import main
from morlfed.metrics import METRICS

ROOT = Path(__file__).resolve().parents[1]
DECIMALS = 2
TITLES = {info.title: key for key, info in METRICS.items()}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, morlfed_cli) -> Path:
    """``python -m morlfed.run -m algo=fedavg,fedpref seed=0,1 ...`` into a fresh folder."""
    folder = tmp_path_factory.mktemp("sweep") / "multirun"
    done = morlfed_cli(
        [
            "-m",
            "algo=fedavg,fedpref",
            "seed=0,1",
            "n_clients=3",
            "rounds=2",
            "local_steps=200",
            "progress=false",
            f"hydra.sweep.dir={folder}",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def parse_comparison(text: str) -> dict[tuple[str, str, str, str], tuple[float, float | None, str]]:
    """``{(dist, metric, algorithm, env): (mean or NaN for n/a, std or None, mark)}`` from comparison.md.

    The mark is ``better`` (bold, ▲), ``worse`` (▼) or empty. A row label's inert mark (``⚠ k/m``) is
    dropped here; the test checks it on the text.
    """
    cells: dict[tuple[str, str, str, str], tuple[float, float | None, str]] = {}
    dist = metric = None
    envs: list[str] = []
    for line in text.splitlines():
        if line.startswith("## Preference distribution: "):
            dist = line.removeprefix("## Preference distribution: ")
        elif line.startswith("### "):
            heading = re.match(r"### (.+) \([↑↓]", line)
            assert heading is not None, f"not a metric heading: {line!r}"
            metric = TITLES[heading.group(1)]
        elif line.startswith("| algorithm |"):
            envs = [c.strip() for c in line.strip("|").split("|")[2:]]  # after the algorithm and n columns
        elif line.startswith("| ") and metric is not None:
            assert dist is not None, "a metric table before any preference distribution heading"
            label, _, *values = [c.strip() for c in line.strip("|").split("|")]
            label = label.partition(" ⚠ ")[0]
            for env, cell in zip(envs, values):
                mark = "better" if cell.endswith(" ▲") else "worse" if cell.endswith(" ▼") else ""
                assert cell.startswith("**") == (mark == "better"), cell
                text = cell.removesuffix(" ▲").removesuffix(" ▼").strip("*").partition(" (n=")[0]
                mean, _, std = ("nan", "", "") if text == "n/a" else text.partition(" ± ")
                cells[dist, metric, label, env] = (float(mean), float(std) if std else None, mark)
    return cells


def test_multirun_comparison_matches_per_run_metrics(sweep, tmp_path):
    runs = sorted(p.parent for p in sweep.glob("*/metrics.json"))
    assert len(runs) == 4
    infos = [json.loads((p / "metrics.json").read_text()) for p in runs]
    assert sorted((i["label"], i["seed"]) for i in infos) == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("fedpref", 0),
        ("fedpref", 1),
    ]

    done = subprocess.run(
        [sys.executable, "-m", "morlfed.analysis.evaluate", str(sweep)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "evaluated 4 runs (0 skipped, discounted returns)" in done.stdout
    assert "warning" not in done.stderr  # recomputed metrics agree with every metrics.json

    summary = pd.read_csv(sweep / "summary.csv")
    assert len(summary) == 4
    for _, row in summary.iterrows():
        stored = json.loads((Path(row["run"]) / "metrics.json").read_text())
        assert (row["label"], row["seed"], row["env"], row["dist"]) == (
            stored["label"],
            stored["seed"],
            "deep-sea-treasure",
            "equidistant",
        )
        for key in METRICS:  # None (not defined, e.g. sparsity of one point) is an empty cell
            want = stored["discounted"][key]
            assert np.isnan(row[key]) if want is None else row[key] == pytest.approx(want, rel=1e-9, abs=1e-12)

    text = (sweep / "comparison.md").read_text()
    # two rounds are fewer than FedPref's patience: both its runs are the weighting-only ablation, and say so
    assert "| fedpref ⚠ 2/2 |" in text and "| fedavg ⚠" not in text
    cells = parse_comparison(text)
    # DST has a known front: every metric some run defines (sparsity needs 2 non-dominated returns)
    defined = {key for key in METRICS if any(i["discounted"][key] is not None for i in infos)}
    assert {m for _, m, _, _ in cells} == defined and defined >= set(METRICS) - {"sparsity"}
    stats = pd.read_csv(sweep / "stats.csv").set_index("metric")
    for key in defined:
        for label in ("fedavg", "fedpref"):
            values = [i["discounted"][key] for i in infos if i["label"] == label and i["discounted"][key] is not None]
            mean, std, _ = cells["equidistant", key, label, "deep-sea-treasure"]
            if not values:  # e.g. sparsity of a run collapsed onto one point
                assert np.isnan(mean)
                continue
            assert mean == pytest.approx(np.mean(values), abs=0.5 * 10**-DECIMALS + 1e-9)
            if len(values) > 1:
                assert std == pytest.approx(np.std(values, ddof=1), abs=0.5 * 10**-DECIMALS + 1e-9)
        direction = stats.loc[key, "direction"] if isinstance(stats.loc[key, "direction"], str) else ""
        assert cells["equidistant", key, "fedavg", "deep-sea-treasure"][2] == direction, key
        assert cells["equidistant", key, "fedpref", "deep-sea-treasure"][2] == ""  # the reference

    # the same runs on undiscounted returns reproduce the stored "undiscounted" metrics
    assert main([str(sweep), "--out", str(tmp_path), "--returns", "undiscounted"]) == 0
    summary = pd.read_csv(tmp_path / "summary.csv")
    for _, row in summary.iterrows():
        stored = json.loads((Path(row["run"]) / "metrics.json").read_text())["undiscounted"]
        for key in METRICS:
            want = stored[key]
            assert np.isnan(row[key]) if want is None else row[key] == pytest.approx(want, rel=1e-9, abs=1e-12)
