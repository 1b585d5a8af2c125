"""The runs of ``bench/gpu.py`` (its parts 1-4; see its docstring), and the budget that stops them.

Every run is the command line's run in this process (:func:`morlfed.api.run_experiment`) under a
:class:`~lockstep_probe.LockstepProbe`, with ``executor=sequential`` so that its clients train in
this process.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import csv
import gc
import gzip
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_figures import profile_figures, project
from lockstep_probe import LockstepProbe, PhaseTotals

from morlfed.api import run_experiment
from morlfed.core.interrupt import RunStopped
from morlfed.core.parallelism import available_cores, cpu_model, resolve
from morlfed.core.provenance import code_version
from morlfed.envs import get_spec
from morlfed.tasks.rl.precision import resolve_precision

HEADLINE = ["env=mo-lunar-lander", "dist=dirichlet"]
CONTINUOUS = ["env=mo-lunar-lander-continuous", "engine=vectorised"]
GOALS_S = {"headline": 120.0, "continuous": 600.0}
RESERVE_S = 10.0  # kept for the summary
TRACE_LIMIT_BYTES = 10 * 2**20  # a larger (compressed) chrome trace is not kept
RUN_FILES = ("rounds.csv", "metrics.json", "run.log", "config.yaml")


class Budget:
    """The script's time: what is left of it, and a deadline that stops the part running past it.

    At the deadline the main thread gets a SIGINT as Python's handlers see it: a run stops within
    seconds, keeping its completed rounds (:mod:`morlfed.core.interrupt`); elsewhere it is a
    ``KeyboardInterrupt``. :attr:`fired` tells either from a user's Ctrl-C.

    :param seconds: the whole budget, the summary's reserve included
    """

    def __init__(self, seconds: float) -> None:
        self.started = time.perf_counter()
        self.end = self.started + seconds - RESERVE_S
        self.fired = False
        self._timer = threading.Timer(max(self.end - self.started, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        """Seconds left before the deadline."""
        return self.end - time.perf_counter()

    def cancel(self) -> None:
        """Disarm the deadline (before the summary is written)."""
        self._timer.cancel()

    def _fire(self) -> None:
        self.fired = True
        _thread.interrupt_main(signal.SIGINT)


def environment(device: str, imports_s: float | None) -> dict[str, Any]:
    """The machine and the software, and what the headline's ``auto`` settings pick on ``device``.

    :param device: ``cuda`` or ``cpu``
    :param imports_s: seconds from the process's start to the script's main (its imports)
    :raises RuntimeError: ``cuda`` where torch sees no CUDA device
    """
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise RuntimeError(f"--device cuda: torch {torch.__version__} sees no CUDA device")
    spec = get_spec("mo-lunar-lander")
    full = spec.n_clients * spec.rounds * spec.local_steps
    record: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cores_available": available_cores(),
        "code": code_version(),
        "imports_s": None if imports_s is None else round(imports_s, 1),
        "headline_precision_auto": resolve_precision("auto", spec, "vectorised", device),
        "headline_executor_auto": resolve(
            "auto", None, "auto", spec.n_clients, full, gpu_batched=device == "cuda"
        ).executor,
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        record |= {
            "device_name": props.name,
            "device_memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "bf16_supported": torch.cuda.is_bf16_supported(),
        }
    return record


def federation(overrides: list[str], folder: Path, probe: LockstepProbe, budget: Budget) -> dict[str, Any]:
    """Run one experiment in this process under ``probe``; its rounds, call time, metrics and files.

    The run directory is a temporary one; its small files are copied into ``folder``, and what the
    run prints goes to ``folder/stdout.txt``. A run stopped at the budget's deadline returns its
    completed rounds, ``stopped`` and its start-up time (``startup_s``: up to its first round's
    training).

    :param overrides: the command line's overrides (``progress=false`` is added)
    :param folder: the part's output folder
    :param probe: the lockstep timers (entered here)
    :param budget: the script's budget
    """
    tmp = Path(tempfile.mkdtemp(prefix="morlfed-gpu-bench-"))
    stopped = False
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        with probe, open(folder / "stdout.txt", "w") as out, contextlib.redirect_stdout(out):
            try:
                run_experiment(overrides=[*overrides, "progress=false"], run_dir=tmp / "run")
            except (RunStopped, KeyboardInterrupt):
                if not budget.fired:
                    raise
                stopped = True
        call_s = time.perf_counter() - started
        for name in RUN_FILES:
            if (tmp / "run" / name).is_file():
                shutil.copy(tmp / "run" / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        gc.collect()
    rows = []
    if (folder / "rounds.csv").is_file():
        with open(folder / "rounds.csv") as fh:
            rows = list(csv.DictReader(fh))
    failed = [f"round {row['round']}: {row['failed']}" for row in rows if row.get("failed")]
    if failed:  # a round without every client's fit measures something else
        raise RuntimeError(f"client fits failed (rounds.csv): {'; '.join(failed)}")
    rounds = [float(row["seconds"]) for row in rows]
    metrics = json.loads((folder / "metrics.json").read_text()) if (folder / "metrics.json").is_file() else {}
    record: dict[str, Any] = {"command": "python -m morlfed.run " + " ".join(overrides), "call_s": round(call_s, 2)}
    record |= {"round_seconds": rounds, "stopped": stopped, "metrics": metrics}
    record["lockstep"] = [{"seconds": round(r.seconds, 3), "steps": r.steps} for r in probe.rounds]
    record["startup_s"] = probe.rounds[0].started_at - started if stopped and probe.rounds else None
    if torch.cuda.is_available():
        record["peak_device_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        torch.cuda.empty_cache()
    return record


class ProfileWindows:
    """Runs ``torch.profiler`` over the probe's ``profile`` and ``trace`` phases, once each.

    :param device: ``cuda`` (CPU and CUDA activity) or ``cpu``
    """

    WINDOWS = ("profile", "trace")

    def __init__(self, device: str) -> None:
        self.device = device
        self.profilers: dict[str, torch.profiler.profile] = {}
        self.probe: LockstepProbe | None = None
        #: what went wrong starting or stopping a profiler (the run goes on without it)
        self.errors: list[str] = []
        self._open: str | None = None

    def on_phase(self, old: str, new: str) -> None:
        """Close the window ``old`` if open; open ``new`` if it is a window not yet recorded.

        It never raises: an exception here would fail the clients' fit, so it is kept in :attr:`errors`.
        """
        try:
            self._switch(old, new)
        except Exception as exc:
            self.errors.append(f"{old} -> {new}: {type(exc).__name__}: {exc}")
            self._open = None
        if self.probe is not None:
            self.probe.labelled = self._open is not None

    def _switch(self, old: str, new: str) -> None:
        if self._open == old:
            self._sync()
            self.profilers[old].stop()
            self._open = None
        if new in self.WINDOWS and new not in self.profilers:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._sync()
            profiler = torch.profiler.profile(activities=activities)
            profiler.start()
            self.profilers[new], self._open = profiler, new

    def _sync(self) -> None:
        """Let the device finish its queued work, so that a window holds its own kernels."""
        if self.device == "cuda":
            torch.cuda.synchronize()


def profile_part(args: argparse.Namespace, precision: str, budget: Budget, folder: Path) -> dict[str, Any]:
    """Part 2 for one precision (see the module docstring)."""
    rounds, steps = args.profile_rounds, args.profile_steps
    first = steps // 4
    window, trace = min(args.profile_window, max(steps // 2, 1)), min(args.trace_window, max(steps // 4, 1))

    def schedule(rnd: int, i: int) -> str:
        if rnd < rounds or i < first:
            return "warm-up" if rnd == 1 else "plain"
        if i < first + window:
            return "profile"
        return "trace" if i < first + window + trace else "plain"

    windows = ProfileWindows(args.device)
    probe = LockstepProbe(schedule, windows.on_phase)
    windows.probe = probe
    overrides = [*HEADLINE, "engine=vectorised", f"precision={precision}", f"device={args.device}"]
    overrides += [f"rounds={rounds}", f"local_steps={steps}", f"n_clients={args.clients}", "executor=sequential"]
    record = federation([*overrides, "env.eval_episodes=1", *args.override], folder, probe, budget)
    record["precision"] = precision
    if windows.errors:
        record["profiler_errors"] = windows.errors
    for phase in ("warm-up", "plain", "profile"):
        totals = probe.phases.get(phase, PhaseTotals())
        record[f"{phase}_steps"] = totals.steps
        record[f"{phase}_ms"] = {k: round(v, 4) for k, v in totals.per_step_ms().items()}
    if "profile" in windows.profilers:
        averages = windows.profilers["profile"].key_averages()
        steps_profiled = max(probe.phases["profile"].steps, 1)
        record["profiler"] = {k: round(v, 4) for k, v in profile_figures(averages, steps_profiled).items()}
        (folder / "key_averages_cpu.txt").write_text(averages.table(sort_by="self_cpu_time_total", row_limit=80))
        if args.device == "cuda":
            table = averages.table(sort_by="self_device_time_total", row_limit=80)
            (folder / "key_averages_device.txt").write_text(table)
    if "trace" in windows.profilers:
        record["trace"] = chrome_trace(windows.profilers["trace"], folder / "trace.json.gz")
    return record


def chrome_trace(profiler: torch.profiler.profile, path: Path) -> str:
    """Write ``profiler``'s chrome trace gzipped to ``path`` unless it is too large; say which."""
    with tempfile.TemporaryDirectory() as tmp:
        profiler.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json", "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    if path.stat().st_size > TRACE_LIMIT_BYTES:
        path.unlink()
        return f"not kept: over {TRACE_LIMIT_BYTES // 2**20} MiB compressed"
    return path.name


def timed_part(args: argparse.Namespace, which: str, rounds: int, budget: Budget, folder: Path) -> dict[str, Any]:
    """Part 3 (``headline``) or 4 (``continuous``): a shorter run and the default run's projection.

    :param which: ``headline`` or ``continuous``
    :param rounds: the rounds to measure
    """
    spec = get_spec("mo-lunar-lander" if which == "headline" else "mo-lunar-lander-continuous")
    if which == "headline":
        steps, precision = args.steps or spec.local_steps, args.headline_precision or args.auto_precision
        overrides = [*HEADLINE, *([f"precision={args.headline_precision}"] if args.headline_precision else [])]
    else:
        steps, precision = args.continuous_steps, "fp32"  # precision=auto: the spec says fp32
        overrides = [*CONTINUOUS, f"env.agent_kwargs.learning_starts={steps}"]
    overrides += [f"device={args.device}", f"rounds={rounds}", f"local_steps={steps}", f"n_clients={args.clients}"]
    probe = LockstepProbe(lambda rnd, _i: f"round {rnd}")
    record = federation([*overrides, "executor=sequential", *args.override], folder, probe, budget)
    record["ms_per_step"] = {
        phase: {k: round(v, 4) for k, v in totals.per_step_ms().items()}
        for phase, totals in probe.phases.items()
        if totals.steps
    }
    record |= {"precision": precision, "rounds": rounds, "steps": steps}
    record |= {"full_rounds": spec.rounds, "full_steps": spec.local_steps, "imports_s": args.imports_s}
    if record["round_seconds"]:
        call_s, startup_s = record["call_s"], record["startup_s"]
        projection = project(
            call_s, record["round_seconds"], probe.rounds, steps, spec.local_steps, spec.rounds, startup_s
        )
        command = projection.seconds + (args.imports_s or 0.0)
        record |= {"projection": projection.record(), "projected_command_s": round(command, 1)}
        record |= {"goal_s": GOALS_S[which], "goal_met": command <= GOALS_S[which]}
    return record
