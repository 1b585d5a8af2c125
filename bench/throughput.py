"""Client throughput: env steps per second of a federation of DQN clients on mo-lunar-lander, per executor.

Each executor is measured against the same SB3 agents trained one after another without morlfed
(the overhead-free reference).

Each measurement runs in a fresh Python process. A federation runs FedAvg for ``--rounds`` rounds
of ``--local-steps`` env steps per client; its time is the sum of the rounds' wall times in
rounds.csv (configure, every client's fit, aggregate, logging), without building the clients
and without the final evaluation. The reference builds ``--clients`` SB3 DQN agents with the
env spec's hyper-parameters on ``LinearReward(mo_gymnasium.make(...))`` and times
``learn(rounds x local_steps)`` of each, one after another. Every process uses one torch thread
per client computation.

Targets (on a 2-core machine): ``process`` at least 1.7x ``sequential``; ``sequential``
within 10% of the plain SB3 reference.

    python bench/throughput.py                                   # 8 clients, 3 rounds x 2000 steps, all executors
    python bench/throughput.py --clients 2 --rounds 1 --local-steps 200 --env deep-sea-treasure   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = ("sb3", "sequential", "process", "ray")


def preferences(spec, n: int, seed: int):
    """``n`` Dirichlet preferences over ``spec``'s objectives, from the ``preferences`` stream of ``seed``."""
    from morlfed.core.seeding import generator
    from morlfed.tasks.rl.preferences import sample_preferences

    return sample_preferences("dirichlet", n, len(spec.objectives), generator(seed, "preferences"))


def federation(kind: str, spec, n: int, rounds: int, steps: int, workers: int, seed: int) -> dict:
    """A FedAvg federation under executor ``kind``: env steps and seconds spent in rounds."""
    import csv

    from morlfed.federation import Federation, FederationConfig, Recorder
    from morlfed.runtime.executors import make_executor
    from morlfed.storage.rundir import RunDirectory
    from morlfed.strategies.base import make_strategy
    from morlfed.tasks.rl.client import RLClientFactory

    options = {"workers": workers}
    if kind == "sequential":
        options = {}
    elif kind == "ray":
        options["num_cpus"] = workers
    executor = make_executor(kind, **options)
    started = time.perf_counter()
    factory = RLClientFactory(replace(spec, eval_episodes=1), preferences(spec, n, seed), seed, steps, rounds)
    executor.start(factory, n)
    startup = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        try:
            Federation(
                make_strategy("fedavg"),
                executor,
                FederationConfig(n, rounds, steps, seed, progress=False),
                Recorder(RunDirectory(Path(tmp))),
            ).run()
        finally:
            executor.close()
        with open(Path(tmp) / "rounds.csv") as fh:
            rows = list(csv.DictReader(fh))
    failed = [r["failed"] for r in rows if r["failed"]]
    if failed:
        raise RuntimeError(f"client fits failed: {failed}")
    return {"steps": n * rounds * steps, "seconds": sum(float(r["seconds"]) for r in rows), "startup": startup}


def sb3_reference(spec, n: int, rounds: int, steps: int, seed: int) -> dict:
    """The same agents without morlfed, trained one after another."""
    import mo_gymnasium
    import torch
    from mo_gymnasium.wrappers import LinearReward
    from stable_baselines3 import DQN
    from stable_baselines3.common.monitor import Monitor

    if spec.agent != "dqn":
        raise ValueError(f"the reference trains DQN agents; {spec.name} uses {spec.agent}")
    torch.set_num_threads(1)
    kwargs = {"max_episode_steps": spec.max_episode_steps} if spec.max_episode_steps else {}
    seconds, started = 0.0, time.perf_counter()
    for i, w in enumerate(preferences(spec, n, seed)):
        env = Monitor(LinearReward(mo_gymnasium.make(spec.gym_id, **kwargs), weight=w.astype("float32")))
        agent = DQN("MlpPolicy", env, seed=seed + i, device="cpu", **spec.agent_kwargs)
        t0 = time.perf_counter()
        agent.learn(total_timesteps=rounds * steps)
        seconds += time.perf_counter() - t0
    return {"steps": n * rounds * steps, "seconds": seconds, "startup": time.perf_counter() - started - seconds}


def main() -> None:
    """Measure each run of ``--runs`` in a fresh process and print env steps per second, ratios and targets.

    A measurement's process runs this script with the internal ``--only RUN`` (``sb3`` for the
    reference, else an executor kind), which prints its figures as JSON; a measurement whose process
    fails gets a ``failed`` line. A row's ratios to ``sequential`` and ``sb3`` need those measured
    before it; each target is checked when both of its runs were measured.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="mo-lunar-lander", help="env spec name (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=8, help="number of clients / agents (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="federated rounds (default: %(default)s)")
    parser.add_argument(
        "--local-steps", type=int, default=2000, help="env steps per client and round (default: %(default)s)"
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count(), help="process workers / Ray actors (default: %(default)s)"
    )
    parser.add_argument("--runs", default=",".join(RUNS), help="what to measure (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help=argparse.SUPPRESS)  # internal: one measurement, printed as JSON
    args = parser.parse_args()

    from morlfed.envs import get_spec

    spec = get_spec(args.env)
    if args.only:
        if args.only == "sb3":
            result = sb3_reference(spec, args.clients, args.rounds, args.local_steps, args.seed)
        else:
            result = federation(args.only, spec, args.clients, args.rounds, args.local_steps, args.workers, args.seed)
        print(json.dumps(result))
        return

    print(
        f"{args.clients} {spec.agent.upper()} clients on {spec.name}, {args.rounds} rounds x {args.local_steps} env steps, "
        f"{args.workers} workers, {os.cpu_count()} CPUs"
    )
    print(
        f"{'run':<11} {'env steps':>9} {'startup s':>9} {'train s':>8} {'steps/s':>8} {'x sequential':>12} {'x SB3':>6}"
    )
    rates = {}
    for kind in args.runs.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--only",
            kind,
            "--env",
            args.env,
            "--clients",
            str(args.clients),
            "--rounds",
            str(args.rounds),
            "--local-steps",
            str(args.local_steps),
            "--workers",
            str(args.workers),
            "--seed",
            str(args.seed),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(
                f"{kind:<11} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
            )
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        rates[kind] = r["steps"] / r["seconds"]
        vs_seq = f"{rates[kind] / rates['sequential']:.2f}" if "sequential" in rates else "-"
        vs_sb3 = f"{rates[kind] / rates['sb3']:.2f}" if "sb3" in rates else "-"
        print(
            f"{kind:<11} {r['steps']:>9} {r['startup']:>9.1f} {r['seconds']:>8.1f} {rates[kind]:>8.0f} {vs_seq:>12} {vs_sb3:>6}"
        )
    if {"process", "sequential"} <= rates.keys():
        ratio = rates["process"] / rates["sequential"]
        print(f"target process >= 1.7x sequential: {ratio:.2f}x -> {'met' if ratio >= 1.7 else 'MISSED'}")
    if {"sb3", "sequential"} <= rates.keys():
        ratio = rates["sequential"] / rates["sb3"]
        print(f"target sequential within 10% of SB3: {ratio:.2f} -> {'met' if ratio >= 0.9 else 'MISSED'}")


if __name__ == "__main__":
    main()
