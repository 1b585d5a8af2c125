"""The vectorised engine against the arithmetic floor, and the headline's projected wall time.

The cost of one batched gradient step on an env's shapes (DQN or DDPG) next to a bare torch chain
of the same matrix products, and the headline's projected wall time.

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

**DDPG** (``--env mo-lunar-lander-continuous``, ``--env mo-halfcheetah``): one engine step is
``StackedDDPG.gradient_step``, its replay filled with synthetic continuous actions. Its floor is
its 28 products per client: the target actor's and the target critic's forward passes; the
critic's forward pass, weight gradients and input gradients but the first layer's; the actor's
forward pass, the critic's forward pass on its actions and the critic's input gradients down to
its input (the actor's loss differentiates the critic's input); the actor's weight gradients and
input gradients but the first layer's. Adam alone is both networks' Adam updates.

**Arithmetic.** The floor's products are counted at 2 FLOP per multiply-add (``chain_flops``) and
printed per client and gradient step, with the rate the floor runs them at. The env's default run
(the spec's clients x rounds x local steps) takes, per client, the spec's gradient steps per env
step (``train_freq``, ``gradient_steps``; ``-1``: one per env step) on every env step after
``learning_starts`` (which counts once per client, across rounds); the line prints those gradient
steps, the run's PFLOP in the floor's products and its time at the measured step on one core.
The action selection (one forward pass of a single observation per env step, a few hundred
kFLOP) and a rollout's overshoot of the local budget are left out.

**bfloat16** (``--precision bf16``, DQN or DDPG): the engine step is the learner's mixed-precision
step (its hidden layers in bfloat16, docs/engines.md, "Precision"), and the floor is the same
chain with every product in bfloat16, the output layers' too, which the step keeps in float32.

**Projection.** ``--round`` also runs the headline command for one round
(``python -m morlfed.run env=mo-lunar-lander dist=dirichlet rounds=1`` with the engine and
precision asked for and the executor and workers that ``executor=auto`` picks for the full run, so
on all cores; everything else at its default), and projects the full run as its setup and final
evaluation plus the spec's rounds times the measured round.

    python bench/engine_floor.py                          # step / floor ratio, one thread
    python bench/engine_floor.py --precision bf16         # the same in bfloat16
    python bench/engine_floor.py --round                  # and the headline's projected wall time
    python bench/engine_floor.py --env mo-lunar-lander-continuous   # DDPG's step / floor ratio
    python bench/engine_floor.py --env mo-halfcheetah --precision bf16  # DDPG's in bfloat16
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

from morlfed.core.parallelism import cpu_model, resolve
from morlfed.envs import get_spec
from morlfed.tasks.rl.vectorised.ddpg import StackedDDPG
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.engine import stacked_algorithm
from morlfed.tasks.rl.vectorised.replay import StackedReplay
from morlfed.tasks.rl.vectorised.rollout import flushed_denormals

HEADLINE = ["env=mo-lunar-lander", "dist=dirichlet"]


def engine_step(
    env: str, clients: int, precision: str
) -> tuple[Callable[[], None], Callable[[], None], dict[str, list[tuple[int, int]]], int]:
    """The env's learner's gradient step and Adam update as closures, its layer shapes and batch size.

    The first closure is one gradient step of the learner the env's run builds, the second its Adam
    update(s) alone (the step's last pass, over the gradients the step left); the shapes are each
    network's layers as ``(in, out)``: ``{"q": ...}`` for DQN, ``{"actor": ..., "critic": ...}``
    for DDPG.
    """
    spec = get_spec(env)
    _, learner, _ = stacked_algorithm(spec, clients, 0, 100_000, "cpu", precision)
    batch = int(spec.agent_kwargs.get("batch_size", 256 if spec.agent == "ddpg" else 32))
    ddpg = isinstance(learner, StackedDDPG)
    rng = np.random.default_rng(0)

    def weights(prefix: str) -> list[tuple[int, int]]:
        layers = [layer for layer in learner.layout.layers if layer.name.startswith(prefix) and len(layer.shape) == 2]
        return [(layer.shape[1], layer.shape[0]) for layer in layers]

    shapes = {"actor": weights("actor."), "critic": weights("critic.qf0.")} if ddpg else {"q": weights("")}
    obs_dim = (shapes["actor"] if ddpg else shapes["q"])[0][0]
    act_dim = shapes["actor"][-1][1] if ddpg else 1
    replay = StackedReplay(clients, 20_000, obs_dim, act_dim, not ddpg)
    rows = rng.standard_normal((clients, 20_000, replay.width)).astype(np.float32)
    if ddpg:
        rows[..., 2 * obs_dim : 2 * obs_dim + act_dim] = rng.uniform(-1, 1, (clients, 20_000, act_dim))
    else:
        rows[..., 2 * obs_dim] = rng.integers(0, shapes["q"][-1][1], (clients, 20_000))
    rows[..., 2 * obs_dim + act_dim + 1] = rng.random((clients, 20_000)) < 0.01
    replay.data.copy_(torch.from_numpy(rows))
    replay.pos[:] = 0
    replay.full[:] = True
    mask = torch.ones(clients, dtype=torch.bool)
    mu, centre = torch.zeros(clients), torch.zeros(clients, learner.layout.dim)

    def step() -> None:
        learner.gradient_step(replay.sample(rng.random((clients, batch))), mask, mu, centre)

    # DDPG's step hands Adam the gradients it computed: the same-shaped stand-ins here
    grads = {name: 1e-3 * torch.randn_like(getattr(learner, name)) for name in ("actor", "critic")} if ddpg else {}

    def optimiser() -> None:
        if isinstance(learner, StackedDDPG):
            learner.critic_optimiser.step(mask, {"critic": grads["critic"]})
            learner.actor_optimiser.step(mask, {"actor": grads["actor"]})
        else:
            assert isinstance(learner, StackedDQN), f"{env}: an engine step of {type(learner).__name__}"
            learner.optimiser.step(mask)

    return step, optimiser, shapes, batch


class _Net:
    """One network's preallocated weights, gradients, activations and input gradients for the floor chain."""

    def __init__(self, shapes: list[tuple[int, int]], clients: int, batch: int, dtype: torch.dtype) -> None:
        self.weights = [torch.randn(clients, out, inp, dtype=dtype) for inp, out in shapes]
        self.grads = [torch.empty(clients, out, inp, dtype=dtype) for inp, out in shapes]
        self.x = torch.randn(clients, batch, shapes[0][0], dtype=dtype)
        self.acts = [torch.empty(clients, batch, out, dtype=dtype) for _, out in shapes]
        self.back = [torch.empty(clients, batch, inp, dtype=dtype) for inp, _ in shapes]

    def forward(self) -> None:
        """One forward pass: a product per layer."""
        h = self.x
        for w, a in zip(self.weights, self.acts):
            h = torch.bmm(h, w.transpose(1, 2), out=a)

    def backward(self, weight_grads: bool = True, to_input: bool = False) -> None:
        """One backward pass: each layer's weight gradient and input gradient (the first layer's if ``to_input``)."""
        g = self.acts[-1]
        for k in range(len(self.weights) - 1, -1, -1):
            if weight_grads:
                torch.bmm(g.transpose(1, 2), self.acts[k - 1] if k else self.x, out=self.grads[k])
            if k or to_input:
                g = torch.bmm(g, self.weights[k], out=self.back[k])


def floor_chain(
    shapes: dict[str, list[tuple[int, int]]], clients: int, batch: int, dtype: torch.dtype
) -> Callable[[], None]:
    """The engine step's matrix products as a bare chain of ``torch.bmm`` on preallocated tensors."""
    nets = {name: _Net(layers, clients, batch, dtype) for name, layers in shapes.items()}
    if "q" in nets:
        q = nets["q"]

        def dqn_chain() -> None:
            q.forward()  # the target's forward pass, then the online one
            q.forward()
            q.backward()

        return dqn_chain
    actor, critic = nets["actor"], nets["critic"]

    def ddpg_chain() -> None:
        actor.forward()  # 1. the target actor and the target critic
        critic.forward()
        critic.forward()  # 2. the critic's loss and gradients
        critic.backward()
        actor.forward()  # 3. the actor's loss through the critic's input, and the actor's gradients
        critic.forward()
        critic.backward(weight_grads=False, to_input=True)
        actor.backward()

    return ddpg_chain


def chain_flops(shapes: dict[str, list[tuple[int, int]]], batch: int) -> int:
    """FLOP per client of one call of :func:`floor_chain` (2 per multiply-add): the step's matrix products.

    A layer ``(in, out)`` costs ``2 * batch * in * out`` for its forward product, as much for its
    weight gradient and as much for its input gradient.
    """
    layer = {name: [2 * batch * inp * out for inp, out in layers] for name, layers in shapes.items()}
    if "q" in layer:  # target and online forward, weight gradients, input gradients but the first layer's
        q = layer["q"]
        return 3 * sum(q) + sum(q[1:])
    actor, critic = layer["actor"], layer["critic"]
    # forward: target actor, actor; target critic, critic, critic on the actor's actions; weight
    # gradients of both; input gradients: the critic's twice (once down to its input), the actor's once
    return 3 * sum(actor) + sum(actor[1:]) + 5 * sum(critic) + sum(critic[1:])


def gradient_steps_per_client(env: str) -> tuple[int, float] | None:
    """Gradient steps per client of the env's default run and per env step after ``learning_starts``.

    ``None`` where the spec trains a fixed number of gradient steps per episode (their count
    depends on the episodes' lengths).
    """
    spec = get_spec(env)
    kwargs = spec.agent_kwargs
    freq = kwargs.get("train_freq", 1)
    every, unit = (int(freq[0]), str(freq[1])) if isinstance(freq, list | tuple) else (int(freq), "step")
    steps = int(kwargs.get("gradient_steps", 1))
    if steps < 0:  # as many gradient steps as the rollout's env steps
        per_env_step = 1.0
    elif unit == "step":
        per_env_step = steps / every
    else:
        return None
    trained = spec.rounds * spec.local_steps - int(kwargs.get("learning_starts", 0))
    return round(max(trained, 0) * per_env_step), per_env_step


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
    parser.add_argument("--env", default="mo-lunar-lander", help="a DQN or DDPG env spec (default: the headline's)")
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
    timings: dict[str, list[float]] = {"engine": [], "floor": [], "adam": []}
    fns = {"engine": step, "floor": chain, "adam": optimiser}
    with flushed_denormals():
        for fn in fns.values():  # warm-up: workspaces, MKL's first calls
            timed(fn, 20)
        for _ in range(args.blocks):
            for name, fn in fns.items():
                timings[name].append(timed(fn, args.steps))
    ms = {name: 1e3 * statistics.median(values) for name, values in timings.items()}
    floor_ms = ms["floor"]
    networks = ", ".join(
        "-".join([str(layers[0][0])] + [str(out) for _, out in layers]) + f" {'Q-network' if name == 'q' else name}s"
        for name, layers in shapes.items()
    )
    print(
        f"{args.env}: {args.clients} clients, {networks}, batch {batch}, {args.precision}, "
        f"{args.threads} thread(s), median of {args.blocks} blocks x {args.steps} steps"
    )
    # the ratio depends on the core type: the faster its matrix products, the more the step's
    # memory-bound passes weigh against them (docs/engines.md, "Speed")
    print(f"cpu: {cpu_model()}, torch {torch.__version__}")
    flops = chain_flops(shapes, batch)
    rate = flops * args.clients / (floor_ms * 1e-3) / 1e9
    print(
        f"products      {flops / 1e9:7.3f} GFLOP per client and step (2 per multiply-add), floor at {rate:.0f} GFLOP/s"
    )
    engine_ms, adam_ms = ms["engine"], ms["adam"]
    print(f"engine step   {engine_ms:7.2f} ms")
    print(f"floor (bmm)   {floor_ms:7.2f} ms")
    print(f"ratio         {engine_ms / floor_ms:7.2f}   (goal <= 1.3)")
    # Adam reads parameters, gradients and both moments and writes three of them: a memory-bound
    # pass that no chain of products contains, so floor + Adam bounds any step that trains
    print(f"Adam alone    {adam_ms:7.2f} ms   (the step's optimiser pass, timed on its own)")
    print(f"floor + Adam  {floor_ms + adam_ms:7.2f} ms   ratio to the floor {(floor_ms + adam_ms) / floor_ms:.2f}")
    spec = get_spec(args.env)
    budget = f"{spec.n_clients} clients x {spec.rounds} rounds x {spec.local_steps:,} steps"
    per_client = gradient_steps_per_client(args.env)
    if per_client is None:
        print(f"{args.env}'s default run ({budget}): gradient steps per episode, their count not projected")
    else:
        steps, per_env_step = per_client
        print(
            f"{args.env}'s default run ({budget}): {steps:,} batched gradient steps per client "
            f"({per_env_step:g} per env step after learning_starts), "
            f"{spec.n_clients * steps * flops / 1e15:.2f} PFLOP; "
            f"{ms['engine'] * steps / 3.6e6:.2f} h of this {args.clients}-client engine step "
            f"on one core"
        )
    if args.round:
        projected, metrics = projected_headline("vectorised", args.precision)
        print(
            f"headline, one round: {metrics['round_seconds']:.1f} s ({metrics['executor']}, {metrics['workers']} "
            f"worker(s) x {metrics['torch_threads']} thread(s), {metrics['cores']} cores); projected full run "
            f"{projected / 60:.1f} min"
        )


if __name__ == "__main__":
    main()
