"""The analysis notebooks run top to bottom (nbclient) on runs made here and show their figures.

They run both on a campaign named by MORLFED_RUNS and, with no environment variable, right after the
README's quick start (its run under runs/, a stopped run beside it).

The kernel is this interpreter (a kernelspec written to a temporary JUPYTER_PATH), so the
notebooks import the same morlfed as the tests, whatever kernels the machine has registered.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # executes the notebooks in a kernel

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "analysis" / "notebooks"
KERNEL = "morlfed-tests"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, morlfed_cli) -> Path:
    """A tiny hydra multirun: no-communication and FedPref (similarity saved), one seed, DST."""
    folder = tmp_path_factory.mktemp("nb") / "multirun"
    done = morlfed_cli(
        [
            "-m",
            "algo=local,fedpref",
            "n_clients=3",
            "rounds=2",
            "local_steps=100",
            "save_similarity=true",
            "progress=false",
            f"hydra.sweep.dir={folder}",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory, morlfed_cli) -> Path:
    """A checkout right after the README's quick start, with a stopped run beside its run.

    ``python -m morlfed.run`` (at a tiny budget) run from its root wrote
    ``runs/deep-sea-treasure/fedpref/<time>/``; a copy of that run stopped after its first round (no
    ``metrics.json``) lies beside it. Returns the checkout's ``analysis/notebooks/`` (copies of the
    notebooks).
    """
    root = tmp_path_factory.mktemp("checkout")
    notebooks = root / "analysis" / "notebooks"
    shutil.copytree(NOTEBOOKS, notebooks)
    done = morlfed_cli(["n_clients=3", "rounds=2", "local_steps=100", "progress=false"], root)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (root / "runs" / "deep-sea-treasure" / "fedpref").iterdir()
    stopped = run.with_name("stopped")
    shutil.copytree(run, stopped)
    (stopped / "metrics.json").unlink()
    rounds = (stopped / "rounds.csv").read_text().splitlines()
    (stopped / "rounds.csv").write_text("\n".join(rounds[:2]) + "\n")
    return notebooks


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory) -> Iterator[None]:
    """A kernelspec for ``sys.executable``; each test sets or clears MORLFED_RUNS itself."""
    home = tmp_path_factory.mktemp("jupyter")
    spec = home / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "PYTHONPATH", "MORLFED_RUNS")}
    os.environ["JUPYTER_PATH"] = str(home)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [saved["PYTHONPATH"]])])
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def execute(name: str, folder: Path = NOTEBOOKS) -> nbformat.NotebookNode:
    """Run notebook ``name`` of ``folder`` in that folder, as Jupyter does."""
    nb = nbformat.read(folder / name, as_version=4)
    NotebookClient(nb, kernel_name=KERNEL, timeout=300, resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def streams(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def outputs(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    return [
        o["data"][mime]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if mime in o.get("data", {})
    ]


def assert_the_api_cell_ran(nb: nbformat.NotebookNode) -> None:
    """The last cell ran an experiment through ``morlfed.run_experiment`` and showed its front and figure."""
    last = nb.cells[-1]
    assert "morlfed.run_experiment(" in last.source
    text = "".join(o.get("text", "") for o in last.outputs)
    assert "experiment through the API: hypervolume" in text
    shown = [o["data"] for o in last.outputs if "data" in o]
    assert any("image/png" in data for data in shown) and any("text/html" in data for data in shown)


def test_notebooks_are_committed_without_outputs_and_read_runs_from_the_first_cell():
    for name in ("pareto_fronts.ipynb", "metrics.ipynb"):
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code)
        assert 'os.environ.get("MORLFED_RUNS"' in code[0].source and "RUNS =" in code[0].source


def test_pareto_fronts_notebook(kernel_env, runs, monkeypatch):
    monkeypatch.setenv("MORLFED_RUNS", str(runs))
    nb = execute("pareto_fronts.ipynb")
    # 2 runs' fronts, 1 comparison, 1 learning-curve figure, FedPref's heatmaps and clusters; the API's run
    assert len(outputs(nb, "image/png")) == 7
    assert_the_api_cell_ran(nb)
    tables = "\n".join(outputs(nb, "text/plain"))
    assert "0_local_equidistant_seed0" in tables and "1_fedpref_equidistant_seed0" in tables
    assert "known" in tables  # DST's reference front
    assert "1 of 2 runs logged clusters" in streams(nb) and "0 unfinished runs" in streams(nb)


def test_metrics_notebook(kernel_env, runs, monkeypatch):
    monkeypatch.setenv("MORLFED_RUNS", str(runs))
    nb = execute("metrics.ipynb")
    assert len(outputs(nb, "image/png")) == 1  # one environment x distribution: one bar figure
    markdown = "\n".join(outputs(nb, "text/markdown"))
    assert "## Preference distribution: equidistant" in markdown
    assert "### Hypervolume (↑ higher is better)" in markdown and "| local |" in markdown
    definitions = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for metric in ("Hypervolume", "IGD+", "Sparsity", "Cardinality", "Expected utility", "campaign front"):
        assert metric in definitions


def test_notebooks_find_the_quick_start_run_with_no_environment_variable(kernel_env, quick_start, monkeypatch):
    monkeypatch.delenv("MORLFED_RUNS", raising=False)
    nb = execute("pareto_fronts.ipynb", quick_start)
    tables = "\n".join(outputs(nb, "text/plain"))
    assert "deep-sea-treasure" in tables and "fedpref" in tables
    # the run's front, the comparison, its learning curve, its clusters; the stopped run's curve; the API's run
    assert len(outputs(nb, "image/png")) == 6
    assert_the_api_cell_ran(nb)
    assert "1 of 1 runs logged clusters" in streams(nb) and "1 unfinished runs" in streams(nb)
    nb = execute("metrics.ipynb", quick_start)
    # the quick-start run is too short for FedPref to split: its row is marked inert (⚠ 1/1)
    assert "| fedpref ⚠ 1/1 |" in "\n".join(outputs(nb, "text/markdown"))
