"""The ``process`` executor: persistent worker processes, each owning a fixed subset of the clients.

The workers are started with ``spawn`` or ``forkserver``; client ``c`` lives on worker
``c % workers``, in one host built inside the worker from the picklable client factory
(:func:`~morlfed.runtime.executors.base.make_host`). One torch thread per worker unless the clients ask
for more.

A worker streams each fit result back as soon as its host yields it, and the env steps that a
batched host reports while it trains (``("steps", n)`` messages, for the progress bar), so the
deadline is per client: ``client_timeout + kill_grace`` seconds since the worker got its tasks or sent its last
result; a worker whose host is ``batched`` (an engine's, which answers once its whole share is
done) gets ``client_timeout x (number of its tasks) + kill_grace`` for the share
(:mod:`morlfed.runtime.executors.remote`). Workers ignore SIGINT (stopping is the main process' business)
and exit when the main process dies; a stop that interrupts their work terminates them.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import pickle
import signal
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import Evaluation, FitTask
from morlfed.runtime.executors.base import (
    DEFAULT_CLIENT_TIMEOUT,
    DEFAULT_KILL_GRACE,
    ClientFactory,
    FitOutcome,
    StepSink,
    make_host,
)
from morlfed.runtime.executors.remote import _RemoteExecutor


def _send(conn: Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _send_steps(conn: Connection, steps: int) -> None:
    _send(conn, ("steps", steps))


def _worker_main(
    conn: Connection, factory: ClientFactory, cids: list[int], timeout: float | None, restore_dir: str | None
) -> None:
    """A worker process: build the host, then serve commands until ``close`` or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process' business
    torch.set_num_threads(1)
    try:
        host = make_host(factory, cids, timeout)
        if restore_dir is not None:
            host.load(Path(restore_dir))
        _send(conn, ("ready", (host.initial(), host.batched)))
    except Exception:
        _send(conn, ("error", traceback.format_exc()))
        return
    while True:
        try:
            command, payload = _recv(conn)
        except (EOFError, OSError):
            return  # the main process is gone
        try:
            if command == "fit":
                for result in host.fit_many(payload, functools.partial(_send_steps, conn)):
                    _send(conn, ("fit", result))
            elif command == "evaluate":
                _send(conn, ("done", host.evaluate_many(payload)))
            elif command == "personal":
                _send(conn, ("done", host.personal_models(payload)))
            elif command == "save":
                host.save(Path(payload))
                _send(conn, ("done", None))
            elif command == "load":
                host.load(Path(payload))
                _send(conn, ("done", None))
            elif command == "close":
                return
        except Exception:
            _send(conn, ("error", traceback.format_exc()))


class ProcessExecutor(_RemoteExecutor):
    """Persistent worker processes, each owning a fixed subset of the clients.

    :param workers: number of worker processes (``None``: ``os.cpu_count()``)
    :param start_method: ``spawn`` or ``forkserver`` (``fork`` is unsafe with torch threads)
    :param client_timeout: seconds a fit may take (``None``/0: no limit)
    :param kill_grace: extra seconds before a worker that does not answer is killed
    """

    name = "process"
    kind = "worker"

    def __init__(
        self,
        workers: int | None = None,
        start_method: str = "spawn",
        client_timeout: float | None = DEFAULT_CLIENT_TIMEOUT,
        kill_grace: float = DEFAULT_KILL_GRACE,
    ) -> None:
        super().__init__(workers, client_timeout, kill_grace)
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        # one literal per branch: the context types (they have Process) follow from the literal
        self.ctx = (
            multiprocessing.get_context("spawn")
            if start_method == "spawn"
            else multiprocessing.get_context("forkserver")
        )
        self.procs: list[Any] = []
        self.conns: list[Connection] = []

    def _spawn(self, g: int) -> Any:
        parent, child = self.ctx.Pipe(duplex=True)
        restore = str(self.restore_dir) if self.restore_dir else None
        proc = self.ctx.Process(
            target=_worker_main,
            args=(child, self.factory, self.assignment[g], self.client_timeout, restore),
            daemon=True,
            name=f"morlfed-worker-{g}",
        )
        proc.start()
        child.close()
        return proc, parent

    def describe(self, n_clients: int) -> str:
        """Name the executor and the number of worker processes it runs for ``n_clients`` clients.

        That is ``workers`` (``os.cpu_count()`` when unset), at most one per client.
        """
        return f"executor=process ({min(self.workers or self._default_workers(), n_clients)} worker processes)"

    def _launch_all(self) -> None:
        for g in range(len(self.assignment)):  # one by one: a stop while starting finds every one in procs
            proc, conn = self._spawn(g)
            self.procs.append(proc)
            self.conns.append(conn)
        ready = [self._await_ready(g) for g in range(len(self.assignment))]
        self._initial = [initial for initial, _ in ready]
        self._batched = [batched for _, batched in ready]

    def _await_ready(self, g: int) -> tuple[tuple[torch.Tensor, ParamLayout], bool]:
        try:
            kind, payload = _recv(self.conns[g])
        except (EOFError, OSError) as exc:
            raise RuntimeError(
                f"worker {g} died while building its clients (exit code {self.procs[g].exitcode})"
            ) from exc
        if kind == "error":
            raise RuntimeError(f"worker {g} could not build its clients:\n{payload}")
        return payload

    def _restart(self, g: int) -> None:
        proc = self.procs[g]
        if proc.is_alive():
            proc.kill()
        proc.join()
        self.conns[g].close()
        self.procs[g], self.conns[g] = self._spawn(g)
        self._batched[g] = self._await_ready(g)[1]
        self._events.append(self._restored_note(g))

    def initial(self) -> tuple[torch.Tensor, ParamLayout]:
        """The shared initial model and its layout, as worker 0's host reported it when it started."""
        return self._initial[0]

    def _submit_fit(self, tasks: dict[int, FitTask]) -> None:
        for g, cids in enumerate(self.assignment):
            mine = [(cid, tasks[cid]) for cid in cids if cid in tasks]
            if mine:
                if not self.procs[g].is_alive():  # died while idle
                    self._restart(g)
                _send(self.conns[g], ("fit", mine))

    def _streams(self, g: int) -> bool:
        return not self._batched[g]

    def _next_results(
        self, timeout: float | None, busy: set[int], on_steps: StepSink | None
    ) -> tuple[list[tuple[int, FitOutcome]], dict[int, str]]:
        watch = {self.conns[g]: g for g in busy}
        sentinels = {self.procs[g].sentinel: g for g in busy}
        ready = wait([*watch, *sentinels], timeout)
        group_of: dict[object, int] = dict([*watch.items(), *sentinels.items()])  # a ready object's worker
        arrived, dead = [], {}
        for g in sorted({group_of[r] for r in ready}):
            conn = self.conns[g]
            try:
                while conn.poll():
                    kind, payload = _recv(conn)
                    if kind == "error":
                        raise RuntimeError(f"worker {g} failed:\n{payload}")
                    if kind == "steps":
                        if on_steps is not None:
                            on_steps(payload)
                        continue
                    arrived.append(payload)
            except (EOFError, OSError):
                pass
            if not self.procs[g].is_alive():
                self.procs[g].join()
                dead[g] = f"died (exit code {self.procs[g].exitcode})"
        return arrived, dead

    def _call(self, command: str, payloads: Mapping[int, Any]) -> dict[int, Any]:
        """Send a command to some workers and collect their single answers.

        A worker that has died, or dies before it answers, is restarted (its clients restored from
        the latest checkpoint, as in training) and asked once more; the restart is an event
        (:meth:`take_events`).
        """
        self.busy = True
        for g, payload in payloads.items():
            with contextlib.suppress(OSError):  # died while idle: its answer below restarts it
                _send(self.conns[g], (command, payload))
        answers = {g: self._answer(g, command, payload) for g, payload in payloads.items()}
        self.busy = False
        return answers

    def _answer(self, g: int, command: str, payload: Any, retry: bool = True) -> Any:
        """Worker ``g``'s answer to ``command``; a dead worker is restarted and asked again (once)."""
        try:
            kind, answer = _recv(self.conns[g])
        except (EOFError, OSError) as exc:
            self.procs[g].join()
            died = f"worker {g} died during {command} (exit code {self.procs[g].exitcode})"
            if not retry:
                raise RuntimeError(f"{died}, after a restart") from exc
            self._restart(g)
            self._events[-1] = f"{died}; {self._events[-1]}; {command} retried"
            _send(self.conns[g], (command, payload))
            return self._answer(g, command, payload, retry=False)
        if kind == "error":
            raise RuntimeError(f"worker {g} failed during {command}:\n{answer}")
        return answer

    def evaluate(self, models: Mapping[int, torch.Tensor | None], seeds: Mapping[int, int]) -> dict[int, Evaluation]:
        """Send each worker the requests of its own clients and merge the answers, in the order of ``models``.

        A worker that owns none of the requested clients is not asked. There is no deadline: it waits
        for every answer.

        :raises RuntimeError: a worker failed during the evaluation, or died again after a restart
        """
        per_host = {
            g: [(c, models[c], seeds[c]) for c in cids if c in models] for g, cids in enumerate(self.assignment)
        }
        answers = self._call("evaluate", {g: items for g, items in per_host.items() if items})
        merged = {cid: ev for part in answers.values() for cid, ev in part.items()}
        return {cid: merged[cid] for cid in models}

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """Ask each worker for its own clients' personal models.

        :raises RuntimeError: a worker died or failed meanwhile
        """
        per_host = {g: [c for c in owned if c in cids] for g, owned in enumerate(self.assignment)}
        answers = self._call("personal", {g: owned for g, owned in per_host.items() if owned})
        return {cid: model for part in answers.values() for cid, model in part.items()}

    def save_clients(self, directory: Path) -> None:
        """Have every worker write its clients' states into ``directory`` and wait until all are done.

        :raises RuntimeError: a worker failed while saving, or died again after a restart
        """
        self._call("save", dict.fromkeys(range(len(self.assignment)), str(directory)))

    def load_clients(self, directory: Path) -> None:
        """Have every worker restore its clients from ``directory``, then remember it as ``restore_dir``.

        A worker restarted later restores its clients from there.

        :raises RuntimeError: a worker failed while loading, or died again after a restart
        """
        self._call("load", dict.fromkeys(range(len(self.assignment)), str(directory)))
        self.restore_dir = Path(directory)

    def close(self) -> None:
        """Stop every worker process and close the pipes.

        An idle worker is asked to exit; while a command is still out (:attr:`busy`: a stop
        interrupted it) the workers are terminated instead, as they would answer only once done. A
        worker still alive 5 s later is killed.
        """
        for g, proc in enumerate(self.procs):
            if proc.is_alive() and self.busy:  # stopped mid-command: it would answer only once done
                proc.terminate()
            elif proc.is_alive():
                with contextlib.suppress(OSError, BrokenPipeError):
                    _send(self.conns[g], ("close", None))
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns, self.busy = [], [], False
