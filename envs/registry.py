"""The environment specs morlfed knows: the packaged YAML folder, its aliases, and specs registered from Python.

:func:`get_spec` reads a spec by canonical name, alias or gym id. A spec of one's own needs no
file in the package: put ``env/<name>.yaml`` in a folder of one's own and add it to hydra's search
path (``env=<name> 'hydra.searchpath=[file:///path/conf]'``), or :func:`register` an
:class:`~morlfed.envs.spec.EnvSpec` from Python, after which ``run_experiment(env=<name>)`` and
:func:`get_spec` know it.

This module depends only on the standard library, omegaconf, hydra's ``ConfigStore`` (for
:func:`register`) and :mod:`morlfed.envs.spec`.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any, cast

from omegaconf import OmegaConf

from .spec import ENV_CONF_DIR, EnvSpec

__all__ = ["aliases", "available", "get_spec", "register", "resolve_name"]


# --------------------------------------------------------------------------------------------
# the registry (read from the YAML folder)
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Read ``envs/conf/env``: ``({canonical: raw spec dict}, {alias: canonical})``."""
    canonical: dict[str, dict[str, Any]] = {}
    alias_files: dict[str, str] = {}
    for path in sorted(ENV_CONF_DIR.glob("*.yaml")):
        node = OmegaConf.load(path)
        if "defaults" in node:
            targets = [t for t in node.defaults if t != "_self_"]
            extra = set(node.keys()) - {"defaults"}
            if len(targets) != 1 or not isinstance(targets[0], str) or extra:
                raise RuntimeError(f"{path}: an alias must only hold a defaults list naming one spec")
            alias_files[path.stem] = targets[0].split("/")[-1]
        else:
            data = OmegaConf.to_container(node, resolve=True)
            assert isinstance(data, dict)
            if data.get("name") != path.stem:
                raise RuntimeError(f"{path}: name {data.get('name')!r} differs from the file name")
            canonical[path.stem] = cast("dict[str, Any]", data)  # a YAML mapping's keys are strings
    aliases_: dict[str, str] = {}
    for name, data in canonical.items():
        aliases_[str(data["gym_id"])] = name
    for alias, target in alias_files.items():
        if target not in canonical:
            raise RuntimeError(f"alias {alias!r} points to unknown env spec {target!r}")
        aliases_[alias] = target
    for name in canonical:
        aliases_.pop(name, None)
    return canonical, aliases_


#: the specs registered from Python (:func:`register`), by name
_REGISTERED: dict[str, EnvSpec] = {}


def register(spec: EnvSpec) -> None:
    """Make ``spec`` an ``env`` option from Python: ``run_experiment(env=spec.name)``, :func:`get_spec`.

    It is stored in hydra's ``ConfigStore`` as ``env/<name>``; registering a name again replaces
    that spec. The spec was validated when it was built; a run checks it against the engine, the
    env's constructor and SB3 as it checks a packaged one.

    :param spec: the spec, e.g. ``get_spec("deep-sea-treasure").replace(name="my-dst", gamma=0.9)``
    :raises TypeError: ``spec`` is not an :class:`EnvSpec`
    :raises ValueError: its name is a packaged spec's or alias
    """
    from hydra.core.config_store import ConfigStore

    if not isinstance(spec, EnvSpec):
        raise TypeError(f"register takes an EnvSpec, got {type(spec).__name__}")
    canonical, alias_map = _registry()
    if spec.name in canonical or spec.name in alias_map:
        raise ValueError(f"env {spec.name!r} is a packaged spec's name: register yours under a name of its own")
    ConfigStore.instance().store(group="env", name=spec.name, node=spec.to_dict())
    _REGISTERED[spec.name] = spec


def available() -> list[str]:
    """The canonical environment names, those registered from Python (:func:`register`) included (sorted)."""
    return sorted([*_registry()[0], *_REGISTERED])


def aliases() -> dict[str, str]:
    """``{alias: canonical name}``: the alias YAMLs plus every spec's gym id."""
    return dict(sorted(_registry()[1].items()))


def resolve_name(name: str) -> str:
    """Map a canonical name, alias or gym id to the canonical name.

    :raises ValueError: unknown name; the message lists the valid names and aliases
    """
    canonical, alias_map = _registry()
    if name in canonical or name in _REGISTERED:
        return name
    if name in alias_map:
        return alias_map[name]
    raise ValueError(
        f"unknown environment {name!r}; valid names: {', '.join(available())} (aliases: {', '.join(sorted(alias_map))})"
    )


def get_spec(name: str) -> EnvSpec:
    """Return the :class:`EnvSpec` of an environment (canonical name, alias or gym id).

    :raises ValueError: unknown name (the message lists the valid names) or an invalid YAML
    """
    canonical_name = resolve_name(name)
    if canonical_name in _REGISTERED:
        return _REGISTERED[canonical_name]
    return EnvSpec.from_config(copy.deepcopy(_registry()[0][canonical_name]))
