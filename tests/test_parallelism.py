"""executor=auto and torch_threads=auto: every core by default, and what the core count changes.

Nothing in the results: docs/engines.md, "Cores".
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
import torch
from conftest import CliRunner, compose_config

from morlfed.cli.execute import build_plan
from morlfed.core import parallelism
from morlfed.core.parallelism import MIN_PARALLEL_STEPS, Parallelism, resolve
from morlfed.tasks.rl.precision import bf16_native

LONG = MIN_PARALLEL_STEPS  # a run just long enough for worker processes


def test_auto_puts_one_single_threaded_worker_on_every_core_for_a_long_run() -> None:
    assert resolve("auto", None, "auto", n_clients=10, total_steps=LONG, cores=2) == Parallelism("process", 2, 1, 2)
    # at most one worker per client
    assert resolve("auto", None, "auto", n_clients=3, total_steps=LONG, cores=8) == Parallelism("process", 3, 1, 8)


def test_auto_keeps_a_short_run_or_a_single_core_in_one_single_threaded_process() -> None:
    assert resolve("auto", None, "auto", n_clients=10, total_steps=LONG - 1, cores=2) == Parallelism(
        "sequential", 1, 1, 2
    )
    assert resolve("auto", None, "auto", n_clients=10, total_steps=10 * LONG, cores=1) == Parallelism(
        "sequential", 1, 1, 1
    )
    assert resolve("auto", None, "auto", n_clients=1, total_steps=10 * LONG, cores=4).executor == "sequential"


def test_auto_keeps_a_batch_on_a_gpu_in_one_process() -> None:
    # worker processes would share the one GPU, switching contexts (docs/engines.md, "GPU")
    one = Parallelism("sequential", 1, 1, 16)
    assert resolve("auto", None, "auto", 10, 10 * LONG, cores=16, gpu_batched=True) == one
    # an explicit executor still wins
    assert resolve("process", 5, "auto", 10, 10 * LONG, cores=16, gpu_batched=True) == Parallelism("process", 5, 1, 16)


def test_explicit_settings_win() -> None:
    # an explicit executor: auto threads are one per worker (two sequential sweeps side by side
    # must not each take every core's thread)
    assert resolve("sequential", None, "auto", 10, LONG, cores=4) == Parallelism("sequential", 1, 1, 4)
    assert resolve("process", None, "auto", 10, LONG, cores=4) == Parallelism("process", 4, 1, 4)
    assert resolve("process", 2, "auto", 10, LONG, cores=4) == Parallelism("process", 2, 1, 4)
    # explicit threads and workers
    assert resolve("auto", 3, 5, 10, LONG, cores=2) == Parallelism("process", 3, 5, 2)
    assert resolve("sequential", None, 3, 10, LONG, cores=2) == Parallelism("sequential", 1, 3, 2)
    # a Ray cluster sizes itself
    assert resolve("ray", None, "auto", 10, LONG, cores=2) == Parallelism("ray", None, 1, 2)


@pytest.mark.parametrize("value", ["two", 0, -1, True, 1.5])
def test_torch_threads_must_be_a_positive_integer_or_auto(value: object) -> None:
    with pytest.raises(ValueError, match=r"torch_threads must be a positive integer or auto .*got"):
        resolve("auto", None, value, 10, LONG, cores=2)


@pytest.mark.parametrize("value", ["two", "0"])
def test_the_cli_refuses_a_bad_torch_threads_before_anything_runs(
    morlfed_cli: CliRunner, tmp_path: Path, value: str
) -> None:
    done = morlfed_cli([f"torch_threads={value}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode == 2
    assert "torch_threads must be a positive integer or auto" in done.stderr
    assert not (tmp_path / "run").exists()


def _run(morlfed_cli: CliRunner, path: Path, *overrides: str) -> dict:
    """A tiny mo-lunar-lander run (256-unit networks: large enough for torch to use its threads)."""
    args = ["env=mo-lunar-lander", "n_clients=2", "rounds=1", "local_steps=200", "env.eval_episodes=1"]
    args.append("env.max_episode_steps=200")  # a short evaluation: the training is what threads could change
    done = morlfed_cli([*args, *overrides, "progress=false", f"hydra.run.dir={path}"])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((path / "metrics.json").read_text())


def _amx() -> bool:
    """Whether this processor has AMX bfloat16 tiles (see the bf16 case below)."""
    return "amx_bf16" in (parallelism.cpuinfo_field("flags") or "").split()


@pytest.mark.parametrize(
    "engine, precision",
    [
        ("sb3", "fp32"),
        ("vectorised", "fp32"),
        pytest.param(
            "vectorised",
            "bf16",
            marks=[
                pytest.mark.skipif(not bf16_native("cpu"), reason="no native bfloat16: auto never picks bf16 here"),
                pytest.mark.skipif(_amx(), reason="not verified on AMX processors (docs/engines.md, Cores)"),
            ],
        ),
    ],
)
def test_the_core_count_changes_no_number(morlfed_cli: CliRunner, tmp_path: Path, engine: str, precision: str) -> None:
    """The promise of docs/engines.md: one thread, two threads and two workers train the same models.

    One thread, two threads and two worker processes train the same models, bit for bit;
    metrics.json records what each run used.
    """
    arm = (f"engine={engine}", f"precision={precision}")
    one = _run(morlfed_cli, tmp_path / "one", *arm, "executor=sequential", "torch_threads=1")
    two = _run(morlfed_cli, tmp_path / "two", *arm, "executor=sequential", "torch_threads=2")
    split = _run(morlfed_cli, tmp_path / "split", *arm, "executor=process", "executor.workers=2")
    assert (one["executor"], one["workers"], one["torch_threads"]) == ("sequential", 1, 1)
    assert (two["executor"], two["workers"], two["torch_threads"]) == ("sequential", 1, 2)
    assert (split["executor"], split["workers"]) == ("process", 2)
    assert one["engine"] == two["engine"] == split["engine"] == engine
    assert one["precision"] == two["precision"] == split["precision"] == precision
    assert one["cpu"] == parallelism.cpu_model() != ""
    final = (tmp_path / "one" / "final.csv").read_bytes()
    assert (tmp_path / "two" / "final.csv").read_bytes() == final
    assert (tmp_path / "split" / "final.csv").read_bytes() == final


@pytest.mark.parametrize(
    "engine, device, workers",
    [("vectorised", "cuda", 1), ("vectorised", "auto", 1), ("vectorised", "cpu", 4), ("sb3", "cuda", 4)],
)
def test_the_cli_keeps_the_vectorised_engine_on_cuda_in_one_process(
    monkeypatch: pytest.MonkeyPatch, engine: str, device: str, workers: int
) -> None:
    # a machine with 4 cores and, as far as torch can tell, a GPU: device=auto resolves to cuda
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # precision=auto asks it where a spec says bf16
    monkeypatch.setattr(parallelism, "available_cores", lambda: 4)
    plan = build_plan(compose_config(["env=mo-lunar-lander", f"engine={engine}", f"device={device}"]))
    try:
        assert plan.parallelism.executor == ("sequential" if workers == 1 else "process")
        assert plan.parallelism.workers == workers
    finally:
        plan.executor.close()


def test_cpu_model_reads_the_model_name(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert parallelism.cpu_model(cpuinfo) == "AMD EPYC 9654 96-Core Processor"
    # no /proc/cpuinfo (macOS, Windows): what the platform module says, never an empty string
    assert parallelism.cpu_model(tmp_path / "absent") == (platform.processor() or "unknown")
