"""The command line, checked before hydra composes it.

A command line that fails a check gets one ``morlfed: error:`` line and exit status 2, and nothing
is written. Left to hydra, an unknown key is a multi-line trace (``evn=...``) or, with ``+``, a key that
nothing reads (``+evn=...`` runs the default environment, ``+n_client=5`` is ignored); a value is
taken as whatever it parses to (``finetune=maybe``); and the output directory is created, and
hydra's files written into it, even when it holds another run. :func:`precheck_argv` refuses, first:

* an unknown option of a config group, or a group that the selected task does not compose (hydra's message);
* an override of a key that the configuration composed with the command line's groups does not
  have, with or without ``+`` (:func:`check_overrides`), with the closest valid keys suggested;
  ``+`` adds keys only below the selected task's ``open_nodes`` (RL: ``env.agent_kwargs``), whose
  keys are passed on as they are;
* a top-level setting's value of the wrong type or range (:mod:`morlfed.core.settings`), every value of
  a sweep;
* an output directory that cannot be created, or a ``hydra.run.dir`` that holds another run or
  other files (:func:`check_new_run_dir`): a run never writes into another's directory; nor does a
  sweep write into another sweep's folder (:func:`check_new_sweep_dir`: hydra would rewrite its
  ``multirun.yaml`` before any job could refuse to start).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from morlfed.cli.config_groups import (
    ADDED_GROUPS,
    CONF_DIR,
    OWN_SEARCHPATH,
    group_options,
    groups,
    option_node,
    registered_targets,
    task_class,
    top_level_keys,
    with_searchpath,
)
from morlfed.cli.resume import SWEEP_JOBS, resume_command
from morlfed.core.commands import python
from morlfed.core.settings import ConfigError, check_setting
from morlfed.storage.runlock import RunDirBusy, holder
from morlfed.storage.runstatus import describe_run_dir

#: Flags with which hydra shows something and runs nothing.
SHOW_FLAGS = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc")


def parse(argv: list[str]) -> list[Override]:
    """The hydra overrides of a command line (its ``-m``, ``--cfg job`` and other flags left out).

    :param argv: the command line's arguments
    """
    words = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        return OverridesParser.create().parse_overrides(words)
    except HydraException as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"cannot read the command line: {first}") from exc


def _values(override: Override) -> list[Any]:
    """An override's values: each of a sweep (choices, a range), else its one value.

    None for a deletion or a sweep hydra alone can expand (glob, interval).
    """
    if override.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP):
        return list(override.sweep_iterator())
    if override.value_type == ValueType.ELEMENT:
        return [override.value()]
    return []


def _line(override: Override) -> str:
    """The override as the command line wrote it."""
    return override.input_line or override.key_or_group


def _line_with(override: Override, value: Any) -> str:
    """The override with ``value`` in place of its own (one value of a sweep): ``[+]key=value``."""
    return f"{'+' if override.is_add() else ''}{override.key_or_group}={value}"


@contextlib.contextmanager
def compose_api() -> Iterator[None]:
    """Hydra's compose API on morlfed's configuration, from a fresh global hydra."""
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


def searchpath_argv(argv: list[str]) -> list[str]:
    """The command line with morlfed's config folders kept first in its ``hydra.searchpath``, if it sets one.

    Hydra's ``hydra.searchpath=[file:///path/conf]`` replaces the root config's list: a user's
    folder of options (``env/my-env.yaml``) then comes after morlfed's own, which stay
    (:func:`~morlfed.cli.config_groups.with_searchpath`).

    :param argv: the command line's arguments
    """
    out = []
    for arg in argv:
        key = arg.partition("=")[0]
        if key.lstrip("+") == "hydra.searchpath" and not arg.startswith("-"):
            entries = _searchpath(parse([arg]))
            arg = f"{key}=[{','.join(repr(e) for e in entries)}]"
        out.append(arg)
    return out


def _searchpath(overrides: list[Override]) -> tuple[str, ...]:
    """The ``hydra.searchpath`` the overrides set (after morlfed's entries), else the root config's."""
    for override in overrides:
        if override.key_or_group == "hydra.searchpath" and isinstance(value := override.value(), list):
            return tuple(with_searchpath([str(e) for e in value]))
    return OWN_SEARCHPATH


def _group(override: Override, searchpath: tuple[str, ...] = OWN_SEARCHPATH) -> str | None:
    in_group = override.key_or_group in groups(searchpath)
    return override.key_or_group if in_group and override.package is None else None


def _check_groups(overrides: list[Override], searchpath: tuple[str, ...]) -> None:
    """Known options, each config's ``name`` its file's, and ``+`` where (and only where) a group needs it.

    A group that the selected task's config does not bring (``env=`` with ``task=vision``) is left
    to hydra, whose message names it: no group belongs to a task here.
    """
    for override in overrides:
        group, line = _group(override, searchpath), _line(override)
        if group is None:
            continue
        valid = group_options(group, searchpath)
        for option in _values(override):
            if option is not None and str(option) not in valid:
                raise ConfigError(f"unknown {group} {str(option)!r}; valid: {', '.join(valid)}")
            name = option_node(group, str(option), searchpath).get("name") if option is not None else None
            if name is not None and name != str(option):
                raise ConfigError(f"{group}={option}: its config says name: {name}; a config's name is its file's")
        if group in ADDED_GROUPS and not override.is_add():
            raise ConfigError(f"{line}: {group} is added to the configuration: write +{line}")
        if group not in ADDED_GROUPS and override.is_add():
            raise ConfigError(f"{line}: {group}= is chosen by default: write {line.lstrip('+')}")


def _composed(
    overrides: list[Override], searchpath: tuple[str, ...]
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """The configurations the command line's groups compose, with their group choices.

    The configurations are unresolved, as plain containers: one with every group at its first
    option, and one more for each further option of a swept group.
    """
    groups = [o for o in overrides if _group(o, searchpath) is not None]
    fixed = [_line(o) for o in groups if not o.is_sweep_override()]
    if searchpath != OWN_SEARCHPATH:
        fixed.append(f"hydra.searchpath=[{','.join(repr(e) for e in searchpath)}]")
    swept = [(o, _values(o)) for o in groups if o.is_sweep_override()]
    first = [_line_with(o, options[0]) for o, options in swept if options]
    variants = [fixed + first]
    for k, (override, options) in enumerate(swept):
        for option in options[1:]:
            others = [line for j, line in enumerate(first) if j != k]
            variants.append([*fixed, *others, _line_with(override, option)])
    with compose_api():
        for lines in variants:
            try:
                cfg = compose("config", overrides=lines, return_hydra_config=True)
            except HydraException as exc:
                raise ConfigError(str(exc).strip().splitlines()[0]) from exc
            choices = {str(k): str(v) for k, v in cfg.hydra.runtime.choices.items()}
            tree = OmegaConf.to_container(cfg, resolve=False)
            assert isinstance(tree, dict), "a composed configuration is a mapping"
            tree.pop("hydra")
            yield {str(k): v for k, v in tree.items()}, choices


def _has(tree: Any, key: str) -> bool:
    for part in key.split("."):
        if isinstance(tree, dict) and part in tree:
            tree = tree[part]
        elif isinstance(tree, list) and part.isdigit() and int(part) < len(tree):
            tree = tree[int(part)]
        else:
            return False
    return True


def _keys(tree: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a configuration tree."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield f"{prefix}{key}"
            yield from _keys(value, f"{prefix}{key}.")


def closest(word: str, candidates: Collection[str]) -> list[str]:
    """The candidates most like ``word``, best first (at most three).

    A candidate needs difflib's ratio at least 0.6, and within 0.05 of the best; keys of the code
    (``_target_``) are not offered.

    :param word: the unknown word
    :param candidates: the valid words
    """
    scores = {c: difflib.SequenceMatcher(None, word, c).ratio() for c in set(candidates) if "_target_" not in c}
    best = max(scores.values(), default=0.0)
    return sorted((c for c, r in scores.items() if r >= max(0.6, best - 0.05)), key=lambda c: -scores[c])[:3]


def _unknown_key(
    key: str, line: str, tree: dict[str, Any], choices: dict[str, str], searchpath: tuple[str, ...]
) -> ConfigError:
    """The error for an override of ``key``, which ``tree`` (composed with ``choices``) lacks."""
    head, _, rest = key.partition(".")
    message = f"unknown key {key} (in {line})"
    if head in choices and rest and isinstance(tree.get(head), dict):
        here = f"{head}={choices[head]}"
        settings = [k for k in tree[head] if k != "_target_"]  # _target_ names the code, not a setting
        message += f": {here} has {', '.join(settings) or 'no settings'}"
        owners = [
            f"{head}={option}"
            for option in group_options(head, searchpath)
            if option != choices[head] and _has(OmegaConf.to_container(option_node(head, option, searchpath)), rest)
        ]
        if owners:
            return ConfigError(f"{message}; {rest} is a setting of {' and '.join(owners)}")
    close = closest(key, [*_keys(tree), *groups(searchpath)])
    if close:
        message += f"; did you mean {' or '.join(close)}?"
    elif not rest:
        message += f"; the keys are {', '.join(sorted(top_level_keys()))} ({python('-m', 'morlfed.run', '--help')})"
    return ConfigError(message)


def _check_key(override: Override, tree: dict[str, Any], choices: dict[str, str], searchpath: tuple[str, ...]) -> None:
    """The key of a value override exists in ``tree``; ``+`` adds one only below the task's ``open_nodes``."""
    key, line = override.key_or_group, _line(override)
    exists = _has(tree, key)
    open_node = any(key.startswith(f"{node}.") for node in task_class(choices["task"]).open_nodes)
    if override.is_add() and exists:
        raise ConfigError(f"{line} adds a key, but {key} exists: write {line.lstrip('+')}")
    if override.is_add() and open_node:
        return
    if not exists and open_node and not override.is_force_add():
        raise ConfigError(f"{key} is not set by default: add it with +{line}")
    if not exists and not override.is_force_add():
        raise _unknown_key(key, line, tree, choices, searchpath)


def check_overrides(argv: list[str]) -> None:
    """Raise :class:`~morlfed.core.settings.ConfigError` unless every override of the command line is valid.

    Every override must name a config group option, or a key of the configuration they compose,
    with a value of the right type (see the module docstring); a sweep needs ``-m``
    (``--multirun``). The output directory is not checked.

    :param argv: the command line's arguments (hydra overrides and flags)
    """
    overrides = parse(argv)
    sweeps = [_line(o) for o in overrides if o.is_sweep_override()]
    if sweeps and not {"-m", "--multirun"} & set(argv):
        raise ConfigError(f"{sweeps[0]} is a sweep: add -m (--multirun) to run one job per value")
    _check_overrides(overrides)


def _targets(key: str, value: Any) -> Iterator[str]:
    """The ``_target_`` values an override of ``key`` with ``value`` sets (itself, or inside a dict value)."""
    if key.split(".")[-1] == "_target_":
        yield str(value)
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _targets(str(k), v)
    elif isinstance(value, list):
        for v in value:
            yield from _targets("", v)


def _check_code(override: Override) -> None:
    """An override names no code outside the configs (``_target_``), and no path as the task's name."""
    key, line = override.key_or_group, _line(override)
    if key == "task.name":
        raise ConfigError(f"{line}: task.name names the task's own config; choose the task with task=NAME")
    for value in _values(override):
        for target in _targets(key, value):
            if target not in registered_targets():
                raise ConfigError(
                    f"{line}: _target_ {target!r} is none of the classes morlfed's configs name (strategies, tasks, "
                    "engines, loggers); a command line may not name other code"
                )


def _check_overrides(overrides: list[Override]) -> None:
    searchpath = _searchpath(overrides)
    _check_groups(overrides, searchpath)
    settings = [o for o in overrides if _group(o, searchpath) is None and not o.is_hydra_override()]
    for override in settings:
        _check_code(override)
    for override in settings:
        for value in _values(override):
            if not (isinstance(value, str) and "${" in value):  # an interpolation resolves later
                try:
                    check_setting(override.key_or_group, value)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from exc
    if any(not o.is_hydra_override() for o in overrides):  # a group another task brings fails to compose
        for tree, choices in _composed(overrides, searchpath):
            for override in settings:
                _check_key(override, tree, choices, searchpath)


def check_new_run_dir(path: Path, key: str, ignore: Collection[str] = ()) -> None:
    """Raise :class:`~morlfed.core.settings.ConfigError` when the directory ``path`` holds a run or other files.

    A run never writes into another run's directory. The message says what is there and what to
    do: continue an unfinished run (``resume=``), or give a new directory.

    :param path: the run directory to be
    :param key: how the command line names it (``hydra.run.dir``)
    :param ignore: entries to overlook (hydra's own, already written for this run)
    """
    busy = holder(path)
    if busy is not None:
        raise RunDirBusy(
            f"{key}={path} is in use by another morlfed run ({busy}): one run at a time writes into a run directory"
        )
    held = describe_run_dir(path, ignore)
    if held is None:
        return
    what = f"{key}={path} already holds {held}"
    if held.startswith("a finished run"):
        todo = f"give a new {key}, or leave it out (every run gets a directory of its own)"
    elif held.startswith("files"):
        todo = f"give a new or empty directory as {key}"
    else:
        todo = f"continue it with `{resume_command(path)}`, or give a new {key}"
    raise ConfigError(f"{what}; a run never writes into another's directory: {todo}")


def sweep_dir(overrides: list[Override]) -> Path | None:
    """The folder a sweep of these overrides writes into, or ``None`` if it is unknown before hydra runs.

    The folder is ``hydra.sweep.dir``, an experiment's or the default. It cannot be known when it
    names the time or a value only hydra's run sets, or when the command line has a sweep only
    hydra can expand (a glob).

    :param overrides: the command line's parsed overrides
    """
    swept = [(o, _values(o)) for o in overrides if o.is_sweep_override()]
    if any(not values for _, values in swept):
        return None
    lines = [_line(o) for o in overrides if not o.is_sweep_override()]
    lines += [_line_with(o, values[0]) for o, values in swept]
    with compose_api():
        try:
            cfg = compose("config", overrides=lines, return_hydra_config=True)
        except HydraException:  # a value that reads otherwise as one element of a sweep
            return None
    node = cfg.hydra.sweep
    raw = OmegaConf.to_container(node, resolve=False)
    assert isinstance(raw, dict), "hydra.sweep is a mapping"
    if "${now:" in str(raw["dir"]):
        return None  # a new folder at every launch
    try:
        return Path(str(node.dir))
    except OmegaConfBaseException:  # an interpolation that only hydra's run can resolve
        return None


def check_new_sweep_dir(path: Path) -> None:
    """Raise :class:`~morlfed.core.settings.ConfigError` when the sweep folder ``path`` holds an earlier sweep.

    An earlier sweep leaves its ``multirun.yaml``, which hydra rewrites before the first job starts,
    and its list of jobs (:data:`~morlfed.cli.resume.SWEEP_JOBS`), whose runs ``branch_siblings`` trusts.

    :param path: the sweep folder to be
    """
    found = [name for name in ("multirun.yaml", SWEEP_JOBS) if (path / name).is_file()]
    if found:
        raise ConfigError(
            f"hydra.sweep.dir={path} already holds a sweep ({found[0]}); a sweep never writes into "
            f"another's folder: give a new hydra.sweep.dir (a stopped job continues with "
            f"`{python()} -m morlfed.run resume=JOB_DIR`)"
        )


def precheck_argv(argv: list[str]) -> None:
    """Check a command line before hydra composes it (see the module docstring).

    Raises :class:`~morlfed.core.settings.ConfigError` saying what is wrong and what is allowed.

    :param argv: the command line's arguments (after ``resume=``/``branch_from=`` expansion)
    """
    check_overrides(argv)
    overrides = parse(argv)
    multirun = bool({"-m", "--multirun"} & set(argv))
    dirs = {o.key_or_group: str(o.value()) for o in overrides if o.key_or_group in ("hydra.run.dir", "hydra.sweep.dir")}
    for key, value in dirs.items():
        check_creatable(Path(value), f"{key}={value}")
    key, default = ("hydra.sweep.dir", "multirun") if multirun else ("hydra.run.dir", "runs")
    if key not in dirs:  # the default: runs/... or multirun/... here
        check_creatable(Path.cwd() / default, f"the default {key} {Path.cwd() / default}/...", f"; set {key}=...")
    resuming = any(o.key_or_group == "resume" for o in overrides)
    runs = not any(a.split("=")[0] in SHOW_FLAGS for a in argv)
    if runs and not multirun and not resuming and "hydra.run.dir" in dirs:
        check_new_run_dir(Path(dirs["hydra.run.dir"]), "hydra.run.dir")
    if runs and multirun and "hydra.launcher.resume=true" not in argv:  # a campaign goes on in its folder
        folder = sweep_dir(overrides)
        if folder is not None:
            check_new_sweep_dir(folder)


def check_creatable(path: Path, what: str = "", hint: str = "") -> None:
    """Raise :class:`~morlfed.core.settings.ConfigError` unless directories can be made at ``path``.

    A probe directory is created in its nearest existing ancestor and removed again (``os.access``
    cannot tell: it says yes to root everywhere, also on /proc and /sys, where nothing can be
    created).

    :param path: the directory to be created (or an existing one to write into)
    :param what: how the message names it (default: ``output directory PATH``)
    :param hint: appended to the message (what to do instead)
    """
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file")
        os.rmdir(tempfile.mkdtemp(prefix=".morlfed-probe-", dir=existing))
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(
            f"{what or f'output directory {path}'} cannot be created: {existing} is not a writable directory ({why}){hint}"
        ) from exc
