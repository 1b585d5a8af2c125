"""``bench/engine.py``: a whole federation's local training timed per engine, and its bfloat16 mode."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import load_bench


def test_bf16_measures_the_vectorised_engine_alone(monkeypatch, capsys):
    bench = load_bench("engine")
    args = "--envs deep-sea-treasure --workers 1 --clients 2 --repeats 1 --steps deep-sea-treasure=60 --precision bf16"
    monkeypatch.setattr(sys, "argv", ["engine.py", *args.split()])
    threads = torch.get_num_threads()
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "deep-sea-treasure vectorised workers=1: 120 steps" in out
    assert "deep-sea-treasure sb3" not in out  # the SB3 engine trains in float32: not run
    row = next(line for line in out.splitlines() if line.startswith("deep-sea-treasure "))
    assert row.split()[5] == "-"  # the sb3 column and the speed-up stay empty
    assert "bf16" in out


def test_the_sb3_engine_refuses_bf16():
    bench = load_bench("engine")
    spec = bench.bench_spec("deep-sea-treasure", None)
    with pytest.raises(ValueError, match="fp32 only"):
        bench.measure("sb3", spec, 2, 1, 10, 1, "cpu", 0, "bf16")
