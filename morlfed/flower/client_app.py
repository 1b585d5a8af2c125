"""morlfed's clients as a Flower ClientApp: each Flower node runs one morlfed client.

The node's client id is its ``partition-id`` (``context.node_config``: Flower's simulation engine
numbers its nodes 0..N-1; a deployed SuperNode is started with ``--node-config
"partition-id=<cid>"``). The ClientApp answers three kinds of message:

* ``query``: which client the node runs (the server maps node ids to client ids with it), or,
  when the query asks for it, the client's private personal model (for the run's ``models/``);
* ``train``: one :class:`~morlfed.core.protocol.FitTask` (:mod:`morlfed.flower.records`), fitted exactly
  as morlfed's executors fit it: through the client's host, guarded (a fit that raises, runs past
  the time limit or diverges is a :class:`~morlfed.core.protocol.ClientFailure`, and the client is
  rolled back);
* ``evaluate``: one model (or the client's personal model) with an evaluation seed.

Flower builds a ClientApp afresh for every message, on whichever worker is free, so the client's
state between rounds (replay buffer, optimiser state, personal model: everything
:meth:`~morlfed.runtime.client.Client.get_state` captures) lives in the node's ``context.state``: the
client is rebuilt from the factory and restored before each message, and saved after a fit. A
client restored from its state fits exactly as one kept in memory (morlfed's checkpoints rely on
the same), so the Flower path gives the numbers of morlfed's own executors.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from morlfed.flower.records import (
    asks_personal_model,
    config_of,
    evaluation_from_request,
    evaluation_to_record,
    outcome_to_record,
    personal_model_to_record,
    task_from_record,
)
from morlfed.runtime.executors import ClientFactory, ClientHost, make_host, state_from_bytes, state_to_bytes

#: the key of the client's state in the node's ``context.state``
STATE_KEY = "morlfed-client"


def node_client(context: Context) -> int:
    """The morlfed client id a Flower node runs: its ``partition-id``.

    :param context: the node's context
    :raises ValueError: the node has no ``partition-id`` in its node config
    """
    if "partition-id" not in context.node_config:
        raise ValueError(
            "a morlfed ClientApp needs the node's client id as partition-id in its node config "
            "(the simulation engine sets it; start a SuperNode with --node-config 'partition-id=<cid>')"
        )
    return int(context.node_config["partition-id"])


def _host(factory: ClientFactory, cid: int, timeout: float | None, context: Context) -> ClientHost:
    """Client ``cid``'s host, its client restored from the node's state when it has one."""
    host = make_host(factory, [cid], timeout)
    if STATE_KEY in context.state:
        host.set_state(cid, state_from_bytes(config_of(context.state, STATE_KEY)["state"]))
    return host


def client_app(factory: ClientFactory, client_timeout: float | None = None) -> ClientApp:
    """A Flower ClientApp whose nodes run morlfed's clients (see the module docstring).

    :param factory: the task's client factory (``Task.client_factory``; picklable: Flower's
        simulation engine ships it to its workers)
    :param client_timeout: seconds a fit may take before it counts as failed (``None``: no limit)
    """
    app = ClientApp()

    @app.query()
    def query(message: Message, context: Context) -> Message:
        cid = node_client(context)
        if asks_personal_model(message.content):
            model = _host(factory, cid, client_timeout, context).personal_models([cid])[cid]
            return Message(personal_model_to_record(cid, model), reply_to=message)
        return Message(RecordDict({"client": ConfigRecord({"cid": cid})}), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        cid = node_client(context)
        host = _host(factory, cid, client_timeout, context)
        ((_, outcome),) = host.fit_many([(cid, task_from_record(message.content))])
        context.state[STATE_KEY] = ConfigRecord({"state": state_to_bytes(host.get_state(cid))})
        return Message(outcome_to_record(outcome), reply_to=message)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        cid = node_client(context)
        params, seed = evaluation_from_request(message.content)
        evaluation = _host(factory, cid, client_timeout, context).evaluate_many([(cid, params, seed)])[cid]
        return Message(evaluation_to_record(evaluation), reply_to=message)

    return app
