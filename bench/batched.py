"""Throughput of K runs trained as one batch against the same K runs one after another (CPU).

K small mo-lunar-lander runs (FedAvg, seeds 0..K-1, the vectorised engine in ``--precision``, one
evaluation episode, ``learning_starts`` reduced so that gradient steps are measured) are run twice,
each way in its own Python process: one after another with :func:`morlfed.experiment.run`, and as
one batch with :func:`morlfed.experiment.batch.run_batch`. Both ways write the same run
directories; the figure is env steps per second of wall time (the clients' training steps,
``metrics.json``'s ``env_steps_per_client``, over the time from the first run's start to the last
run's end, set-up and evaluation included), and the batched runs' ``final.csv`` are checked equal
to the sequential ones'.

    python bench/batched.py                          # 4 runs x 2 clients x 2 rounds x 1000 steps
    python bench/batched.py --runs 8 --steps 500     # more runs, shorter
    python bench/batched.py --runs 3 --clients 10 --rounds 1 --steps 2000 --precision bf16  # the spec's precision
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from morlfed.baselines.fedavg import FedAvg
from morlfed.envs import get_spec
from morlfed.experiment import Experiment, Settings, build_experiment, run
from morlfed.experiment.batch import run_batch
from morlfed.tasks.rl.task import RLTask


def experiment(seed: int, args: argparse.Namespace) -> Experiment:
    """One of the K runs: mo-lunar-lander, FedAvg, the vectorised engine on the CPU in ``args.precision``.

    :param seed: the run's seed
    :param args: the command line
    """
    spec = get_spec("mo-lunar-lander")
    spec = spec.replace(eval_episodes=1, agent_kwargs={**spec.agent_kwargs, "learning_starts": args.learning_starts})
    task = RLTask.create(spec, args.clients, seed, engine="vectorised", device="cpu", precision=args.precision)
    settings = Settings(n_clients=args.clients, rounds=args.rounds, local_steps=args.steps, seed=seed, progress=False)
    return build_experiment(task, FedAvg(), settings, executor="sequential", executor_options={})


def env_steps(run_dir: Path) -> int:
    """The run's training env steps, all clients (``metrics.json``)."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    per_client = metrics["env_steps_per_client"]
    return int(per_client["mean"] * metrics["n_clients"])


def measure(way: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Run the K runs one way in this process; its seconds and env steps.

    :param way: ``batched`` or ``sequential``
    :param args: the command line
    :param root: where the run directories go
    """
    dirs = [root / way / f"seed{s}" for s in range(args.runs)]
    started = time.perf_counter()
    if way == "batched":
        plans = [experiment(s, args) for s in range(args.runs)]
        failed = [r for r in run_batch(plans, dirs) if isinstance(r, Exception)]
        assert not failed, failed
    else:
        for seed, out in enumerate(dirs):
            run(experiment(seed, args), out)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "steps": sum(env_steps(d) for d in dirs)}


def main() -> None:
    """Measure both ways, each in its own process, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs K (default: 4)")
    parser.add_argument("--clients", type=int, default=2, help="clients per run (default: 2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per run (default: 2)")
    parser.add_argument("--steps", type=int, default=1000, help="local env steps per client and round (default: 1000)")
    parser.add_argument("--learning-starts", type=int, default=200, help="the spec's learning_starts (default: 200)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="(default: fp32)")
    parser.add_argument("--way", choices=("batched", "sequential"), help=argparse.SUPPRESS)  # one measurement
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way is not None:
        print(json.dumps(measure(args.way, args, args.root)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        figures = {}
        for way in ("sequential", "batched"):
            command = [sys.executable, __file__, "--way", way, "--root", str(root), *sys.argv[1:]]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            figures[way] = json.loads(done.stdout.strip().splitlines()[-1])
        same = all(
            (root / "batched" / f"seed{s}" / "final.csv").read_bytes()
            == (root / "sequential" / f"seed{s}" / "final.csv").read_bytes()
            for s in range(args.runs)
        )
    print(
        f"{args.runs} runs x {args.clients} clients x {args.rounds} rounds x {args.steps} steps, mo-lunar-lander, "
        f"cpu, {args.precision}"
    )
    print(f"{'way':<11} {'seconds':>8} {'env steps':>10} {'steps/s':>8}")
    for way, f in figures.items():
        print(f"{way:<11} {f['seconds']:>8.1f} {f['steps']:>10} {f['steps'] / f['seconds']:>8.0f}")
    speedup = figures["sequential"]["seconds"] / figures["batched"]["seconds"]
    print(f"batched / sequential throughput: {speedup:.2f}x; final.csv identical: {same}")


if __name__ == "__main__":
    main()
