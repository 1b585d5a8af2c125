"""The command line's configuration from Python values: composed, checked, objects put in place, and run.

:func:`composed` turns keyword settings into the overrides the command line would take
(``rounds=2`` is ``rounds=2``, ``True`` is ``true``), checks them as the command line checks them
(:func:`morlfed.cli.overrides.precheck_argv`) and composes them with hydra's public compose API. A
value that is an object takes the place of the node it stands for: a
:class:`~morlfed.strategies.base.Strategy` for ``algo``, an object with ``name`` and ``to_dict()`` (an
env spec) for its group. :func:`plan_composed` builds the run's objects from that, and
:func:`run_composed` runs them in the run directory the command line would use (its ``.hydra/``
and ``run.log`` included). The process is left as it was found: the logging configuration,
hydra's global state and torch's thread count are restored.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from morlfed.cli.execute import Job, build_plan, execute
from morlfed.cli.overrides import compose_api, parse, precheck_argv, searchpath_argv
from morlfed.cli.resume import resume_argv
from morlfed.core.settings import ConfigError
from morlfed.experiment import Experiment, strategy_name, strategy_record
from morlfed.strategies.base import Strategy

#: the config group a strategy object stands for
STRATEGY_GROUP = "algo"


def plan_composed(settings: Mapping[str, Any], overrides: Sequence[str] = ()) -> Experiment:
    """The validated experiment of these settings and overrides, built as the command line builds it, nothing run.

    :param settings: config groups and top-level settings (values or objects, see :func:`composed`)
    :param overrides: further overrides in command-line syntax
    :raises ConfigError: bad input, the command line's error
    """
    with composed(settings, overrides) as (cfg, strategy):
        return build_plan(_task_config(cfg), cfg.hydra.runtime.choices, strategy)


def run_composed(settings: Mapping[str, Any], overrides: Sequence[str] = (), run_dir: str | Path | None = None) -> Path:
    """Run the experiment of these settings and overrides as the command line runs it; its run directory.

    :param settings: config groups and top-level settings (values or objects, see :func:`composed`)
    :param overrides: further overrides in command-line syntax
    :param run_dir: the run directory (``hydra.run.dir``); by default the command line's
    :raises ConfigError: bad input, the command line's error; nothing is left written
    :raises morlfed.core.interrupt.RunStopped: SIGINT or SIGTERM stopped the run
    """
    if run_dir is not None:
        overrides = [*overrides, _override("hydra.run.dir", Path(run_dir))]
    objects = tuple(f"{k}=<{type(v).__name__} object>" for k, v in settings.items() if _is_object(k, v))
    with composed(settings, overrides) as (cfg, strategy):
        job = _job(cfg)
        execute(_task_config(cfg), replace(job, overrides=(*objects, *job.overrides)), strategy)
    return job.out


@contextlib.contextmanager
def composed(
    settings: Mapping[str, Any], overrides: Sequence[str] = ()
) -> Iterator[tuple[DictConfig, Strategy | None]]:
    """The configuration (with hydra's node) of these settings and overrides, and the strategy object given, if any.

    Plain values are written as command-line overrides and checked as the command line checks
    them. A :class:`~morlfed.strategies.base.Strategy` given as ``algo`` replaces the ``algo`` node by its
    record (:func:`~morlfed.experiment.strategy_record`), its name the group's option; an object
    with ``name`` and ``to_dict()`` replaces its group's node by ``to_dict()``, its ``name`` the
    option. Hydra's global state is restored after.

    :param settings: config groups and top-level settings
    :param overrides: further overrides in command-line syntax
    :raises ConfigError: bad input; an override below a node that an object replaces
    """
    strategy = settings.get(STRATEGY_GROUP) if isinstance(settings.get(STRATEGY_GROUP), Strategy) else None
    nodes = {k: v for k, v in settings.items() if not isinstance(v, Strategy) and _is_node(v)}
    plain = {k: v for k, v in settings.items() if k not in nodes and not (k == STRATEGY_GROUP and strategy)}
    argv = [*(_override(key, value) for key, value in plain.items()), *overrides]
    _refuse_what_only_the_command_line_does(argv)
    replaced = [*nodes, *([STRATEGY_GROUP] if strategy is not None else [])]
    groups = [(str(o.input_line), str(o.key_or_group or "").lstrip("+~").split(".")[0]) for o in parse(argv)]
    below = [(line, group) for line, group in groups if group in replaced]
    if below:
        line, group = below[0]
        raise ConfigError(f"{line}: {group} is given as an object; set its values on the object itself")
    argv = searchpath_argv(resume_argv(argv))
    precheck_argv(argv)
    with process_state_restored(), compose_api():
        cfg = compose("config", overrides=[*argv, "hydra.job.name=run"], return_hydra_config=True)
        with read_write(cfg), open_dict(cfg):
            for key, value in nodes.items():
                cfg[key] = value.to_dict()
                cfg.hydra.runtime.choices[key] = value.name
            if strategy is not None:
                cfg[STRATEGY_GROUP] = strategy_record(strategy)
                cfg.hydra.runtime.choices[STRATEGY_GROUP] = strategy_name(strategy)
        HydraConfig.instance().set_config(cfg)
        yield cfg, strategy


def _is_object(key: str, value: Any) -> bool:
    """Whether ``key=value`` is a config group given as an object (:func:`composed`)."""
    return (key == STRATEGY_GROUP and isinstance(value, Strategy)) or _is_node(value)


def _is_node(value: Any) -> bool:
    """An object that stands for a config group's node: it has a ``name`` and a ``to_dict()``."""
    return isinstance(getattr(value, "name", None), str) and callable(getattr(value, "to_dict", None))


def _task_config(cfg: DictConfig) -> DictConfig:
    """The run's configuration without hydra's node, as the command line's run gets it."""
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def _job(cfg: DictConfig) -> Job:
    """The run directory as the command line's run starts it: made, logged into (``run.log``), ``.hydra/`` saved.

    :param cfg: the composed configuration; its ``hydra.runtime.output_dir`` is set here
    """
    out = Path(str(OmegaConf.select(cfg, "hydra.run.dir"))).absolute()
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(out)
    HydraConfig.instance().set_config(cfg)
    out.mkdir(parents=True, exist_ok=True)
    configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
    if cfg.hydra.output_subdir is not None:
        saved = out / str(cfg.hydra.output_subdir)
        saved.mkdir(parents=True, exist_ok=True)
        hydra_cfg = HydraConfig.instance().cfg
        assert hydra_cfg is not None, "set above"
        for name, node in (
            ("config", _task_config(cfg)),
            ("hydra", hydra_cfg),
            ("overrides", cfg.hydra.overrides.task),
        ):
            (saved / f"{name}.yaml").write_text(OmegaConf.to_yaml(node), encoding="utf-8")
    return Job.of(cfg.hydra)


def _override(key: str, value: Any) -> str:
    """One ``key=value`` override, the value written in hydra's override syntax."""
    return f"{key}={override_value(value)}"


def override_value(value: Any) -> str:
    """A Python value in hydra's override syntax (``True``: ``true``, ``None``: ``null``, lists, mappings).

    :param value: the value
    :raises ConfigError: a value the command line cannot say
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return repr(value.item() if isinstance(value, np.generic) else value)
    if isinstance(value, (str, Path)):
        text = str(value)
        # quoted where hydra's grammar would read the text as something else (a list, a sweep, ...)
        plain = text and all(c.isalnum() or c in "-_./:+@" for c in text)
        return text if plain else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) as a command-line value")


def _refuse_what_only_the_command_line_does(argv: list[str]) -> None:
    """A sweep, hydra's flags: the command line's, not one experiment's."""
    flags = [a for a in argv if a.startswith("-")]
    if flags:
        raise ConfigError(f"{flags[0]} is a command-line flag; run_experiment runs one experiment")
    sweeps = [o for o in parse(argv) if o.is_sweep_override()]
    if sweeps:
        raise ConfigError(
            f"{sweeps[0].input_line} is a sweep; run_experiment runs one experiment: call it once per value "
            "(or run the sweep with python -m morlfed.run -m)"
        )


@contextlib.contextmanager
def process_state_restored() -> Iterator[None]:
    """Put back what a run changes in the process: the logging configuration, hydra's config, torch's threads."""
    root = logging.getLogger()
    handlers, level, threads = list(root.handlers), root.level, torch.get_num_threads()
    loggers = {
        name: (lg.level, lg.disabled)
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    hydra_config = HydraConfig.instance().cfg
    try:
        yield
    finally:
        for handler in set(root.handlers) - set(handlers):
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, (lg_level, disabled) in loggers.items():
            lg = logging.getLogger(name)
            lg.setLevel(lg_level)
            lg.disabled = disabled
        HydraConfig.instance().cfg = hydra_config
        torch.set_num_threads(threads)
