"""The FedFew paper's comparison on digits: mean and worst client accuracy of every strategy.

FedFew (Guo et al., CVPR 2026) compares FedFew (K = 3 server models) with FedAvg, FedProx, IFCA
and local training on label-skewed image classification (Dirichlet alpha = 0.5, 20 clients, one
local epoch per round, full participation) and reports the mean client accuracy, each client
scoring the model it deploys on its own test data (L-acc), and for the medical datasets also the
worst client's. This script runs that comparison, plus FedMHC, FedPG, FedPref, CFL and MaTFL, on
scikit-learn's digits through the real command line (``python -m morlfed.run task=vision ...``, a
hydra multirun over the seeds for each strategy), then tables the run directories with
``analysis.evaluate``'s vision summary:

* mean L-acc: the mean over clients, averaged over seeds (± the std over seeds);
* min L-acc: the worst client's L-acc, averaged over seeds (± std over seeds);
* G-acc: the mean over clients of the accuracy on all clients' test data;
* wall time: the federation loops' seconds summed over seeds, then the whole benchmark's.

Scaled to digits (1797 8x8 images, about 67 training samples per client instead of CIFAR-10's
2250): the paper's one local epoch per round, full participation, K = 3 and every strategy's
default hyper-parameters are kept; the MLP (64 hidden units) replaces the 4-layer CNN, and the
digits data config's batch size 10 and learning rate 0.05 replace batch 50 and lr 0.005 (7
minibatches per local epoch instead of 45). 200 rounds instead of 2000: FedAvg has converged on
digits well before that.

    python bench/vision_fedfew.py                                  # full: 10 strategies x 3 seeds x 200 rounds
    python bench/vision_fedfew.py --rounds 3 --seeds 0 --clients 5 # a smoke test (the figures mean nothing)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STRATEGIES = ("fedavg", "fedprox", "ifca", "fedfew", "local", "fedmhc", "fedpg", "fedpref", "cfl", "matfl")


def run_strategy(algo: str, args: argparse.Namespace, out: Path) -> float:
    """One hydra multirun of ``algo`` over the seeds; returns its wall time in seconds."""
    from morlfed.baselines.cfl import CFL

    overrides = [
        "-m",
        "task=vision",
        "data=digits",
        "partition=dirichlet",
        f"partition.alpha={args.alpha}",
        f"n_clients={args.clients}",
        f"rounds={args.rounds}",
        f"local_steps={args.epochs}",
        f"algo={algo}",
        f"seed={args.seeds}",
        f"executor={args.executor}",
        "progress=false",
        f"hydra.sweep.dir={out / algo}",
        *args.overrides,
    ]
    if algo == "cfl" and args.rounds <= CFL().warmup:  # a smoke test's few rounds: let CFL split
        overrides.append(f"algo.warmup={args.rounds - 1}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    with open(out / f"{algo}.log", "w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "morlfed.run", *overrides], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    if proc.returncode != 0:
        raise SystemExit(f"{algo} failed (exit {proc.returncode}); see {out / f'{algo}.log'}")
    return time.perf_counter() - started


def table(out: Path, algos: list[str]) -> str:
    """The comparison table of the run directories under ``out``."""
    from morlfed.analysis.campaign import evaluate_vision_runs
    from morlfed.analysis.runs import VisionRun, load_runs

    loaded, skipped = load_runs([str(out)], tasks=("vision",))
    if skipped:
        raise SystemExit(f"unusable run directories: {skipped}")
    runs = [r for r in loaded if isinstance(r, VisionRun)]  # task=vision runs only: all VisionRun
    summary, _ = evaluate_vision_runs(runs)
    walls = {run.algo: 0.0 for run in runs}
    for run in runs:
        walls[run.algo] += float(run.info["wall_time_s"])
    stats = summary.groupby("algo")[["l_acc_mean", "l_acc_min", "g_acc_mean"]].agg(["mean", "std"])
    seeds = summary.groupby("algo")["seed"].nunique()
    lines = [
        f"{'strategy':<9}  {'mean L-acc (%)':>15}  {'min L-acc (%)':>15}  {'G-acc (%)':>13}  {'seeds':>5}  {'wall (s)':>8}"
    ]
    for algo in sorted(algos, key=lambda a: -stats[("l_acc_mean", "mean")][a]):
        cells = [
            f"{stats[(m, 'mean')][algo]:6.2f} ± {stats[(m, 'std')][algo]:4.2f}".replace("nan", " n/a")
            for m in ("l_acc_mean", "l_acc_min", "g_acc_mean")
        ]
        lines.append(f"{algo:<9}  {cells[0]:>15}  {cells[1]:>15}  {cells[2]:>13}  {seeds[algo]:>5}  {walls[algo]:8.1f}")
    if {"fedfew", "fedavg", "ifca"} <= set(algos):
        mean = stats[("l_acc_mean", "mean")]
        lines.append(
            f"\nFedFew - FedAvg: {mean['fedfew'] - mean['fedavg']:+.2f} points mean L-acc; "
            f"FedFew - IFCA: {mean['fedfew'] - mean['ifca']:+.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    """Run each strategy asked for through the command line, then print the comparison table.

    Each strategy is one hydra multirun over the seeds (:func:`run_strategy`) into ``--out``, its
    wall time printed as it ends; unknown strategies are a usage error. The table is :func:`table`'s,
    followed by the whole benchmark's wall time.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated strategies (default: all ten)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated root seeds (default: 0,1,2)")
    p.add_argument("--rounds", type=int, default=200, help="communication rounds (default: 200)")
    p.add_argument("--epochs", type=int, default=1, help="local epochs per round (default: 1, as the paper)")
    p.add_argument("--clients", type=int, default=20, help="number of clients (default: 20)")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet label-skew concentration (default: 0.5)")
    p.add_argument("--executor", default="sequential", help="sequential | process | ray (default: sequential)")
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / f"vision_fedfew_{time.strftime('%Y%m%d_%H%M%S')}",
        help="where the run directories go (default: bench/results/vision_fedfew_<time>)",
    )
    p.add_argument("overrides", nargs="*", help="extra morlfed.run overrides, e.g. data.lr=0.1")
    args = p.parse_args()
    algos = [a for a in args.strategies.split(",") if a]
    unknown = set(algos) - set(STRATEGIES)
    if unknown:
        p.error(f"unknown strategies {sorted(unknown)}; valid: {', '.join(STRATEGIES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"digits, {args.clients} clients, Dirichlet alpha {args.alpha}, {args.rounds} rounds x {args.epochs} epoch(s), "
        f"seeds {args.seeds}; run directories in {args.out}",
        flush=True,
    )
    started = time.perf_counter()
    for algo in algos:
        seconds = run_strategy(algo, args, args.out)
        print(f"  {algo}: {seconds:.0f} s", flush=True)
    print()
    print(table(args.out, algos))
    print(f"\nwall time: {time.perf_counter() - started:.0f} s (including process start-up)")


if __name__ == "__main__":
    main()
