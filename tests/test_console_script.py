"""The installed ``morlfed`` script: help, version, a run and its warnings, from a folder outside the repository.

Known answers: ``--version`` prints the installed package's version (not hydra's), for the script
and for ``python -m morlfed.run``; a run through the script writes a finished run directory with
its deployed models; its warnings, logged or Python's, are one ``morlfed: warning:`` line each. The
licence and citation files the package's metadata promises exist.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "morlfed"

pytestmark = pytest.mark.slow


def script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run the installed console script (the one beside this interpreter) in ``cwd``."""
    assert SCRIPT.is_file(), f"{SCRIPT} is not installed: pip install -e ."
    return subprocess.run([str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_help_and_version_of_the_installed_script(tmp_path: Path) -> None:
    shown = script("--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "Configuration groups" in shown.stdout and "env: " in shown.stdout
    for run in (script("--version", cwd=tmp_path), script("-V", cwd=tmp_path)):
        assert run.returncode == 0 and run.stdout == f"morlfed {version('morlfed')}\n"
    module = subprocess.run([sys.executable, "-m", "morlfed.run", "--version"], capture_output=True, text=True)
    assert module.returncode == 0 and module.stdout == f"morlfed {version('morlfed')}\n"
    assert "Hydra" not in module.stdout


def test_the_installed_script_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = script("n_clients=2", "rounds=1", "local_steps=100", "progress=false", f"hydra.run.dir={out}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "metrics.json").is_file() and (out / "models" / "deployment.json").is_file()


def test_the_licence_and_citation_match_the_metadata() -> None:
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT"
    assert citation["version"] == version("morlfed")


def test_a_runs_warnings_are_one_morlfed_line_each(tmp_path: Path) -> None:
    out = tmp_path / "run"
    fault = "faults=[{client: 1, round: 1, kind: raise}]"  # a logged warning: the client fails in round 1
    args = ["engine=sb3", "n_clients=2", "rounds=2", "local_steps=100", "progress=false", fault, f"hydra.run.dir={out}"]
    done = script(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr  # the console's log handler writes to stdout, Python's warnings to stderr
    warned = [line for line in printed.splitlines() if "warning:" in line.lower()]
    assert any(line.startswith("morlfed: warning: round 1: client 1 failed") for line in warned)
    assert any("do not strictly dominate the reference point" in line for line in warned)  # a Python warning
    assert all(line.startswith("morlfed: warning: ") for line in warned), warned
    assert ".py:" not in "".join(line.split("(")[0] for line in warned)  # no file and line of the source
    assert "[WARNING]" in (out / "run.log").read_text()  # run.log keeps its own, full format
