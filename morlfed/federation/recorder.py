"""The run directory as an observer of the rounds: :class:`Recorder`.

A front-end (morlfed's loop, Flower's strategy) runs the rounds (:class:`~morlfed.federation.round.FederatedRound`)
and tells its recorder what happened; the recorder writes everything a run records:

* per round (:meth:`Recorder.on_round`): a row of ``rounds.csv``, the strategy's diagnostics in
  ``clusters.jsonl``, ``similarity_<r>.npy`` (``save_similarity``), the round's line of the
  ``morlfed.federation`` log (``run.log``) with a warning for each failed client and event, the
  tracker's scalars, and with a checkpointer the checkpoint after the round;
* per evaluation of the deployed models (:meth:`Recorder.on_evaluation`): ``evaluations.csv``;
* at the end (:meth:`Recorder.on_end`): the final evaluation's learning-curve point, the deployed
  models (``models/``, :mod:`morlfed.federation.deployment`), the task's results (``final.csv``, ...,
  ``metrics.json`` last) and the tracker's final scalars.

A recorder without a run directory still logs the round lines and feeds its tracker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from morlfed.core.protocol import Evaluation
from morlfed.federation.checkpoint import Checkpointer, csv_rows, read_log
from morlfed.federation.config import FederationOutcome
from morlfed.federation.deployment import MODELS, PersonalModels
from morlfed.federation.round import FederatedRound, RoundReport, mean_metric, mean_scalarised
from morlfed.runtime.executors import Executor
from morlfed.storage.rundir import RunDirectory
from morlfed.tracking import Tracker, flat_scalars, round_line, round_scalars

#: the round lines and warnings keep the logger name runs have always logged them under
log = logging.getLogger("morlfed.federation")

#: the task's results writer: the run directory and the outcome in, ``metrics.json``'s metrics out
ResultsWriter = Callable[[RunDirectory, FederationOutcome], dict[str, Any]]

#: the logs a checkpoint keeps, to restore them on resume
LOGS = ("rounds.csv", "clusters.jsonl")


class Recorder:
    """Writes a run's record from the events of its rounds.

    Duties: write ``rounds.csv``, ``clusters.jsonl``, ``similarity_<r>.npy``, ``evaluations.csv``,
    ``models/`` and the task's results into the run directory; log each round's line and warnings;
    feed the tracker; write checkpoints and restore its logs from one (:meth:`restore`). It is
    attached to the round it records (:meth:`attach`) by the front-end that runs it.

    :param run_dir: the run directory (``None``: log lines and tracker only)
    :param checkpointer: writes a checkpoint after every round but the last (and after the last if
        due); needs the clients' executor (:meth:`attach`)
    :param tracker: receives every round's scalars (:func:`~morlfed.tracking.round_scalars`) and
        the final metrics
    :param results: writes the task's results at the end (``final.csv``, ``metrics.json``, ...) and
        returns the metrics (``None``: none written)
    """

    def __init__(
        self,
        run_dir: RunDirectory | None = None,
        checkpointer: Checkpointer | None = None,
        tracker: Tracker | None = None,
        results: ResultsWriter | None = None,
    ) -> None:
        self.run_dir, self.checkpointer, self.tracker, self.results = run_dir, checkpointer, tracker, results
        #: the metrics the task's results writer returned (after :meth:`on_end`)
        self.metrics: dict[str, Any] = {}
        self._round: FederatedRound | None = None
        self._personal: PersonalModels | None = None
        self._clients: Executor | None = None

    def attach(self, round: FederatedRound, personal: PersonalModels, clients: Executor | None = None) -> None:
        """Record ``round``, whose clients' personal models come from ``personal``.

        :param round: the round object the front-end runs
        :param personal: where the clients' private personal models are fetched from (``models/``)
        :param clients: the executor whose client states a checkpoint saves (``None``: the clients'
            states are not the server's to save, and a checkpointer is refused)
        :raises ValueError: a checkpointer without the clients' executor
        """
        if self.checkpointer is not None and clients is None:
            raise ValueError("a checkpoint saves the clients' states: it needs the executor that holds them")
        self._round, self._personal, self._clients = round, personal, clients

    @property
    def round(self) -> FederatedRound:
        """The round object recorded (:meth:`attach`)."""
        if self._round is None:
            raise RuntimeError("the recorder is attached to no round (Recorder.attach)")
        return self._round

    def restore(self, state: Mapping[str, Any]) -> None:
        """Restore the logs a checkpoint kept (``rounds.csv``, ``clusters.jsonl``) into the run directory.

        :param state: the checkpoint's server state
        """
        if self.run_dir is None:
            return
        rounds, clusters = state["logs"]["rounds.csv"], state["logs"]["clusters.jsonl"]
        self.run_dir.restore_logs(csv_rows(rounds), clusters.splitlines())
        self.run_dir.write_text("rounds.csv", rounds)
        if clusters:  # a strategy without clusters never writes the file: neither does its resume
            self.run_dir.write_text("clusters.jsonl", clusters)

    # ------------------------------------------------------------------------------------------
    # the events
    def on_round(self, report: RoundReport) -> None:
        """Round ``report.round`` is done: log it, write its row and diagnostics, checkpoint it.

        :param report: what the round did
        """
        cfg, rnd = self.round.cfg, report.round
        aggregated = len(report.ok) if report.aggregated else 0
        scalars = round_scalars(
            report.ok,
            report.failed,
            report.participants,
            aggregated,
            report.n_clusters,
            report.evaluated,
            report.seconds,
        )
        for cid, why in sorted(report.failed.items()):
            log.warning("round %d: client %d failed, left out of this round: %s", rnd, cid, why)
        for event in report.events:
            log.warning("round %d: %s", rnd, event)
        log.info(round_line(rnd, cfg.rounds, scalars))
        if self.tracker is not None:
            self.tracker.log_round(rnd, scalars)
        if self.run_dir is not None:
            self._write_round(report, aggregated)
        if self.checkpointer and (rnd < cfg.rounds or self.checkpointer.due(rnd)):  # a stop loses one round at most
            self._checkpoint(report)

    def on_evaluation(self, rnd: int, evaluations: Mapping[int, Evaluation]) -> None:
        """The deployed models were evaluated after round ``rnd`` (a learning-curve point): ``evaluations.csv``.

        :param rnd: the round
        :param evaluations: each client's evaluation
        """
        if self.run_dir is not None:
            self.run_dir.log_evaluations(rnd, evaluations)

    def on_end(self, outcome: FederationOutcome, events: Iterable[str] = ()) -> None:
        """The run ended: the final evaluation's curve point, ``models/``, the task's results, the final scalars.

        :param outcome: what the run produced
        :param events: what the front-end saw happen during the final evaluation
        """
        cfg = self.round.cfg
        if outcome.inert_warning is not None:
            log.warning(outcome.inert_warning)
        for event in events:
            log.warning("final evaluation: %s", event)
        if self.round.eval_due(cfg.rounds):
            final = mean_scalarised(outcome.evaluations)
            log.info("round %d/%d: deployed models' mean scalarised evaluation %.4g", cfg.rounds, cfg.rounds, final)
            if self.run_dir is not None:
                self.run_dir.update_last_round({"mean_eval_scalarised": final})
                self.run_dir.log_evaluations(cfg.rounds, outcome.evaluations)
            if self.tracker is not None:
                self.tracker.log_round(cfg.rounds, {"eval/mean_scalarised": final})
        if self.run_dir is None:
            return
        assert self._personal is not None, "attach() gives the personal models' source"
        self.round.deployment(self._personal).write(self.run_dir.path / MODELS)
        if self.results is not None:
            self.metrics = self.results(self.run_dir, outcome)
        if self.checkpointer is not None:
            self.checkpointer.finish()
        if self.tracker is not None:
            pictures = sorted(self.run_dir.path.glob("*.png"))
            self.tracker.log_final(cfg.rounds, flat_scalars(self.metrics, "final/"), pictures)

    # ------------------------------------------------------------------------------------------
    def _write_round(self, report: RoundReport, aggregated: int) -> None:
        """``rounds.csv``'s row, ``clusters.jsonl``'s line and ``similarity_<r>.npy`` of a round."""
        assert self.run_dir is not None, "only a recorder with a run directory writes"
        cfg = self.round.cfg
        evaluated = {"mean_eval_scalarised": "" if report.evaluated is None else report.evaluated}
        self.run_dir.log_round(
            {
                "round": report.round,
                "participants": report.participants,
                "aggregated": aggregated,
                "failed": ";".join(f"{cid}:{why}" for cid, why in sorted(report.failed.items())),
                "events": "; ".join(report.events),
                "mean_train_reward": report.train_reward,
                **{f"mean_{key}": mean_metric(report.ok, key) for key in cfg.round_metrics},
                **(evaluated if cfg.eval_every else {}),
                "n_clusters": report.n_clusters or "",
                "seconds": round(report.seconds, 3),
            }
        )
        if report.diagnostics:
            self.run_dir.log_clusters({"round": report.round, **report.diagnostics})
        if cfg.save_similarity and report.similarity:
            self.run_dir.write_similarity(report.round, cfg.n_clients, report.similarity)

    def _checkpoint(self, report: RoundReport) -> Path:
        """The checkpoint after the round: the round's state, the logs so far, the run's seconds, the clients."""
        assert self.checkpointer is not None and self._clients is not None and self._personal is not None
        logs = {name: read_log(self.run_dir.path / name) if self.run_dir else "" for name in LOGS}
        state = {**self.round.state_dict(), "logs": logs, "seconds": report.elapsed}
        return self.checkpointer.save(report.round, state, self._clients, self.round.deployment(self._personal))
