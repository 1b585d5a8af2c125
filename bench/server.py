"""Server cost: wall time and peak memory of one ``strategy.aggregate`` call.

For every strategy, N (clients) and d (parameters), a fresh Python process sets the strategy up
on an MLP-shaped layout of about d parameters (input 8, two hidden layers of width h, 4 outputs:
six tensors), asks it to ``configure`` a round with all N clients, synthesises what N clients would
report (two planted groups of updates pointing in opposite directions plus noise, so clustering
strategies see a split-worthy round; losses and model choices where the task asks for them),
frees the tasks, and times ``aggregate``. Peak memory is the process' peak resident set size
(``ru_maxrss``; torch allocations are invisible to tracemalloc), shown next to the resident size
just before ``aggregate`` (which already holds the N reported models).

Targets: fedpref at N = 1000, d = 1e5, R = 0.1 under 10 s and under 4 GiB.

    python bench/server.py                                  # fedpref, cfl, matfl, fedfew; N = 10, 100, 1000; d = 1e4, 1e5
    python bench/server.py --strategies all --n 10 --d 1e4  # every registered strategy, one size
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_STRATEGIES = ("fedpref", "cfl", "matfl", "fedfew")
#: Strategy options used by the benchmark (the target case is fedpref with R = 0.1).
OPTIONS = {"fedpref": {"top_r": 0.1, "patience": 1}}
GIB = 1024**3


def mlp_layout(d: float):
    """An 8 -> h -> h -> 4 MLP layout with about ``d`` parameters."""
    from morlfed.core.params import ParamLayout

    h = max(1, round((-14 + math.sqrt(14**2 + 4 * (d - 4))) / 2))  # d = h^2 + 14 h + 4
    shapes = {
        "l0.weight": (h, 8),
        "l0.bias": (h,),
        "l1.weight": (h, h),
        "l1.bias": (h,),
        "l2.weight": (4, h),
        "l2.bias": (4,),
    }
    return ParamLayout.from_shapes(shapes, head=["l2.weight", "l2.bias"])


def rss_bytes() -> int:
    """The current resident set size of this process."""
    import os

    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_case(name: str, n: int, d: float, round: int = 101) -> dict:
    """One measurement (in this process; call it in a fresh process)."""
    import numpy as np
    import torch

    from morlfed.strategies.base import make_strategy

    torch.set_num_threads(1)
    layout = mlp_layout(d)
    g = torch.Generator().manual_seed(0)
    init = torch.randn(layout.dim, generator=g) * 0.1
    strategy = make_strategy(name, **OPTIONS.get(name, {}))
    strategy.setup(n, init, layout, np.random.default_rng(0))
    tasks = strategy.configure(round, list(range(n)))
    direction = torch.randn(layout.dim, generator=g)
    direction *= 2.0 / direction.norm()
    results = {}
    for cid, task in tasks.items():
        update = (1 if cid % 2 == 0 else -1) * direction + 0.1 * torch.randn(layout.dim, generator=g) / math.sqrt(
            layout.dim
        )
        results[cid] = synthetic_result(task, update, g)
    del tasks
    before = rss_bytes()
    started = time.perf_counter()
    strategy.aggregate(round, results)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"strategy": name, "n": n, "d": layout.dim, "seconds": seconds, "rss_before": before, "peak_rss": peak}


def synthetic_result(task, update, g):
    """What a client would report for ``task``: the received model(s) moved by ``update``.

    It has random losses / model choice where the task asks for them.
    """
    import torch

    from morlfed.core.protocol import FitResult

    params = task.params.float()
    k = params.shape[0] if params.ndim == 2 else 1
    losses = torch.rand(k, generator=g) if (task.report_losses or task.train_best or task.train_all) else None
    index = None
    if params.ndim == 2 and not task.train_all:
        index = int(losses.argmin())  # train_best (train_all keeps every model)
        params = params[index]
    return FitResult(params=params + update, num_samples=1000, losses=losses, model_index=index)


def main() -> None:
    """Time ``aggregate`` for every strategy, N and d asked for, each case in a fresh process.

    Each case is a line of the printed table. A case's process runs this script with the internal
    ``--case NAME:N:D``, which prints that case's figures as JSON; a case whose process fails gets a
    ``failed`` line. Strategies that are not registered are named and skipped. The fedpref case at
    N = 1000, d = 1e5 is also checked against its target.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help="comma-separated algo names, or 'all' (default: %(default)s)",
    )
    parser.add_argument("--n", default="10,100,1000", help="client counts (default: %(default)s)")
    parser.add_argument("--d", default="1e4,1e5", help="parameter counts (default: %(default)s)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = parser.parse_args()
    if args.case:
        name, n, d = args.case.split(":")
        print(json.dumps(run_case(name, int(n), float(d))))
        return

    from morlfed.strategies.base import available_strategies

    known = available_strategies()
    wanted = known if args.strategies == "all" else args.strategies.split(",")
    missing = [s for s in wanted if s not in known]
    if missing:
        print(f"not registered yet (skipped): {', '.join(missing)}")
    print(
        f"{'strategy':<9} {'N':>5} {'d':>7} {'aggregate s':>12} {'RSS before':>11} {'peak RSS':>10} {'peak - before':>14}"
    )
    for name in (s for s in wanted if s not in missing):
        for n in (int(x) for x in args.n.split(",")):
            for d in (float(x) for x in args.d.split(",")):
                cmd = [sys.executable, __file__, "--case", f"{name}:{n}:{d}"]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"{name:<9} {n:>5} {d:>7.0e}  failed: {done.stderr.strip().splitlines()[-1]}")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                extra = max(0, r["peak_rss"] - r["rss_before"])
                print(
                    f"{name:<9} {n:>5} {r['d']:>7} {r['seconds']:>12.3f} {r['rss_before'] / GIB:>9.2f}Gi "
                    f"{r['peak_rss'] / GIB:>8.2f}Gi {extra / GIB:>12.2f}Gi"
                )
                if name == "fedpref" and n == 1000 and abs(d - 1e5) < 1:
                    ok = r["seconds"] < 10 and r["peak_rss"] < 4 * GIB
                    print(f"  target fedpref N=1000 d=1e5 R=0.1: < 10 s and < 4 GiB -> {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
