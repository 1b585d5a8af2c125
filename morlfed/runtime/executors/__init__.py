"""Executors own the clients and run their ``fit`` / ``evaluate`` calls, one module per transport.

* ``sequential`` (:mod:`morlfed.runtime.executors.sequential`): every client in this process, one after
  another.
* ``process`` (:mod:`morlfed.runtime.executors.process`): persistent worker processes, client ``c`` on
  worker ``c % workers``.
* ``ray`` (:mod:`morlfed.runtime.executors.ray`): Ray actors owning the clients the same way.

What they share (the :class:`Executor` interface, guarded fits, client hosts and the engine seam,
state serialisation) is in :mod:`morlfed.runtime.executors.base`; the fit loop of the remote executors
(deadlines, restarts) in :mod:`morlfed.runtime.executors.remote`.
"""

from __future__ import annotations

from typing import Any

from morlfed.runtime.executors.base import (
    DEFAULT_CLIENT_TIMEOUT,
    DEFAULT_KILL_GRACE,
    ClientFactory,
    ClientHost,
    ClientTimeout,
    Executor,
    FitOutcome,
    HostFactory,
    StepSink,
    alarm,
    describe,
    guarded_fit,
    make_host,
    state_file,
    state_from_bytes,
    state_to_bytes,
)
from morlfed.runtime.executors.process import ProcessExecutor
from morlfed.runtime.executors.ray import RAY_MISSING, RayExecutor, RayHost
from morlfed.runtime.executors.sequential import SequentialExecutor

__all__ = [
    "DEFAULT_CLIENT_TIMEOUT",
    "DEFAULT_KILL_GRACE",
    "EXECUTORS",
    "RAY_MISSING",
    "ClientFactory",
    "ClientHost",
    "ClientTimeout",
    "Executor",
    "FitOutcome",
    "HostFactory",
    "ProcessExecutor",
    "RayExecutor",
    "RayHost",
    "SequentialExecutor",
    "StepSink",
    "alarm",
    "describe",
    "guarded_fit",
    "make_executor",
    "make_host",
    "state_file",
    "state_from_bytes",
    "state_to_bytes",
]

EXECUTORS: dict[str, type[Executor]] = {
    "sequential": SequentialExecutor,
    "process": ProcessExecutor,
    "ray": RayExecutor,
}


def make_executor(name: str, **options: Any) -> Executor:
    """The executor registered as ``name`` with its options (see each class).

    :param name: ``sequential``, ``process`` or ``ray``
    :param options: the executor's keyword arguments
    :raises ValueError: unknown name or a bad option value
    :raises TypeError: an option the executor does not take
    :raises ImportError: ``ray`` without Ray installed (the message names the pip command)
    """
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; valid: {', '.join(EXECUTORS)}")
    return EXECUTORS[name](**options)
