"""Which run a log line belongs to, where several runs share one process: :func:`run_scope`, :class:`RunFilter`.

A batch of runs (:mod:`morlfed.experiment.batch`) runs in one process, but each run writes its own
``run.log``. The batch runs each run's work inside ``run_scope(<its directory>)``, and each run's
log file handler carries a :class:`RunFilter` for its directory, so it takes that run's lines only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

#: the run whose work goes on now (its directory), if a batch said so
_CURRENT: ContextVar[str | None] = ContextVar("morlfed_run_scope", default=None)


@contextlib.contextmanager
def run_scope(name: str) -> Iterator[None]:
    """The lines logged in the block belong to run ``name``.

    :param name: the run's name (its directory)
    """
    token = _CURRENT.set(name)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class RunFilter(logging.Filter):
    """Passes the records logged inside :func:`run_scope` of one run, and no others.

    :param name: the run's name (its directory)
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.run = name

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` was logged in this run's scope.

        :param record: the log record
        """
        return _CURRENT.get() == self.run
