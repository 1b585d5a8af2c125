"""Which code produced a run (``morlfed.core.provenance``), and the run directory keeps it.

The commit of a git checkout, whether its tracked files were modified, nothing invented outside a
checkout.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import morlfed
from morlfed.core.provenance import code_version, describe_code

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


def _commit_all(root: Path, message: str) -> None:
    """Commit every file under ``root`` (with an identity of its own: CI's git may have none)."""
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """A one-commit git checkout with one tracked file."""
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "tracked.py").write_text("x = 1\n")
    _commit_all(root, "one")
    return root


def test_a_clean_checkout_names_its_commit(checkout: Path) -> None:
    code = code_version(checkout)
    assert code == {
        "morlfed": morlfed.__version__,
        "commit": _git(checkout, "rev-parse", "--short", "HEAD"),
        "modified": False,
    }
    assert describe_code(code) == f"morlfed {morlfed.__version__}, commit {code['commit']}"


def test_an_edited_tracked_file_marks_the_run_modified_and_an_untracked_one_does_not(checkout: Path) -> None:
    (checkout / "scratch.txt").write_text("a run directory, a note")
    assert code_version(checkout)["modified"] is False
    (checkout / "tracked.py").write_text("x = 2\n")
    code = code_version(checkout)
    assert code["modified"] is True
    assert describe_code(code).endswith("(tracked files modified)")


def test_documentation_and_committed_results_are_not_code(checkout: Path) -> None:
    """A study's report written into the checkout its runs import does not mark them modified.

    A study writes its report (docs/results/...) into the checkout its runs import: that must not
    mark them modified; a change to the code under the same checkout still does.
    """
    (checkout / "docs" / "results").mkdir(parents=True)
    (checkout / "docs" / "results" / "runs.csv").write_text("seed\n0\n")
    (checkout / "README.md").write_text("# readme\n")
    (checkout / "pkg").mkdir()
    (checkout / "pkg" / "notes.md").write_text("notes\n")
    _commit_all(checkout, "two")
    (checkout / "docs" / "results" / "runs.csv").write_text("seed\n0\n1\n")
    (checkout / "README.md").write_text("# readme, edited\n")
    (checkout / "pkg" / "notes.md").write_text("notes, edited\n")
    assert code_version(checkout / "pkg")["modified"] is False
    (checkout / "tracked.py").write_text("x = 2\n")
    assert code_version(checkout / "pkg")["modified"] is True


def test_outside_a_checkout_the_commit_is_unknown_not_guessed(tmp_path: Path) -> None:
    code = code_version(tmp_path)
    assert code == {"morlfed": morlfed.__version__, "commit": None, "modified": None}
    assert describe_code(code) == f"morlfed {morlfed.__version__}, not a git checkout"


def test_a_run_records_the_code_that_ran(tmp_path: Path, morlfed_cli) -> None:
    """metrics.json and run.log name the package's own checkout and commit."""
    out = tmp_path / "run"
    done = morlfed_cli(
        ["algo=local", "n_clients=2", "rounds=1", "local_steps=100", "progress=false", f"hydra.run.dir={out}"]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = code_version()
    assert json.loads((out / "metrics.json").read_text())["code"] == expected
    assert f"code: {describe_code(expected)}" in (out / "run.log").read_text()


def test_the_version_is_pyproject_tomls() -> None:
    """One source of truth: ``morlfed.__version__`` and the runs' records read the installed metadata."""
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "(.+)"$', pyproject, re.M).group(1)  # type: ignore[union-attr]
    assert morlfed.__version__ == declared == code_version()["morlfed"]
