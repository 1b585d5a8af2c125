"""morlfed's own front-end: :class:`Federation` runs the rounds on an executor's clients.

For each round: :meth:`FederatedRound.begin <morlfed.federation.round.FederatedRound.begin>` ->
the executor runs ``client.fit`` -> :meth:`FederatedRound.end
<morlfed.federation.round.FederatedRound.end>` -> the recorder writes the round down
(:class:`~morlfed.federation.recorder.Recorder`). With ``eval_every=k`` the deployed models are
also evaluated after every k-th round (the learning curve); at the end every client's deployed
model is evaluated. With a checkpointer (the recorder's), a stop (Ctrl-C, SIGTERM:
:class:`~morlfed.core.interrupt.RunStopped`) loses at most the round in progress, and
:meth:`Federation.resume` continues from the latest checkpoint. The progress bar counts the budget.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from morlfed.core.interrupt import StopSignals
from morlfed.core.progress import RoundProgress
from morlfed.core.protocol import Evaluation, FitTask
from morlfed.federation.checkpoint import load_server_state
from morlfed.federation.config import FederationConfig, FederationOutcome
from morlfed.federation.recorder import Recorder
from morlfed.federation.round import FederatedRound, mean_scalarised, round_budgets
from morlfed.runtime.executors import Executor, FitOutcome
from morlfed.strategies.base import Strategy


class Federation:
    """Runs a strategy's rounds over the clients an executor owns, and tells a recorder what happened.

    Duties: drive :class:`~morlfed.federation.round.FederatedRound` round after round, its clients'
    fits and evaluations through the executor; keep the run's wall time (across a resume); stop
    between or within rounds on a signal; report each round, each evaluation and the end to the
    recorder. It writes nothing itself.

    :param strategy: the server strategy (not yet set up)
    :param executor: the executor (clients already started)
    :param cfg: loop settings
    :param recorder: writes the run's record (:class:`~morlfed.federation.recorder.Recorder`); by
        default one that only logs each round's line (``run.log``)
    :param stop: the signal handling the caller installed for the whole run (the CLI's); by
        default the rounds install their own when the recorder writes checkpoints
    """

    def __init__(
        self,
        strategy: Strategy,
        executor: Executor,
        cfg: FederationConfig,
        recorder: Recorder | None = None,
        stop: StopSignals | None = None,
    ) -> None:
        self.strategy, self.executor, self.cfg = strategy, executor, cfg
        self.recorder = recorder or Recorder()
        self.stop = stop or StopSignals()
        initial, layout = executor.initial()
        #: the round every front-end runs: sampling, configuring, aggregating, the deployed models
        self.round = FederatedRound(strategy, cfg, initial, layout)
        self.recorder.attach(self.round, executor, executor)
        self.start_round = 1
        #: a run resumed in place: the round it continues after and the loop's seconds until then
        self._resumed_after: int | None = None
        self._seconds_before: float | None = 0.0
        self._started = time.perf_counter()

    def resume(self, path: Path, in_place: bool = True) -> None:
        """Continue from the checkpoint at ``path``; the next :meth:`run` starts after its round.

        Restores the round (strategy, "+FT" models, step counts, global RNGs), every client's state
        and the recorder's logs up to its round.

        :param path: the checkpoint
        :param in_place: the same run goes on (``resume=``), so its wall time goes on from the
            checkpoint's; ``False``: a new run starts from it (``branch_from=``), and its wall time
            counts its own rounds only
        """
        state = load_server_state(path)
        self.round.load_state_dict(state)
        self.executor.load_clients(Path(path) / "clients")
        self.start_round = state["round"] + 1
        if in_place:
            self._resumed_after, self._seconds_before = state["round"], state.get("seconds")
        self.recorder.restore(state)

    def run(self) -> FederationOutcome:
        """Run the remaining rounds, then evaluate every client's deployed model.

        Raises :class:`~morlfed.core.interrupt.RunStopped` when a signal stops it. The phases it goes
        through (:meth:`begin_run`, then per round :meth:`begin` -> the executor's fit ->
        :meth:`end`, then :meth:`final_evaluation` and :meth:`conclude`) are public, so that a
        coordinator (:class:`~morlfed.federation.coordinator.Coordinator`) can run several
        federations' rounds with one fit.
        """
        cfg, stop = self.cfg, self.stop
        self.begin_run()
        with stop if self.recorder.checkpointer else contextlib.nullcontext():
            with RoundProgress(round_budgets(cfg), self.start_round, cfg.budget_unit, cfg.progress) as progress:
                for rnd in range(self.start_round, cfg.rounds + 1):
                    stop.check()
                    tasks = self.begin(rnd)
                    with stop.interruptible():
                        outcomes = self.executor.fit(
                            tasks, lambda cid: progress.advance(cfg.local_steps), progress.steps
                        )
                    self.end(rnd, outcomes, progress)
            stop.check()
            evaluations, events = self.final_evaluation()
        return self.conclude(evaluations, events)

    def begin_run(self) -> None:
        """Start the run's clock: the loop's seconds count from here (plus those before a resume)."""
        self._started = time.perf_counter()

    def begin(self, rnd: int) -> dict[int, FitTask]:
        """The first half of round ``rnd``: each participant's task (:meth:`FederatedRound.begin`).

        :param rnd: the round
        """
        return self.round.begin(rnd)

    def end(self, rnd: int, outcomes: Mapping[int, FitOutcome], progress: RoundProgress | None = None) -> None:
        """The rest of round ``rnd``, its fits done: end it, evaluate if due, report it.

        A stop abandons the round's evaluation.

        :param rnd: the round
        :param outcomes: the participants' outcomes, by client
        :param progress: the run's progress bar, if it shows one
        """
        report = self.round.end(rnd, outcomes)
        if self.round.eval_due(rnd) and rnd < self.cfg.rounds:  # the last round's is the final evaluation
            with self.stop.interruptible():
                evaluations = self.executor.evaluate(self.round.deployed(), self.round.eval_seeds())
            self.recorder.on_evaluation(rnd, evaluations)
            report.evaluated = mean_scalarised(evaluations)
        report.events = self.executor.take_events()
        report.seconds = self.round.since_begin()
        report.elapsed = self._elapsed()
        self.recorder.on_round(report)
        if progress is not None:
            progress.round_done(rnd, train_reward=f"{report.train_reward:.3g}", failed=str(len(report.failed)))

    def final_evaluation(self) -> tuple[dict[int, Evaluation], list[str]]:
        """Evaluate every client's deployed model after the last round; a stop abandons it.

        :return: the evaluations and the events seen meanwhile (a worker restarted)
        """
        with self.stop.interruptible():
            evaluations = self.executor.evaluate(self.round.deployed(), self.round.eval_seeds())
        return evaluations, self.executor.take_events()

    def conclude(self, evaluations: dict[int, Evaluation], events: list[str]) -> FederationOutcome:
        """The run's outcome, which the recorder writes down (:meth:`Recorder.on_end`).

        :param evaluations: the final evaluation (:meth:`final_evaluation`)
        :param events: what happened during it
        """
        elapsed = self._elapsed()
        seconds = time.perf_counter() - self._started if elapsed is None else elapsed
        outcome = self.round.outcome(evaluations, seconds, self._resumed_after, self._seconds_before)
        self.recorder.on_end(outcome, events)
        return outcome

    def _elapsed(self) -> float | None:
        """The loop's seconds since the run's start, the rounds before a resume included.

        ``None``: a checkpoint that predates the record did not say how long they took.
        """
        if self._seconds_before is None:
            return None
        return self._seconds_before + time.perf_counter() - self._started

    def deployed_models(self) -> dict[int, torch.Tensor | None]:
        """The model each client deploys now (after :meth:`run`: its final one; ``None``: its private personal model).

        A "+FT" run's clients deploy their own fine-tuned models; the others, the strategy's model for them.
        """
        return self.round.deployed()
