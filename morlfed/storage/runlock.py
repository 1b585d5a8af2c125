"""One writer per run directory: an exclusive lock that a run (or ``resume=``) holds for its whole life.

The lock is ``flock`` on the file ``RUN_DIR/.morlfed.lock`` (:data:`LOCK`), which says who holds it
(process id, host, start time). A second run or resume of the same directory is refused at once
with :class:`RunDirBusy` (``morlfed: error: ...``, exit status 2), naming the holder. The kernel
releases the lock when its process ends, however it ends, so the file a killed run leaves behind is
never a stale lock: the next run takes it over. The holder removes the file when it is done.
Re-entrant within a process: the command line takes the lock before hydra writes into the
directory, and the run itself takes it again (the Python API and each job of a sweep take it there
first).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from morlfed.core.settings import ConfigError

#: The lock file's name in a run directory.
LOCK = ".morlfed.lock"

#: The locks this process holds: directory -> (open file, depth).
_held: dict[Path, tuple[int, int]] = {}


class RunDirBusy(ConfigError):
    """Another process holds the run directory's lock; the message names it."""


def holder(path: Path) -> str | None:
    """Who else holds the lock of the run directory ``path`` (``pid 123 on host h since ...``), or ``None``.

    ``None`` also when this process holds it.

    :param path: a run directory
    """
    if Path(path).absolute() in _held:
        return None  # this process
    lock = Path(path) / LOCK
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe(lock)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _describe(lock: Path) -> str:
    try:
        record = json.loads(lock.read_text())
        return f"pid {record['pid']} on host {record['host']} since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its lock file is being written)"


@contextlib.contextmanager
def run_dir_lock(path: Path) -> Iterator[None]:
    """Hold the run directory ``path``'s lock (creating the directory) for the block.

    :param path: the run directory
    :raises RunDirBusy: another process holds it
    """
    key = Path(path).absolute()
    if key in _held:
        fd, depth = _held[key]
        _held[key] = (fd, depth + 1)
        try:
            yield
        finally:
            fd, depth = _held[key]
            _held[key] = (fd, depth - 1)
        return
    try:
        key.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot create the run directory ({exc.strerror})") from None
    fd = _acquire(key / LOCK, key)
    _held[key] = (fd, 1)
    try:
        yield
    finally:
        del _held[key]
        with contextlib.suppress(FileNotFoundError):
            (key / LOCK).unlink()  # still held: a process that opened this file gets no lock on it (see _acquire)
        os.close(fd)


def _acquire(lock: Path, directory: Path) -> int:
    """Lock ``lock`` (created if missing) and write this process into it; the open file."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise ConfigError(f"{lock}: cannot write the run directory's lock file ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirBusy(
                f"{directory} is in use by another morlfed run ({_describe(lock)}); one run at a time writes "
                "into a run directory: wait for it to end or stop it, or give another directory"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else its holder removed the file after we opened it: take the new one
            break
        os.close(fd)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(record) + "\n").encode())
    return fd
