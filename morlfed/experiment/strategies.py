"""A strategy object's identity in a run: its config name (:func:`strategy_name`) and its record (:func:`strategy_record`).

A strategy built in Python has no ``algo=`` option; the run still needs a name for its identity
(``metrics.json``'s ``algo``, the analysis' variant label) and a ``config.yaml`` entry that documents
it. The name is that of the config in ``morlfed/conf/algo`` whose ``_target_`` is the strategy's
class, so such a run sits beside the command line's runs of the same strategy.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import yaml

from morlfed.core.settings import ConfigError
from morlfed.strategies.base import ALGO_DIR, Strategy, available_strategies


def class_path(cls: type) -> str:
    """``module.Class``, as a config's ``_target_`` names a class.

    :param cls: the class
    """
    return f"{cls.__module__}.{cls.__qualname__}"


@cache
def _names_by_target() -> dict[str, str]:
    """``{_target_: config name}`` of ``morlfed/conf/algo``; the first name (sorted) where several share a class."""
    found: dict[str, str] = {}
    for name in available_strategies():
        target = (yaml.safe_load((ALGO_DIR / f"{name}.yaml").read_text()) or {}).get("_target_")
        if isinstance(target, str):
            found.setdefault(target, name)
    return found


def strategy_name(strategy: Strategy) -> str:
    """The run's ``algo`` for a strategy object: its class's config name, else the class name lowercased.

    :param strategy: the strategy
    """
    cls = type(strategy)
    return _names_by_target().get(class_path(cls), cls.__name__.lower())


def strategy_record(strategy: Strategy) -> dict[str, Any]:
    """What ``config.yaml`` records of a strategy object: its class and its constructor's parameters.

    A parameter is recorded where the object keeps it under its own name (``FedPref(top_r=0.5)``
    keeps ``top_r``), as a config's keys are.

    :param strategy: the strategy
    """
    record: dict[str, Any] = {"_target_": class_path(type(strategy))}
    for name in inspect.signature(type(strategy).__init__).parameters:
        value = getattr(strategy, name, None)
        if name != "self" and isinstance(value, (bool, int, float, str, list, tuple, dict, type(None))):
            record[name] = list(value) if isinstance(value, tuple) else value
    return record


def check_strategy(strategy: Strategy, name: str, n_clients: int, rounds: int, finetune: bool) -> None:
    """Refuse a strategy whose settings cannot work with the run (:meth:`Strategy.validate`).

    :param strategy: the strategy
    :param name: its config name, which the message starts with (``algo=NAME: ...``)
    :param n_clients: the run's clients
    :param rounds: the run's rounds
    :param finetune: a "+FT" run, whose last round is not aggregated
    :raises ConfigError: what is wrong, as the command line says it
    """
    if not isinstance(strategy, Strategy):
        raise ConfigError(f"algo={name}: {type(strategy).__name__} is not a morlfed.strategies.base.Strategy")
    try:
        strategy.validate(n_clients, rounds - 1 if finetune else rounds)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"algo={name}: {exc}") from exc
