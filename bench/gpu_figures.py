"""The figures ``bench/gpu.py`` derives: a profile's host and device time per lockstep step, and a run's projection.

**Profile.** From ``torch.profiler``'s key averages over a window of lockstep steps: the host's
time in the CUDA runtime's calls (kernel launches, copies, synchronisations) and the device's
time in kernels and in copies, each per lockstep step, with the calls that make the host wait
for the device (``aten::_local_scalar_dense``: a device tensor read as a Python number).

**Projection.** A run of fewer rounds (and possibly fewer steps per round) than the full run,
timed in the same process, projects linearly: each measured round's time is its time outside the
lockstep loop (the round's snapshots, evaluations, aggregation), its loop's start (env resets)
and its lockstep steps at the round's measured cost per step, rescaled to the full run's steps
per round (a round's overshoot, the steps past its budget that finish a rollout, kept as
measured); the full run is the run's fixed cost (composing, building the clients, the final
evaluation: the call's time less its rounds), its first round as the first measured round, and
every later round as the mean of the later measured rounds (the first alone when it is the only
one, which then includes the first round's warm-up).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lockstep_probe import NESTED, RoundTotals

#: CUDA runtime calls by what the host waits for in them.
LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"})
#: Copies and fills; a copy to pageable host memory also waits for the device's queued work.
COPIES = frozenset({"cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync", "cudaMemcpy2DAsync"})
SYNCS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"})
#: The aten op behind ``.item()``, ``bool()`` and ``float()`` of a tensor: on a device, a wait for it.
SCALAR_READ = "aten::_local_scalar_dense"


def profile_figures(events: Iterable[Any], steps: int) -> dict[str, float]:
    """Per lockstep step: the host's milliseconds in CUDA runtime calls, the device's in kernels and copies.

    :param events: ``profiler.key_averages()`` (``FunctionEventAvg``: times in microseconds)
    :param steps: the lockstep steps the profile covered
    :return: ``host_launch_ms``, ``host_copy_ms``, ``host_sync_ms``, ``device_kernel_ms``,
        ``device_copy_ms`` per step; ``launches``, ``copies``, ``syncs``, ``scalar_reads`` calls per step
    """
    out = dict.fromkeys(("host_launch_ms", "host_copy_ms", "host_sync_ms", "device_kernel_ms", "device_copy_ms"), 0.0)
    out |= dict.fromkeys(("launches", "copies", "syncs", "scalar_reads"), 0.0)
    for event in events:
        key, count = str(event.key), int(event.count)
        for names, ms, calls in ((LAUNCHES, "host_launch_ms", "launches"), (COPIES, "host_copy_ms", "copies")):
            if key in names:
                out[ms] += event.self_cpu_time_total / 1e3
                out[calls] += count
        if key in SYNCS:
            out["host_sync_ms"] += event.self_cpu_time_total / 1e3
            out["syncs"] += count
        if key == SCALAR_READ:
            out["scalar_reads"] += count
        # the device's own events, as torch's table totals them (annotations are not device work)
        if str(event.device_type).endswith("CUDA") and not getattr(event, "is_user_annotation", False):
            device_us = getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0))
            out["device_copy_ms" if key.startswith(("Memcpy", "Memset")) else "device_kernel_ms"] += device_us / 1e3
    return {name: value / steps for name, value in out.items()}


@dataclass(frozen=True)
class Projection:
    """A full run's wall time projected from a shorter run (see the module docstring).

    :param seconds: the projected wall time of the run's call (imports excluded)
    :param fixed_seconds: the measured run's time outside its rounds
    :param first_round_seconds: the full run's first round, projected
    :param later_round_seconds: each later round, projected
    :param later_from: the measured rounds the later rounds come from (1-based)
    :param scaled_by_steps: whether the per-step costs were measured (else rounds scaled by nominal steps)
    """

    seconds: float
    fixed_seconds: float
    first_round_seconds: float
    later_round_seconds: float
    later_from: list[int]
    scaled_by_steps: bool

    def record(self) -> dict[str, Any]:
        """The projection as a JSON-able dict."""
        return {
            "seconds": round(self.seconds, 1),
            "fixed_seconds": round(self.fixed_seconds, 1),
            "first_round_seconds": round(self.first_round_seconds, 2),
            "later_round_seconds": round(self.later_round_seconds, 2),
            "later_from_rounds": self.later_from,
            "scaled_by_lockstep_steps": self.scaled_by_steps,
        }


def project(
    call_seconds: float,
    round_seconds: Sequence[float],
    lockstep: Sequence[RoundTotals],
    measured_steps: int,
    full_steps: int,
    full_rounds: int,
    fixed_seconds: float | None = None,
) -> Projection:
    """Project a full run from the rounds of a shorter one (see the module docstring).

    :param call_seconds: the measured run's whole call (a stopped run: up to its stop)
    :param round_seconds: each completed round's wall time (``rounds.csv``)
    :param lockstep: the probe's record of each round's training (the first ``len(round_seconds)``
        are the completed rounds'; with another count, rounds scale by nominal steps)
    :param measured_steps: the measured run's steps per client and round
    :param full_steps: the full run's steps per client and round
    :param full_rounds: the full run's rounds
    :param fixed_seconds: the run's time outside its rounds, where the call's time does not give it
        (a stopped run: its start-up alone)
    :raises ValueError: no round completed
    """
    if not round_seconds:
        raise ValueError("no round completed: nothing to project from")
    scaled = len(lockstep) >= len(round_seconds) and all(r.steps for r in lockstep[: len(round_seconds)])
    full = []
    for k, seconds in enumerate(round_seconds):
        if scaled:
            r = lockstep[k]
            per_step = (r.seconds - r.start_seconds) / r.steps
            unscaled = seconds - r.seconds + r.start_seconds  # outside the loop, and the loop's start
            full.append(unscaled + (r.steps - measured_steps + full_steps) * per_step)
        else:
            full.append(seconds * full_steps / measured_steps)
    later = list(range(2, len(full) + 1)) or [1]
    later_s = statistics.fmean(full[k - 1] for k in later)
    fixed = call_seconds - sum(round_seconds) if fixed_seconds is None else fixed_seconds
    return Projection(fixed + full[0] + (full_rounds - 1) * later_s, fixed, full[0], later_s, later, scaled)


def _breakdown(ms: dict[str, float]) -> str:
    """A phase's milliseconds per lockstep step by section, the nested ones in parentheses."""
    top = [f"{k} {v:.2f}" for k, v in ms.items() if k not in ("wall", "other", *NESTED)]
    nested = [f"{k} {v:.2f}" for k, v in ms.items() if k in NESTED]
    inside = f" (in gradient_steps: {', '.join(nested)})" if nested else ""
    return " | ".join([*top, f"other {ms['other']:.2f}"]) + inside


def _environment_lines(r: dict[str, Any]) -> list[str]:
    device = "no CUDA device"
    if r.get("device_name"):
        bf16 = "yes" if r["bf16_supported"] else "no"
        device = f"{r['device_name']} ({r['device_memory_gib']} GiB, sm {r['capability']}, bf16 {bf16})"
    return [
        f"environment: {device}; torch {r['torch']} (CUDA {r['torch_cuda']}); {r['cores_available']} of "
        f"{r['cpu_count']} cores, {r['cpu']}; imports {r['imports_s']} s; the headline's auto settings here: "
        f"precision {r['headline_precision_auto']}, executor {r['headline_executor_auto']}"
    ]


def _profile_lines(r: dict[str, Any]) -> list[str]:
    name, precision = r["part"], r["precision"]
    if not r.get("plain_ms"):
        return [f"{name} ({precision}): no lockstep step outside the warm-up and the profiler's windows"]
    plain = r["plain_ms"]
    lines = [
        f"{name} ({precision}): {plain['wall']:.2f} ms per lockstep step, plain timers over {r['plain_steps']} "
        f"steps: {_breakdown(plain)}"
    ]
    if r.get("profiler") and r.get("profile_ms"):
        p, wall = r["profiler"], r["profile_ms"]["wall"]
        busy = (p["device_kernel_ms"] + p["device_copy_ms"]) / wall
        lines.append(
            f"  under torch.profiler ({r['profile_steps']} steps): {wall:.2f} ms per step; host in CUDA calls: "
            f"launches {p['host_launch_ms']:.2f}, copies {p['host_copy_ms']:.2f}, syncs {p['host_sync_ms']:.2f} ms; "
            f"device: kernels {p['device_kernel_ms']:.3f}, copies {p['device_copy_ms']:.3f} ms ({busy:.0%} of the "
            f"step); per step {p['launches']:.0f} launches, {p['copies']:.1f} copies, {p['syncs']:.1f} syncs, "
            f"{p['scalar_reads']:.1f} scalar reads; trace: {r.get('trace', 'none')}"
        )
        if r["metrics"].get("device") == "cuda" and not p["device_kernel_ms"]:
            lines.append("  NO CUDA KERNEL RECORDED: the profiler saw no device activity (CUPTI missing?)")
    if r.get("profiler_errors"):
        lines.append(f"  PROFILER FAILED: {'; '.join(r['profiler_errors'])}")
    return lines


def _timed_lines(r: dict[str, Any]) -> list[str]:
    name, rounds, steps = r["part"], r["round_seconds"], r["steps"]
    config = f"{r['precision']}, {len(rounds)} of {r['full_rounds']} rounds x {steps} steps"
    labels = ["warm-up, ", "training, "] if name == "continuous" else []
    measured = ", ".join(
        f"{s:.1f} ({labels[k] if k < len(labels) else ''}loop {loop['seconds']:.1f})"
        for k, (s, loop) in enumerate(zip(rounds, r["lockstep"]))
    )
    memory = f"; peak device memory {r['peak_device_memory_gib']} GiB" if "peak_device_memory_gib" in r else ""
    lines = [f"{name} ({config}): rounds {measured or 'none completed'} s{memory}"]
    breakdown = r["ms_per_step"].get(f"round {len(rounds)}")
    if breakdown:
        lines.append(f"  round {len(rounds)}: {breakdown['wall']:.2f} ms per lockstep step: {_breakdown(breakdown)}")
    if r.get("stopped"):
        lines.append("  STOPPED at the budget's deadline: the projection lacks the final evaluation")
    if "projection" in r:
        p, total = r["projection"], r["projected_command_s"]
        verdict = "met" if r["goal_met"] else "MISSED"
        first, last = p["later_from_rounds"][0], p["later_from_rounds"][-1]
        later = f"rounds {first}-{last}" if last > first else f"round {first}"
        warm = ", which includes round 1's warm-up" if last == 1 else ""
        lines.append(
            f"  PROJECTED (linear) {r['full_rounds']} rounds x {r['full_steps']} steps: {total / 60:.1f} min = "
            f"{p['seconds']:.0f} s run (fixed {p['fixed_seconds']:.0f} s, round 1 {p['first_round_seconds']:.1f} s, "
            f"each later round {p['later_round_seconds']:.1f} s from measured {later}{warm}) + imports "
            f"{r['imports_s'] or 0:.0f} s; goal <= {r['goal_s'] / 60:.0f} min: {verdict}"
        )
    return lines


def summary_lines(records: Sequence[dict[str, Any]], args: Any) -> list[str]:
    """The printed summary: one or a few lines per part.

    :param records: each part's record (``bench/gpu.py``'s ``run_part``)
    :param args: the command line (``device``, ``budget_s``, ``clients``)
    """
    lines = [f"bench/gpu.py --device {args.device} --clients {args.clients}: budget {args.budget_s:.0f} s"]
    for r in records:
        name, status = r["part"], r["status"]
        if status in ("skipped", "failed") or (status == "stopped" and "reason" in r):
            lines.append(f"{name}: {status.upper()}: {r.get('reason') or r.get('error')}")
        elif name == "environment":
            lines += _environment_lines(r)
        elif name.startswith("profile"):
            lines += _profile_lines(r)
        else:
            lines += _timed_lines(r)
    return lines
