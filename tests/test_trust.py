"""Run directories you can trust: reading one runs no code, damage is named, one writer at a time.

Checkpoints hold data only: a pickle in any checkpoint file is refused (exit status 2, naming it)
and the code it names never runs; altered bytes are named by the manifest, and the run falls back
to the previous intact checkpoint or refuses; two runs (or resumes) of one directory at once: one is
refused with exit status 2, naming the holder; a command line, or the saved one ``resume=``
reapplies, names no code and no path; the pickled checkpoints of an earlier morlfed are refused
with the converter's command, and convert to the same results.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from morlfed.cli.convert import main as convert
from morlfed.cli.overrides import precheck_argv
from morlfed.cli.resume import resume_argv, resume_point
from morlfed.core.projection import Projection
from morlfed.core.settings import ConfigError
from morlfed.federation.checkpoint import Checkpointer
from morlfed.storage.manifest import CorruptError, verify_manifest, write_manifest
from morlfed.storage.runlock import RunDirBusy, run_dir_lock
from morlfed.storage.safestate import (
    UnsafeStateError,
    check_state,
    load_state,
    save_state,
    state_from_bytes,
    state_to_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": "0"}
RUN = ["engine=sb3", "n_clients=2", "rounds=2", "local_steps=200", "seed=7", "progress=false"]


class Payload:
    """Unpickling it runs code: it creates the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def write_pickle(path: Path, marker: Path) -> None:
    """A malicious ``torch.save`` file at ``path``: reading it with pickle creates ``marker``."""
    torch.save({"state": Payload(marker)}, path)


def test_state_files_hold_data_and_read_back_exactly() -> None:
    state = {
        "weights": torch.arange(6.0).reshape(2, 3),
        "half": torch.ones(2, dtype=torch.bfloat16),
        "replay": {"observations": np.arange(4, dtype=np.uint32), "pos": 3, "full": False},
        "optimiser": {0: {"step": 2.0}, "param_groups": [{"betas": (0.9, 0.999), "foreach": None}]},
        "scalar": np.float32(1.5),
        "text": "round 1",
        "nan": float("nan"),
    }
    back = state_from_bytes(state_to_bytes(state))
    assert torch.equal(back["weights"], state["weights"]) and back["half"].dtype == torch.bfloat16
    assert back["replay"]["observations"].dtype == np.uint32 and back["replay"]["pos"] == 3
    assert back["optimiser"][0] == {"step": 2.0} and back["optimiser"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert type(back["scalar"]) is np.float32 and back["text"] == "round 1" and np.isnan(back["nan"])
    with pytest.raises(TypeError, match=r"state\.env: a deque cannot be written as data"):
        state_to_bytes({"env": deque([1])})


def test_a_pickle_or_a_truncated_file_is_refused_without_running_it(tmp_path: Path) -> None:
    marker, evil = tmp_path / "ran", tmp_path / "client_0.safetensors"
    write_pickle(evil, marker)
    for read in (check_state, load_state):
        with pytest.raises(UnsafeStateError, match=rf"{evil}: a pickle, which can run code when read: refused"):
            read(evil)
    truncated = tmp_path / "server.safetensors"
    save_state(truncated, {"round": 1, "model": torch.zeros(100)})
    truncated.write_bytes(truncated.read_bytes()[:-50])
    with pytest.raises(UnsafeStateError, match=rf"{truncated}: not a morlfed state file"):
        load_state(truncated)
    assert not marker.exists()


def test_the_manifest_names_a_changed_missing_or_unlisted_file(tmp_path: Path) -> None:
    (tmp_path / "clients").mkdir()
    for name in ("server.safetensors", "clients/client_0.safetensors", "models/map.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(name.encode() * 10)
    write_manifest(tmp_path)
    verify_manifest(tmp_path)  # every file below the directory, whatever wrote it
    client = tmp_path / "clients" / "client_0.safetensors"
    data = bytearray(client.read_bytes())
    data[5] ^= 0xFF
    client.write_bytes(bytes(data))
    with pytest.raises(CorruptError, match=rf"{client}: its SHA-256 differs"):
        verify_manifest(tmp_path)
    client.unlink()
    with pytest.raises(CorruptError, match=rf"{client}: missing"):
        verify_manifest(tmp_path)
    write_manifest(tmp_path)
    (tmp_path / "models" / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(CorruptError, match=r"extra\.safetensors: not in the manifest"):
        verify_manifest(tmp_path)


def test_the_lock_refuses_a_second_holder_naming_it_and_a_dead_holders_lock_is_free(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from morlfed.storage.runlock import run_dir_lock\n"
            f"with run_dir_lock({str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(600)",
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(RunDirBusy, match=rf"{tmp_path} is in use by another morlfed run \(pid {holder.pid} on host"),
            run_dir_lock(tmp_path),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / ".morlfed.lock").exists()  # a killed holder leaves its file, but no lock
    with run_dir_lock(tmp_path), run_dir_lock(tmp_path):  # re-entrant within a process
        pass
    assert not (tmp_path / ".morlfed.lock").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo._target_=os.system", "_target_ 'os.system' is none of the classes morlfed's configs name"),
        ("algo.threshold={_target_:os.system,_args_:[id]}", "_target_ 'os.system' is none of the classes"),
        ("task.name=../../x", "task.name names the task's own config; choose the task with task=NAME"),
    ],
)
def test_a_command_line_and_the_overrides_resume_reapplies_name_no_code(
    tmp_path: Path, override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        precheck_argv([override])
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(f"- algo=fedavg\n- {json.dumps(override)}\n")
    with pytest.raises(ConfigError, match=r"none of the classes|task\.name names"):
        precheck_argv(resume_argv([f"resume={tmp_path}"]))
    precheck_argv(["algo._target_=morlfed.baselines.fedavg.FedAvg"])  # a registered class is fine


def test_a_budget_is_projected_without_a_loop_over_its_rounds() -> None:
    with pytest.raises(ValueError, match=r"rounds=1,000,000,000,000 cannot fit: their records alone take about"):
        Projection(10**12, 10**16, "env steps", 1e6).check(64 * 2**30)
    warning = Projection(100, 10**12, "env steps", 1e6).check(64 * 2**30)
    assert warning is not None and "more than a day" in warning and "12 days" in warning
    assert Projection(100, 10**6, "env steps", 1e6).check(64 * 2**30) is None


# --- the command line -------------------------------------------------------------------------


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "morlfed.run", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def start_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "morlfed.run", *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: hydra's console log (warnings) and morlfed's lines
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    """Wait for a process of :func:`start_cli`: its exit status and output."""
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def snapshot(folder: Path) -> dict[str, bytes]:
    """The run's own files and their bytes (not hydra's .hydra/ and run.log, which every resume rewrites and appends to)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).parts[0] not in (".hydra", "run.log")
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run that kept both rounds' checkpoints: its final.csv is the uninterrupted result."""
    out = tmp_path_factory.mktemp("finished") / "run"
    done = run_cli(*RUN, "checkpoint_every=1", f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def unfinished(finished: Path, where: Path, keep_round_1: bool = True) -> Path:
    """A copy of ``finished`` as if killed during its final evaluation: resumable from round 2's checkpoint."""
    shutil.copytree(finished, where)
    for name in ("metrics.json", "final.csv", "front.png"):
        (where / name).unlink()
    if not keep_round_1:
        shutil.rmtree(where / "checkpoints" / "round_1")
    return where


@pytest.mark.slow
def test_a_pickle_in_any_checkpoint_file_is_refused_and_no_code_runs(finished: Path, tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    files = sorted(
        p.relative_to(finished / "checkpoints" / "round_2") for p in (finished / "checkpoints" / "round_2").rglob("*.*")
    )
    assert [str(f) for f in files] == [
        "clients/client_0.safetensors",
        "clients/client_1.safetensors",
        "manifest.json",
        "models/deployment.json",
        "models/model_0.safetensors",
        "models/model_1.safetensors",
        "server.safetensors",
    ]
    for k, name in enumerate(files):
        run = unfinished(finished, tmp_path / f"run_{k}", keep_round_1=False)
        checkpoint = run / "checkpoints" / "round_2"
        write_pickle(checkpoint / name, marker)
        if name.name != "manifest.json":
            write_manifest(checkpoint)  # a forger who also rewrote the manifest: the format check still refuses it
        found, refused = Checkpointer(run).usable()
        assert found is None and len(refused) == 1 and refused[0].startswith(f"{checkpoint / name}: ")
    # the command line: exit status 2, the file named, nothing written or deleted, no code run
    (run / "stopped.json").write_text("{}")
    before = snapshot(run)
    done = run_cli(f"resume={run}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{run / 'checkpoints' / 'round_2' / 'server.safetensors'}: a pickle, which can run code" in done.stderr
    assert snapshot(run) == before and not marker.exists()


@pytest.mark.slow
def test_altered_bytes_are_named_and_the_run_falls_back_to_the_previous_checkpoint(
    finished: Path, tmp_path: Path
) -> None:
    run, alone = unfinished(finished, tmp_path / "run"), unfinished(finished, tmp_path / "alone", keep_round_1=False)
    for copy in (run, alone):
        client = copy / "checkpoints" / "round_2" / "clients" / "client_1.safetensors"
        data = bytearray(client.read_bytes())
        data[len(data) // 2] ^= 0x01  # one flipped bit in its tensors
        client.write_bytes(bytes(data))
    done = run_cli(f"resume={run}")
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr  # hydra's console log, where warnings go, is stdout
    assert (
        f"checkpoint refused: {run / 'checkpoints' / 'round_2' / 'clients' / client.name}: its SHA-256 differs" in said
    )
    assert f"continuing from {run / 'checkpoints' / 'round_1'}" in said
    assert (run / "final.csv").read_bytes() == (finished / "final.csv").read_bytes()
    # with no earlier checkpoint to fall back to, resume refuses, naming the file
    config = (alone / "config.yaml").read_text()
    with pytest.raises(ValueError, match="its checkpoint is damaged, and no earlier one is intact") as refused:
        resume_point(alone, config)
    assert f"{client}: its SHA-256 differs" in str(refused.value)


@pytest.mark.slow
def test_two_runs_or_two_resumes_of_one_directory_at_once_one_is_refused(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / "shared"
    procs = [start_cli(*RUN, f"hydra.run.dir={out}") for _ in range(2)]
    results = [finish(p) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "is in use by another morlfed run" in refused or "already holds a finished run" in refused, refused
    assert (out / "run.log").read_text().count("morlfed run ") == 1  # one run's log
    assert (out / "final.csv").read_bytes() == (finished / "final.csv").read_bytes()

    run = unfinished(finished, tmp_path / "resumed")
    procs = [start_cli(f"resume={run}") for _ in range(2)]
    results = [finish(p) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "is in use by another morlfed run" in refused or "already completed" in refused, refused


@pytest.mark.slow
def test_a_path_as_the_task_name_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_cli("task.name=../../x", f"hydra.run.dir={out}")
    assert done.returncode == 2 and done.stderr.strip().startswith("morlfed: error: task.name=../../x:")
    assert not out.exists()


@pytest.mark.slow
def test_sigkill_at_any_moment_even_in_round_1s_checkpoint_resumes_to_the_uninterrupted_result(
    finished: Path, tmp_path: Path
) -> None:
    rng = np.random.default_rng(49)
    for k, extra in enumerate([None, rng.uniform(0.0, 3.0)]):
        run = tmp_path / f"killed_{k}"
        proc = start_cli(*RUN, f"hydra.run.dir={run}")
        deadline = time.monotonic() + 300
        if extra is None:  # as round 1 is written down: its rounds.csv row first, then its checkpoint
            while not (run / "rounds.csv").is_file():
                assert proc.poll() is None and time.monotonic() < deadline, "the run ended before round 1's row"
                time.sleep(0.001)
        else:  # at a random moment after it started
            while not (run / "config.yaml").is_file():
                assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it started"
                time.sleep(0.01)
            time.sleep(extra)
        proc.kill()
        proc.wait()
        if (run / "metrics.json").is_file():
            continue  # it finished first: nothing to resume
        done = run_cli(f"resume={run}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert (run / "final.csv").read_bytes() == (finished / "final.csv").read_bytes()
        strip = lambda text: [line.rsplit(",", 1)[0] for line in text.splitlines()]  # noqa: E731 (no seconds)
        assert strip((run / "rounds.csv").read_text()) == strip((finished / "rounds.csv").read_text())


@pytest.mark.slow
def test_workers_that_die_while_saving_or_evaluating_are_restarted_and_the_step_retried(tmp_path: Path) -> None:
    out = tmp_path / "run"
    faults = "faults=[{client:0,round:1,kind:kill_saving},{client:1,round:2,kind:kill_evaluating}]"
    done = run_cli(*RUN, "executor=process", "executor.workers=2", faults, f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    rounds = (out / "rounds.csv").read_text()
    assert "worker 0 died during save (exit code -9); worker 0 restarted" in rounds
    log = (out / "run.log").read_text()
    assert "final evaluation: worker 1 died during evaluate (exit code -9); worker 1 restarted" in log
    assert (out / "metrics.json").is_file()


@pytest.mark.slow
def test_a_huge_budget_is_refused_or_warned_at_once_and_sigterm_stops_the_start(tmp_path: Path) -> None:
    done = run_cli("rounds=1000000000000", f"hydra.run.dir={tmp_path / 'huge'}", timeout=120)
    assert done.returncode == 2 and "cannot fit: their records alone take about" in done.stderr
    assert not (tmp_path / "huge").exists()
    long = start_cli("rounds=100000", "local_steps=10000000", f"hydra.run.dir={tmp_path / 'long'}")
    assert long.stdout is not None
    for line in long.stdout:
        if "more than a day" in line:
            break
    long.terminate()
    assert long.wait(timeout=120) == 128 + 15


@pytest.mark.slow
def test_an_earlier_morlfeds_pickled_checkpoints_are_refused_until_converted(finished: Path, tmp_path: Path) -> None:
    from stable_baselines3.common.buffers import ReplayBuffer

    from morlfed.envs import get_spec, make_train_env

    run = unfinished(finished, tmp_path / "old", keep_round_1=False)
    checkpoint = run / "checkpoints" / "round_2"
    env = make_train_env(get_spec("deep-sea-treasure"), np.array([0.5, 0.5]), seed=0)
    for new in [checkpoint / "server.safetensors", *sorted((checkpoint / "clients").iterdir())]:
        state = load_state(new)
        if "replay_buffer" in state:  # as an earlier morlfed pickled an SB3 client: the buffer and deques as objects
            arrays = state["replay_buffer"]
            buffer = ReplayBuffer(arrays["buffer_size"], env.observation_space, env.action_space)
            vars(buffer).update(arrays)
            state["replay_buffer"] = buffer
            state["episode_info"] = tuple(None if b is None else deque(b, maxlen=100) for b in state["episode_info"])
        torch.save(state, new.with_suffix(".pt"))
        new.unlink()
    (checkpoint / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"pickled by an earlier morlfed.*python -m morlfed\.cli\.convert RUN_DIR"):
        Checkpointer(run).usable()
    assert convert([str(run)]) == 0
    assert not list(run.rglob("*.pt")) and Checkpointer(run).usable() == (checkpoint, [])
    done = run_cli(f"resume={run}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run / "final.csv").read_bytes() == (finished / "final.csv").read_bytes()


@pytest.mark.slow
def test_analysis_refuses_a_finished_run_whose_rounds_csv_was_truncated(finished: Path, tmp_path: Path) -> None:
    from morlfed.analysis.plot import main as plot

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    lines = (run / "rounds.csv").read_text().splitlines()
    (run / "rounds.csv").write_text("\n".join(lines[:2]) + "\n")  # the header and round 1
    assert plot([str(run), "--out", str(tmp_path / "figures")]) == 1
    assert not (tmp_path / "figures").exists()
