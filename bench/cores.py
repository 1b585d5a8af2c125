"""Threads or workers? One round of the headline run under each way of using the machine's cores.

``executor=auto`` (``morlfed/core/parallelism.py``) must pick the faster of torch's intra-op threads
in one process and single-threaded worker processes. This script runs one round of
``python -m morlfed.run env=mo-lunar-lander dist=dirichlet`` (``--steps`` local steps, default the
spec's 5 000) with the vectorised engine, once per setting, alternating over ``--repeats``, and
prints each setting's median round time (``rounds.csv``: the clients' fits and the aggregation,
not the workers' start nor the final evaluation) and its whole wall time:

* ``sequential``, 1 thread: the one-core reference;
* ``sequential``, every core as torch threads;
* ``process``, one single-threaded worker per core (what ``executor=auto`` picks).

    python bench/cores.py                       # the headline's round, 3 settings, 1 repeat
    python bench/cores.py --steps 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from morlfed.core.parallelism import available_cores

HEADLINE = ["env=mo-lunar-lander", "dist=dirichlet", "engine=vectorised", "rounds=1", "progress=false"]


def settings(cores: int) -> dict[str, list[str]]:
    """The settings measured, by label."""
    return {
        "sequential x 1 thread": ["executor=sequential", "torch_threads=1"],
        f"sequential x {cores} threads": ["executor=sequential", f"torch_threads={cores}"],
        f"process x {cores} workers x 1 thread": ["executor=process", f"executor.workers={cores}", "torch_threads=1"],
    }


def one_round(overrides: list[str], steps: int | None) -> tuple[float, float]:
    """Run one round; return its round time and the command's whole wall time, in seconds."""
    budget = [] if steps is None else [f"local_steps={steps}"]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "morlfed.run", *HEADLINE, *budget, *overrides, f"hydra.run.dir={tmp}/run"]
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - start
        with open(Path(tmp, "run", "rounds.csv")) as fh:
            seconds = float(next(csv.DictReader(fh))["seconds"])
        json.loads(Path(tmp, "run", "metrics.json").read_text())  # the run finished
    return seconds, wall


def main() -> None:
    """Measure every setting and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="local steps (default: the spec's)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting, alternating (default: 1)")
    args = parser.parse_args()
    cores = available_cores()
    measured: dict[str, list[tuple[float, float]]] = {label: [] for label in settings(cores)}
    for _ in range(args.repeats):
        for label, overrides in settings(cores).items():
            measured[label].append(one_round(overrides, args.steps))
            print(
                f"  {label}: round {measured[label][-1][0]:.1f} s, command {measured[label][-1][1]:.1f} s", flush=True
            )
    print(f"\n{cores} usable cores; one round of the headline, vectorised engine, median of {args.repeats}")
    for label, runs in measured.items():
        rounds = statistics.median(r for r, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"{label:<36} round {rounds:7.1f} s   command {wall:7.1f} s")


if __name__ == "__main__":
    main()
