"""How morlfed's commands speak on the console: one ``morlfed: <level>: <message>`` line.

A command line's warnings and errors are for its user, not its developers: no file path, no
source line, no timestamp. :class:`ConsoleFormatter` formats the console's log records (the
``job_logging`` of ``conf/config.yaml``; ``run.log`` keeps its own, full format) and
:func:`one_line_warnings` prints Python's warnings (``warnings.warn``, e.g. a reference point that
a return does not dominate) the same way. The Python API leaves both alone: there, warnings are
Python's, to filter as one likes.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import TextIO


class ConsoleFormatter(logging.Formatter):
    """``morlfed: warning: <message>`` (or ``error``, ...), a record's exception left to ``run.log``."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one ``morlfed: <level>: <message>`` line.

        :param record: the log record
        """
        return f"morlfed: {record.levelname.lower()}: {record.getMessage()}"


def one_line_warnings(prog: str = "morlfed") -> None:
    """Print this process' Python warnings as ``<prog>: warning: <message>`` on stderr.

    :param prog: the command's name, the lines' prefix
    """

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        print(f"{prog}: warning: {message}", file=file or sys.stderr)

    warnings.showwarning = show
