"""Which code produced a run: morlfed's version and, for a git checkout, its commit.

A number is citable only with the code that made it. ``metrics.json`` keeps this record under
``code`` (taken when the run starts, so that editing the checkout during a long run cannot relabel
it), and ``run.log`` says it in its first lines. Outside a git checkout (an installed wheel) the
commit is ``None``; the version still says which release ran.
"""

from __future__ import annotations

import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

#: the directory whose git checkout (if any) holds the running morlfed package
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _git(root: Path, *args: str) -> str | None:
    """``git -C root args`` standard output, or ``None`` when git or the checkout is missing."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


#: tracked files that cannot change a run's numbers, as git pathspecs from the checkout's top: the
#: documentation and the results committed under docs/ (a study that writes its report into the
#: checkout it runs from must not mark its own later runs modified)
NOT_CODE = (":(top,exclude)docs", ":(top,exclude,glob)**/*.md")


def code_version(root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    """The running code: ``{"morlfed": version, "commit": short hash or None, "modified": bool or None}``.

    ``modified`` is true when tracked files that can change a run's numbers (all but
    :data:`NOT_CODE`) differ from the commit (the run's numbers then belong to no commit
    exactly); both are ``None`` outside a git checkout.

    :param root: a directory of the package's checkout (default: the installed package's)
    """
    commit = _git(root, "rev-parse", "--short", "HEAD")
    status = (
        None
        if commit is None
        else _git(root, "status", "--porcelain", "--untracked-files=no", "--", ":(top)", *NOT_CODE)
    )
    return {
        "morlfed": package_version(),
        "commit": commit,
        "modified": None if status is None else bool(status),
    }


def package_version() -> str:
    """The installed package's version (``pyproject.toml``'s), ``"unknown"`` for a checkout that was never installed."""
    try:
        return version("morlfed")
    except PackageNotFoundError:
        return "unknown"


def describe_code(code: dict[str, Any]) -> str:
    """One line for ``run.log``: ``morlfed 0.1.0, commit 1e5827c (tracked files modified)``.

    :param code: from :func:`code_version`
    """
    if code["commit"] is None:
        return f"morlfed {code['morlfed']}, not a git checkout"
    return f"morlfed {code['morlfed']}, commit {code['commit']}" + (
        " (tracked files modified)" if code["modified"] else ""
    )
