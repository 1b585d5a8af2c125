"""The layers of docs/architecture.md, checked over the source: who may import whom, file sizes, names.

Every ``import`` of every module under morlfed/ (envs/, baselines/ and analysis/ included; imports
inside functions too) goes from a module to one of its own layer or of a layer below, and within a
layer only inside its own group. The tasks do not import each other; only the RL task and the
analysis know the environments. Core code (strings and names, not its docs) names no strategy.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import package_modules

ROOT = Path(__file__).resolve().parents[1]

#: (layer, group, module prefixes), from the bottom; the same table is in docs/architecture.md
LAYERS: list[tuple[int, str, tuple[str, ...]]] = [
    (
        0,
        "foundation",
        (
            "morlfed.params",
            "morlfed.protocol",
            "morlfed.seeding",
            "morlfed.commands",
            "morlfed.rundir",
            "morlfed.runstatus",
            "morlfed.similarity",
            "morlfed.proximal",
            "morlfed.metrics",
            "morlfed.figures",
            "morlfed.settings",
            "morlfed.parallelism",
            "morlfed.progress",
            "morlfed.interrupt",
            "morlfed.safestate",
            "morlfed.manifest",
            "morlfed.runlock",
            "morlfed.projection",
            "morlfed.console",
        ),
    ),
    (1, "strategies", ("morlfed.strategy", "morlfed.strategies", "morlfed.baselines")),
    (
        1,
        "machinery",
        (
            "morlfed.executors",
            "morlfed.client",
            "morlfed.faults",
            "morlfed.checkpoint",
            "morlfed.deployment",
            "morlfed.tracking",
        ),
    ),
    (1, "environments", ("morlfed.envs",)),
    (2, "federation", ("morlfed.federation",)),
    (3, "task seam", ("morlfed.tasks",)),  # tasks/base.py; the tasks themselves match longer prefixes
    (4, "rl task", ("morlfed.tasks.rl",)),
    (4, "vision task", ("morlfed.tasks.vision",)),
    (5, "experiment", ("morlfed.experiment", "morlfed.provenance")),
    (
        6,
        "entry",
        (
            "morlfed.run",
            "morlfed.compose",
            "morlfed.overrides",
            "morlfed.config_groups",
            "morlfed.resume",
            "morlfed.startstop",
            "morlfed.convert",
        ),
    ),
    (7, "analysis", ("morlfed.analysis",)),
    (8, "python api", ("morlfed.api", "morlfed")),
    (9, "flower interop", ("morlfed.flower",)),
]
STRATEGY_NAMES = re.compile(r"\b(fedpref|fedavg|fedprox|cfl|matfl|ifca|fedfew|fedmhc|fedpg)\b", re.IGNORECASE)
MAX_LINES = 450


def place(module: str) -> tuple[int, str]:
    """The layer and group of ``module``: the entry with the longest prefix that matches it."""
    matches = [
        (len(prefix), layer, group)
        for layer, group, prefixes in LAYERS
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no layer: add it to LAYERS and to docs/architecture.md"
    _, layer, group = max(matches)
    return layer, group


def imports(module: str, path: Path) -> set[str]:
    """The morlfed modules that ``module`` (at ``path``) imports, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
    return {name for name in found if name == "morlfed" or name.startswith("morlfed.")}


def test_every_module_is_in_a_layer() -> None:
    files = package_modules()
    assert len(files) > 100
    for module in files:
        place(module)


def test_imports_go_down_the_layers_or_stay_in_their_group() -> None:
    wrong = []
    for module, path in package_modules().items():
        layer, group = place(module)
        for target in imports(module, path):
            target_layer, target_group = place(target)
            if target_layer > layer or (target_layer == layer and target_group != group):
                wrong.append(f"{module} ({layer}, {group}) imports {target} ({target_layer}, {target_group})")
    assert not wrong, "\n".join(wrong)


def test_only_the_rl_task_and_the_analysis_know_the_environments() -> None:
    for module, path in package_modules().items():
        if any(target.startswith("morlfed.envs") for target in imports(module, path)):
            assert place(module)[1] in ("rl task", "analysis", "environments"), module


def test_a_misplaced_import_is_caught() -> None:
    """The check itself: the federation importing a task, or a strategy an executor, is wrong."""
    assert place("morlfed.federation") < place("morlfed.tasks.rl.task")
    assert place("morlfed.strategies.fedpref")[0] == place("morlfed.executors.base")[0]
    assert place("morlfed.strategies.fedpref")[1] != place("morlfed.executors.base")[1]
    assert place("morlfed.tasks.rl.vectorised.dqn") == (4, "rl task")


CORE = ("foundation", "machinery", "federation", "task seam", "experiment", "entry")


def code_strings(module: str) -> list[str]:
    """The string constants (docstrings excepted) and identifiers of ``module``'s code."""
    tree = ast.parse(package_modules()[module].read_text())
    docstrings = {
        id(node.body[0].value)  # type: ignore[attr-defined]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
    }
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            texts.append(node.value)
        elif isinstance(node, ast.Name):
            texts.append(node.id)
    return texts


@pytest.mark.parametrize("module", [m for m in package_modules() if place(m)[1] in CORE])
def test_core_code_names_no_strategy(module: str) -> None:
    """Strategies come in through configs (``_target_``): core code never spells one's name.

    Docstrings and comments may name them as examples; string constants and identifiers may not.
    """
    for text in code_strings(module):
        assert not STRATEGY_NAMES.search(text), f"{module}: names a strategy: {text!r}"


TASK_WORDS = re.compile(r"\b(rl|vision|env|envs|engine|dist|partition)\b")
#: the core without the metric library, which is multi-objective by nature (returns, preferences)
TASK_FREE = tuple(
    m for m in package_modules() if place(m)[1] in CORE and not m.startswith(("morlfed.metrics", "morlfed.figures"))
)


@pytest.mark.parametrize("module", TASK_FREE)
def test_core_code_names_no_task_and_no_task_group(module: str) -> None:
    """The core composes tasks through ``conf/task/<name>.yaml``: no ``rl``, ``env`` or ``dist`` in its code."""
    for text in code_strings(module):
        assert not TASK_WORDS.search(text), f"{module}: names a task or a task's config group: {text!r}"


def test_no_source_file_is_over_450_lines() -> None:
    paths = {*package_modules().values(), *(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py")}
    long = {str(p.relative_to(ROOT)): n for p in paths if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"
