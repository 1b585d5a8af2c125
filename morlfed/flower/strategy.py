"""Any morlfed strategy as a Flower strategy: :class:`FlowerStrategy`.

Flower ships no clustered or personalised strategy; wrapped here, FedPref, FedFew, FedMHC, FedPG,
CFL, IFCA and the others run on Flower's ServerApp with Flower's own round loop
(:meth:`flwr.serverapp.strategy.Strategy.start`), and each client gets its own model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as FlwrStrategy

from morlfed.federation import (
    FederationConfig,
    deployed_models,
    eval_due,
    eval_seeds,
    mean_metric,
    mean_scalarised,
    participants_for,
    split_results,
)
from morlfed.flower.records import (
    config_of,
    evaluation_from_record,
    evaluation_request,
    outcome_from_record,
    task_to_record,
)
from morlfed.params import ParamLayout
from morlfed.protocol import ClientFailure, Evaluation, FitResult
from morlfed.seeding import generator
from morlfed.strategy import Strategy

log = logging.getLogger(__name__)


class FlowerStrategy(FlwrStrategy):
    """A morlfed :class:`~morlfed.strategy.Strategy` behind Flower's strategy interface.

    Each round, the morlfed strategy configures a :class:`~morlfed.protocol.FitTask` per sampled
    client (:func:`~morlfed.federation.participants_for`, the same sampling as morlfed's loop), and
    :meth:`configure_train` sends each one to the node that runs that client: a personalised or
    clustered strategy sends each client its own model, a multi-model one its ``[K, d]`` models.
    :meth:`aggregate_train` hands the usable results to the morlfed strategy (a failed or
    non-finite one is left out, as morlfed's loop leaves it out) and returns every client's
    deployed model as one ``ArrayRecord`` (``client-<cid>``): the ``arrays`` of Flower's round
    loop, and ``Result.arrays`` at its end. In a "+FT" run's last round the clients keep their
    fine-tuned models instead. The clients evaluate the models they deploy in the last round and
    every ``eval_every`` rounds, with morlfed's evaluation seeds (:func:`~morlfed.federation.eval_seeds`; :attr:`evaluations`).

    Client duties (the ClientApp, :func:`morlfed.flower.client_app.client_app`): answer a
    ``query`` with its client id, carry out a ``train`` message's task and reply with its
    outcome, evaluate an ``evaluate`` message's model.

    :param strategy: the morlfed strategy
    :param fed: the federation's settings (clients, rounds, seed, participation, finetune, eval_every)
    :param initial: the shared initial model, ``[d]``
    :param layout: its layout
    :param node_wait: seconds to wait for a node per client to connect before the first round
    """

    def __init__(
        self,
        strategy: Strategy,
        fed: FederationConfig,
        initial: torch.Tensor,
        layout: ParamLayout,
        node_wait: float = 120.0,
    ) -> None:
        self.strategy, self.fed, self.node_wait = strategy, fed, node_wait
        strategy.setup(fed.n_clients, initial, layout, generator(fed.seed, "strategy"))
        #: node id of each client, learnt from the nodes' answers to a query before the first round
        self.nodes: dict[int, int] = {}
        self._client_of_node: dict[int, int] = {}  # the inverse of nodes
        #: "+FT": the fine-tuned models the clients keep after the last round
        self.finetuned: dict[int, torch.Tensor] = {}
        #: the clients' evaluations of their deployed models, by round (the last round's: the final one)
        self.evaluations: dict[int, dict[int, Evaluation]] = {}
        #: each round's failed clients and why
        self.failures: dict[int, dict[int, str]] = {}
        self._sent: set[int] = set()

    # ------------------------------------------------------------------------------------------
    # Flower's interface
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One ``train`` message per sampled client, each with its own task.

        ``arrays`` is not read: the morlfed strategy holds every client's model.
        """
        self._find_nodes(grid)
        tasks = self.strategy.configure(server_round, participants_for(self.fed, server_round))
        self._sent = set(tasks)
        return [
            Message(
                task_to_record(replace(task, round=server_round)),
                dst_node_id=self.nodes[cid],
                message_type=MessageType.TRAIN,
            )
            for cid, task in tasks.items()
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the usable results; return every client's deployed model and the round's figures."""
        outcomes: dict[int, FitResult | ClientFailure] = {
            self._client(reply): self._outcome(reply) for reply in replies
        }
        for cid in self._sent - set(outcomes):
            outcomes[cid] = ClientFailure("no reply from its Flower node")
        ok, failed = split_results(outcomes)
        self.failures[server_round] = failed
        for cid, why in sorted(failed.items()):
            log.warning("round %d: client %d failed, left out of this round: %s", server_round, cid, why)
        if self.fed.finetune and server_round == self.fed.rounds:
            self.finetuned = {cid: self.strategy.finetuned_model(cid, result) for cid, result in ok.items()}
        else:
            self.strategy.aggregate(server_round, ok)
        figures: dict[str, int | float] = {
            "mean_train_reward": mean_metric(ok, "train_reward"),
            "aggregated": len(ok),
            "failed": len(failed),
        }
        return self.deployed_arrays(), MetricRecord(figures)  # type: ignore[arg-type]  # dict is invariant

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Every client evaluates the model it deploys, in the last round and every ``eval_every`` rounds."""
        if server_round != self.fed.rounds and not eval_due(self.fed, server_round):
            return []
        self._find_nodes(grid)
        seeds = eval_seeds(self.fed)
        return [
            Message(
                evaluation_request(model, seeds[cid]),
                dst_node_id=self.nodes[cid],
                message_type=MessageType.EVALUATE,
            )
            for cid, model in self.deployed().items()
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Keep the evaluations (:attr:`evaluations`); return their mean scalarised value."""
        evaluations = {}
        for reply in replies:
            if reply.has_error():
                log.warning("round %d: an evaluation failed: %s", server_round, reply.error.reason)
            else:
                evaluations[self._client(reply)] = evaluation_from_record(reply.content)
        if not evaluations:
            return None
        self.evaluations[server_round] = evaluations
        return MetricRecord({"mean_scalarised": mean_scalarised(evaluations)})

    def summary(self) -> None:
        """Log what runs: the morlfed strategy and the federation's settings."""
        log.info("morlfed %s: %s", type(self.strategy).__name__, self.fed)

    # ------------------------------------------------------------------------------------------
    # the deployed models
    def deployed(self) -> dict[int, torch.Tensor | None]:
        """The model each client deploys now (``None``: its private personal model)."""
        return deployed_models(self.strategy, self.fed.n_clients, self.finetuned)

    def deployed_arrays(self) -> ArrayRecord:
        """:meth:`deployed` as one ``ArrayRecord``: ``client-<cid>`` for each client with a server-side model."""
        return ArrayRecord(
            {f"client-{cid}": Array(model.numpy()) for cid, model in self.deployed().items() if model is not None}
        )

    # ------------------------------------------------------------------------------------------
    def _find_nodes(self, grid: Grid) -> None:
        """Learn which node runs which client, once: a ``query`` to every node."""
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
