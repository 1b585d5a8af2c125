"""What a run tells its user while it goes: where and how it runs, an estimate of the time, a progress bar.

Within seconds of launch its directory, budget, engine, executor, threads and cores; after its first
round an estimate of the time; a progress bar that counts env steps and moves as each client's fit
comes back, and while an engine's batch of clients still trains, starting at the rounds done when
the run is resumed; a batch of runs has one bar over all their budgets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_executors import CountingClient

from morlfed import envs
from morlfed.core.progress import BatchProgress, RoundBudgets, RoundProgress, StepReporter, duration
from morlfed.core.protocol import FitResult, FitTask
from morlfed.runtime.executors import Executor, ProcessExecutor, SequentialExecutor
from morlfed.tasks.rl.vectorised.factory import VectorisedClientFactory


def test_a_resumed_bar_starts_at_the_rounds_done_and_moves_within_a_round(capsys):
    with RoundProgress(RoundBudgets(300, 20, 300), start_round=5, unit="env steps") as progress:
        assert (progress.bar.n, progress.bar.total) == (4 * 300, 20 * 300)
        progress.advance(100)  # one client's fit of round 5
        assert progress.bar.n == 4 * 300 + 100
        progress.advance(200)
        progress.round_done(5, train_reward="1.5")
        progress.round_done(6)
    err = capsys.readouterr().err
    assert "4/20 rounds" in err and "5/20 rounds" in err and "6/20 rounds" in err and "0/20" not in err
    assert "morlfed: round 5/20 took " in err and "estimated time of rounds 5-20: about " in err
    assert err.count("estimated time") == 1  # once, after the first round this process ran


def test_steps_reported_during_a_round_are_not_counted_twice():
    with RoundProgress(RoundBudgets(1000, 2, 1000), start_round=1, unit="env steps") as progress:
        progress.steps(300)  # a batch of four 250-step clients still training
        progress.steps(400)
        assert progress.bar.n == 700
        for _ in range(4):  # the batch answers: only the steps not shown yet move the bar
            progress.advance(250)
        assert progress.bar.n == 1000
        progress.round_done(1)
        progress.steps(5000)  # a report past the round's budget (rollouts finish) stops at it
        assert progress.bar.n == 2000
        progress.advance(500)
        progress.advance(500)
        assert progress.bar.n == 2000


def test_a_step_reporter_sends_chunks_fixed_by_the_budget_not_the_clock():
    sent: list[int] = []
    report = StepReporter(sent.append, budget=1000, reports=10)
    for _ in range(250):
        report(3)  # three clients stepped
    assert sent == [102] * 7 and report.pending == 36  # chunks of at least 100 steps, 750 in all


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sequential", "process"])
def test_the_vectorised_engine_moves_the_bar_while_its_batch_trains(kind: str):
    """The engine's steps reported while its batch trains move the bar before any client's result is back.

    The engine answers once its whole batch is done; the steps it reports meanwhile must move the
    bar before any client's result is back, and the bar must end at the round's budget.
    """
    clients, steps = 4, 400
    prefs = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.1, 0.9]])
    factory = VectorisedClientFactory(envs.get_spec("deep-sea-treasure"), prefs, 0, steps, 2)
    executor: Executor = SequentialExecutor() if kind == "sequential" else ProcessExecutor(workers=2)
    executor.start(factory, clients)
    try:
        initial, _ = executor.initial()
        tasks = {cid: FitTask(params=initial, round=1) for cid in range(clients)}
        events: list[tuple[str, int]] = []
        with RoundProgress(RoundBudgets(clients * steps, 1, clients * steps), start_round=1, unit="env steps") as bar:

            def on_steps(n: int) -> None:
                events.append(("steps", n))
                bar.steps(n)

            def on_result(cid: int) -> None:
                events.append(("result", int(bar.bar.n)))
                bar.advance(steps)

            outcomes = executor.fit(tasks, on_result, on_steps)
            assert bar.bar.n == clients * steps
    finally:
        executor.close()
    assert all(isinstance(o, FitResult) for o in outcomes.values())
    first = next(i for i, (what, _) in enumerate(events) if what == "result")
    shown_before = sum(n for what, n in events[:first] if what == "steps")
    one_batch = clients * steps // (1 if kind == "sequential" else 2)  # the first batch to answer
    assert shown_before >= 0.9 * one_batch  # about 20 reports per batch, all before it answers
    assert events[first][1] == shown_before  # the bar showed them before the first answer
    spent = sum(o.steps_spent or 0 for o in outcomes.values() if isinstance(o, FitResult))
    assert sum(n for what, n in events if what == "steps") <= spent


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (2.46, 42, 420, 4680, 9000)] == ["2.5 s", "42 s", "7 min", "78 min", "2.5 h"]


@pytest.mark.slow
def test_every_executor_reports_each_client_as_soon_as_its_fit_is_back():
    sequential = SequentialExecutor()
    sequential.start(CountingClient, 4)
    tasks = {cid: FitTask(params=torch.zeros(3), round=1) for cid in range(4)}
    fitted_so_far = []
    sequential.fit(tasks, lambda cid: fitted_so_far.append(sum(c.fits for c in sequential.host.clients.values())))
    assert fitted_so_far == [1, 2, 3, 4]  # called during the round, one client at a time

    workers = ProcessExecutor(workers=2)
    workers.start(CountingClient, 4)
    try:
        seen: list[int] = []
        assert set(workers.fit(tasks, seen.append)) == set(range(4))
        assert sorted(seen) == [0, 1, 2, 3]
    finally:
        workers.close()


def test_the_launch_summary_says_where_what_and_how_long(tmp_path: Path, morlfed_cli):
    out = tmp_path / "run"
    done = morlfed_cli(["n_clients=3", "rounds=3", "local_steps=300", "progress=false", f"hydra.run.dir={out}"])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("morlfed: ")]
    assert lines[:3] == [
        f"morlfed: run directory {out}",
        "morlfed: deep-sea-treasure/fedpref/equidistant/seed0: 3 rounds x 3 clients x 300 env steps = 2,700 env steps",
        f"morlfed: engine=vectorised, precision=fp32, device=cpu; executor=sequential; torch_threads=1; {lines[2].split('; ')[-1]}",
    ]
    assert lines[2].endswith(" cores")
    assert lines[3].startswith("morlfed: round 1/3 took ") and "estimated time of rounds 1-3: about " in lines[3]
    assert "estimated time of rounds 1-3" in (out / "run.log").read_text()


def test_round_budgets_add_up_in_closed_form_as_a_list_of_rounds_would() -> None:
    budgets = RoundBudgets(per_round=300, rounds=5, last=900)  # a "+FT" run's last round has every client
    listed = [300, 300, 300, 300, 900]
    assert [budgets.of(r) for r in range(0, 7)] == [0, *listed, 0]
    for first in range(1, 7):
        for last in range(0, 7):
            assert budgets.total(first, last) == sum(listed[first - 1 : last])
    assert budgets.total() == 2100 and RoundBudgets(3, 10**12, 3).total() == 3 * 10**12  # no loop over the rounds


def test_a_batch_bar_counts_every_runs_remaining_rounds_and_the_runs_done(capsys):
    # run 0: 2 rounds of 30 steps from round 1; run 1: resumed after round 1 of 3 rounds of 20
    budgets = [RoundBudgets(30, 2, 30), RoundBudgets(20, 3, 20)]
    with BatchProgress(budgets, [1, 2], "env steps") as progress:
        assert (progress.bar.total, progress.bar.n, progress.bar.desc) == (60 + 40, 0, "0/2 runs trained")
        progress.begin_round([0, 1])
        progress.steps(45)
        progress.steps(1000)  # never past the round's budget (30 + 20)
        assert progress.bar.n == 50
        progress.round_done()
        assert progress.bar.n == 50 and progress.bar.desc == "0/2 runs trained"
        progress.begin_round([0, 1])
        progress.round_done()
        assert (progress.bar.n, progress.bar.desc) == (100, "2/2 runs trained")
    err = capsys.readouterr().err
    assert err.count("estimated time of its rounds") == 1  # once, after the batch's first round


def test_a_failed_run_leaves_the_batch_bar_with_its_remaining_rounds():
    budgets = [RoundBudgets(30, 3, 30), RoundBudgets(20, 3, 20)]
    with BatchProgress(budgets, [1, 1], "env steps", enabled=False) as progress:
        progress.begin_round([0, 1])
        progress.round_done(failed={1})  # run 1 failed in round 1: its rounds 2 and 3 go
        assert (progress.total, progress.shown, progress.bar.desc) == (90 + 20, 50, "1/2 runs trained")
        progress.begin_round([0])
        progress.round_done()
        progress.begin_round([0])
        progress.round_done()
        assert (progress.total, progress.shown, progress.bar.desc) == (110, 110, "2/2 runs trained")
