"""The federation loop.

For each round: choose the participants (seeded), ``strategy.configure`` -> the executor runs
``client.fit`` -> non-finite or failed results are dropped and logged -> ``strategy.aggregate``
-> ``rounds.csv`` / ``clusters.jsonl``. With ``finetune`` (the "+FT" variant) the last round
includes every client and is not aggregated: each client deploys the model it just trained.
At the end every client's deployed model is evaluated and written to ``models/``
(:mod:`morlfed.deployment`); with ``eval_every=k`` also evaluated after every k-th round, into
``rounds.csv`` (``mean_eval_scalarised``, the deployed models' learning curve) and, client by
client, ``evaluations.csv``. With a checkpointer, a checkpoint is written after every round but
the last (and the last when ``checkpoint_every`` asks), so a stop (Ctrl-C, SIGTERM:
:class:`~morlfed.interrupt.RunStopped`) loses at most the round in progress;
:meth:`Federation.resume` continues from the latest. The progress bar counts the budget.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morlfed.checkpoint import (
    Checkpointer,
    csv_rows,
    global_rng_state,
    load_server_state,
    read_log,
    set_global_rng_state,
)
from morlfed.deployment import MODELS, Deployment, deployed_weights
from morlfed.executors import Executor
from morlfed.interrupt import StopSignals
from morlfed.progress import RoundBudgets, RoundProgress
from morlfed.protocol import ClientFailure, Evaluation, FitResult
from morlfed.rundir import RunDirectory
from morlfed.seeding import derive_seed, generator
from morlfed.strategy import Strategy
from morlfed.tracking import Tracker, round_line, round_scalars

log = logging.getLogger(__name__)


@dataclass
class FederationConfig:
    """The loop's settings.

    :param n_clients: number of clients
    :param rounds: communication rounds
    :param local_steps: local budget per round (env steps or epochs)
    :param seed: the root seed
    :param participation: fraction of clients in (0, 1] sampled each round
    :param finetune: "+FT": skip the last aggregation, every client keeps its own last model
    :param save_similarity: write ``similarity_<round>.npy`` each round (NaN outside the blocks
        the strategy computed)
    :param progress: show a progress bar
    :param eval_every: evaluate every client's deployed model after every ``eval_every``-th round
        and log the clients' mean ``Evaluation.scalarised`` in ``rounds.csv`` as
        ``mean_eval_scalarised`` (0: only the final evaluation); evaluation never changes training
    :param round_metrics: client training metrics (``FitResult.metrics`` keys) whose mean over the
        round's usable results is logged in ``rounds.csv`` as ``mean_<key>``, after
        ``mean_train_reward`` (vision runs: ``train_loss``)
    :param budget_unit: what ``local_steps`` counts, as the progress bar names it (``env steps``)
    """

    n_clients: int
    rounds: int
    local_steps: int
    seed: int = 0
    participation: float = 1.0
    finetune: bool = False
    save_similarity: bool = False
    progress: bool = True
    eval_every: int = 0
    round_metrics: tuple[str, ...] = ()
    budget_unit: str = "steps"


@dataclass
class FederationOutcome:
    """What a finished run produced.

    :param evaluations: each client's evaluation of its deployed model
    :param model_ids: each client's deployed model id or cluster (:attr:`Strategy.model_id_note`), -1
        for a client that keeps its own fine-tuned model ("+FT")
    :param seconds: wall time of the loop; in a run resumed in place, from its start: the
        seconds its checkpoint recorded (the rounds before it) plus this process's (``seconds_before``)
    :param steps_spent: each client's local budget spent training over the run (RL: env steps),
        the sum of its usable fits' ``FitResult.steps_spent``; ``None`` for a client that did not
        report it (or in a run resumed from a checkpoint that predates the count)
    :param loss_steps_spent: each client's env steps spent measuring the losses of received
        models over the run (IFCA, FedFew, FedMHC, FedPG), the sum of its usable fits'
        ``FitResult.loss_steps_spent``; ``None`` when not counted (vision, or a checkpoint that
        predates the count)
    :param inert_warning: how the run left its strategy inert (:meth:`Strategy.inert_warning`), or
        ``None``; logged as a warning and stored in ``metrics.json``
    :param split_events: every cluster split of the run (:meth:`Strategy.split_events`), ``None``
        for a strategy that does not split clusters
    :param resumed_after: the round of the checkpoint a run resumed in place continued from;
        ``None``: it ran from its start (or branched: a new run)
    :param seconds_before: the loop's seconds up to that checkpoint (``None``: a checkpoint that
        predates the record, so ``seconds`` counts this process's rounds only)
    :param model_id_note: what ``model_ids`` mean, the footnote of the console table's ``model`` column
    """

    evaluations: dict[int, Evaluation]
    model_ids: dict[int, int]
    seconds: float
    steps_spent: dict[int, int | None] = field(default_factory=dict)
    inert_warning: str | None = None
    loss_steps_spent: dict[int, int | None] = field(default_factory=dict)
    split_events: list[dict[str, Any]] | None = None
    resumed_after: int | None = None
    seconds_before: float | None = None
    model_id_note: str = ""

    def time_record(self) -> dict[str, Any]:
        """What ``metrics.json`` keeps of the run's time.

        ``wall_time_s``, and for a run resumed in place the round it continued after
        (``resumed_after_round``) and the seconds recorded before it (``wall_time_before_resume_s``).
        """
        record: dict[str, Any] = {"wall_time_s": round(self.seconds, 2)}
        if self.resumed_after is not None:
            before = None if self.seconds_before is None else round(self.seconds_before, 2)
            record |= {"resumed_after_round": self.resumed_after, "wall_time_before_resume_s": before}
        return record

    def strategy_record(self) -> dict[str, Any]:
        """What ``metrics.json`` keeps of the strategy's account: ``inert_warning``, ``split_events`` if it splits."""
        record: dict[str, Any] = {"inert_warning": self.inert_warning}
        if self.split_events is not None:
            record["split_events"] = self.split_events
        return record


def participants_for(cfg: FederationConfig, round: int) -> list[int]:
    """The clients that take part in ``round`` (all of them in a "+FT" run's last round)."""
    if cfg.participation >= 1.0 or (cfg.finetune and round == cfg.rounds):
        return list(range(cfg.n_clients))
    m = max(1, int(np.floor(cfg.participation * cfg.n_clients + 0.5)))  # halves round up
    chosen = generator(cfg.seed, "participation", round).choice(cfg.n_clients, size=m, replace=False)
    return sorted(int(c) for c in chosen)


def round_budgets(cfg: FederationConfig) -> RoundBudgets:
    """Each round's budget (participants x local steps), in closed form: no loop over the rounds."""
    per_round, last = (len(participants_for(cfg, r)) * cfg.local_steps for r in (1, cfg.rounds))
    return RoundBudgets(per_round, cfg.rounds, last)


def deployed_models(
    strategy: Strategy, n_clients: int, finetuned: dict[int, torch.Tensor]
) -> dict[int, torch.Tensor | None]:
    """The model each client deploys now: its "+FT" model, else the strategy's (``None``: its private personal model)."""
    if strategy.deploys_personal:  # each client evaluates its private personal model
        return dict.fromkeys(range(n_clients))
    return {cid: finetuned.get(cid, strategy.model_for(cid)) for cid in range(n_clients)}


def eval_seeds(cfg: FederationConfig) -> dict[int, int]:
    """Evaluation seeds: the same every round, so the curve's last point is the final evaluation."""
    return {cid: derive_seed(cfg.seed, "final-eval", cid) for cid in range(cfg.n_clients)}


def eval_due(cfg: FederationConfig, rnd: int) -> bool:
    """Whether round ``rnd`` adds a point to the learning curve (``eval_every``; the last round's is the final one)."""
    return cfg.eval_every > 0 and (rnd % cfg.eval_every == 0 or rnd == cfg.rounds)


class Federation:
    """Runs a strategy over the clients an executor owns.

    :param strategy: the server strategy (not yet set up)
    :param executor: the executor (clients already started)
    :param cfg: loop settings
    :param run_dir: where to log, or ``None``
    :param checkpointer: writes a checkpoint after every round but the last (and after the last if
        due), and the rounds stop on SIGINT and SIGTERM (:class:`~morlfed.interrupt.RunStopped`);
        ``None``: no checkpoints, signals as usual
    :param tracker: receives every round's scalars (:func:`~morlfed.tracking.round_scalars`);
        ``None``: none. Every round is also one line of the ``morlfed.federation`` log (``run.log``)
    :param stop: the signal handling the caller installed for the whole run (the CLI's); by
        default the rounds install their own when there is a checkpointer
    """

    def __init__(
        self,
        strategy: Strategy,
        executor: Executor,
        cfg: FederationConfig,
        run_dir: RunDirectory | None = None,
        checkpointer: Checkpointer | None = None,
        tracker: Tracker | None = None,
        stop: StopSignals | None = None,
    ) -> None:
        self.strategy, self.executor, self.cfg, self.run_dir = strategy, executor, cfg, run_dir
        self.checkpointer, self.tracker = checkpointer, tracker
        self.stop = stop or StopSignals()
        self._initial, layout = executor.initial()
        strategy.setup(cfg.n_clients, self._initial, layout, generator(cfg.seed, "strategy"))
        self.start_round = 1
        #: a run resumed in place: the round it continues after and the loop's seconds until then
        self._resumed_after: int | None = None
        self._seconds_before: float | None = 0.0
        self._started = time.perf_counter()
        self._finetuned: dict[int, torch.Tensor] = {}
        self._steps_spent: dict[int, int | None] = dict.fromkeys(range(cfg.n_clients), 0)
        self._loss_steps_spent: dict[int, int | None] = dict.fromkeys(range(cfg.n_clients), 0)

    def resume(self, path: Path, in_place: bool = True) -> None:
        """Continue from the checkpoint at ``path``; the next :meth:`run` starts after its round.

        Restores the strategy, the "+FT" models, the global RNGs, every client's state and the logs
        up to its round.

        :param path: the checkpoint
        :param in_place: the same run goes on (``resume=``), so its wall time goes on from the
            checkpoint's; ``False``: a new run starts from it (``branch_from=``), and its wall time
            counts its own rounds only
        """
        state = load_server_state(path)
        self.strategy.load_state_dict(state["strategy"])
        self.executor.load_clients(Path(path) / "clients")
        self._finetuned = dict(state["finetuned"])
        unknown = dict.fromkeys(range(self.cfg.n_clients))  # a checkpoint from before the count
        self._steps_spent = dict(state.get("steps_spent", unknown))
        self._loss_steps_spent = dict(state.get("loss_steps_spent", unknown))
        set_global_rng_state(state["global_rng"])
        self.start_round = state["round"] + 1
        if in_place:
            self._resumed_after, self._seconds_before = state["round"], state.get("seconds")
        if self.run_dir is not None:
            rounds, clusters = state["logs"]["rounds.csv"], state["logs"]["clusters.jsonl"]
            self.run_dir.restore_logs(csv_rows(rounds), clusters.splitlines())
            self.run_dir.write_text("rounds.csv", rounds)
            self.run_dir.write_text("clusters.jsonl", clusters)

    def _checkpoint(self, rnd: int, finetuned: dict[int, torch.Tensor]) -> Path:
        names = ("rounds.csv", "clusters.jsonl")
        logs = {name: read_log(self.run_dir.path / name) if self.run_dir else "" for name in names}
        state = {
            "round": rnd,
            "strategy": self.strategy.state_dict(),
            "finetuned": finetuned,
            "steps_spent": dict(self._steps_spent),
            "loss_steps_spent": dict(self._loss_steps_spent),
            "global_rng": global_rng_state(),
            "logs": logs,
            "seconds": self._elapsed(),
        }
        assert self.checkpointer is not None, "only a run with a checkpointer writes checkpoints"
        return self.checkpointer.save(rnd, state, self.executor, self._deployment(rnd))

    def run(self) -> FederationOutcome:
        """Run the remaining rounds, then evaluate every client's deployed model.

        Raises :class:`~morlfed.interrupt.RunStopped` when a signal stops it.
        """
        cfg, stop = self.cfg, self.stop
        self._started = time.perf_counter()
        with stop if self.checkpointer else contextlib.nullcontext():
            with RoundProgress(round_budgets(cfg), self.start_round, cfg.budget_unit, cfg.progress) as progress:
                for rnd in range(self.start_round, cfg.rounds + 1):
                    stop.check()
                    self._round(rnd, progress)
            stop.check()
            inert = self.strategy.inert_warning()
            if inert is not None:
                log.warning(inert)
            with stop.interruptible():
                evaluations = self.executor.evaluate(self.deployed_models(), eval_seeds(cfg))
            for event in self.executor.take_events():  # a worker restarted during the final evaluation
                log.warning("final evaluation: %s", event)
        if eval_due(cfg, cfg.rounds):
            final = mean_scalarised(evaluations)
            log.info("round %d/%d: deployed models' mean scalarised evaluation %.4g", cfg.rounds, cfg.rounds, final)
            if self.run_dir is not None:
                self.run_dir.update_last_round({"mean_eval_scalarised": final})
                self.run_dir.log_evaluations(cfg.rounds, evaluations)
            if self.tracker is not None:
                self.tracker.log_round(cfg.rounds, {"eval/mean_scalarised": final})
        deployment = self._deployment(cfg.rounds)
        if self.run_dir is not None:
            deployment.write(self.run_dir.path / MODELS)
        elapsed = self._elapsed()
        return FederationOutcome(
            evaluations,
            deployment.model_ids,
            time.perf_counter() - self._started if elapsed is None else elapsed,
            dict(self._steps_spent),
            inert,
            dict(self._loss_steps_spent),
            self.strategy.split_events(),
            self._resumed_after,
            self._seconds_before,
            f"model: what the client deploys: {deployment.model_id_note}",
        )

    def _elapsed(self) -> float | None:
        """The loop's seconds since the run's start, the rounds before a resume included.

        ``None``: a checkpoint that predates the record did not say how long they took.
        """
        if self._seconds_before is None:
            return None
        return self._seconds_before + time.perf_counter() - self._started

    def _round(self, rnd: int, progress: RoundProgress) -> None:
        """Round ``rnd``: configure, fit, aggregate, log, checkpoint.

        A stop abandons the round during the fit; a "+FT" run's last round keeps the fine-tuned
        models instead of aggregating.

        :param rnd: the round
        :param progress: the run's progress bar
        """
        cfg, t0 = self.cfg, time.perf_counter()
        tasks = self.strategy.configure(rnd, participants_for(cfg, rnd))
        tasks = {cid: replace(t, round=rnd) for cid, t in tasks.items()}
        with self.stop.interruptible():
            outcomes = self.executor.fit(tasks, lambda cid: progress.advance(cfg.local_steps), progress.steps)
        ok, failed = split_results(outcomes)
        self._count_steps(ok)
        last_ft = cfg.finetune and rnd == cfg.rounds
        if last_ft:
            self._finetuned = {cid: self.strategy.finetuned_model(cid, r) for cid, r in ok.items()}
        else:
            self.strategy.aggregate(rnd, ok)
        reward = mean_metric(ok, "train_reward")  # the scalarised training reward
        curve = None
        if eval_due(cfg, rnd) and rnd < cfg.rounds:
            with self.stop.interruptible():
                curve = self._evaluate_deployed(rnd)
        self._log(
            rnd, len(tasks), ok, failed, reward, time.perf_counter() - t0, aggregated=not last_ft, evaluated=curve
        )
        if self.checkpointer and (rnd < cfg.rounds or self.checkpointer.due(rnd)):  # a stop loses one round at most
            self._checkpoint(rnd, self._finetuned)
        progress.round_done(rnd, train_reward=f"{reward:.3g}", failed=str(len(failed)))

    def _count_steps(self, ok: dict[int, FitResult]) -> None:
        """Add the usable fits' ``steps_spent`` and ``loss_steps_spent`` to their clients' totals.

        Unknown stays unknown: a ``None`` total or count leaves the total ``None``.
        """
        for cid, result in ok.items():
            for totals, spent in (
                (self._steps_spent, result.steps_spent),
                (self._loss_steps_spent, result.loss_steps_spent),
            ):
                total = totals[cid]
                totals[cid] = None if total is None or spent is None else total + spent

    def deployed_models(self) -> dict[int, torch.Tensor | None]:
        """The model each client deploys now (after :meth:`run`: its final one; ``None``: its private personal model).

        A "+FT" run's clients deploy their own fine-tuned models; the others, the strategy's model for them.
        """
        return deployed_models(self.strategy, self.cfg.n_clients, self._finetuned)

    def _deployment(self, rnd: int) -> Deployment:
        """Every client's deployed model after round ``rnd``, personal models fetched, for the run's files."""
        ids = {c: -1 if c in self._finetuned else self.strategy.model_id(c) for c in range(self.cfg.n_clients)}
        note = self.strategy.model_id_note + ("; -1: its own fine-tuned model (+FT)" if self._finetuned else "")
        weights = deployed_weights(self.deployed_models(), self.executor, self._initial)
        return Deployment.of(rnd, self.strategy.layout, weights, ids, note)

    def _evaluate_deployed(self, rnd: int) -> float:
        """The clients' mean scalarised evaluation of the models they deploy after round ``rnd`` (``evaluations.csv``)."""
        deployed = deployed_models(self.strategy, self.cfg.n_clients, {})
        evaluations = self.executor.evaluate(deployed, eval_seeds(self.cfg))
        if self.run_dir is not None:
            self.run_dir.log_evaluations(rnd, evaluations)
        return mean_scalarised(evaluations)

    def _log(
        self,
        rnd: int,
        n_tasks: int,
        ok: dict[int, FitResult],
        failed: dict[int, str],
        reward: float,
        seconds: float,
        aggregated: bool,
        evaluated: float | None,
    ) -> None:
        diag = self.strategy.diagnostics() if aggregated else {}
        events = self.executor.take_events()
        scalars = round_scalars(
            ok, failed, n_tasks, len(ok) if aggregated else 0, len(diag.get("clusters", [])), evaluated, seconds
        )
        for cid, why in sorted(failed.items()):
            log.warning("round %d: client %d failed, left out of this round: %s", rnd, cid, why)
        for event in events:
            log.warning("round %d: %s", rnd, event)
        log.info(round_line(rnd, self.cfg.rounds, scalars))
        if self.tracker is not None:
            self.tracker.log_round(rnd, scalars)
        if self.run_dir is None:
            return
        self.run_dir.log_round(
            {
                "round": rnd,
                "participants": n_tasks,
                "aggregated": len(ok) if aggregated else 0,
                "failed": ";".join(f"{cid}:{why}" for cid, why in sorted(failed.items())),
                "events": "; ".join(events),
                "mean_train_reward": reward,
                **{f"mean_{key}": mean_metric(ok, key) for key in self.cfg.round_metrics},
                **({"mean_eval_scalarised": "" if evaluated is None else evaluated} if self.cfg.eval_every else {}),
                "n_clusters": len(diag.get("clusters", [])) or "",
                "seconds": round(seconds, 3),
            }
        )
        if diag:
            self.run_dir.log_clusters({"round": rnd, **diag})
        if self.cfg.save_similarity and aggregated and self.strategy.similarity():
            self.run_dir.write_similarity(rnd, self.cfg.n_clients, self.strategy.similarity())


def split_results(results: dict[int, FitResult | ClientFailure]) -> tuple[dict[int, FitResult], dict[int, str]]:
    """Separate usable results from failures; a result with NaN/Inf parameters is a failure."""
    ok, failed = {}, {}
    for cid, res in results.items():
        if isinstance(res, ClientFailure):
            failed[cid] = res.reason
        elif not res.is_finite():
            failed[cid] = "non-finite parameters"
        else:
            ok[cid] = res
    return ok, failed


def mean_scalarised(evaluations: dict[int, Evaluation]) -> float:
    """Mean over clients of their scalarised evaluation (RL: ``w . return``; vision: accuracy)."""
    return float(np.mean([ev.scalarised for ev in evaluations.values()]))


def mean_metric(results: dict[int, FitResult], key: str) -> float:
    """Mean over clients of the training metric ``key`` they reported (NaN if none did)."""
    values = [r.metrics.get(key, float("nan")) for r in results.values()]
    values = [v for v in values if np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")
