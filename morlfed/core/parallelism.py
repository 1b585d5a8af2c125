"""How a run uses the machine's cores: ``executor=auto`` and ``torch_threads=auto``.

A run with no flags uses every core it may run on (``os.sched_getaffinity``: a Slurm or
``taskset`` allocation counts, not the machine's total). Two ways exist to spread a run over cores:
torch's intra-op threads inside one process, or worker processes that each own a share of the
clients. Workers win for morlfed's clients (``bench/cores.py`` measures both): a worker also
steps its clients' environments, which threads cannot share, and a worker's results do not
depend on how the clients are spread over workers, bit for bit, while multi-threaded reductions
may round differently with another thread count. So:

* ``executor=auto`` runs ``process`` workers, one per core (at most one per client) with one torch
  thread each, when the run is long enough to repay their start (``MIN_PARALLEL_STEPS`` env steps
  in all; a worker spends a few seconds importing torch and SB3); a shorter run stays in this
  process, on one thread.
* A run that trains its clients as one batch on a GPU (the vectorised engine on CUDA: the task's
  ``gpu_batched``) stays in one process under ``executor=auto``: worker processes would each open
  a context on the one GPU, which then switches between them. Measured on an H200
  (docs/engines.md, "GPU"): the headline's rounds took 13-21 s in one process and 30-37 s with
  five worker processes. The SB3 engine on CUDA keeps its workers (not measured either way).
* ``torch_threads=auto`` is one thread per worker under every executor, ``sequential`` included:
  more threads are ``torch_threads=N``'s to ask for.

Intra-op threads are never auto's choice, for a measured reason besides speed: on a machine
whose cores are busy with other work, torch's threads wait on each other; a short mo-lunar-lander
run took 25 times longer with 2 threads than with 1 while other jobs loaded both cores, and two
``executor=sequential`` sweeps side by side (the way the studies of docs/results.md use a 2-core
machine) took 20 times longer per round when each gave its one process both cores' threads.

Explicit settings always win: ``executor=sequential``, ``executor.workers=N``,
``torch_threads=N``.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Env steps of a whole run (clients x rounds x local steps) from which ``executor=auto`` starts
#: worker processes: below it, their start (importing torch and SB3 in each, a few seconds) costs
#: more than the second core saves.
MIN_PARALLEL_STEPS = 200_000
#: The executors whose ``workers`` option places clients on separate processes or actors.
_WORKER_EXECUTORS = ("process", "ray")


def cpuinfo_field(key: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first non-empty value of ``key`` in ``cpuinfo``; ``None`` where it has none or cannot be read.

    ``cpuinfo`` is Linux's description of the processors; ``key`` is e.g. ``model name`` or ``flags``.

    :param key: the field's name
    :param cpuinfo: where the kernel describes the processors
    """
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key and value.strip():
            return value.strip()
    return None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name.

    ``/proc/cpuinfo``'s ``model name`` on Linux, else what :func:`platform.processor` reports;
    ``unknown`` when neither says. A run's wall time depends on it as much as on the core count:
    the same 2-core budget costs twice as much on one core type as on another (docs/engines.md,
    "Speed").

    :param cpuinfo: where the kernel describes the processors
    """
    return cpuinfo_field("model name", cpuinfo) or platform.processor() or "unknown"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Parallelism:
    """A run's resolved use of the cores.

    :param executor: ``sequential``, ``process`` or ``ray``
    :param workers: worker processes (or Ray actors) holding clients; 1 for ``sequential``;
        ``None`` where a Ray cluster decides
    :param torch_threads: torch intra-op threads in each worker
    :param cores: the cores the run may use on this machine
    """

    executor: str
    workers: int | None
    torch_threads: int
    cores: int

    def record(self) -> dict[str, Any]:
        """The fields ``metrics.json`` records, with the processor's model (:func:`cpu_model`)."""
        return {
            "executor": self.executor,
            "workers": self.workers,
            "torch_threads": self.torch_threads,
            "cores": self.cores,
            "cpu": cpu_model(),
        }


def parse_threads(value: Any) -> int | None:
    """``torch_threads`` as a positive integer, ``None`` for ``auto``.

    :param value: the configured value
    :raises ValueError: anything else
    """
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"torch_threads must be a positive integer or auto (one per worker), got {value!r}")
    return value


def resolve(
    executor: str,
    workers: int | None,
    torch_threads: Any,
    n_clients: int,
    total_steps: int,
    cores: int | None = None,
    gpu_batched: bool = False,
) -> Parallelism:
    """The executor, worker count and threads a run uses (see the module docstring).

    :param executor: the ``executor`` option (``auto``, ``sequential``, ``process``, ``ray``)
    :param workers: its ``workers`` option (``None``: its default)
    :param torch_threads: the ``torch_threads`` setting (a positive integer or ``auto``)
    :param n_clients: clients of the run
    :param total_steps: env steps of the whole run (clients x rounds x local steps)
    :param cores: the usable cores (default: :func:`available_cores`)
    :param gpu_batched: the clients train as one batch on a GPU (``auto`` then keeps them in one
        process)
    """
    cores = available_cores() if cores is None else cores
    threads = parse_threads(torch_threads)
    if executor == "auto":
        parallel = not gpu_batched and cores > 1 and n_clients > 1 and total_steps >= MIN_PARALLEL_STEPS
        executor = "process" if parallel else "sequential"
    if executor == "sequential":
        workers = 1
    elif executor == "process":
        workers = min(workers or cores, n_clients)
    return Parallelism(executor, workers, 1 if threads is None else threads, cores)


def free_memory(device: str, meminfo: Path = Path("/proc/meminfo")) -> int:
    """The memory free for new work on ``device``, in bytes.

    On ``cuda`` the device's free memory (``torch.cuda.mem_get_info``); on the CPU ``MemAvailable``
    of ``meminfo`` (the kernel's estimate of what can be allocated without swapping), else the free
    physical pages.

    :param device: ``cpu`` or ``cuda``
    :param meminfo: the kernel's memory report
    """
    if device == "cuda":
        import torch  # here only: the command line's checks import this module (core.settings) before torch

        return int(torch.cuda.mem_get_info()[0])
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
