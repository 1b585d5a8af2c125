"""Stopping a run on a signal: Ctrl-C (SIGINT) and SIGTERM (what Slurm, Kubernetes and ``timeout`` send).

:class:`StopSignals` handles both signals for as long as a run goes on. The first one stops the run
within seconds, not at the end of the round: while the clients are built, train or are evaluated
(inside :meth:`StopSignals.interruptible`) it raises :class:`RunStopped` at once and the round in
progress is abandoned; anywhere else (aggregating, logging, writing a checkpoint) it only records
the request, and the round loop raises :class:`RunStopped` at its next :meth:`StopSignals.check`,
so that no log or checkpoint is left half-written. Either way the run keeps the checkpoint of its
last completed round (the federation writes one after every round, :mod:`morlfed.federation.checkpoint`).
A second signal exits at once, without a traceback (:class:`StopNow`; once the stopped run is
leaving, through ``os._exit``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

#: The signals that stop a run.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)


def exit_status(sig: signal.Signals) -> int:
    """The shell's exit status of a process ended by ``sig`` (128 + its number: 130 for SIGINT).

    :param sig: the signal
    """
    return 128 + int(sig)


class RunStopped(BaseException):
    """The run was stopped by a signal.

    A ``BaseException``, like ``KeyboardInterrupt``, so that code catching ``Exception`` (a client's
    guarded fit, a library) cannot swallow it.

    :param sig: the signal that stopped it
    """

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(f"stopped by {sig.name}")
        self.signal = sig


class StopNow(SystemExit):
    """A second signal: exit at once with the first signal's status.

    A ``SystemExit``: Python prints no traceback for it.

    :param sig: the first signal
    """

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(exit_status(sig))
        self.signal = sig


def leave(sig: signal.Signals) -> NoReturn:
    """Exit the process after a stopped run, with ``sig``'s status; a further signal exits at once.

    A stopped process on its way out may still join workers, run ``atexit`` hooks and flush files;
    a signal arriving then would end it with a traceback under Python's usual handlers. Meant for
    a command line's last step: a program that goes on after catching :class:`RunStopped` (a
    notebook) keeps its handlers.

    :param sig: the signal that stopped the run
    """
    _exit_on_next_signal(sig)
    raise SystemExit(exit_status(sig))


def _exit_on_next_signal(first: signal.Signals) -> None:
    """Make SIGINT and SIGTERM end the process at once (``os._exit``) with ``first``'s status."""

    def exit_now(signum: int, _frame: FrameType | None) -> None:
        _say(f"{signal.Signals(signum).name} again: exiting now")
        os._exit(exit_status(first))

    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, exit_now)


def _say(text: str) -> None:
    """Write a line to stderr from a signal handler.

    A raw write, since the handler may run while the main thread is in the middle of writing to
    ``sys.stderr`` (a buffered stream that refuses to be re-entered).
    """
    os.write(2, f"\nmorlfed: {text}\n".encode())


class StopSignals:
    """Context manager: SIGINT and SIGTERM stop the run (see the module docstring).

    The previous handlers come back at exit. Re-entrant: a federation entering the one its caller
    installed changes nothing. Installs nothing outside the main thread, where signals cannot be
    handled.
    """

    def __init__(self) -> None:
        #: the first signal received, if any
        self.received: signal.Signals | None = None
        self._interruptible = False
        self._depth = 0
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopSignals:
        """Install the stop handlers for SIGINT and SIGTERM (outermost entry, main thread only)."""
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        """On the outermost exit, restore the previous handlers, unless a stopped run is leaving.

        When a stopped run leaves through a ``SystemExit``, a further signal instead exits the process
        at once (``os._exit`` with the first signal's status), where the usual handlers would end it
        with a traceback.
        """
        self._depth -= 1
        if self._depth == 0:
            previous, self._previous = self._previous, {}
            if self.received is not None and kind is not None and issubclass(kind, SystemExit):
                _exit_on_next_signal(self.received)
            else:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.received is not None:
            _say(f"{sig.name} again: exiting now")
            raise StopNow(self.received)
        self.received = sig
        _say(
            f"{sig.name}: stopping; the checkpoint of the last completed round is kept ({sig.name} again exits at once)"
        )
        if self._interruptible:
            raise RunStopped(sig)

    def check(self) -> None:
        """Raise :class:`RunStopped` if a signal has asked the run to stop."""
        if self.received is not None:
            raise RunStopped(self.received)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A block that a signal may abandon at any point.

        Meant for the clients' work of a round, whose result nothing keeps: a stop requested before
        or during it raises :class:`RunStopped`.
        """
        before, self._interruptible = self._interruptible, True
        try:
            self.check()  # after setting the flag: a signal in between raises at once
            yield
        finally:
            self._interruptible = before
