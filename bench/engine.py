"""Engine throughput: env steps per second of a whole federation's local training under each RL engine.

The SB3 engine (``engine=sb3``: one ``RLClient`` per client) against the vectorised engine
(``engine=vectorised``: one ``VectorisedClients`` per worker), on the same budget.

Every measurement runs a real federation: FedAvg for ``--rounds`` round(s) of the env's local
steps (``--steps``, reduced from the spec's budget but past ``learning_starts``, so gradient steps
are measured; DDPG's ``learning_starts`` is reduced too, ``--learning-starts``, or its warm-up alone
would take a minute) through morlfed's ``Federation`` and an executor: ``--workers 1`` is the
``sequential`` executor (every client in this process), ``--workers 2`` the ``process`` executor
with two worker processes, each holding half the clients. One torch thread per worker. The time is
the sum of the rounds' wall times in ``rounds.csv`` (configure, every fit, aggregate; not the
clients' construction nor the final evaluation), the env steps are the ones the clients report
spending (``FitResult.steps_spent``: SB3 finishes its last rollout, so an episodic ``train_freq``
overshoots the budget). Each measurement's line also gives the whole run's CPU seconds (this
process and its worker processes, joined by then) as a share of one core: below 100% per worker,
other jobs shared the cores and the rates read low. The engines alternate repeat by repeat, so
that machine noise hits both alike; the table holds the medians and the targets.

    python bench/engine.py                                            # 4 envs x 1 and 2 workers, 3 repeats
    python bench/engine.py --envs deep-sea-treasure --workers 1 --repeats 1       # a quick look
    python bench/engine.py --steps mo-lunar-lander=2000 --clients 4               # another budget
    python bench/engine.py --device cuda                                          # where a GPU is present
    python bench/engine.py --envs minecart --workers 1 --profile vectorised       # cProfile one federation
    python bench/engine.py --envs mo-lunar-lander-continuous --workers 1 --precision bf16  # vectorised bf16 alone

``--precision bf16`` measures the vectorised engine alone (its bfloat16 gradient step; the SB3
engine trains in float32), and its table leaves the sb3 column and the speed-up empty.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import pstats
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from morlfed.core.seeding import generator
from morlfed.envs import EnvSpec, get_spec
from morlfed.federation import Federation, FederationConfig, Recorder
from morlfed.runtime.executors import make_executor
from morlfed.storage.rundir import RunDirectory
from morlfed.strategies.base import make_strategy
from morlfed.tasks.rl.client import RLClientFactory
from morlfed.tasks.rl.preferences import sample_preferences
from morlfed.tasks.rl.vectorised.factory import VectorisedClientFactory

#: Speed-up targets of the vectorised engine over the SB3 engine.
TARGETS = {"deep-sea-treasure": 8.0, "minecart": 3.0, "mo-lunar-lander": 1.2, "mo-lunar-lander-continuous": 1.0}
#: Default env steps per client and round: past learning_starts, tens of seconds per measurement.
STEPS = {"deep-sea-treasure": 2000, "minecart": 2000, "mo-lunar-lander": 1000, "mo-lunar-lander-continuous": 1200}
#: Default learning_starts overrides (the DDPG spec's 10000 random steps would dominate a short run).
LEARNING_STARTS = {"mo-lunar-lander-continuous": 1000}
ENGINES = ("sb3", "vectorised")


@dataclass
class Measurement:
    """One federation's local training: env steps and seconds spent in rounds, and the whole run's CPU seconds."""

    steps: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        """Env steps per second."""
        return self.steps / self.seconds


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_spec(name: str, learning_starts: int | None) -> EnvSpec:
    """The env's spec with one evaluation episode and, if given, ``learning_starts`` overridden.

    One evaluation episode because the final evaluation is not timed.
    """
    spec = get_spec(name)
    kwargs = dict(spec.agent_kwargs)
    if learning_starts is not None:
        kwargs["learning_starts"] = learning_starts
    return spec.replace(eval_episodes=1, agent_kwargs=kwargs)


def measure(
    engine: str,
    spec: EnvSpec,
    clients: int,
    rounds: int,
    steps: int,
    workers: int,
    device: str,
    seed: int,
    precision: str = "fp32",
) -> Measurement:
    """Run one FedAvg federation with ``engine`` on ``workers`` worker(s).

    :param engine: ``sb3`` or ``vectorised``
    :param spec: the env spec
    :param clients: number of clients
    :param rounds: federated rounds
    :param steps: env steps per client and round
    :param workers: 1 (``sequential`` executor) or more (``process`` executor)
    :param device: the clients' torch device
    :param seed: root seed
    :param precision: the vectorised engine's gradient step, ``fp32`` or ``bf16`` (the SB3 engine: ``fp32`` only)
    """
    if engine == "sb3" and precision != "fp32":
        raise ValueError(f"the sb3 engine trains in fp32 only, got precision {precision!r}")
    cpu_before = cpu_seconds()
    prefs = sample_preferences("equidistant", clients, spec.n_objectives, generator(seed, "preferences"))
    if engine == "sb3":
        factory: RLClientFactory | VectorisedClientFactory = RLClientFactory(
            spec, prefs, seed, steps, rounds, 1, device
        )
    else:
        factory = VectorisedClientFactory(spec, prefs, seed, steps, rounds, 1, device, precision)
    executor = make_executor("sequential") if workers == 1 else make_executor("process", workers=workers)
    executor.start(factory, clients)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            config = FederationConfig(clients, rounds, steps, seed, progress=False)
            outcome = Federation(make_strategy("fedavg"), executor, config, Recorder(RunDirectory(Path(tmp)))).run()
        finally:
            executor.close()
        with open(Path(tmp) / "rounds.csv") as fh:
            rows = list(csv.DictReader(fh))
    failed = [row["failed"] for row in rows if row.get("failed")]
    if failed:
        raise RuntimeError(f"{engine} on {spec.name}: client fits failed: {failed}")
    spent = list(outcome.steps_spent.values())
    total = sum(s for s in spent if s is not None) if None not in spent else clients * rounds * steps
    cpu = cpu_seconds() - cpu_before  # the worker processes are joined by now: their CPU time counts
    return Measurement(total, sum(float(row["seconds"]) for row in rows), cpu)


def parse_overrides(items: list[str], kind: str) -> dict[str, int]:
    """``ENV=N`` pairs as a dict."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"{kind}: expected ENV=N, got {item!r}")
        out[name] = int(value)
    return out


def main() -> None:
    """Parse the arguments, measure every (env, workers) pair, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(TARGETS), help="env specs (default: the four targets)")
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2], help="worker counts (default: 1 2)")
    parser.add_argument("--clients", type=int, default=10, help="clients of every federation (default: 10)")
    parser.add_argument("--rounds", type=int, default=1, help="federated rounds (default: 1)")
    parser.add_argument("--steps", nargs="*", default=[], metavar="ENV=N", help=f"local steps (default: {STEPS})")
    parser.add_argument(
        "--learning-starts", nargs="*", default=[], metavar="ENV=N", help=f"overrides (default: {LEARNING_STARTS})"
    )
    parser.add_argument("--repeats", type=int, default=3, help="measurements per engine; medians (default: 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--profile", choices=ENGINES, help="only cProfile one 1-worker federation of this engine")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: the vectorised engine alone (default: fp32)",
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    torch.set_num_threads(1)
    steps = STEPS | parse_overrides(args.steps, "--steps")
    starts = LEARNING_STARTS | parse_overrides(args.learning_starts, "--learning-starts")
    if args.profile:
        name = args.envs[0]
        spec = bench_spec(name, starts.get(name))
        profiler = cProfile.Profile()
        profiler.enable()
        local = steps.get(name, 2000)
        m = measure(args.profile, spec, args.clients, args.rounds, local, 1, args.device, args.seed, args.precision)
        profiler.disable()
        print(f"{args.profile} on {name}: {m.rate:.0f} env steps/s")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    engines = ENGINES if args.precision == "fp32" else ("vectorised",)
    rows = []
    for name in args.envs:
        spec = bench_spec(name, starts.get(name))
        local = steps.get(name, 2000)
        for workers in args.workers:
            runs: dict[str, list[float]] = {engine: [] for engine in ENGINES}
            for _ in range(args.repeats):
                for engine in engines:
                    started = time.perf_counter()
                    m = measure(
                        engine, spec, args.clients, args.rounds, local, workers, args.device, args.seed, args.precision
                    )
                    runs[engine].append(m.rate)
                    whole = time.perf_counter() - started
                    # CPU seconds over wall seconds: under 100% per worker, other jobs shared the cores
                    print(
                        f"  {name} {engine} workers={workers}: {m.steps} steps in {m.seconds:.1f} s "
                        f"= {m.rate:.0f}/s (whole run {whole:.0f} s, {m.cpu_seconds:.0f} CPU s: "
                        f"{100 * m.cpu_seconds / whole:.0f}% of a core)",
                        flush=True,
                    )
            rows.append((spec, workers, local, runs))
    print(
        f"\n{args.clients} clients, {args.rounds} round(s), FedAvg, {args.device}, {args.precision}, "
        "1 torch thread per worker, "
        f"median of {args.repeats} (env steps/s of the rounds' wall time)"
    )
    header = f"{'env':<27} {'agent':<5} {'steps':>5} {'start':>5} {'workers':>7} {'sb3':>8} {'vectorised':>10}"
    print(header + f" {'speed-up':>8} {'target':>7}  runs sb3 | vectorised")
    for spec, workers, local, runs in rows:
        vec = statistics.median(runs["vectorised"])
        target = TARGETS.get(spec.name)
        if runs["sb3"]:
            sb3 = statistics.median(runs["sb3"])
            verdict = "-" if target is None else f">={target:g}x {'met' if vec / sb3 >= target else 'MISSED'}"
            against = f"{sb3:>8.0f} {vec:>10.0f} {vec / sb3:>7.2f}x {verdict:>12}"
        else:  # bf16: the vectorised engine alone
            against = f"{'-':>8} {vec:>10.0f} {'-':>8} {'-':>12}"
        learning_starts = spec.agent_kwargs.get("learning_starts", 0)
        print(
            f"{spec.name:<27} {spec.agent:<5} {local:>5} {learning_starts:>5} {workers:>7} {against}  "
            f"{np.round(runs['sb3']).astype(int).tolist()} | "
            f"{np.round(runs['vectorised']).astype(int).tolist()}"
        )


if __name__ == "__main__":
    main()
