"""CONTRIBUTING.md's recipes, followed literally in a copy of the repository.

"Add a strategy" (FedAvgM) and "Add an environment" (resource-gathering) each show the files to
write, as code blocks titled with their paths, and a command. The test writes exactly those files
into a copy of the package, checks that the recipe touched 2 files (a strategy) or 1 (an env),
and runs the command there, from the copy's root, where ``python -m`` imports the copy. "An
environment of your own" writes its files into an empty folder, outside any package, and runs its
commands there on the installed package.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()
BLOCK = re.compile(r"^( *)```(\w+)(?: title=\"([^\"]+)\")?\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def section(title: str) -> str:
    """The text of CONTRIBUTING.md's ``## <title>`` section."""
    start = CONTRIBUTING.index(f"## {title}\n")
    end = CONTRIBUTING.find("\n## ", start + 1)
    return CONTRIBUTING[start : end if end > 0 else None]


def recipe(title: str) -> tuple[dict[str, str], list[str]]:
    """The files a section writes (``{path: text}``, from titled blocks) and the commands it runs."""
    files, commands = {}, []
    for indent, lang, path, body in BLOCK.findall(section(title)):
        text = re.sub(f"^{indent}", "", body, flags=re.MULTILINE)  # a block inside a list item
        if path:
            files[path] = text
        elif lang == "bash":
            commands += [line for line in text.splitlines() if line.startswith("python -m morlfed.run")]
    return files, commands


def copy_of_the_package(dest: Path) -> Path:
    """The package's folders, copied with their links (morlfed/envs -> ../envs and so on)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("morlfed", "envs", "baselines", "analysis"):
        shutil.copytree(ROOT / folder, dest / folder, symlinks=True, ignore=ignore)
    return dest


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (the links to folders are not followed)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "title, n_files, check",
    [
        ("Walkthrough: add a strategy", 2, {"algo": "fedavgm"}),
        ("Walkthrough: add an environment", 1, {"env": "resource-gathering"}),
    ],
)
def test_a_recipe_followed_literally_runs_through_the_cli(tmp_path, title, n_files, check):
    files, commands = recipe(title)
    assert len(files) == n_files and len(commands) == 1, (files.keys(), commands)
    copy = copy_of_the_package(tmp_path / "repo")
    before = tree(copy)
    for path, text in files.items():
        assert not (copy / path).exists(), f"the recipe's {path} exists already"
        (copy / path).write_text(text)
    after = tree(copy)
    touched = {p for p in after if before.get(p) != after[p]}
    assert touched == set(files)  # nothing else to edit
    run_dir = tmp_path / "run"
    argv = shlex.split(commands[0])[3:]  # python -m morlfed.run ARGS
    done = subprocess.run(
        [sys.executable, "-m", "morlfed.run", *argv, "progress=false", f"hydra.run.dir={run_dir}"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # it can only succeed on the copy: the original repository has neither file
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key, value in check.items():
        assert metrics[key] == value
    assert metrics["rounds"] == 2


def test_the_new_strategy_matches_fedavg_without_momentum_and_resumes_its_velocity(tmp_path):
    """The recipe's FedAvgM is a real strategy: momentum 0 and step 1 is FedAvg, and its state round-trips."""
    import numpy as np
    import torch

    files, _ = recipe("Walkthrough: add a strategy")
    namespace: dict[str, object] = {}
    exec(compile(files["morlfed/strategies/fedavgm.py"], "fedavgm.py", "exec"), namespace)
    fedavgm: Any = namespace["FedAvgM"]
    from morlfed.baselines.fedavg import FedAvg
    from morlfed.core.params import ParamLayout
    from morlfed.core.protocol import FitResult

    layout = ParamLayout.from_shapes({"w": (3,)})
    init = torch.zeros(3)
    rounds = [
        {0: FitResult(torch.tensor([1.0, 2.0, 3.0]), 10), 1: FitResult(torch.tensor([3.0, 2.0, 1.0]), 30)},
        {0: FitResult(torch.tensor([0.0, 1.0, 0.0]), 20)},
    ]
    plain, no_momentum, heavy = FedAvg(), fedavgm(server_lr=1.0, momentum=0.0), fedavgm(momentum=0.5)
    for strat in (plain, no_momentum, heavy):
        strat.setup(2, init, layout, np.random.default_rng(0))
        for r, results in enumerate(rounds, start=1):
            strat.aggregate(r, results)
    torch.testing.assert_close(no_momentum.global_model, plain.global_model)
    # by hand: round 1 mean (2.5, 2, 1.5), v = -(2.5, 2, 1.5); round 2 mean (0, 1, 0):
    # v = 0.5 v + ((2.5, 2, 1.5) - (0, 1, 0)) = (1.25, 0, 0.75), theta = (2.5, 2, 1.5) - v
    torch.testing.assert_close(heavy.global_model, torch.tensor([1.25, 2.0, 0.75]))
    clone = fedavgm(momentum=0.5)
    clone.setup(2, init, layout, np.random.default_rng(0))
    clone.load_state_dict(heavy.state_dict())
    torch.testing.assert_close(clone.velocity, heavy.velocity)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\), got 1.0"):
        fedavgm(momentum=1.0)


@pytest.mark.slow
def test_an_environment_of_your_own_runs_from_a_folder_and_from_python(tmp_path):
    section_text = section("Walkthrough: an environment of your own, without editing the package")
    files = {path: body for _, _, path, body in BLOCK.findall(section_text) if path}
    commands = [
        line
        for _, lang, path, body in BLOCK.findall(section_text)
        if lang == "bash" and not path
        for line in body.splitlines()
        if line.startswith("python ")
    ]
    assert sorted(files) == ["my-conf/env/shallow-sea-treasure.yaml", "register_env.py"] and len(commands) == 2
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    folder_way = shlex.split(commands[0])[3:]  # python -m morlfed.run ARGS
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "morlfed.run", *folder_way, "progress=false", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["env"], metrics["rounds"]) == ("shallow-sea-treasure", 2)
    assert "gamma: 0.9" in (run_dir / "config.yaml").read_text()
    python_way = shlex.split(commands[1])
    assert python_way == ["python", "register_env.py"]
    done = subprocess.run(
        [sys.executable, "register_env.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith("shallow-sea-treasure ")
