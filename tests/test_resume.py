"""Checkpoint and resume: stopped, killed and branched runs give exactly the uninterrupted runs' results.

A run stopped by Ctrl-C in round 2 of 4 (at once, keeping round 1's checkpoint) and resumed gives
exactly the uninterrupted run; a CLI run killed with SIGKILL resumes from its last complete
checkpoint and completes with the uninterrupted run's results; client states round-trip exactly. A
branch (``branch_from=RUN_DIR finetune=true``) from a run's checkpoint before its last round gives
exactly the "+FT" run trained from scratch.

The uninterrupted run is made once through the Federation API with the CLI's defaults (fedpref,
equidistant preferences), so the CLI test also checks that the CLI runs exactly the API.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from morlfed.cli.execute import _start_point
from morlfed.cli.resume import branch_point, record_sweep_job, resume_argv, sibling_source
from morlfed.core.interrupt import RunStopped
from morlfed.core.protocol import FitResult, FitTask
from morlfed.core.seeding import generator
from morlfed.envs import get_spec
from morlfed.federation import Federation, FederationConfig, FederationOutcome, Recorder
from morlfed.federation.checkpoint import Checkpointer, load_server_state
from morlfed.runtime.executors import SequentialExecutor, state_from_bytes, state_to_bytes
from morlfed.storage.rundir import RunDirectory
from morlfed.storage.safestate import save_state
from morlfed.strategies.base import make_strategy
from morlfed.tasks.rl.client import RLClientFactory
from morlfed.tasks.rl.preferences import sample_preferences

ROOT = Path(__file__).resolve().parents[1]
SPEC = get_spec("deep-sea-treasure")
FED = FederationConfig(n_clients=3, rounds=4, local_steps=300, seed=3, progress=False)
PREFS = sample_preferences("equidistant", FED.n_clients, 2, generator(FED.seed, "preferences"))
CLI_RUN = ["engine=sb3", "n_clients=3", "rounds=4", "local_steps=300", "seed=3", "progress=false"]  # the same run
FACTORY = RLClientFactory(SPEC, PREFS, FED.seed, FED.local_steps, FED.rounds)


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "rounds.csv") as fh:
        return list(csv.DictReader(fh))


class CtrlCInRound:
    """Client wrapper that presses Ctrl-C (SIGINT to this process) during its fit in one round."""

    def __init__(self, client: Any, round: int) -> None:
        self.client, self.round = client, round

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def fit(self, task: FitTask) -> FitResult:
        result = self.client.fit(task)
        if task.round == self.round:
            os.kill(os.getpid(), signal.SIGINT)
        return result


def federation(run_dir: Path, factory: Any, every: int = 0) -> Federation:
    executor = SequentialExecutor()
    executor.start(factory, FED.n_clients)
    return Federation(
        make_strategy("fedpref"), executor, FED, Recorder(RunDirectory(run_dir), Checkpointer(run_dir, every))
    )


def assert_same_outcome(a: FederationOutcome, b: FederationOutcome) -> None:
    assert a.model_ids == b.model_ids
    for cid in range(FED.n_clients):
        np.testing.assert_array_equal(a.evaluations[cid].vector_return, b.evaluations[cid].vector_return)
        np.testing.assert_array_equal(a.evaluations[cid].discounted_return, b.evaluations[cid].discounted_return)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[FederationOutcome, Path]:
    """The uninterrupted run and its run directory."""
    run_dir = tmp_path_factory.mktemp("whole")
    return federation(run_dir, FACTORY).run(), run_dir


def test_ctrl_c_in_round_2_stops_at_once_then_resume_equals_uninterrupted(whole, tmp_path):
    whole, whole_dir = whole
    stopped = tmp_path / "stopped"
    fed = federation(stopped, lambda cid: CtrlCInRound(FACTORY(cid), 2) if cid == 1 else FACTORY(cid), every=0)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a process started in a shell's background
    with pytest.raises(RunStopped) as info:
        fed.run()
    assert info.value.signal == signal.SIGINT
    assert [r["round"] for r in rows(stopped)] == ["1"]  # round 2 was abandoned, client 2 never trained in it
    assert Checkpointer(stopped).latest() == stopped / "checkpoints" / "round_1"
    assert signal.getsignal(signal.SIGINT) == before  # Ctrl-C does again what it did before the run

    fed = federation(stopped, FACTORY)  # a fresh process' view: new clients, new strategy
    fed.resume(Checkpointer(stopped).latest())
    assert fed.start_round == 2
    recorded = load_server_state(stopped / "checkpoints" / "round_1")["seconds"]
    resumed = fed.run()
    assert_same_outcome(resumed, whole)
    # the wall time is the run's, not this process's: the checkpoint's seconds for round 1, plus the rest
    assert resumed.time_record() == {
        "wall_time_s": round(resumed.seconds, 2),
        "resumed_after_round": 1,
        "wall_time_before_resume_s": round(recorded, 2),
    }
    assert 0 < recorded < resumed.seconds
    assert whole.time_record() == {"wall_time_s": round(whole.seconds, 2)}
    for a, b in zip(rows(stopped), rows(whole_dir), strict=True):
        assert (a["round"], a["mean_train_reward"], a["n_clusters"]) == (
            b["round"],
            b["mean_train_reward"],
            b["n_clusters"],
        )
    assert (stopped / "clusters.jsonl").read_text() == (whole_dir / "clusters.jsonl").read_text()


def test_a_resume_writes_no_clusters_log_for_a_strategy_without_clusters(tmp_path):
    # FedAvg's checkpoint keeps an empty clusters.jsonl: its uninterrupted run directory has none
    Recorder(RunDirectory(tmp_path)).restore({"logs": {"rounds.csv": "round,seconds\n1,0.5\n", "clusters.jsonl": ""}})
    assert (tmp_path / "rounds.csv").read_text() == "round,seconds\n1,0.5\n"
    assert not (tmp_path / "clusters.jsonl").exists()


def test_client_state_round_trips_exactly():
    a, fresh, restored = FACTORY(0), FACTORY(0), FACTORY(0)
    first = a.fit(FitTask(params=a.initial_params(), round=1))
    restored.set_state(0, state_from_bytes(state_to_bytes(a.get_state(0))))
    task = FitTask(params=first.params, round=2)
    want = a.fit(task)
    got = restored.fit(task)
    assert torch.equal(got.params, want.params) and got.metrics == want.metrics
    # the state matters: a client without round 1's buffer, optimiser and counters trains differently
    assert not torch.equal(fresh.fit(task).params, want.params)


def test_latest_ignores_incomplete_checkpoints(tmp_path):
    ckpt = Checkpointer(tmp_path, every=2)
    assert ckpt.latest() is None
    for name in ("round_3", "round_12", ".tmp-round_14-99"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    (tmp_path / "checkpoints" / "round_3" / "manifest.json").write_bytes(b"")
    (tmp_path / "checkpoints" / ".tmp-round_14-99" / "manifest.json").write_bytes(b"")
    assert ckpt.latest() == tmp_path / "checkpoints" / "round_3"  # round_12 has no manifest yet
    assert [ckpt.due(r) for r in (1, 2, 3, 4)] == [False, True, False, True]
    with pytest.raises(ValueError, match="checkpoint_every must be an integer >= 0"):
        Checkpointer(tmp_path, every=-1)


class _NoClients:
    """Stands in for an executor in :meth:`Checkpointer.save`: writes one client file."""

    restore_dir: Path | None = None

    def save_clients(self, directory: Path) -> None:
        save_state(directory / "client_0.safetensors", {"fits": 1})


def checkpoint(run: Path, r: int) -> None:
    """A real checkpoint after round ``r`` in the run directory ``run`` (an empty server state, one client)."""
    Checkpointer(run, every=1).save(r, {"round": r}, _NoClients())  # type: ignore[arg-type]


def test_checkpoint_every_keeps_every_kth_round_and_only_those(tmp_path):
    ckpt = Checkpointer(tmp_path, every=3)
    executor: Any = _NoClients()
    for r in range(1, 8):  # rounds 1-7 of a longer run: the federation saves after each
        assert ckpt.save(r, {"round": r}, executor) == tmp_path / "checkpoints" / f"round_{r}"
        assert executor.restore_dir == tmp_path / "checkpoints" / f"round_{r}" / "clients"
        kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        # the rounds to keep, and the latest for a stop
        assert kept == sorted({f"round_{k}" for k in (3, 6) if k <= r} | {f"round_{r}"})
    assert ckpt.latest() == tmp_path / "checkpoints" / "round_7"
    assert ckpt.latest(before=7) == tmp_path / "checkpoints" / "round_6"
    ckpt.finish()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_3", "round_6"]
    assert load_server_state(tmp_path / "checkpoints" / "round_3")["round"] == 3


def test_resume_command_line_reuses_the_saved_overrides(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(
        "- algo=fedavg\n- executor=process\n- executor.workers=2\n- seed=4\n"
    )
    assert resume_argv(["seed=1"]) == ["seed=1"]
    assert resume_argv([f"resume={tmp_path}"]) == [
        "algo=fedavg",
        "executor=process",
        "executor.workers=2",
        "seed=4",
        f"resume={tmp_path}",
        f"hydra.run.dir={tmp_path}",
    ]
    assert resume_argv([f"resume={tmp_path}", "executor=sequential"]) == [
        "algo=fedavg",
        "seed=4",
        "executor=sequential",
        f"resume={tmp_path}",
        f"hydra.run.dir={tmp_path}",
    ]
    with pytest.raises(
        ValueError, match="only executor, progress, checkpoint_every, branch_siblings may be changed, got seed=5"
    ):
        resume_argv([f"resume={tmp_path}", "seed=5"])
    with pytest.raises(ValueError, match="nothing: no such directory"):  # a mistyped path says so
        resume_argv([f"resume={tmp_path / 'nothing'}"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: not a morlfed run directory"):
        resume_argv([f"resume={tmp_path / 'empty'}"])
    with pytest.raises(ValueError, match="to continue elsewhere with another finetune=, use branch_from="):
        resume_argv([f"resume={tmp_path}", "hydra.run.dir=elsewhere"])


def test_branch_command_line_reuses_the_saved_overrides(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- algo=fedavg\n- finetune=False\n- seed=4\n")
    assert resume_argv([f"branch_from={tmp_path}", "finetune=true", "hydra.run.dir=out"]) == [
        "algo=fedavg",
        "seed=4",
        "finetune=true",
        "hydra.run.dir=out",
        f"branch_from={tmp_path}",
    ]
    with pytest.raises(
        ValueError,
        match="only executor, progress, checkpoint_every, branch_siblings, finetune may be changed, got algo=cfl",
    ):
        resume_argv([f"branch_from={tmp_path}", "algo=cfl"])
    with pytest.raises(ValueError, match="give one of them"):
        resume_argv([f"branch_from={tmp_path}", f"resume={tmp_path}"])
    # a source that was resumed once: hydra saved its rewritten command line, resume= included
    (tmp_path / ".hydra" / "overrides.yaml").write_text(f"- algo=fedavg\n- seed=4\n- resume={tmp_path}\n")
    assert resume_argv([f"branch_from={tmp_path}", "finetune=true"]) == [
        "algo=fedavg",
        "seed=4",
        "finetune=true",
        f"branch_from={tmp_path}",
    ]
    # a branch resumed: it keeps its source, and goes on in place
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- algo=fedavg\n- finetune=true\n- branch_from=/src\n")
    assert resume_argv([f"resume={tmp_path}"]) == [
        "algo=fedavg",
        "finetune=true",
        "branch_from=/src",
        f"resume={tmp_path}",
        f"hydra.run.dir={tmp_path}",
    ]


def test_a_resumed_branch_goes_on_from_its_own_checkpoint_else_from_its_sources(tmp_path):
    config = {
        "algo": "fedavg",
        "rounds": 3,
        "finetune": False,
        "seed": 1,
        "resume": None,
        "branch_from": None,
        "branch_siblings": False,
    }
    source, branch = tmp_path / "source", tmp_path / "branch"
    source.mkdir()
    (source / "config.yaml").write_text(OmegaConf.to_yaml(config))
    checkpoint(source, 2)
    branched = config | {"finetune": True, "branch_from": str(source)}
    branch.mkdir()
    (branch / "config.yaml").write_text(OmegaConf.to_yaml(branched))  # killed before its first checkpoint
    resumed = OmegaConf.create(branched | {"resume": str(branch)})
    assert _start_point(resumed, branch) == (source / "checkpoints" / "round_2", source)
    checkpoint(branch, 3)
    assert _start_point(resumed, branch) == (branch / "checkpoints" / "round_3", None)


def test_branch_point_needs_the_same_config_and_a_checkpoint_before_the_last_round(tmp_path):
    (tmp_path / "config.yaml").write_text("algo: fedavg\nrounds: 3\nfinetune: false\nseed: 1\n")
    branch = "algo: fedavg\nrounds: 3\nfinetune: true\nseed: 1\nbranch_from: x\n"
    with pytest.raises(ValueError, match=r"before the last round 3 \(none\); run it with checkpoint_every=2"):
        branch_point(tmp_path, branch)
    for r in (3, 2, 1):
        checkpoint(tmp_path, r)
        if r == 3:
            with pytest.raises(ValueError, match=r"the only one is after round 3\); run it with checkpoint_every=2"):
                branch_point(tmp_path, branch)
    # a run with checkpoint_every=1 keeps them all: the branch starts from the one before the last round
    assert branch_point(tmp_path, branch) == tmp_path / "checkpoints" / "round_2"
    with pytest.raises(ValueError, match=r"differs from the saved config\.yaml in algo, seed"):
        branch_point(tmp_path, branch.replace("fedavg", "cfl").replace("seed: 1", "seed: 2"))


def test_sibling_source_is_a_finished_run_with_the_same_config_and_an_earlier_checkpoint(tmp_path):
    config = "algo: fedavg\nrounds: 3\nfinetune: false\nseed: 1\nbranch_siblings: true\n"

    def sibling(
        name: str, text: str = config, checkpoints: tuple[int, ...] = (2,), finished: bool = True, ours: bool = True
    ) -> Path:
        run = tmp_path / name
        run.mkdir()
        if ours:  # a job of this sweep
            record_sweep_job(run)
        (run / "config.yaml").write_text(text)
        for r in checkpoints:
            checkpoint(run, r)
        if finished:
            (run / "metrics.json").write_text("{}")
        return run

    me = sibling("9_me", finished=False)
    ft = config.replace("finetune: false", "finetune: true")
    assert sibling_source(me, ft) is None
    sibling("0_other_seed", config.replace("seed: 1", "seed: 2"))
    sibling("1_unfinished", finished=False)
    sibling("2_no_checkpoint", checkpoints=())
    sibling("3_checkpoint_after_last_round", checkpoints=(3,))
    assert sibling_source(me, ft) is None
    early = sibling("5_early", checkpoints=(1,))
    assert sibling_source(me, ft) == early
    late = sibling("6_late", config.replace("branch_siblings: true", "branch_siblings: false"))
    assert sibling_source(me, ft) == late
    sibling("4_planted", ours=False)  # it would come first, but this sweep did not create it
    assert sibling_source(me, ft) == late
    assert sibling_source(me, config) == late  # a plain run may branch too: only the last round differs


def test_branch_with_finetune_equals_the_finetune_run_from_scratch(tmp_path, morlfed_cli):
    """A branch of a FedAvg run at round 2 with finetune gives the FedAvg+FT run's exact results.

    FedAvg's last round aggregates (everyone deploys the mean) while FedAvg+FT keeps each client's
    own model: a branch of the plain run at round 2 must give the +FT run's exact results, here
    under the process executor, and leave its source untouched.
    """
    run = ["algo=fedavg", "n_clients=3", "rounds=3", "local_steps=300", "seed=5", "progress=false"]
    source, fresh, branch = tmp_path / "source", tmp_path / "fresh", tmp_path / "branch"
    for args, out in ((["checkpoint_every=2"], source), (["finetune=true"], fresh)):
        done = morlfed_cli([*run, *args, f"hydra.run.dir={out}"])
        assert done.returncode == 0, done.stderr[-3000:]
    before = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
    done = morlfed_cli(
        [f"branch_from={source}", "finetune=true", "executor=process", "executor.workers=2", f"hydra.run.dir={branch}"]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (branch / "final.csv").read_bytes() == (fresh / "final.csv").read_bytes()
    assert (branch / "final.csv").read_bytes() != (source / "final.csv").read_bytes()
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(rows(branch)) == strip(rows(fresh))
    info = json.loads((branch / "metrics.json").read_text())
    assert info["label"] == "fedavg+FT" and info["branched_from"] == str(source)
    assert "resumed_after_round" not in info  # a branch is a new run: its wall time counts its own round
    assert info["undiscounted"] == json.loads((fresh / "metrics.json").read_text())["undiscounted"]
    assert {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()} == before

    done = morlfed_cli([f"branch_from={fresh}", "finetune=false", f"hydra.run.dir={tmp_path / 'no'}"])
    assert done.returncode == 2 and "needs an intact checkpoint from before the last round 3" in done.stderr
    assert not (tmp_path / "no").exists()


def test_a_run_killed_and_resumed_branches_to_the_finetune_run_from_scratch(tmp_path, morlfed_cli):
    """A +FT branch of a run that was killed and resumed gives the FedAvg+FT run's exact results.

    A resumed run's saved command line holds its ``resume=``; a campaign's +FT row branches from
    such a run whenever the plain run was interrupted.
    """
    run = ["algo=fedavg", "n_clients=3", "rounds=3", "local_steps=300", "seed=5", "progress=false"]
    source, fresh, branch = tmp_path / "source", tmp_path / "fresh", tmp_path / "branch"
    proc = started_until_checkpoint(source, 1, *run, "checkpoint_every=1")
    proc.kill()
    proc.wait()
    assert not (source / "metrics.json").exists(), "the run finished before it was killed"
    for args in ([f"resume={source}"], [*run, "finetune=true", f"hydra.run.dir={fresh}"]):
        done = morlfed_cli(args)
        assert done.returncode == 0, done.stderr[-3000:]
    done = morlfed_cli([f"branch_from={source}", "finetune=true", f"hydra.run.dir={branch}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (branch / "final.csv").read_bytes() == (fresh / "final.csv").read_bytes()
    assert json.loads((branch / "metrics.json").read_text())["branched_from"] == str(source)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "morlfed.run", *args]


def started_until_checkpoint(run_dir: Path, round_: int, *args: str) -> subprocess.Popen:
    """``python -m morlfed.run ARGS`` into ``run_dir``, running, once its round-``round_`` checkpoint is complete."""
    proc = subprocess.Popen(
        cli(*args, f"hydra.run.dir={run_dir}"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / f"round_{round_}" / "manifest.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (
            f"the run ended before its round-{round_} checkpoint"
        )
        time.sleep(0.05)
    return proc


@pytest.mark.slow
def test_sigkill_mid_run_resumes_from_last_checkpoint(whole, tmp_path):
    whole, whole_dir = whole
    killed = tmp_path / "killed"
    proc = started_until_checkpoint(killed, 2, *CLI_RUN, "checkpoint_every=1", "executor=process", "executor.workers=2")
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    proc.kill()
    proc.wait()
    assert not (killed / "metrics.json").exists(), "the run finished before it was killed"
    done_rows = [r for r in rows(killed) if int(r["round"]) <= 2]
    for pid in workers:  # orphaned workers see their pipe close and exit
        for _ in range(200):
            if not alive(pid):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"worker {pid} outlived the killed run")

    done = subprocess.run(
        cli(f"resume={killed}", "executor=sequential"), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (killed / "metrics.json").exists()
    with open(killed / "final.csv") as fh:
        final = list(csv.DictReader(fh))
    for cid, row in enumerate(final):
        assert [float(row[f"return_{k}"]) for k in range(2)] == whole.evaluations[cid].vector_return.tolist()
        assert [float(row[f"disc_return_{k}"]) for k in range(2)] == whole.evaluations[cid].discounted_return.tolist()
        assert int(row["model"]) == whole.model_ids[cid]
    resumed_rows = rows(killed)
    assert [r["round"] for r in resumed_rows] == ["1", "2", "3", "4"]
    assert resumed_rows[: len(done_rows)] == done_rows  # rounds up to the checkpoint were not rerun (same timings)
    assert [r["mean_train_reward"] for r in resumed_rows] == [r["mean_train_reward"] for r in rows(whole_dir)]
    # checkpoint_every=1 keeps every round's checkpoint, those before the kill included
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["round_1", "round_2", "round_3", "round_4"]
