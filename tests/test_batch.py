"""Many runs as one batch (morlfed/experiment/batch.py, morlfed/cli/launcher.py): each run's own numbers.

Known answers: a run trained in a batch with other runs (other seeds, strategies, preference
distributions, client counts and rounds, a "+FT" run) writes exactly the final.csv and metrics.json it writes
alone, on the CPU; a run whose strategy raises fails alone and a run whose client diverges (NaN)
leaves the others bit-identical; a signal stops the whole batch, each run keeping its checkpoint;
incompatible runs never share a batch; the command line's batched sweep writes every run
directory, and a stopped campaign continues with ``resume=SWEEP_DIR`` to the uninterrupted numbers;
the batch shows one progress bar over all its runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from morlfed.baselines.fedavg import FedAvg
from morlfed.core.interrupt import RunStopped
from morlfed.core.protocol import FitTask
from morlfed.core.settings import ConfigError
from morlfed.experiment import Experiment, Settings, build_experiment, run
from morlfed.experiment import batch as batching
from morlfed.experiment.batch import group_runs, run_batch, runs_per_batch
from morlfed.strategies.fedpref import FedPref
from morlfed.tasks.rl.task import RLTask

#: metrics.json keys that describe how a run was carried out, not what it computed: the wall time
#: (a batch's rounds also take the other runs' time), the executor (``batched``) and its workers
#: (the batch is one worker), and the batch's size (``batch_runs``, absent from a run alone)
HOW_IT_RAN = {"wall_time_s", "executor", "workers", "batch_runs"}


def experiment(
    seed: int,
    strategy: Any,
    n_clients: int = 3,
    dist: str = "equidistant",
    rounds: int = 2,
    progress: bool = False,
    **settings: Any,
) -> Experiment:
    """A tiny deep-sea-treasure run on the vectorised engine (200 random steps, then training from round 2)."""
    task = RLTask.create(
        "deep-sea-treasure", n_clients, seed, dist, engine="vectorised", device="cpu", precision="fp32"
    )
    fed = Settings(n_clients=n_clients, rounds=rounds, local_steps=200, seed=seed, progress=progress, **settings)
    return build_experiment(task, strategy, fed, executor="sequential")


def metrics(run_dir: Path) -> dict[str, Any]:
    """The run's metrics.json without the keys that say how it ran."""
    return {k: v for k, v in json.loads((run_dir / "metrics.json").read_text()).items() if k not in HOW_IT_RAN}


def assert_same_run(batched: Path, alone: Path) -> None:
    """The two run directories hold the same results, bit for bit."""
    assert (batched / "final.csv").read_bytes() == (alone / "final.csv").read_bytes()
    assert metrics(batched) == metrics(alone)
    assert (batched / "preferences.csv").read_bytes() == (alone / "preferences.csv").read_bytes()


class Raises(FedAvg):
    """FedAvg whose aggregation raises in round 2 (a strategy's bug, planted)."""

    def aggregate(self, rnd: int, results: Any) -> None:
        """FedAvg's aggregation, which raises in round 2.

        :param rnd: the round
        :param results: the usable results
        """
        if rnd == 2:
            raise RuntimeError("planted failure")
        super().aggregate(rnd, results)


class Diverges(FedAvg):
    """FedAvg that sends client 0 a model of huge weights in round 2: its training overflows to NaN."""

    def configure(self, round: int, participants: Sequence[int]) -> dict[int, FitTask]:
        """FedAvg's tasks, client 0's starting from 1e30 everywhere in round 2.

        :param round: the round
        :param participants: the round's clients
        """
        tasks = super().configure(round, participants)
        if round == 2:
            tasks[0] = replace(tasks[0], params=torch.full_like(tasks[0].params, 1e30))
        return tasks


class Signals(FedAvg):
    """FedAvg that sends its own process SIGTERM while it aggregates round 1 (a stop between rounds)."""

    def aggregate(self, rnd: int, results: Any) -> None:
        """FedAvg's aggregation; in round 1, SIGTERM to this process too.

        :param rnd: the round
        :param results: the usable results
        """
        super().aggregate(rnd, results)
        if rnd == 1:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs of the batches below, each run alone."""
    root = tmp_path_factory.mktemp("alone")
    run(experiment(0, FedPref()), root / "fedpref-0")
    run(experiment(1, FedAvg(), 2, "dirichlet", 3, finetune=True), root / "fedavg-ft-1")
    return root


def test_each_run_of_a_batch_gets_the_numbers_it_gets_alone(alone: Path, tmp_path: Path) -> None:
    runs = [experiment(0, FedPref()), experiment(1, FedAvg(), 2, "dirichlet", 3, finetune=True)]
    results = run_batch(runs, [tmp_path / "a", tmp_path / "b"])
    assert all(isinstance(r, dict) for r in results)
    assert_same_run(tmp_path / "a", alone / "fedpref-0")
    assert_same_run(tmp_path / "b", alone / "fedavg-ft-1")
    recorded = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert (recorded["executor"], recorded["workers"], recorded["batch_runs"]) == ("batched", 1, 2)
    log = (tmp_path / "a" / "run.log").read_text()
    assert "seed0" in log and "seed1" not in log  # each run.log holds its own run's lines only


def test_a_failing_run_fails_alone(alone: Path, tmp_path: Path) -> None:
    runs = [experiment(0, FedPref()), experiment(1, Raises()), experiment(2, Diverges(), 2)]
    results = run_batch(runs, [tmp_path / "ok", tmp_path / "raises", tmp_path / "nan"])
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "planted failure"
    assert not (tmp_path / "raises" / "metrics.json").exists()
    assert "the run failed: RuntimeError: planted failure" in (tmp_path / "raises" / "run.log").read_text()
    assert_same_run(tmp_path / "ok", alone / "fedpref-0")
    assert isinstance(results[2], dict)  # a diverging client is left out of its rounds, as in a run alone
    assert "non-finite parameters" in (tmp_path / "nan" / "rounds.csv").read_text()


def test_a_batch_shows_one_progress_bar_over_all_its_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plans = [experiment(0, FedAvg(), progress=True), experiment(1, FedPref(), n_clients=2, rounds=3, progress=True)]
    run_batch(plans, [tmp_path / "a", tmp_path / "b"])
    err = capsys.readouterr().err
    # 2 rounds x 3 clients and 3 rounds x 2 clients of 200 steps: 2 400 env steps, all shown by the end
    assert "2/2 runs trained" in err and "2.40k/2.40k" in err
    assert err.count("estimated time of its rounds") == 1


def test_a_signal_stops_the_whole_batch_each_run_keeping_its_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(RunStopped):
        run_batch([experiment(0, FedPref()), experiment(1, Signals(), 2)], [tmp_path / "a", tmp_path / "b"])
    for name in ("a", "b"):
        assert (tmp_path / name / "checkpoints" / "round_1").is_dir()
        assert not (tmp_path / name / "metrics.json").exists()


def test_incompatible_runs_never_share_a_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sb3 = build_experiment(
        RLTask.create("deep-sea-treasure", 2, engine="sb3", device="cpu"),
        FedAvg(),
        Settings(n_clients=2, rounds=2, local_steps=200),
        executor="sequential",
    )
    plans = [
        experiment(0, FedPref()),
        experiment(1, FedAvg(), 2),
        more_steps(300),
        sb3,
        experiment(3, FedAvg(), 2),
    ]
    assert group_runs(plans, max_runs=None) == [[0, 1, 4], [2], [3]]
    assert group_runs(plans, max_runs=2) == [[0, 1], [4], [2], [3]]
    with pytest.raises(
        ConfigError, match="cannot train as one batch: run 1 cannot share a batch with run 0: local_steps"
    ):
        run_batch([plans[0], plans[2]], [tmp_path / "x", tmp_path / "y"])
    with pytest.raises(
        ConfigError,
        match="cannot train as one batch: run 1 cannot share a batch: its clients do not train as one batched",
    ):
        run_batch([plans[0], plans[3]], [tmp_path / "v", tmp_path / "w"])
    factory = batching.batch_factory(plans[0])
    assert factory is not None
    per_client = factory.client_bytes()
    assert per_client == 4 * (10_000 * (2 * 2 + 1 + 2) + 6 * 2 * (2 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4))
    monkeypatch.setattr(batching, "free_memory", lambda device: 10 * 3 * per_client * 2)
    assert runs_per_batch(factory, 3) == 10  # half the free memory, 3 clients a run
    assert runs_per_batch(factory, 3, max_runs=4) == 4  # the user's limit wins


def more_steps(steps: int) -> Experiment:
    """A run as :func:`experiment`'s but for its local budget."""
    task = RLTask.create("deep-sea-treasure", 3, 2, engine="vectorised", device="cpu", precision="fp32")
    fed = Settings(n_clients=3, rounds=2, local_steps=steps, seed=2, progress=False)
    return build_experiment(task, FedPref(), fed, executor="sequential")


def test_the_command_lines_batched_sweep_and_its_resume(morlfed_cli: Any, tmp_path: Path) -> None:
    sweep = [
        "-m",
        "seed=0,1,2",
        "n_clients=2",
        "rounds=2",
        "local_steps=200",
        "engine=vectorised",
        "precision=fp32",
        "device=cpu",
        "executor=sequential",
        "progress=false",
        "checkpoint_every=1",
        "hydra/launcher=batched",
        "hydra.sweep.dir=mr",
    ]
    done = morlfed_cli(sweep, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    jobs = sorted(p for p in (tmp_path / "mr").iterdir() if p.is_dir())
    assert [p.name for p in jobs] == [f"{k}_fedpref_equidistant_seed{k}" for k in range(3)]
    for job in jobs:
        for name in ("config.yaml", "rounds.csv", "final.csv", "metrics.json", "run.log", "preferences.csv"):
            assert (job / name).is_file(), f"{job.name} has no {name}"
        assert json.loads((job / "metrics.json").read_text())["batch_runs"] == 3
    reference = {job.name: (job / "final.csv").read_bytes() for job in jobs}
    # as if killed: job 0 after its first round, job 2 before it started; job 1 finished
    stopped = jobs[0]
    for name in ("metrics.json", "final.csv", "front.png"):
        (stopped / name).unlink()
    shutil.rmtree(stopped / "models")
    shutil.rmtree(stopped / "checkpoints" / "round_2")
    shutil.rmtree(jobs[2])
    untouched = (jobs[1] / "metrics.json").read_bytes()
    resumed = morlfed_cli([f"resume={tmp_path / 'mr'}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "completed already; skipped" in resumed.stderr
    assert (jobs[1] / "metrics.json").read_bytes() == untouched
    assert {job.name: (job / "final.csv").read_bytes() for job in jobs} == reference
    log = (stopped / "run.log").read_text()
    assert "resumed in place, starting from checkpoint" in log
    rounds = [line.split(",")[0] for line in (stopped / "rounds.csv").read_text().splitlines()[1:]]
    assert rounds == ["1", "2"]
