"""The config groups on morlfed's search path, their folders and options, and the task classes.

Hydra composes a run from ``conf/`` and the folders the root config's ``hydra.searchpath`` names
(``envs/conf`` for the RL task's ``env`` group), and from hydra's ``ConfigStore`` (options registered
from Python). These functions read the same folders and store without composing anything, for the
command line's checks (:mod:`morlfed.cli.overrides`), ``--help`` and the analysis' variant labels; they
know no group's home but what the root config says. A command line's own ``hydra.searchpath``
(a user's config folder) comes after morlfed's (:func:`with_searchpath`); each function takes the
search path's entries as the command line gives them.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import get_class
from omegaconf import OmegaConf

from morlfed.tasks.base import Task

#: morlfed's own config folder (the root config, config.yaml, and its groups)
CONF_DIR = Path(__file__).parent.parent / "conf"
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


#: the root config's ``hydra.searchpath``: where morlfed's own groups beyond ``conf/`` live
OWN_SEARCHPATH: tuple[str, ...] = tuple(str(e) for e in OmegaConf.load(CONF_DIR / "config.yaml").hydra.searchpath)


def with_searchpath(entries: list[str] | tuple[str, ...]) -> list[str]:
    """A command line's ``hydra.searchpath`` entries after morlfed's own (:data:`OWN_SEARCHPATH`).

    Hydra's override replaces the root config's list: without morlfed's entries, its packaged
    options (every ``env=``) would be gone.

    :param entries: the command line's entries (``file:///path/conf``)
    """
    return [*OWN_SEARCHPATH, *(e for e in entries if e not in OWN_SEARCHPATH)]


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
def search_path(entries: tuple[str, ...] = OWN_SEARCHPATH) -> tuple[Path, ...]:
    """The config folders hydra searches: ``conf/`` and each entry of ``hydra.searchpath``.

    A task's config groups may live beside its code (the RL task's ``env`` group in envs/conf/):
    the root config names their packages, so this module knows no group's home.

    :param entries: ``hydra.searchpath`` (``pkg://a.b.c`` or ``file:///path``; default: the root config's)
    """
    folders = [CONF_DIR]
    for entry in entries:
        if entry.startswith("pkg://"):
            # the folder of package a.b.c, found without importing a.b (finding a.b.c would import it)
            top, *rest = entry.removeprefix("pkg://").split(".")
            spec = importlib.util.find_spec(top)
            folders.append(Path(spec.submodule_search_locations[0], *rest))  # type: ignore[union-attr, index]
        else:
            folders.append(Path(entry.removeprefix("file://")))
    return tuple(folders)


def groups(entries: tuple[str, ...] = OWN_SEARCHPATH) -> tuple[str, ...]:
    """The config groups on the search path: every folder of YAML options in it (conf/algo, ...).

    :param entries: ``hydra.searchpath`` (default: the root config's)
    """
    found = {d.name for f in search_path(entries) if f.is_dir() for d in f.iterdir() if _options_folder(d)}
    return tuple(sorted(found))


def _options_folder(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*.yaml"))


def group_folder(group: str, entries: tuple[str, ...] = OWN_SEARCHPATH) -> Path:
    """The folder of config group ``group`` on the search path (the first that has it).

    :param group: the group
    :param entries: ``hydra.searchpath`` (default: the root config's)
    :raises ValueError: no folder on the search path has the group
    """
    for folder in search_path(entries):
        if (folder / group).is_dir():
            return folder / group
    raise ValueError(f"no config group {group!r} on the search path {', '.join(map(str, search_path(entries)))}")


def group_options(group: str, entries: tuple[str, ...] = OWN_SEARCHPATH) -> list[str]:
    """The options of a config group (one of :func:`groups`): its files on the search path, and those stored from Python.

    :param group: the group
    :param entries: ``hydra.searchpath`` (default: the root config's)
    """
    found = {p.stem for folder in search_path(entries) for p in (folder / group).glob("*.yaml")}
    return sorted(found | set(_stored(group)))


def option_node(group: str, option: str, entries: tuple[str, ...] = OWN_SEARCHPATH) -> Any:
    """The config of one option of a group, unresolved: the first file on the search path, else the stored one.

    :param group: the group
    :param option: one of :func:`group_options`
    :param entries: ``hydra.searchpath`` (default: the root config's)
    """
    for folder in search_path(entries):
        if (folder / group / f"{option}.yaml").is_file():
            return OmegaConf.load(folder / group / f"{option}.yaml")
    return ConfigStore.instance().load(f"{group}/{option}.yaml").node


def _stored(group: str) -> list[str]:
    """The options of ``group`` stored in hydra's ``ConfigStore`` (registered from Python)."""
    try:
        return [name.removesuffix(".yaml") for name in ConfigStore.instance().list(group)]
    except OSError:  # no such group in the store
        return []


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
