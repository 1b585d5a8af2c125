"""``bench/engine_floor.py``: the engine step next to a chain of exactly its matrix products, DQN and DDPG."""

from __future__ import annotations

import sys

import torch
from conftest import load_bench


def _products(chain, monkeypatch) -> list[tuple[int, ...]]:
    """The shapes of the ``torch.bmm`` products one call of ``chain`` makes."""
    seen: list[tuple[int, ...]] = []
    bmm = torch.bmm

    def counted(a, b, **kwargs):
        seen.append((*a.shape, b.shape[-1]))
        return bmm(a, b, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "bmm", counted)
        chain()
    return seen


def _run(bench, monkeypatch, capsys, *args: str) -> str:
    """``main``'s output for ``args`` on one client, one block of one step."""
    monkeypatch.setattr(sys, "argv", ["engine_floor.py", *args, "--clients", "1", "--blocks", "1", "--steps", "1"])
    threads = torch.get_num_threads()
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def test_the_dqn_floor_is_two_forward_passes_and_one_backward_pass(monkeypatch):
    bench = load_bench("engine_floor")
    chain = bench.floor_chain({"q": [(8, 16), (16, 16), (16, 4)]}, 2, 5, torch.float32)
    # target and online forward (3 + 3), weight gradients (3), input gradients but the first layer's (2)
    assert len(_products(chain, monkeypatch)) == 11


def test_the_ddpg_floor_has_the_28_products_of_a_ddpg_step(monkeypatch):
    bench = load_bench("engine_floor")
    shapes = {"actor": [(8, 16), (16, 12), (12, 2)], "critic": [(10, 16), (16, 12), (12, 1)]}
    products = _products(bench.floor_chain(shapes, 2, 5, torch.float32), monkeypatch)
    # target actor, target critic (6); critic forward, weight and input gradients (3 + 3 + 2); actor
    # forward, critic forward, critic input gradients to its input (3 + 3 + 3); actor weight and
    # input gradients (3 + 2)
    assert len(products) == 28
    # the critic's input gradient reaches its input: a [batch, 10] product of its first layer
    assert (2, 5, 16, 10) in products


def test_it_prints_the_ddpg_ratio_on_the_continuous_lander(monkeypatch, capsys):
    bench = load_bench("engine_floor")
    out = _run(bench, monkeypatch, capsys, "--env", "mo-lunar-lander-continuous")
    assert "8-400-300-2 actors, 10-400-300-1 critics, batch 256" in out
    ratio = next(line for line in out.splitlines() if line.startswith("ratio"))
    assert float(ratio.split()[1]) > 0
    # 30 rounds x 10 000 steps, less learning_starts' 10 000; 0.632 GFLOP per client and step
    assert "290,000 batched gradient steps per client (1 per env step after learning_starts), 1.83 PFLOP" in out
    assert "0.632 GFLOP per client and step" in out


def test_the_flop_count_is_the_chains_products(monkeypatch):
    bench = load_bench("engine_floor")
    nets = {
        "q": {"q": [(8, 16), (16, 16), (16, 4)]},
        "ddpg": {"actor": [(8, 16), (16, 12), (12, 2)], "critic": [(10, 16), (16, 12), (12, 1)]},
    }
    for shapes in nets.values():
        products = _products(bench.floor_chain(shapes, 2, 5, torch.float32), monkeypatch)
        counted = sum(2 * m * k * n for _, m, k, n in products)  # per client: 2 FLOP per multiply-add
        assert bench.chain_flops(shapes, 5) == counted


def test_the_default_runs_gradient_steps_follow_the_spec():
    bench = load_bench("engine_floor")
    assert bench.gradient_steps_per_client("mo-lunar-lander") == (100_000, 1.0)  # train_freq 4, gradient_steps -1
    assert bench.gradient_steps_per_client("minecart") == (62_250, 0.25)  # (250 000 - 1 000) / 4
    assert bench.gradient_steps_per_client("mo-halfcheetah") == (990_000, 1.0)  # 50 x 20 000 - 10 000


def test_bf16_times_the_ddpg_engine_step_and_its_ratio(monkeypatch, capsys):
    bench = load_bench("engine_floor")
    out = _run(bench, monkeypatch, capsys, "--env", "mo-halfcheetah", "--precision", "bf16")
    assert "17-400-300-6 actors, 23-400-300-1 critics, batch 256, bf16" in out
    rows = {row.split("  ")[0]: row.split() for row in out.splitlines()}
    assert float(rows["engine step"][2]) > 0 and float(rows["ratio"][1]) > 0
    assert "0.653 GFLOP per client and step" in out
    assert "990,000 batched gradient steps per client" in out and "6.46 PFLOP" in out
