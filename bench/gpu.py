"""The prepared GPU measurement: where a lockstep step's time goes on a device, and the goals.

One call on a machine with a GPU runs every part and writes what it measures under ``--out``:

1. **environment**: torch and CUDA, the device and its memory, bfloat16, the cores, what
   ``precision=auto`` and ``executor=auto`` pick for the headline there, and this script's imports.
2. **profile-fp32, profile-bf16**: a short federation of the headline's configuration
   (``env=mo-lunar-lander dist=dirichlet``, vectorised engine; ``--profile-rounds`` x
   ``--profile-steps``, ``--clients``, one evaluation episode) with timers inside the lockstep loop
   (``bench/lockstep_probe.py``): per lockstep step, its wall time and its sections (env stepping,
   action selection with its copies, replay writes, gradient steps, the loop's own Python). The
   first round is warm-up. In the last round ``--profile-window`` steps run under
   ``torch.profiler`` (CPU and CUDA activity): its key averages (``key_averages_*.txt``), the host's
   time in kernel launches, copies and synchronisations and the device's kernel time per step
   (``bench/gpu_figures.py``), and the timers under the profiler beside the plain ones (its
   overhead); then ``--trace-window`` steps as a chrome trace (``trace.json.gz``).
3. **headline**: ``python -m morlfed.run env=mo-lunar-lander dist=dirichlet device=DEVICE`` for
   ``--rounds`` of its 20 rounds, run in this process (``morlfed.api.run_experiment``), the full
   run projected linearly from them (``bench/gpu_figures.py``: the first round includes the
   warm-up, so the later rounds come from the later measured rounds), against the goal: 2 minutes.
4. **continuous**: mo-lunar-lander-continuous's default run (DDPG, 10 clients x 30 rounds x 10 000
   steps; ``learning_starts`` 10 000, so its first round is random actions) with
   ``engine=vectorised``, measured as 2 rounds of ``--continuous-steps`` with ``learning_starts``
   at that many steps (a round of random actions, then one that trains) and projected to the
   default run, against the goal: 10 minutes.

Every run uses ``executor=sequential`` (the probe times the clients in this process; on a GPU
``executor=auto`` picks it too). **Budget**: a part runs only if its estimate fits in what is left
of ``--budget-s``, else it is skipped, saying so; a part still running at the budget's end is
stopped (a run keeps its completed rounds and projects from them). A part's failure is recorded
(``<part>/error.txt``) and the next part runs. ``summary.txt`` and ``summary.json`` hold every
figure; the exit status is 1 if a part failed.

    python bench/gpu.py --out $OUT          # on a machine with a GPU: about 7 minutes

    # a dry run on a CPU, in about a minute:
    python bench/gpu.py --out /tmp/gpu --device cpu --clients 2 --profile-steps 200 --steps 200 --continuous-steps 200 --override env.eval_episodes=1 --budget-s 180
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_figures import summary_lines
from gpu_runs import Budget, environment, profile_part, timed_part

from morlfed.core.interrupt import RunStopped
from morlfed.envs import get_spec
from morlfed.tasks.rl.precision import resolve_precision

#: Seconds per lockstep step of 10 clients, before a part has measured one (generous guesses): the
#: H200's 3 ms for DQN (docs/engines.md, "GPU"), DDPG's training step about twice DQN's work
#: (two networks, 28 products), a warm-up step its envs alone; on a CPU the one-core step of
#: docs/engines.md ("Speed").
STEP_GUESS_S = {
    ("cuda", "dqn"): 0.004,
    ("cuda", "ddpg"): 0.01,
    ("cuda", "warm-up"): 0.002,
    ("cpu", "dqn"): 0.015,
    ("cpu", "ddpg"): 0.12,
    ("cpu", "warm-up"): 0.002,
}
SETUP_GUESS_S = 15.0  # composing the config, building the clients' SB3 templates, the device's context
EVAL_STEP_GUESS_S = 3e-4  # one evaluation env step (SB3 policy and env on the CPU)
PROFILED_STEP_GUESS_S = 0.03  # one profiled step's share of the profiler's start and analysis
PARTS = ("environment", "profile", "headline", "continuous")


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``), ``None`` where it cannot be read."""
    try:
        start_ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def eval_guess_s(spec_name: str, args: argparse.Namespace, episodes: int | None = None) -> float:
    """A run's final evaluation, guessed: every client's episodes at full length.

    :param spec_name: the env spec
    :param args: the command line (its clients and ``--override`` of the episodes or their length)
    :param episodes: the run's evaluation episodes (default: the spec's, or the override's)
    """
    spec = get_spec(spec_name)
    given = {key: value for key, _, value in (item.partition("=") for item in args.override)}
    episodes = episodes or int(given.get("env.eval_episodes", spec.eval_episodes))
    length = int(given.get("env.max_episode_steps", spec.max_episode_steps or 1000))  # no limit: a guess
    return args.clients * episodes * length * EVAL_STEP_GUESS_S


def estimate_s(args: argparse.Namespace, part: str, rounds: int, measured_step_s: dict[str, float]) -> float:
    """A part's seconds, guessed from :data:`STEP_GUESS_S` or, for the headline, a profile's measured step.

    :param args: the command line
    :param part: ``profile``, ``headline`` or ``continuous``
    :param rounds: the rounds the part runs
    :param measured_step_s: seconds per lockstep step measured by the profiles, by precision
    """

    def guess(kind: str) -> float:
        return STEP_GUESS_S[(args.device, kind)] * max(args.clients, 1) / 10

    if part == "profile":
        run = rounds * args.profile_steps * guess("dqn") + args.profile_window * PROFILED_STEP_GUESS_S
        return SETUP_GUESS_S + run + eval_guess_s("mo-lunar-lander", args, episodes=1)
    if part == "headline":
        precision = args.headline_precision or args.auto_precision
        step = 1.25 * measured_step_s[precision] if precision in measured_step_s else guess("dqn")
        steps = args.steps or get_spec("mo-lunar-lander").local_steps
        return SETUP_GUESS_S + rounds * steps * step + eval_guess_s("mo-lunar-lander", args)
    run = args.continuous_steps * (guess("warm-up") + guess("ddpg"))
    return SETUP_GUESS_S + run + eval_guess_s("mo-lunar-lander-continuous", args)


def run_part(
    name: str, estimate: float, body: Callable[[Path], dict[str, Any]], budget: Budget, out: Path
) -> dict[str, Any]:
    """Run one part if its estimate fits the budget; record its figures, or why it was skipped, stopped or failed.

    :param name: the part's name (its folder under ``out``)
    :param estimate: its guessed seconds
    :param body: the part, given its folder
    :param budget: the script's budget
    :param out: the output folder
    """
    record: dict[str, Any] = {"part": name, "estimate_s": round(estimate, 1)}
    left = budget.left()
    if budget.fired or estimate > left:
        return record | {"status": "skipped", "reason": f"estimated {estimate:.0f} s, {max(left, 0):.0f} s left"}
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        figures = body(folder)
        record |= {"status": "stopped" if figures.get("stopped") else "ok", **figures}
    except (RunStopped, KeyboardInterrupt):
        if not budget.fired:
            raise
        record |= {"status": "stopped", "reason": "the budget's deadline"}
    except Exception as exc:  # a part's failure is recorded, and the next part runs
        (folder / "error.txt").write_text(traceback.format_exc())
        record |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": f"{name}/error.txt"}
    record["seconds"] = round(time.perf_counter() - started, 1)
    print(f"[{time.perf_counter() - budget.started:4.0f} s] {name}: {record['status']}", flush=True)
    return record


def unavailable(device: str, precision: str) -> str | None:
    """Why a run on ``device`` in ``precision`` cannot run here; ``None`` if it can.

    :param device: ``cuda`` or ``cpu``
    :param precision: ``fp32`` or ``bf16``
    """
    if device == "cuda" and not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if device == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        return "the CUDA device does not compute bfloat16"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--out", type=Path, required=True, help="folder for every file it writes")
    add("--device", choices=("cuda", "cpu"), default="cuda")
    add("--budget-s", type=float, default=420.0, help="seconds for everything after the imports (default: 420)")
    add("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run (default: all)")
    add("--clients", type=int, default=10, help="clients of every run (default: 10, the specs')")
    add("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"], help="the profiles'")
    add("--profile-rounds", type=int, default=2, help="rounds of each profiled run (default: 2)")
    add("--profile-steps", type=int, default=2000, help="steps per client and round of a profiled run (2000)")
    add("--profile-window", type=int, default=300, help="lockstep steps under the profiler (default: 300)")
    add("--trace-window", type=int, default=20, help="lockstep steps in the chrome trace (default: 20)")
    add("--rounds", type=int, default=3, help="the headline's measured rounds (default: 3 of 20)")
    add("--steps", type=int, help="the headline's steps per client and round (default: the spec's 5000)")
    add("--headline-precision", choices=("fp32", "bf16"), help="default: the command's (precision=auto)")
    add("--continuous-steps", type=int, default=2500, help="continuous: steps per round and learning_starts")
    add("--override", action="append", default=[], metavar="KEY=VALUE", help="added to every run's overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, imports_s: float | None = None) -> int:
    """Run the parts, write and print the summary; 1 if a part failed, else 0.

    :param argv: the command line's arguments (default: ``sys.argv[1:]``)
    :param imports_s: seconds from the process's start to this call (its imports), added to the
        projected commands; ``None``: not known
    """
    args = parse_args(argv)
    args.imports_s = imports_s
    args.auto_precision = resolve_precision("auto", get_spec("mo-lunar-lander"), "vectorised", args.device)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    measured: dict[str, float] = {}
    budget = Budget(args.budget_s)
    try:
        if "environment" in args.parts:
            body = functools.partial(environment, args.device, imports_s)
            records.append(run_part("environment", 0.0, lambda _: body(), budget, out))
        for precision in args.precisions if "profile" in args.parts else []:
            name = f"profile-{precision}"
            if reason := unavailable(args.device, precision):
                records.append({"part": name, "status": "skipped", "reason": reason})
                continue
            estimate = estimate_s(args, "profile", args.profile_rounds, measured)
            record = run_part(name, estimate, functools.partial(profile_part, args, precision, budget), budget, out)
            if record.get("plain_ms"):
                measured[precision] = record["plain_ms"]["wall"] / 1e3
            records.append(record)
        for which in ("headline", "continuous"):
            if which not in args.parts:
                continue
            if reason := unavailable(args.device, "fp32"):
                records.append({"part": which, "status": "skipped", "reason": reason})
                continue
            rounds = args.rounds if which == "headline" else 2
            # fewer headline rounds where three do not fit, but never fewer than two (one is all warm-up)
            while which == "headline" and rounds > 2 and estimate_s(args, which, rounds, measured) > budget.left():
                rounds -= 1
            body = functools.partial(timed_part, args, which, rounds, budget)
            records.append(run_part(which, estimate_s(args, which, rounds, measured), body, budget, out))
    finally:
        budget.cancel()
    lines = summary_lines(records, args)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    summary = {"arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    (out / "summary.json").write_text(json.dumps(summary | {"parts": records}, indent=1, default=str) + "\n")
    print("\n".join(lines))
    return 1 if any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main(imports_s=process_age()))
