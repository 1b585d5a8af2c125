"""Any morlfed strategy as a Flower strategy: :class:`FlowerStrategy`.

Flower ships no clustered or personalised strategy; wrapped here, FedPref, FedFew, FedMHC, FedPG,
CFL, IFCA and the others run on Flower's ServerApp with Flower's own round loop
(:meth:`flwr.serverapp.strategy.Strategy.start`), and each client gets its own model. The round
itself is morlfed's (:class:`~morlfed.federation.round.FederatedRound`, the one morlfed's own loop
runs), and so is the run's record (:class:`~morlfed.federation.recorder.Recorder`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as FlwrStrategy

from morlfed.core.params import ParamLayout
from morlfed.core.protocol import ClientFailure, Evaluation, FitResult
from morlfed.federation import (
    FederatedRound,
    FederationConfig,
    FederationOutcome,
    Recorder,
    RoundReport,
    mean_metric,
    mean_scalarised,
)
from morlfed.flower.records import (
    config_of,
    evaluation_from_record,
    evaluation_request,
    outcome_from_record,
    personal_model_from_record,
    personal_model_request,
    task_to_record,
)
from morlfed.strategies.base import Strategy

log = logging.getLogger(__name__)


class FlowerStrategy(FlwrStrategy):
    """A morlfed :class:`~morlfed.strategies.base.Strategy` behind Flower's strategy interface.

    Flower splits a round across callbacks; each hands its half to morlfed's round object
    (:attr:`round`, a :class:`~morlfed.federation.round.FederatedRound`, the round morlfed's own
    loop runs). :meth:`configure_train` sends each sampled client's task
    (:meth:`~morlfed.federation.round.FederatedRound.begin`) to the node that runs that client: a
    personalised or clustered strategy sends each client its own model, a multi-model one its
    ``[K, d]`` models. :meth:`aggregate_train` hands the outcomes back
    (:meth:`~morlfed.federation.round.FederatedRound.end`: failed and non-finite results left
    out, aggregation or the "+FT" models) and returns every client's deployed model as one
    ``ArrayRecord`` (``client-<cid>``): the ``arrays`` of Flower's round loop, and
    ``Result.arrays`` at its end. The clients evaluate the models they deploy in the last round and
    every ``eval_every`` rounds, with morlfed's evaluation seeds (:attr:`evaluations`).
    :meth:`aggregate_evaluate` closes the round: the recorder writes it down, and after the last
    round the run's results (:attr:`outcome`); a client's private personal model is fetched from
    its node for ``models/`` (:meth:`personal_models`).

    Client duties (the ClientApp, :func:`morlfed.flower.client_app.client_app`): answer a
    ``query`` with its client id or its personal model, carry out a ``train`` message's task and
    reply with its outcome, evaluate an ``evaluate`` message's model.

    :param strategy: the morlfed strategy
    :param fed: the federation's settings (clients, rounds, seed, participation, finetune, eval_every)
    :param initial: the shared initial model, ``[d]``
    :param layout: its layout
    :param node_wait: seconds to wait for a node per client to connect before the first round
    :param recorder: writes the run's record (a run directory: :func:`morlfed.flower.flower_apps`'s
        ``run_dir``); by default one that only logs each round's line. It takes no checkpointer:
        the clients' states live in the Flower nodes
    """

    def __init__(
        self,
        strategy: Strategy,
        fed: FederationConfig,
        initial: torch.Tensor,
        layout: ParamLayout,
        node_wait: float = 120.0,
        recorder: Recorder | None = None,
    ) -> None:
        self.strategy, self.fed, self.node_wait = strategy, fed, node_wait
        #: the round morlfed's own loop runs: sampling, configuring, aggregating, the deployed models
        self.round = FederatedRound(strategy, fed, initial, layout)
        self.recorder = recorder or Recorder()
        self.recorder.attach(self.round, self)
        #: node id of each client, learnt from the nodes' answers to a query before the first round
        self.nodes: dict[int, int] = {}
        self._client_of_node: dict[int, int] = {}  # the inverse of nodes
        #: the clients' evaluations of their deployed models, by round (the last round's: the final one)
        self.evaluations: dict[int, dict[int, Evaluation]] = {}
        #: each round's failed clients and why
        self.failures: dict[int, dict[int, str]] = {}
        #: what the run produced, once its last round is done
        self.outcome: FederationOutcome | None = None
        self._report: RoundReport | None = None  # the round's report, recorded once its evaluation is in
        self._grid: Grid | None = None
        self._started: float | None = None

    # ------------------------------------------------------------------------------------------
    # Flower's interface
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One ``train`` message per sampled client, each with its own task.

        ``arrays`` is not read: the morlfed strategy holds every client's model.
        """
        if self._started is None:
            self._started = time.perf_counter()
        self._find_nodes(grid)
        tasks = self.round.begin(server_round)
        return [
            Message(task_to_record(task), dst_node_id=self.nodes[cid], message_type=MessageType.TRAIN)
            for cid, task in tasks.items()
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the usable results; return every client's deployed model and the round's figures."""
        outcomes = {self._client(reply): self._outcome(reply) for reply in replies}
        report = self.round.end(server_round, outcomes)
        self.failures[server_round], self._report = report.failed, report
        figures: dict[str, int | float] = {
            "mean_train_reward": mean_metric(report.ok, "train_reward"),
            "aggregated": len(report.ok),
            "failed": len(report.failed),
        }
        return self.deployed_arrays(), MetricRecord(figures)  # type: ignore[arg-type]  # dict is invariant

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Every client evaluates the model it deploys, in the last round and every ``eval_every`` rounds."""
        if server_round != self.fed.rounds and not self.round.eval_due(server_round):
            return []
        self._find_nodes(grid)
        seeds = self.round.eval_seeds()
        return [
            Message(
                evaluation_request(model, seeds[cid]),
                dst_node_id=self.nodes[cid],
                message_type=MessageType.EVALUATE,
            )
            for cid, model in self.deployed().items()
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Keep the evaluations (:attr:`evaluations`), record the round (and the run after the last); return their mean."""
        evaluations = {}
        for reply in replies:
            if reply.has_error():
                log.warning("round %d: an evaluation failed: %s", server_round, reply.error.reason)
            else:
                evaluations[self._client(reply)] = evaluation_from_record(reply.content)
        if evaluations:
            self.evaluations[server_round] = evaluations
        self._record(server_round, evaluations)
        return MetricRecord({"mean_scalarised": mean_scalarised(evaluations)}) if evaluations else None

    def summary(self) -> None:
        """Log what runs: the morlfed strategy and the federation's settings."""
        log.info("morlfed %s: %s", type(self.strategy).__name__, self.fed)

    # ------------------------------------------------------------------------------------------
    # the deployed models
    def deployed(self) -> dict[int, torch.Tensor | None]:
        """The model each client deploys now (``None``: its private personal model)."""
        return self.round.deployed()

    def deployed_arrays(self) -> ArrayRecord:
        """:meth:`deployed` as one ``ArrayRecord``: ``client-<cid>`` for each client with a server-side model."""
        return ArrayRecord(
            {f"client-{cid}": Array(model.numpy()) for cid, model in self.deployed().items() if model is not None}
        )

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """Clients ``cids``' private personal models, each asked of its node (a ``query``).

        :param cids: client ids
        :raises RuntimeError: no round ran yet (no nodes to ask), or a node did not answer
        """
        if not cids:
            return {}
        if self._grid is None:
            raise RuntimeError("the personal models live in the Flower nodes: no round has reached them yet")
        queries = [
            Message(personal_model_request(), dst_node_id=self.nodes[cid], message_type=MessageType.QUERY)
            for cid in cids
        ]
        models: dict[int, torch.Tensor | None] = {}
        for reply in self._grid.send_and_receive(queries):
            if reply.has_error():
                raise RuntimeError(f"a Flower node did not send its personal model: {reply.error.reason}")
            cid, model = personal_model_from_record(reply.content)
            models[cid] = model
        missing = sorted(set(cids) - set(models))
        if missing:
            raise RuntimeError(f"clients {missing} sent no personal model")
        return models

    # ------------------------------------------------------------------------------------------
    def _record(self, rnd: int, evaluations: dict[int, Evaluation]) -> None:
        """Round ``rnd`` is over (its evaluation too): the recorder writes it, and after the last round the run."""
        report = self._report
        assert report is not None and report.round == rnd, "aggregate_train reports the round first"
        if evaluations and rnd < self.fed.rounds:  # a learning-curve point; the last round's is the final evaluation
            self.recorder.on_evaluation(rnd, evaluations)
            report.evaluated = mean_scalarised(evaluations)
        report.seconds = self.round.since_begin()
        report.elapsed = time.perf_counter() - (self._started or time.perf_counter())
        self.recorder.on_round(report)
        if rnd < self.fed.rounds:
            return
        missing = sorted(set(range(self.fed.n_clients)) - set(evaluations))
        if missing:
            raise RuntimeError(f"clients {missing} sent no final evaluation: the run's results cannot be written")
        self.outcome = self.round.outcome(evaluations, report.elapsed)
        self.recorder.on_end(self.outcome)

    def _find_nodes(self, grid: Grid) -> None:
        """Learn which node runs which client, once: a ``query`` to every node."""
        self._grid = grid
        if len(self.nodes) == self.fed.n_clients:
            return
        waited = time.monotonic()
        nodes = list(grid.get_node_ids())
        while len(nodes) < self.fed.n_clients and time.monotonic() - waited < self.node_wait:
            time.sleep(0.1)  # nodes register while the server starts (the simulation engine's too)
            nodes = list(grid.get_node_ids())
        queries = [Message(RecordDict(), dst_node_id=node, message_type=MessageType.QUERY) for node in nodes]
        for reply in grid.send_and_receive(queries):
            if not reply.has_error():
                self.nodes[int(config_of(reply.content, "client")["cid"])] = reply.metadata.src_node_id
        self._client_of_node = {node: cid for cid, node in self.nodes.items()}
        missing = sorted(set(range(self.fed.n_clients)) - set(self.nodes))
        if missing:
            raise RuntimeError(
                f"{len(nodes)} Flower nodes connected within {self.node_wait:g} s and answered for clients "
                f"{sorted(self.nodes)}; clients {missing} have no node (a federation of {self.fed.n_clients} "
                "clients needs one node per client)"
            )

    def _client(self, reply: Message) -> int:
        return self._client_of_node[reply.metadata.src_node_id]

    @staticmethod
    def _outcome(reply: Message) -> FitResult | ClientFailure:
        if reply.has_error():
            return ClientFailure(f"Flower error {reply.error.code}: {reply.error.reason}")
        return outcome_from_record(reply.content)
