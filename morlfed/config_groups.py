"""The config groups on morlfed's search path, their folders and options, and the task classes.

Hydra composes a run from ``conf/`` and the folders the root config's ``hydra.searchpath`` names
(``envs/conf`` for the RL task's ``env`` group). These functions read the same folders without
composing anything, for the command line's checks (:mod:`morlfed.overrides`), ``--help`` and the
analysis' variant labels; they know no group's home but what the root config says.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

from hydra.utils import get_class
from omegaconf import OmegaConf

from morlfed.tasks.base import Task

#: morlfed's own config folder (the root config, config.yaml, and its groups)
CONF_DIR = Path(__file__).parent / "conf"
#: The groups a command line adds with ``+`` (``+experiment=NAME``); the others are chosen by default.
ADDED_GROUPS = ("experiment", "variant")


@cache
def task_class(name: str) -> type[Task]:
    """The class of task ``name``, named by ``task._target_`` in ``conf/task/<name>.yaml``.

    :raises ValueError: ``name`` is not a task (an option of the ``task`` group)
    """
    if name not in group_options("task"):
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(group_options('task'))}")
    return get_class(OmegaConf.load(group_folder("task") / f"{name}.yaml").task._target_)


@cache
def registered_targets() -> frozenset[str]:
    """Every ``_target_`` that a config on morlfed's search path names: the strategies, tasks, engines, loggers, ...

    A command line (or the saved one that ``resume=`` reapplies) may name no other code.
    """
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "_target_" and isinstance(value, str):
                    found.add(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for folder in search_path():
        for path in folder.rglob("*.yaml"):
            walk(OmegaConf.to_container(OmegaConf.load(path)))
    return frozenset(found)


@cache
def search_path() -> tuple[Path, ...]:
    """The config folders hydra searches: ``conf/`` and each ``pkg://`` entry of ``hydra.searchpath``.

    A task's config groups may live beside its code (the RL task's ``env`` group in envs/conf/):
    the root config names their packages, so this module knows no group's home.
    """
    entries = OmegaConf.load(CONF_DIR / "config.yaml").hydra.searchpath
    folders = [CONF_DIR]
    for entry in entries:
        # the folder of package a.b.c, found without importing a.b (finding a.b.c would import it)
        top, *rest = str(entry).removeprefix("pkg://").split(".")
        spec = importlib.util.find_spec(top)
        folders.append(Path(spec.submodule_search_locations[0], *rest))  # type: ignore[union-attr, index]
    return tuple(folders)


@cache
def groups() -> tuple[str, ...]:
    """The config groups on morlfed's search path: every folder of YAML options in it (conf/algo, ...)."""
    return tuple(
        sorted({d.name for folder in search_path() for d in folder.iterdir() if d.is_dir() and any(d.glob("*.yaml"))})
    )


def group_folder(group: str) -> Path:
    """The folder of config group ``group`` on the search path (the first that has it).

    :raises ValueError: no folder on the search path has the group
    """
    for folder in search_path():
        if (folder / group).is_dir():
            return folder / group
    raise ValueError(f"no config group {group!r} on the search path {', '.join(map(str, search_path()))}")


def group_options(group: str) -> list[str]:
    """The options of a config group (one of :func:`groups`) on morlfed's search path."""
    return sorted(p.stem for p in group_folder(group).glob("*.yaml"))


def top_level_keys() -> set[str]:
    """Every key a run's ``config.yaml`` may hold at its top.

    ``conf/config.yaml``'s settings, the settings each task's config adds (RL: ``precision``,
    ``device``), and the config groups (a task's groups included: ``env``, ``data``, ...).
    """
    configs = [CONF_DIR / "config.yaml", *sorted(group_folder("task").glob("*.yaml"))]
    keys = {str(key) for path in configs for key in OmegaConf.load(path)} - {"defaults", "hydra", "task"}
    return keys | {"task"} | (set(groups()) - set(ADDED_GROUPS))


def help_groups() -> str:
    """The ``--help`` list of config groups, one ``group: options`` line each.

    Hydra's own list misses ``env``, whose configs come in through the search path.
    """
    return "\n".join(f"{group}: {', '.join(group_options(group))}" for group in groups())
