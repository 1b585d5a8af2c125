"""The layers, read from the folders, checked over the source: who may import whom, file sizes, names.

Each folder of morlfed/ is one group of one layer: its ``__init__.py`` says which (``LAYER = <n>``, and
``GROUP = "<name>"`` for a folder that joins another folder's group); a subfolder without its own ``LAYER`` belongs to its parent's group, and the top-level modules (the
entry points) sit above every folder. Every ``import`` of
every module under morlfed/ (envs/, baselines/ and analysis/ included; imports inside functions too)
goes to a module of its own layer or of a layer below, and within a layer only inside its own group.
The tasks do not import each other; only the RL task and the analysis know the environments. Core
code (strings and names, not its docs) names no strategy. docs/architecture.md lists the same layers.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from conftest import package_modules

ROOT = Path(__file__).resolve().parents[1]

STRATEGY_NAMES = re.compile(r"\b(fedpref|fedavg|fedprox|cfl|matfl|ifca|fedfew|fedmhc|fedpg)\b", re.IGNORECASE)
MAX_LINES = 450
PACKAGE = ROOT / "morlfed"


def declared(init: Path, name: str) -> int | str | None:
    """The constant ``name`` (``LAYER``, ``GROUP``) a package's ``__init__.py`` declares, or ``None``."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == name:
            assert isinstance(value, ast.Constant) and isinstance(value.value, (int, str)), f"{init}: {name}"
            return value.value
    return None


@cache
def folder_layers() -> dict[str, int]:
    """Each folder that declares a layer (``core``, ``tasks/rl``, ...) and its layer."""
    found: dict[str, int] = {}
    for init in sorted(PACKAGE.glob("**/__init__.py")) + [
        PACKAGE / f"{name}/__init__.py" for name in ("envs", "baselines", "analysis")
    ]:
        layer = declared(init, "LAYER")
        if isinstance(layer, int):
            found[init.parent.relative_to(PACKAGE).as_posix() if init.parent != PACKAGE else "morlfed"] = layer
    return found


def place(module: str) -> tuple[int, str]:
    """The layer and group (its folder) of ``module``: the nearest folder above it that declares a layer."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    folder_parts = parts if path.is_dir() else parts[:-1]
    layers = folder_layers()
    for depth in range(len(folder_parts), 0, -1):
        folder = "/".join(folder_parts[:depth])
        if folder in layers:
            group = declared(PACKAGE / folder / "__init__.py", "GROUP")  # a folder may join another's group
            return layers[folder], group if isinstance(group, str) else folder
    return max(layers.values()) + 1, "morlfed"  # the top level's entry points sit above every folder


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


def test_every_folder_of_modules_declares_its_layer_and_the_top_level_keeps_the_entry_points() -> None:
    """A folder's modules sit in their layer's folder: a top-level folder of modules declares ``LAYER``.

    The top level keeps at most 8 modules: the entry points (``run``, ``api``, the package's ``__init__``).
    """
    files = package_modules()
    assert len(files) > 100
    top = sorted(m for m, path in files.items() if path.parent == PACKAGE)
    assert len(top) <= 8, f"{len(top)} modules at morlfed/'s top level: {top}"
    for module, path in files.items():
        if path.parent != PACKAGE:
            folder = path.relative_to(PACKAGE).parts[0]
            assert folder in folder_layers(), f"{module}: morlfed/{folder}/__init__.py declares no LAYER"


def test_docs_architecture_lists_the_folders_layers() -> None:
    """docs/architecture.md's table has a row per layer folder, with the layer its ``__init__.py`` declares."""
    rows = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            for folder in re.findall(r"`([\w/]+)/`", cells[1]):
                rows[folder] = int(cells[0])
    assert rows == folder_layers()


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
            assert place(module)[1] in ("tasks/rl", "analysis", "envs"), module


def test_a_misplaced_import_is_caught() -> None:
    """The check itself: the federation importing a task, or a strategy an executor, is wrong."""
    assert place("morlfed.federation")[0] < place("morlfed.tasks.rl.task")[0]
    assert place("morlfed.strategies.fedpref")[0] == place("morlfed.runtime.executors.base")[0]
    assert place("morlfed.strategies.fedpref")[1] != place("morlfed.runtime.executors.base")[1]
    assert place("morlfed.tasks.rl.vectorised.dqn")[1] == "tasks/rl"
    assert place("morlfed.tasks.base")[0] < place("morlfed.tasks.rl.vectorised.dqn")[0]
    assert place("morlfed.baselines.cfl") == place("morlfed.strategies.fedpref")
    assert place("morlfed.run") == place("morlfed.api") == place("morlfed")


#: the groups that make up the core: what runs any task with any strategy
CORE = ("core", "storage", "runtime", "tracking", "federation", "tasks", "experiment", "cli", "morlfed")


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


@pytest.mark.parametrize("module", [m for m in package_modules() if place(m)[1] in (*CORE, "metrics")])
def test_core_code_names_no_strategy(module: str) -> None:
    """Strategies come in through configs (``_target_``): core code never spells one's name.

    Docstrings and comments may name them as examples; string constants and identifiers may not.
    """
    for text in code_strings(module):
        assert not STRATEGY_NAMES.search(text), f"{module}: names a strategy: {text!r}"


TASK_WORDS = re.compile(r"\b(rl|vision|env|envs|engine|dist|partition)\b")
#: the core (the metric library, multi-objective by nature, speaks of returns and preferences)
#: and the Python API, whose plots speak of RL and vision results
TASK_FREE = tuple(m for m in package_modules() if place(m)[1] in CORE and m != "morlfed.api")


@pytest.mark.parametrize("module", TASK_FREE)
def test_core_code_names_no_task_and_no_task_group(module: str) -> None:
    """The core composes tasks through ``conf/task/<name>.yaml``: no ``rl``, ``env`` or ``dist`` in its code."""
    for text in code_strings(module):
        assert not TASK_WORDS.search(text), f"{module}: names a task or a task's config group: {text!r}"


def test_no_source_file_is_over_450_lines() -> None:
    paths = {*package_modules().values(), *(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py")}
    long = {str(p.relative_to(ROOT)): n for p in paths if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"
