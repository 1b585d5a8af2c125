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
    argv = ["engine_floor.py", "--env", "mo-lunar-lander-continuous", "--clients", "1", "--blocks", "1", "--steps", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    threads = torch.get_num_threads()
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "8-400-300-2 actors, 10-400-300-1 critics, batch 256" in out
    ratio = next(line for line in out.splitlines() if line.startswith("ratio"))
    assert float(ratio.split()[1]) > 0
    assert "300,000 batched gradient steps per client" in out  # 30 rounds x 10 000 steps
