"""Faults: a failed client is excluded from its round and retried; a dead worker is restarted.

A client whose fit raises, hangs or returns NaN is excluded from that round, recorded in rounds.csv
and retried next round from its last good state; a worker that dies or freezes is killed, restarted
and its clients restored from the latest checkpoint; the run always completes.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from morlfed.core.protocol import ClientFailure, FitResult, FitTask
from morlfed.envs import get_spec
from morlfed.federation import Federation, FederationConfig, Recorder
from morlfed.runtime.executors import ClientTimeout, SequentialExecutor, alarm
from morlfed.runtime.faults import Fault, FaultyClientFactory, FaultyHost, parse_faults
from morlfed.storage.rundir import RunDirectory
from morlfed.strategies.base import make_strategy
from morlfed.tasks.rl.client import RLClientFactory

ROOT = Path(__file__).resolve().parents[1]
FACTORY = RLClientFactory(get_spec("deep-sea-treasure"), np.array([[0.3, 0.7]]), seed=1, local_steps=200, rounds=3)


def test_fault_specs_are_validated():
    raw = [{"client": 1, "round": 2, "kind": "hang"}, {"client": 0, "round": 1, "kind": float("nan")}]
    assert parse_faults(raw, 3, 2, "sequential") == [Fault(1, 2, "hang"), Fault(0, 1, "nan")]
    with pytest.raises(
        ValueError,
        match=r"faults\[0\].kind must be one of raise, hang, freeze, nan, kill_worker, kill_saving, kill_evaluating, got 'boom'",
    ):
        parse_faults([{"client": 0, "round": 1, "kind": "boom"}], 3, 2, "process")
    with pytest.raises(ValueError, match=r"faults\[0\].client must be a client id in \[0, 2\], got 3"):
        parse_faults([{"client": 3, "round": 1, "kind": "raise"}], 3, 2, "process")
    with pytest.raises(ValueError, match=r"faults\[0\].round must be a round in \[1, 2\], got 0"):
        parse_faults([{"client": 0, "round": 0, "kind": "raise"}], 3, 2, "process")
    with pytest.raises(ValueError, match="exactly client, round and kind"):
        parse_faults([{"client": 0, "round": 1}], 3, 2, "process")
    with pytest.raises(ValueError, match="kill_worker needs executor=process or ray"):
        parse_faults([{"client": 0, "round": 1, "kind": "kill_worker"}], 3, 2, "sequential")


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("raise", "exception InjectedFault"), ("hang", "timeout after 1 s"), ("nan", "non-finite parameters")],
)
def test_failed_fit_is_rolled_back_and_retried_from_the_last_good_state(kind, reason):
    faulty, twin = FaultyHost(FACTORY, [0], None, [Fault(0, 2, kind)]), FACTORY(0)
    start = twin.initial_params()
    for round_ in (1, 2, 3):
        task = FitTask(params=start, round=round_)
        # only the hang needs the time limit (a loaded machine may take over 1 s for the others' fit)
        faulty.timeout = 1.0 if round_ == 2 and kind == "hang" else None
        ((_, outcome),) = faulty.fit_many([(0, task)])
        if round_ == 2:  # the fault trains first, then fails: the twin skips this round altogether
            assert isinstance(outcome, ClientFailure) and outcome.reason.startswith(reason)
            continue
        expected = twin.fit(task)
        assert isinstance(outcome, FitResult)
        assert torch.equal(outcome.params, expected.params) and outcome.metrics == expected.metrics


def run_with_faults(run_dir: Path, *overrides: str) -> list[dict[str, str]]:
    cmd = [
        sys.executable,
        "-m",
        "morlfed.run",
        "algo=fedavg",
        "engine=sb3",  # faults wrap one client at a time (deep-sea-treasure's engine=auto is vectorised)
        "n_clients=3",
        "rounds=3",
        "local_steps=200",
        "progress=false",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "metrics.json").exists()
    with open(run_dir / "final.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 3
    with open(run_dir / "rounds.csv") as fh:
        return list(csv.DictReader(fh))


def failures(row: dict[str, str]) -> dict[int, str]:
    return {int(c): why for c, _, why in (part.partition(":") for part in row["failed"].split(";") if part)}


def test_a_timeout_that_strikes_while_gradients_are_off_does_not_poison_later_fits():
    """A client's timeout inside ``torch.no_grad()``'s ``__enter__`` leaves gradients as they were.

    There, gradients are off and the ``with`` that would turn them on again is not yet in force;
    every later fit in the process would fail ("does not require grad").
    """
    with pytest.raises(ClientTimeout), alarm(0.2):
        torch.set_grad_enabled(False)  # where no_grad's __enter__ has got to when the alarm strikes
        time.sleep(10)
    assert torch.is_grad_enabled()
    client = FACTORY(0)
    client.fit(FitTask(params=client.initial_params(), round=1))  # trains: gradients work


@pytest.mark.slow
def test_sequential_run_survives_an_exception_a_hang_and_nan(tmp_path):
    faults = parse_faults(
        [
            {"client": 0, "round": 1, "kind": "raise"},
            {"client": 1, "round": 2, "kind": "hang"},
            {"client": 2, "round": 2, "kind": "nan"},
        ],
        3,
        3,
        "sequential",
    )
    factory = RLClientFactory(
        get_spec("deep-sea-treasure"), np.array([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]), seed=0, local_steps=200, rounds=3
    )
    executor = SequentialExecutor(client_timeout=15)  # an honest 200-step fit stays far inside it on a busy machine
    executor.start(FaultyClientFactory(factory, faults), 3)
    cfg = FederationConfig(n_clients=3, rounds=3, local_steps=200, progress=False)
    outcome = Federation(make_strategy("fedavg"), executor, cfg, Recorder(RunDirectory(tmp_path))).run()
    assert sorted(outcome.evaluations) == [0, 1, 2]
    with open(tmp_path / "rounds.csv") as fh:
        rounds = list(csv.DictReader(fh))
    r1, r2, r3 = (failures(r) for r in rounds)
    assert list(r1) == [0] and r1[0].startswith("exception InjectedFault: injected fault: client 0 raises in round 1")
    assert r2 == {1: "timeout after 15 s", 2: "non-finite parameters"}
    assert r3 == {}
    assert [r["aggregated"] for r in rounds] == ["2", "1", "3"]


@pytest.mark.slow
def test_dead_and_frozen_workers_are_restarted_from_the_checkpoint(tmp_path):
    # workers=2: worker 0 owns clients 0 and 2, worker 1 owns client 1
    rounds = run_with_faults(
        tmp_path / "run",
        "executor=process",
        "executor.workers=2",
        "executor.client_timeout=5",
        "executor.kill_grace=1",
        "checkpoint_every=1",
        "faults=[{client:1,round:2,kind:kill_worker},{client:2,round:2,kind:freeze}]",
    )
    r2 = failures(rounds[1])
    assert r2[1] == "worker 1 died (exit code -9) during this fit"
    assert r2[2] == "worker 0 no answer within client_timeout + kill_grace = 6 s (killed) during this fit"
    assert rounds[1]["aggregated"] == "1"  # client 0 finished before its worker froze on client 2
    assert set(rounds[1]["events"].split("; ")) == {
        "worker 1 restarted, clients [1] restored from checkpoint round_1",
        "worker 0 restarted, clients [0, 2] restored from checkpoint round_1",
    }
    assert failures(rounds[2]) == {} and rounds[2]["aggregated"] == "3" and rounds[0]["events"] == ""


@pytest.mark.slow
def test_ray_actors_that_die_or_freeze_fail_their_whole_batch_and_restart(tmp_path):
    pytest.importorskip("ray")
    # an actor fits its share as one batch: actor 0 (clients 0 and 2) gets 2 x 5 + 1 = 11 s
    rounds = run_with_faults(
        tmp_path / "run",
        "executor=ray",
        "executor.workers=2",
        "executor.num_cpus=2",
        "executor.client_timeout=5",
        "executor.kill_grace=1",
        "checkpoint_every=1",
        "faults=[{client:1,round:2,kind:kill_worker},{client:2,round:2,kind:freeze}]",
    )
    r2 = failures(rounds[1])
    frozen = "actor 0 no answer within client_timeout x 2 tasks + kill_grace = 11 s (killed) during the batch of clients [0, 2]"
    assert r2[0] == r2[2] == frozen  # which client of the batch froze is unknown: the batch fails
    assert r2[1].startswith("actor 1 died (") and r2[1].endswith(") during the batch of clients [1]")
    assert rounds[1]["aggregated"] == "0"
    assert set(rounds[1]["events"].split("; ")) == {
        "actor 1 restarted, clients [1] restored from checkpoint round_1",
        "actor 0 restarted, clients [0, 2] restored from checkpoint round_1",
    }
    assert failures(rounds[2]) == {} and rounds[2]["aggregated"] == "3"
