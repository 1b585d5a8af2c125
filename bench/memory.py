"""Memory per RL client, by environment, and how many clients fit in a memory budget.

For each env, a fresh Python process builds one client (so that every library is imported and
warm), records its resident set size, builds ``--clients`` more, fills their replay buffers to
capacity (every page of the buffer arrays written, as after a long run), gives each a short fit
(optimiser state allocated) and records the resident size again; the difference divided by the
number of clients is the memory of one client. Also printed: the replay buffer's array bytes,
the size of one client checkpoint (``get_state()`` serialised: what ``checkpoints/`` holds per
client), and the resident size of a process holding only the imports and one client (the fixed
cost of each worker process).

The budget line: how many mo-lunar-lander DQN clients fit in ``--budget-gib`` (24 by default)
with ``--workers`` worker processes: ``(budget - workers x fixed) / per-client``. During a fit a
worker also holds one snapshot of the client it trains (for rollback), at most one client's
state per worker, included in the count.

    python bench/memory.py                                   # every env, 8 clients each
    python bench/memory.py --envs deep-sea-treasure --clients 2   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENVS = ("deep-sea-treasure", "minecart", "mo-lunar-lander", "mo-lunar-lander-continuous", "mo-halfcheetah")
MIB, GIB = 1024**2, 1024**3


def rss_bytes() -> int:
    """The current resident set size of this process."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(env: str, n: int) -> dict:
    """One env's figures (run in a fresh process)."""
    import numpy as np
    import torch

    from morlfed.core.protocol import FitTask
    from morlfed.envs import get_spec
    from morlfed.runtime.executors import state_to_bytes
    from morlfed.tasks.rl.client import RLClientFactory

    spec = get_spec(env)
    m = len(spec.objectives)
    factory = RLClientFactory(spec, np.full((n + 1, m), 1.0 / m), seed=0, local_steps=64, rounds=156)
    warm = factory(n)
    warm.fit(FitTask(params=warm.initial_params(), round=1))
    fixed = rss_bytes()
    clients = [factory(cid) for cid in range(n)]
    buffer_bytes = 0
    for client in clients:
        buffer = client.agent.replay_buffer
        for value in vars(buffer).values():
            if isinstance(value, np.ndarray):
                value.fill(1)  # commit every page, as a full buffer would
                buffer_bytes += value.nbytes
        client.fit(FitTask(params=client.initial_params(), round=1))
    per_client = (rss_bytes() - fixed) / n
    return {
        "env": spec.name,
        "agent": spec.agent,
        "buffer_size": spec.agent_kwargs.get("buffer_size"),
        "fixed": fixed,
        "per_client": per_client,
        "buffer_bytes": buffer_bytes / n,
        "state_bytes": len(state_to_bytes(clients[0].get_state(0))),
        "params": int(clients[0].layout.dim),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    """Print the memory table of ``--envs`` and, when mo-lunar-lander is among them, the budget line.

    Each env is measured in a fresh process running this script with the internal ``--only ENV``,
    which prints that env's figures as JSON; an env whose process fails gets a ``failed`` line
    instead.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default=",".join(ENVS), help="env spec names (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=8, help="clients built per env (default: %(default)s)")
    parser.add_argument("--budget-gib", type=float, default=24.0, help="memory budget (default: %(default)s)")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count(),
        help="worker processes for the budget line (default: %(default)s)",
    )
    parser.add_argument("--only", help=argparse.SUPPRESS)  # internal: one env, printed as JSON
    args = parser.parse_args()
    if args.only:
        print(json.dumps(measure(args.only, args.clients)))
        return

    print(
        f"{'env':<27} {'agent':<5} {'buffer':>7} {'params':>7} {'MiB/client':>10} {'buffer MiB':>10} "
        f"{'ckpt MiB':>8} {'process MiB':>11}"
    )
    figures = {}
    for env in args.envs.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--only", env, "--clients", str(args.clients)], capture_output=True, text=True
        )
        if done.returncode != 0:
            print(
                f"{env:<27} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
            )
            continue
        r = figures[env] = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{r['env']:<27} {r['agent']:<5} {r['buffer_size']:>7} {r['params']:>7} {r['per_client'] / MIB:>10.1f} "
            f"{r['buffer_bytes'] / MIB:>10.1f} {r['state_bytes'] / MIB:>8.1f} {r['fixed'] / MIB:>11.0f}"
        )
    if "mo-lunar-lander" in figures:
        r = figures["mo-lunar-lander"]
        budget = args.budget_gib * GIB - args.workers * (r["fixed"] + r["state_bytes"])
        print(
            f"mo-lunar-lander DQN clients in {args.budget_gib:g} GiB with {args.workers} worker processes: "
            f"{int(budget // r['per_client'])}  (= ({args.budget_gib:g} GiB - {args.workers} x "
            f"({r['fixed'] / MIB:.0f} + {r['state_bytes'] / MIB:.1f}) MiB) / {r['per_client'] / MIB:.1f} MiB)"
        )


if __name__ == "__main__":
    main()
