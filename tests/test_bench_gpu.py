"""``bench/gpu.py``: a CPU dry run writes every part's figures and files; its profile figures and projection."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import load_bench
from stable_baselines3.common.monitor import Monitor
from torch.autograd import DeviceType

from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.rollout import Lockstep

PARTS = ("environment", "profile-bf16", "headline", "continuous")


def _numbers(figures: dict) -> list[float]:
    assert figures, "no figures"
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in figures.values()), figures
    return list(figures.values())


@pytest.mark.slow
def test_a_cpu_dry_run_measures_every_part_and_writes_its_files(tmp_path: Path, capsys) -> None:
    bench = load_bench("gpu")
    # bf16 in the profile, fp32 in the headline: both precisions, one profiled run
    tiny = ["--clients", "2", "--precisions", "bf16", "--profile-steps", "100", "--profile-window", "30"]
    tiny += ["--trace-window", "5", "--rounds", "2", "--steps", "100", "--headline-precision", "fp32"]
    tiny += ["--continuous-steps", "50", "--budget-s", "300"]
    # small networks and batches, short episodes: the machinery is under test, not the figures
    small = ["env.eval_episodes=1", "env.max_episode_steps=50", "env.agent_kwargs.batch_size=32"]
    for override in [*small, "env.agent_kwargs.policy_kwargs.net_arch=[32,32]"]:
        tiny += ["--override", override]
    threads, probed = torch.get_num_threads(), (Lockstep.run, Monitor.step, StackedDQN.gradient_step)
    try:
        status = bench.main(["--out", str(tmp_path), "--device", "cpu", *tiny])
    finally:
        torch.set_num_threads(threads)
    assert status == 0
    assert (Lockstep.run, Monitor.step, StackedDQN.gradient_step) == probed  # the probe put them back
    parts = {p["part"]: p for p in json.loads((tmp_path / "summary.json").read_text())["parts"]}
    assert tuple(parts) == PARTS
    assert {p["status"] for p in parts.values()} == {"ok"}, {k: p.get("error") for k, p in parts.items()}
    assert parts["environment"]["torch"] == torch.__version__
    profile, folder = parts["profile-bf16"], tmp_path / "profile-bf16"
    assert profile["precision"] == profile["metrics"]["precision"] == "bf16"
    # round 2 less the profiler's 30 steps and the trace's 5: the plain timers' steps
    assert (profile["warm-up_steps"], profile["plain_steps"], profile["profile_steps"]) == (100, 65, 30)
    for phase in ("plain_ms", "profile_ms"):
        assert profile[phase]["wall"] > 0
        assert profile[phase]["wall"] >= profile[phase]["gradient_steps"] >= profile[phase]["gradient_step"]
    _numbers(profile["profiler"])
    assert "lockstep.gradient_step" in (folder / "key_averages_cpu.txt").read_text()
    assert profile["trace"] == "trace.json.gz"
    assert json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
    assert parts["headline"]["precision"] == parts["headline"]["metrics"]["precision"] == "fp32"
    for name, full in (("headline", 20 * 5000), ("continuous", 30 * 10_000)):
        run, folder = parts[name], tmp_path / name
        assert len(run["round_seconds"]) == 2 and all(s > 0 for s in run["round_seconds"])
        assert (folder / "rounds.csv").is_file() and (folder / "metrics.json").is_file()
        assert run["full_rounds"] * run["full_steps"] == full
        assert all(v > 0 for v in _numbers({k: v for k, v in run["projection"].items() if k != "later_from_rounds"}))
        assert run["projection"]["later_from_rounds"] == [2]
        assert run["projected_command_s"] >= run["projection"]["seconds"] and isinstance(run["goal_met"], bool)
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count("PROJECTED") == 2 and summary in capsys.readouterr().out + "\n"


def test_profile_figures_split_the_hosts_cuda_calls_and_the_devices_time() -> None:
    figures = load_bench("gpu_figures")

    def event(key: str, count: int, cpu_us: float = 0.0, device_us: float = 0.0, device: bool = False):
        device_type = DeviceType.CUDA if device else DeviceType.CPU
        return SimpleNamespace(
            key=key, count=count, self_cpu_time_total=cpu_us, self_device_time_total=device_us, device_type=device_type
        )

    events = [
        event("cudaLaunchKernel", 40, cpu_us=200.0),
        event("cudaMemcpyAsync", 6, cpu_us=120.0),
        event("cudaStreamSynchronize", 2, cpu_us=80.0),
        event("aten::_local_scalar_dense", 4, cpu_us=10.0),
        event("aten::bmm", 10, cpu_us=50.0, device_us=30.0),  # an op's device time is its kernels' again
        event("ampere_sgemm_32x32", 10, device_us=30.0, device=True),
        event("Memcpy HtoD (Pageable -> Device)", 6, device_us=6.0, device=True),
    ]
    out = figures.profile_figures(events, steps=2)
    assert out["host_launch_ms"] == pytest.approx(0.1) and out["launches"] == 20
    assert out["host_copy_ms"] == pytest.approx(0.06) and out["copies"] == 3
    assert out["host_sync_ms"] == pytest.approx(0.04) and out["syncs"] == 1
    assert out["scalar_reads"] == 2
    assert out["device_kernel_ms"] == pytest.approx(0.015) and out["device_copy_ms"] == pytest.approx(0.003)


def test_the_projection_rescales_each_rounds_lockstep_steps_and_keeps_the_rest() -> None:
    figures = load_bench("gpu_figures")
    probe = load_bench("lockstep_probe")
    # two rounds of 100 steps: 2 s in the loop (0.2 s of it before the first step) and 1 s outside;
    # then 1.1 s in the loop for 110 steps (10 past the budget) and 0.5 s outside
    loops = [probe.RoundTotals(2.0, 100, 0.2, 0.0), probe.RoundTotals(1.1, 110, 0.0, 3.0)]
    p = figures.project(10.0, [3.0, 1.6], loops, measured_steps=100, full_steps=1000, full_rounds=5)
    assert p.first_round_seconds == pytest.approx(1.0 + 0.2 + 1000 * 0.018)
    assert p.later_round_seconds == pytest.approx(0.5 + 1010 * 0.01)
    assert p.fixed_seconds == pytest.approx(10.0 - 4.6)
    assert p.seconds == pytest.approx(p.fixed_seconds + p.first_round_seconds + 4 * p.later_round_seconds)
    assert p.later_from == [2] and p.scaled_by_steps
