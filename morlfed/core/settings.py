"""The run's top-level settings (``morlfed/conf/config.yaml``): the type and range each takes.

:func:`check_setting` checks one value and :func:`check_settings` every one of a composed
configuration; the command line's values are checked before hydra composes them
(:mod:`morlfed.cli.overrides`, every value of a sweep) and the composed ones before anything runs
(:func:`morlfed.cli.execute.build_plan`). The messages say what was given and what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from morlfed.core.parallelism import parse_threads


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says what and what is allowed."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _boolean(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")


def _positive(key: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")


def _at_least_zero(meaning: str) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if not _is_int(value) or value < 0:
            raise ValueError(f"{key} must be an integer >= 0 ({meaning}), got {value!r}")

    return check


def _fraction(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ValueError(f"{key} must be in (0, 1], got {value!r}")


def _threads(key: str, value: Any) -> None:
    parse_threads(value)  # the one rule for torch_threads (morlfed.core.parallelism)


def _device(key: str, value: Any) -> None:
    if value not in ("cpu", "cuda", "auto"):
        raise ValueError(f"{key} must be cpu, cuda or auto, got {value!r}")


def _run_dir(key: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be a run directory (a path) or null, got {value!r}")


#: Each top-level setting with a fixed type and its check.
CHECKS: dict[str, Callable[[str, Any], None]] = {
    "n_clients": _positive,
    "rounds": _positive,
    "local_steps": _positive,
    "seed": _at_least_zero("the root seed"),
    "finetune": _boolean,
    "participation": _fraction,
    "save_similarity": _boolean,
    "progress": _boolean,
    "eval_every": _at_least_zero("0: only the final evaluation"),
    "torch_threads": _threads,
    "device": _device,
    "checkpoint_every": _at_least_zero("0: none kept once the run completes"),
    "resume": _run_dir,
    "branch_from": _run_dir,
    "branch_siblings": _boolean,
}


def check_setting(key: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` suits the top-level setting ``key``.

    The message says what was given and what is allowed. Settings without a fixed type (and other
    keys) pass.

    :param key: a top-level key of the configuration
    :param value: its value
    """
    check = CHECKS.get(key)
    if check is not None:
        check(key, value)


def check_settings(cfg: Mapping[str, Any]) -> None:
    """:func:`check_setting` on every top-level setting of a composed configuration.

    :param cfg: the configuration (its top-level values resolved)
    """
    for key in CHECKS:
        if key in cfg:
            check_setting(key, cfg[key])
