"""The vectorised engine against the arithmetic floor, and the headline's projected wall time.

The cost of one batched gradient step on the headline's shapes next to a bare torch chain of the
same matrix products, and the headline's projected wall time.

**Step and floor.** The learner is the one the headline run builds (``env=mo-lunar-lander``: 10
clients' 8-256-256-4 Q-networks, batch 128; ``--env`` and ``--clients`` change it), its replay
filled with synthetic transitions of the env's shapes (the arithmetic does not depend on the
values). One engine step is ``StackedDQN.gradient_step``: replay sampling, the target network's
forward pass, the online forward and backward passes, the loss, gradient clipping, Adam. The floor
is the same matrix products as one plain chain of ``torch.bmm`` calls on preallocated tensors: the
target's forward, the online forward, every weight gradient and every input gradient but the
first layer's; no bias, activation, loss, clipping or optimiser. Both run in this process, with
denormals flushed as the engine trains, alternating block by block so that machine noise hits both
alike; the figures are medians over blocks. The step's Adam update is also timed alone: floor +
Adam is what any step that trains must cost at least, and shows how much of the gap to the floor
the optimiser's one memory-bound pass takes.

**Projection.** ``--round`` also runs the headline command for one round
(``python -m morlfed.run env=mo-lunar-lander dist=dirichlet rounds=1`` with the engine and
precision asked for and the executor and workers that ``executor=auto`` picks for the full run, so
on all cores; everything else at its default), and projects the full run as its setup and final
evaluation plus the spec's rounds times the measured round.

    python bench/engine_floor.py                          # step / floor ratio, one thread
    python bench/engine_floor.py --precision bf16         # the same in bfloat16
    python bench/engine_floor.py --round                  # and the headline's projected wall time
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from morlfed.envs import get_spec
from morlfed.parallelism import cpu_model, resolve
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.engine import stacked_algorithm
from morlfed.tasks.rl.vectorised.replay import StackedReplay
from morlfed.tasks.rl.vectorised.rollout import flushed_denormals

HEADLINE = ["env=mo-lunar-lander", "dist=dirichlet"]


def engine_step(
    env: str, clients: int, precision: str
) -> tuple[Callable[[], None], Callable[[], None], list[tuple[int, int]], int]:
    """The headline learner's gradient step and Adam update as closures, its layer shapes and batch size.

    The first closure is one gradient step of the headline's learner, the second its Adam update
    alone (the step's last pass, over the gradients the step left); the shapes are the Q-network's
    layers as ``(in, out)``.
    """
    spec = get_spec(env)
    _, learner, _ = stacked_algorithm(spec, clients, 0, 100_000, "cpu", precision)
    assert isinstance(learner, StackedDQN), f"{env} does not use DQN"
    batch = int(spec.agent_kwargs["batch_size"])
    obs_dim = int(learner.layout.layers[0].shape[1])
    replay = StackedReplay(clients, 20_000, obs_dim, 1, True)
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((clients, 20_000, replay.width)).astype(np.float32)
    n_actions = int(learner.layout.layers[-1].shape[0])
    rows[..., 2 * obs_dim] = rng.integers(0, n_actions, (clients, 20_000))
    rows[..., 2 * obs_dim + 2] = rng.random((clients, 20_000)) < 0.01
    replay.data.copy_(torch.from_numpy(rows))
    replay.pos[:] = 0
    replay.full[:] = True
    mask = torch.ones(clients, dtype=torch.bool)
    mu, centre = torch.zeros(clients), torch.zeros(clients, learner.layout.dim)

    def step() -> None:
        learner.gradient_step(replay.sample(rng.random((clients, batch))), mask, mu, centre)

    def optimiser() -> None:
        learner.optimiser.step(mask)

    shapes = [(layer.shape[1], layer.shape[0]) for layer in learner.layout.layers if len(layer.shape) == 2]
    return step, optimiser, shapes, batch


def floor_chain(shapes: list[tuple[int, int]], clients: int, batch: int, dtype: torch.dtype) -> Callable[[], None]:
    """The engine step's matrix products as a bare chain of ``torch.bmm`` on preallocated tensors."""
    weights = [torch.randn(clients, out, inp, dtype=dtype) for inp, out in shapes]
    grads = [torch.empty(clients, out, inp, dtype=dtype) for inp, out in shapes]
    x = torch.randn(clients, batch, shapes[0][0], dtype=dtype)
    acts = [torch.empty(clients, batch, out, dtype=dtype) for _, out in shapes]
    back = [torch.empty(clients, batch, inp, dtype=dtype) for inp, _ in shapes]

    def chain() -> None:
        for _ in range(2):  # the target's forward pass, then the online one
            h = x
            for w, a in zip(weights, acts):
                h = torch.bmm(h, w.transpose(1, 2), out=a)
        g = acts[-1]
        for k in range(len(weights) - 1, -1, -1):
            torch.bmm(g.transpose(1, 2), acts[k - 1] if k else x, out=grads[k])
            if k:
                g = torch.bmm(g, weights[k], out=back[k])

    return chain


def timed(fn: Callable[[], None], repeats: int) -> float:
    """Seconds per call of ``fn`` over ``repeats`` calls."""
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def projected_headline(engine: str, precision: str) -> tuple[float, dict]:
    """Run the headline for one round; return its projected full wall time and its metrics.

    The round runs on the executor and workers that ``executor=auto`` gives the full run: one round
    alone is too short for auto to start worker processes (``MIN_PARALLEL_STEPS``), so left to
    itself it would time a sequential round that the headline never runs.
    """
    spec = get_spec("mo-lunar-lander")
    full = resolve("auto", None, "auto", spec.n_clients, spec.n_clients * spec.rounds * spec.local_steps)
    executor = [f"executor={full.executor}"] + ([f"executor.workers={full.workers}"] if full.workers else [])
    with tempfile.TemporaryDirectory() as tmp:
        args = [*HEADLINE, "rounds=1", f"engine={engine}", f"precision={precision}", *executor, "progress=false"]
        subprocess.run(
            [sys.executable, "-m", "morlfed.run", *args, f"hydra.run.dir={tmp}/run"], check=True, capture_output=True
        )
        metrics = json.loads(Path(tmp, "run", "metrics.json").read_text())
        with open(Path(tmp, "run", "rounds.csv")) as fh:
            round_seconds = float(fh.read().splitlines()[1].split(",")[-1])
    fixed = metrics["wall_time_s"] - round_seconds  # set-up and the final evaluation
    return fixed + spec.rounds * round_seconds, metrics | {"round_seconds": round_seconds}


def main() -> None:
    """Measure and print the step / floor ratio (and, with ``--round``, the projection)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="mo-lunar-lander", help="a DQN env spec (default: the headline's)")
    parser.add_argument("--clients", type=int, default=10, help="clients in the batch (default: 10)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--blocks", type=int, default=7, help="alternating blocks (default: 7)")
    parser.add_argument("--steps", type=int, default=100, help="steps per block (default: 100)")
    parser.add_argument("--round", action="store_true", help="also project the headline from a 1-round run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    step, optimiser, shapes, batch = engine_step(args.env, args.clients, args.precision)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    chain = floor_chain(shapes, args.clients, batch, dtype)
    engine_s, floor_s, adam_s = [], [], []
    with flushed_denormals():
        for fn in (step, chain, optimiser):  # warm-up: workspaces, MKL's first calls
            timed(fn, 20)
        for _ in range(args.blocks):
            engine_s.append(timed(step, args.steps))
            floor_s.append(timed(chain, args.steps))
            adam_s.append(timed(optimiser, args.steps))
    engine_ms, floor_ms = 1e3 * statistics.median(engine_s), 1e3 * statistics.median(floor_s)
    adam_ms = 1e3 * statistics.median(adam_s)
    layers = "-".join([str(shapes[0][0])] + [str(out) for _, out in shapes])
    print(
        f"{args.env}: {args.clients} clients, {layers} Q-networks, batch {batch}, {args.precision}, "
        f"{args.threads} thread(s), median of {args.blocks} blocks x {args.steps} steps"
    )
    # the ratio depends on the core type: the faster its matrix products, the more the step's
    # memory-bound passes weigh against them (docs/engines.md, "Speed")
    print(f"cpu: {cpu_model()}, torch {torch.__version__}")
    print(f"engine step   {engine_ms:7.2f} ms")
    print(f"floor (bmm)   {floor_ms:7.2f} ms")
    print(f"ratio         {engine_ms / floor_ms:7.2f}   (goal <= 1.3)")
    # Adam reads parameters, gradients and both moments and writes three of them: a memory-bound
    # pass that no chain of products contains, so floor + Adam bounds any step that trains
    print(f"Adam alone    {adam_ms:7.2f} ms   (the step's optimiser pass, timed on its own)")
    print(f"floor + Adam  {floor_ms + adam_ms:7.2f} ms   ratio to the floor {(floor_ms + adam_ms) / floor_ms:.2f}")
    print(f"headline's 100 000 batched gradient steps: {engine_ms * 100_000 / 60_000:.1f} min of this engine step")
    if args.round:
        projected, metrics = projected_headline("vectorised", args.precision)
        print(
            f"headline, one round: {metrics['round_seconds']:.1f} s ({metrics['executor']}, {metrics['workers']} "
            f"worker(s) x {metrics['torch_threads']} thread(s), {metrics['cores']} cores); projected full run "
            f"{projected / 60:.1f} min"
        )


if __name__ == "__main__":
    main()
