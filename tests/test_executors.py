"""Executors: the same seed gives the same run whatever runs the clients.

Sequential, worker processes or Ray actors; workers own fixed clients for the whole run; bad options
are refused.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import ClientFailure, Evaluation, FitResult, FitTask
from morlfed.envs import get_spec
from morlfed.federation import Federation, FederationConfig, Recorder
from morlfed.federation.checkpoint import Checkpointer
from morlfed.runtime.client import Client, TrainJob, TrainOutput
from morlfed.runtime.executors import (
    ClientHost,
    Executor,
    FitOutcome,
    ProcessExecutor,
    RayExecutor,
    SequentialExecutor,
    StepSink,
    make_executor,
    make_host,
)
from morlfed.runtime.faults import Fault, FaultyClientFactory, FaultyHost
from morlfed.storage.rundir import RunDirectory
from morlfed.storage.safestate import load_state
from morlfed.strategies.base import make_strategy
from morlfed.tasks.rl.client import RLClientFactory

ROOT = Path(__file__).resolve().parents[1]
# fedpref on a tiny Deep Sea Treasure run: 3 clients with different preferences, 2 rounds.
RUN = ["n_clients=3", "rounds=2", "local_steps=400", "progress=false"]


def run_cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``python -m morlfed.run`` into ``run_dir``; fails the test with its stderr if it fails."""
    cmd = [sys.executable, "-m", "morlfed.run", *RUN, *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def train_rewards(run_dir: Path) -> list[str]:
    """The per-round mean training reward column of rounds.csv (sensitive to every RNG draw)."""
    with open(run_dir / "rounds.csv") as fh:
        return [row["mean_train_reward"] for row in csv.DictReader(fh)]


@pytest.fixture(scope="module")
def sequential_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("sequential") / "run"
    run_cli(run_dir)
    return run_dir


def assert_same_run(a: Path, b: Path) -> None:
    assert (a / "final.csv").read_bytes() == (b / "final.csv").read_bytes()
    assert train_rewards(a) == train_rewards(b)
    assert (a / "clusters.jsonl").read_text() == (b / "clusters.jsonl").read_text()


@pytest.mark.slow
def test_process_executor_gives_the_sequential_run(sequential_run, tmp_path):
    run_cli(tmp_path / "run", "executor=process", "executor.workers=2")
    assert_same_run(sequential_run, tmp_path / "run")


@pytest.mark.slow
def test_ray_executor_gives_the_sequential_run(sequential_run, tmp_path):
    pytest.importorskip("ray")
    run_cli(tmp_path / "run", "executor=ray", "executor.workers=2", "executor.num_cpus=2")
    assert_same_run(sequential_run, tmp_path / "run")


class CountingClient(Client):
    """A tiny picklable client: its model is ``[cid, fits so far, worker pid]``.

    A fit adds ``cid`` to the received vector (client 2 is told to fail in round 3), ``evaluate``
    reports the vector's sum. Its state is its ``fits`` counter.
    """

    def __init__(self, cid: int) -> None:
        super().__init__([cid], seed=0, local_steps=1)
        self.cid, self.fits = cid, 0

    @property
    def layout(self) -> ParamLayout:
        return ParamLayout.from_shapes({"w": (3,)})

    def initial_params(self) -> torch.Tensor:
        return torch.zeros(3)

    def _train(self, jobs: Mapping[int, TrainJob]) -> dict[int, TrainOutput]:
        ((cid, job),) = jobs.items()
        if (cid, job.keys[0]) == (2, 3):
            raise RuntimeError("told to fail")
        self.fits += 1
        return {cid: TrainOutput(job.start + cid)}

    def _loss(self, cid: int, params: torch.Tensor, keys: tuple[int, int]) -> tuple[float, int | None]:
        raise AssertionError("CountingClient is never asked for a loss")

    def _fit_metrics(self, cid: int, outputs: list[TrainOutput], serving: int) -> dict[str, float]:
        info = torch.tensor([float(cid), float(self.fits), float(os.getpid())])
        owner, fits, pid = info.tolist()
        return {"cid": owner, "fits": fits, "pid": pid}

    def _personal_metrics(self, cid: int, output: TrainOutput) -> dict[str, float]:
        return {}

    def _num_samples(self, cid: int, steps: int, trained: int) -> int:
        return 1

    def evaluate_client(self, cid: int, params: torch.Tensor | None, seed: int) -> Evaluation:
        assert params is not None, "CountingClient has no personal model"
        return Evaluation(
            vector_return=params.numpy(),
            discounted_return=params.numpy(),
            scalarised=float(params.sum()),
            scalarised_discounted=float(seed),
        )

    def get_state(self, cid: int) -> dict[str, Any]:
        return {"fits": self.fits}

    def set_state(self, cid: int, state: dict[str, Any]) -> None:
        self.fits = state["fits"]


@pytest.mark.slow
def test_workers_own_fixed_clients_for_the_whole_run():
    executor = ProcessExecutor(workers=2)
    executor.start(CountingClient, 5)
    try:
        pids = {}
        for round_ in (1, 2):
            tasks = {cid: FitTask(params=torch.full((3,), float(round_)), round=round_) for cid in range(5)}
            results = executor.fit(tasks)
            for cid, res in results.items():
                assert torch.equal(res.params, torch.full((3,), float(round_ + cid)))
                owner_cid, fits, pid = res.metrics["cid"], res.metrics["fits"], res.metrics["pid"]
                assert owner_cid == cid and fits == round_  # the same client object, round after round
                pids.setdefault(cid, pid)
                assert pids[cid] == pid  # never moved to another process
        assert {cid: pids[cid] == pids[cid % 2] for cid in range(5)} == dict.fromkeys(range(5), True)
        assert pids[0] != pids[1] and os.getpid() not in pids.values()
        # one client's exception does not stop its worker or the other clients
        results = executor.fit({cid: FitTask(params=torch.zeros(3), round=3) for cid in range(5)})
        assert isinstance(results[2], ClientFailure) and "told to fail" in results[2].reason
        assert all(isinstance(results[c], FitResult) for c in (0, 1, 3, 4))
        evals = executor.evaluate({c: torch.ones(3) * c for c in range(5)}, {c: 10 + c for c in range(5)})
        assert [evals[c].scalarised for c in range(5)] == [0.0, 3.0, 6.0, 9.0, 12.0]
        assert [evals[c].scalarised_discounted for c in range(5)] == [10.0, 11.0, 12.0, 13.0, 14.0]
    finally:
        executor.close()
    assert not executor.procs


def test_sequential_executor_matches_the_counting_client():
    executor = SequentialExecutor()
    executor.start(CountingClient, 3)
    results = executor.fit({cid: FitTask(params=torch.ones(3), round=1) for cid in range(3)})
    assert [results[c].params.tolist() for c in range(3)] == [[1.0] * 3, [2.0] * 3, [3.0] * 3]


def test_bad_executor_options_are_refused():
    with pytest.raises(ValueError, match="unknown executor 'threads'; valid: sequential, process, ray"):
        make_executor("threads")
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        make_executor("process", workers=0)
    with pytest.raises(ValueError, match="start_method must be 'spawn' or 'forkserver'"):
        make_executor("process", start_method="fork")
    with pytest.raises(ValueError, match="client_timeout must be a number of seconds >= 0"):
        make_executor("sequential", client_timeout=-1)
    with pytest.raises(TypeError):
        make_executor("sequential", workers=2)


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ImportError, match=re.escape(f"{sys.executable} -m pip install -e '.[ray]'")):
        make_executor("ray")


# ---------------------------------------------------------------------------------------------
# the engine seam: a factory's own host
# ---------------------------------------------------------------------------------------------
class RecordingHost(ClientHost):
    """The default host that also logs every batch it is given to ``log_dir/host_<first cid>.jsonl``.

    One line per call: operation, client ids, process id.
    """

    def __init__(self, factory: Any, cids: Sequence[int], timeout: float | None, log_dir: str) -> None:
        super().__init__(factory, cids, timeout)
        self.log = Path(log_dir) / f"host_{self.cids[0]}.jsonl"

    def _record(self, op: str, cids: list[int]) -> None:
        with open(self.log, "a") as fh:
            fh.write(json.dumps({"op": op, "cids": cids, "pid": os.getpid()}) + "\n")

    def fit_many(
        self, tasks: Sequence[tuple[int, FitTask]], on_steps: StepSink | None = None
    ) -> Iterator[tuple[int, FitOutcome]]:
        self._record("fit", [cid for cid, _ in tasks])
        yield from super().fit_many(tasks, on_steps)

    def evaluate_many(self, requests: Sequence[tuple[int, torch.Tensor | None, int]]) -> dict[int, Evaluation]:
        self._record("evaluate", [cid for cid, _, _ in requests])
        return super().evaluate_many(requests)


@dataclass
class RecordingFactory:
    """A picklable factory whose ``make_host`` builds a :class:`RecordingHost`."""

    factory: Any
    log_dir: str

    def __call__(self, cid: int) -> Any:
        return self.factory(cid)

    def make_host(self, cids: list[int], timeout: float | None) -> ClientHost:
        return RecordingHost(self.factory, cids, timeout, self.log_dir)


def batches(log_dir: Path) -> dict[str, list[tuple[str, list[int]]]]:
    """Every host's recorded calls, by log file name."""
    return {
        p.stem: [(e["op"], e["cids"]) for e in map(json.loads, p.read_text().splitlines())]
        for p in sorted(log_dir.glob("host_*.jsonl"))
    }


def counting_rounds(executor: Executor) -> list[dict[int, Any]]:
    """Three rounds (all five clients twice, then clients 0, 1 and 4) and an evaluation."""
    out: list[dict[int, Any]] = []
    for round_, cids in ((1, range(5)), (2, range(5)), (3, (0, 1, 4))):
        results: dict[int, Any] = executor.fit(
            {cid: FitTask(params=torch.full((3,), float(round_)), round=round_) for cid in cids}
        )
        out.append({cid: (r.params.tolist(), [r.metrics["cid"], r.metrics["fits"]]) for cid, r in results.items()})
    evals = executor.evaluate({c: torch.ones(3) * c for c in range(5)}, {c: 10 + c for c in range(5)})
    out.append({c: (e.scalarised, e.scalarised_discounted) for c, e in evals.items()})
    return out


def ray_actors() -> Executor:
    """Two Ray actors on a local instance.

    This module's classes travel by value (Ray workers cannot import test modules).
    """
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return RayExecutor(workers=2, num_cpus=2)


ON_TWO_WORKERS = {"host_0": [[0, 2, 4], [0, 2, 4], [0, 4]], "host_1": [[1, 3], [1, 3], [1]]}


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (SequentialExecutor, {"host_0": [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [0, 1, 4]]}),
        (lambda: ProcessExecutor(workers=2), ON_TWO_WORKERS),
        (ray_actors, ON_TWO_WORKERS),
    ],
    ids=["sequential", "process", "ray"],
)
@pytest.mark.slow
def test_a_factory_host_gets_each_workers_tasks_as_one_batch(make, expected, tmp_path):
    plain = SequentialExecutor()
    plain.start(CountingClient, 5)
    recorded = make()
    recorded.start(RecordingFactory(CountingClient, str(tmp_path)), 5)
    try:
        assert counting_rounds(recorded) == counting_rounds(plain)
    finally:
        recorded.close()
    calls = batches(tmp_path)
    assert {h: [cids for op, cids in c if op == "fit"] for h, c in calls.items()} == expected
    assert {h: [cids for op, cids in c if op == "evaluate"] for h, c in calls.items()} == {
        h: [fits[0]] for h, fits in expected.items()
    }


@pytest.mark.parametrize(
    "make", [SequentialExecutor, lambda: ProcessExecutor(workers=2)], ids=["sequential", "process"]
)
@pytest.mark.slow
def test_checkpoints_go_through_the_hosts_state(make, tmp_path):
    executor = make()
    executor.start(RecordingFactory(CountingClient, str(tmp_path)), 3)
    try:
        for round_ in (1, 2, 3):
            if round_ == 3:
                executor.save_clients(tmp_path)
            executor.fit({cid: FitTask(params=torch.zeros(3), round=round_) for cid in range(3)})
        assert load_state(tmp_path / "client_1.safetensors") == {"fits": 2}
        executor.load_clients(tmp_path)  # back to two fits each
        results = executor.fit({cid: FitTask(params=torch.zeros(3), round=4) for cid in range(3)})
        assert [results[c].metrics["fits"] for c in range(3)] == [3.0, 3.0, 3.0]
    finally:
        executor.close()


@pytest.mark.slow
def test_a_run_with_a_factory_host_on_worker_processes_is_the_sequential_run(tmp_path):
    spec = get_spec("deep-sea-treasure")
    fed = FederationConfig(n_clients=3, rounds=2, local_steps=200, seed=2, progress=False)
    factory = RLClientFactory(spec, np.array([[0.2, 0.8], [0.5, 0.5], [0.9, 0.1]]), fed.seed, 200, 2)
    outcomes = []
    for name, executor, fac in (
        ("plain", SequentialExecutor(), factory),
        ("hosted", ProcessExecutor(workers=2), RecordingFactory(factory, str(tmp_path))),
    ):
        executor.start(fac, fed.n_clients)
        try:
            recorder = Recorder(RunDirectory(tmp_path / name), Checkpointer(tmp_path / name, 1))
            run = Federation(make_strategy("fedavg"), executor, fed, recorder)
            outcomes.append(run.run())
        finally:
            executor.close()
    for cid in range(3):
        np.testing.assert_array_equal(
            outcomes[0].evaluations[cid].vector_return, outcomes[1].evaluations[cid].vector_return
        )
    assert train_rewards(tmp_path / "plain") == train_rewards(tmp_path / "hosted")
    fits = {h: [cids for op, cids in calls if op == "fit"] for h, calls in batches(tmp_path).items()}
    assert fits == {"host_0": [[0, 2], [0, 2]], "host_1": [[1], [1]]}
    assert sorted(p.name for p in (tmp_path / "hosted" / "checkpoints" / "round_2" / "clients").iterdir()) == [
        "client_0.safetensors",
        "client_1.safetensors",
        "client_2.safetensors",
    ]


def test_hosts_are_the_factorys_own_or_per_client(tmp_path):
    assert type(make_host(CountingClient, [0, 1], None)) is ClientHost
    assert type(make_host(RecordingFactory(CountingClient, str(tmp_path)), [0, 1], None)) is RecordingHost
    faults = [Fault(0, 1, "raise")]
    host = make_host(FaultyClientFactory(CountingClient, faults), [0, 1], 5.0)
    assert type(host) is FaultyHost and host.timeout == 5.0 and host.faults == {(0, 1): "raise"}
    assert all(isinstance(client, CountingClient) for client in host.clients.values())
    # an engine's host is used as is: fault injection applies to per-client hosts
    engine = make_host(FaultyClientFactory(RecordingFactory(CountingClient, str(tmp_path)), faults), [0, 1], None)
    assert type(engine) is RecordingHost and isinstance(engine.clients[0], CountingClient)


class SlowBatchHost(ClientHost):
    """The default host, but it answers only once its whole batch is done, 0.7 s per client."""

    def fit_many(
        self, tasks: Sequence[tuple[int, FitTask]], on_steps: StepSink | None = None
    ) -> Iterator[tuple[int, FitOutcome]]:
        outcomes = list(super().fit_many(tasks, on_steps))
        time.sleep(0.7 * len(tasks))
        yield from outcomes


@dataclass
class SlowBatchFactory:
    """Builds a :class:`SlowBatchHost` that says whether it is ``batched``."""

    batched: bool

    def __call__(self, cid: int) -> CountingClient:
        return CountingClient(cid)

    def make_host(self, cids: list[int], timeout: float | None) -> ClientHost:
        host = SlowBatchHost(self, cids, timeout)
        host.batched = self.batched
        return host


@pytest.mark.slow
@pytest.mark.parametrize("batched", [True, False])
def test_a_batched_host_gets_the_time_of_its_whole_batch(batched):
    # three clients in 2.1 s: within 3 x 1 + 0.5 s for the batch, past 1 + 0.5 s for one answer
    executor = ProcessExecutor(workers=1, client_timeout=1, kill_grace=0.5)
    executor.start(SlowBatchFactory(batched), 3)
    try:
        results = executor.fit({cid: FitTask(params=torch.zeros(3), round=1) for cid in range(3)})
    finally:
        executor.close()
    if batched:
        assert all(isinstance(r, FitResult) for r in results.values())
    else:
        assert (
            results[0].reason
            == "worker 0 no answer within client_timeout + kill_grace = 1.5 s (killed) during this fit"
        )
        assert results[2].reason == "not run: worker 0 restarted after client 0 failed"


def test_remote_deadlines_are_per_client_when_streamed_and_per_batch_otherwise():
    executor = ProcessExecutor(client_timeout=5, kill_grace=1)
    executor._batched = [False, True]
    assert executor._deadline(0, 3) == (6.0, "client_timeout + kill_grace")
    assert executor._deadline(1, 3) == (16.0, "client_timeout x 3 tasks + kill_grace")
    assert ProcessExecutor(client_timeout=0)._deadline(0, 3) is None
    pytest.importorskip("ray")
    assert RayExecutor(client_timeout=5, kill_grace=1)._deadline(0, 3) == (
        16.0,
        "client_timeout x 3 tasks + kill_grace",
    )
    assert RayExecutor(client_timeout=None)._deadline(0, 3) is None
