"""morlfed's messages as Flower records: what crosses between the ServerApp and the ClientApps.

A :class:`~morlfed.core.protocol.FitTask`, a :class:`~morlfed.core.protocol.FitResult` (or the
:class:`~morlfed.core.protocol.ClientFailure` that replaces it) and an
:class:`~morlfed.core.protocol.Evaluation` each become a :class:`flwr.app.RecordDict` and come back
unchanged: tensors travel as float32 arrays (an ``ArrayRecord`` keeps their bytes), options and
counts as a ``ConfigRecord``, training metrics as ``MetricRecord``s. A field that is ``None`` is
left out (Flower's records hold no ``None``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from morlfed.core.protocol import ClientFailure, Evaluation, FitResult, FitTask

R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)

#: the FitTask options sent as they are (the tensors and ``personal_lambda``, which may be None, apart)
TASK_OPTIONS = ("round", "train_best", "train_all", "report_losses", "prox_mu", "split_budget")


def _arrays(**tensors: torch.Tensor | np.ndarray | None) -> ArrayRecord:
    """An ``ArrayRecord`` of the given tensors (``None`` ones left out)."""
    return ArrayRecord(
        {
            name: Array(np.ascontiguousarray(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t))
            for name, t in tensors.items()
            if t is not None
        }
    )


def _tensor(record: ArrayRecord, name: str) -> torch.Tensor | None:
    return torch.from_numpy(record[name].numpy().copy()) if name in record else None


def record_of(record: RecordDict, name: str, kind: type[R]) -> R:
    """The record ``name`` of a message's content, checked to be a ``kind`` (ArrayRecord, ConfigRecord, MetricRecord).

    :param record: a message's content
    :param name: the record's key
    :param kind: the record's class
    :raises TypeError: it is another kind of record
    """
    value = record[name]
    if not isinstance(value, kind):
        raise TypeError(f"{name} is a {type(value).__name__}, not a {kind.__name__}")
    return value


def config_of(record: RecordDict, name: str) -> dict[str, Any]:
    """The ``ConfigRecord`` ``name`` of a message's content, as a dict.

    :param record: a message's content
    :param name: the record's key
    """
    return dict(record_of(record, name, ConfigRecord))


def metrics_of(record: RecordDict, name: str) -> dict[str, float]:
    """The ``MetricRecord`` ``name`` of a message's content, as a dict of floats.

    :param record: a message's content
    :param name: the record's key
    """
    return {key: float(v) for key, v in record_of(record, name, MetricRecord).items()}  # type: ignore[arg-type]


def _metric_record(values: dict[str, float]) -> MetricRecord:
    return MetricRecord({key: float(v) for key, v in values.items()})


def _present(**values: Any) -> dict[str, Any]:
    """The values that are not ``None`` (Flower's records hold no ``None``)."""
    return {key: value for key, value in values.items() if value is not None}


def task_to_record(task: FitTask) -> RecordDict:
    """A round's instructions for one client as a record.

    :param task: the task
    """
    options = {name: getattr(task, name) for name in TASK_OPTIONS}
    options = {k: (bool(v) if isinstance(v, (bool, np.bool_)) else v) for k, v in options.items()}
    return RecordDict(
        {
            "task": _arrays(params=task.params.float(), prox_centre=task.prox_centre),
            "options": ConfigRecord({**options, **_present(personal_lambda=task.personal_lambda)}),
        }
    )


def task_from_record(record: RecordDict) -> FitTask:
    """Inverse of :func:`task_to_record`.

    :param record: the message's content
    """
    arrays, options = record_of(record, "task", ArrayRecord), config_of(record, "options")
    params = _tensor(arrays, "params")
    assert params is not None, "a task record always carries params"
    return FitTask(params=params, prox_centre=_tensor(arrays, "prox_centre"), **options)


def outcome_to_record(outcome: FitResult | ClientFailure) -> RecordDict:
    """A client's fit outcome as a record: the result, or the reason it failed.

    :param outcome: what the client's guarded fit gave
    """
    if isinstance(outcome, ClientFailure):
        return RecordDict({"failure": ConfigRecord({"reason": outcome.reason})})
    counts = _present(
        num_samples=outcome.num_samples,
        model_index=outcome.model_index,
        steps_spent=outcome.steps_spent,
        loss_steps_spent=outcome.loss_steps_spent,
    )
    return RecordDict(
        {
            "result": _arrays(params=outcome.params, losses=outcome.losses),
            "counts": ConfigRecord(counts),
            "metrics": _metric_record(outcome.metrics),
            "learner": _metric_record(outcome.learner_stats),
        }
    )


def outcome_from_record(record: RecordDict) -> FitResult | ClientFailure:
    """Inverse of :func:`outcome_to_record`.

    :param record: the reply's content
    """
    if "failure" in record:
        return ClientFailure(str(config_of(record, "failure")["reason"]))
    arrays, counts = record_of(record, "result", ArrayRecord), config_of(record, "counts")
    params = _tensor(arrays, "params")
    assert params is not None, "a result record always carries params"
    return FitResult(
        params=params,
        num_samples=int(counts["num_samples"]),
        losses=_tensor(arrays, "losses"),
        model_index=counts.get("model_index"),
        metrics=metrics_of(record, "metrics"),
        learner_stats=metrics_of(record, "learner"),
        steps_spent=counts.get("steps_spent"),
        loss_steps_spent=counts.get("loss_steps_spent"),
    )


def evaluation_request(params: torch.Tensor | None, seed: int) -> RecordDict:
    """What a client evaluates: a ``[d]`` model (``None``: its personal model) with an evaluation seed.

    :param params: the model
    :param seed: the evaluation seed
    """
    return RecordDict({"model": _arrays(params=params), "evaluation": ConfigRecord({"seed": int(seed)})})


def evaluation_from_request(record: RecordDict) -> tuple[torch.Tensor | None, int]:
    """Inverse of :func:`evaluation_request`.

    :param record: the message's content
    """
    return _tensor(record_of(record, "model", ArrayRecord), "params"), int(config_of(record, "evaluation")["seed"])


def evaluation_to_record(evaluation: Evaluation) -> RecordDict:
    """A client's evaluation as a record.

    :param evaluation: the evaluation
    """
    scalars = _present(
        scalarised=float(evaluation.scalarised),
        scalarised_discounted=float(evaluation.scalarised_discounted),
        env_steps=evaluation.env_steps,
    )
    return RecordDict(
        {
            "returns": _arrays(
                vector_return=np.asarray(evaluation.vector_return, dtype=np.float64),
                discounted_return=np.asarray(evaluation.discounted_return, dtype=np.float64),
            ),
            "scalars": ConfigRecord(scalars),
            "metrics": _metric_record(evaluation.metrics),
        }
    )


def evaluation_from_record(record: RecordDict) -> Evaluation:
    """Inverse of :func:`evaluation_to_record`.

    :param record: the reply's content
    """
    returns, scalars = record_of(record, "returns", ArrayRecord), config_of(record, "scalars")
    return Evaluation(
        vector_return=returns["vector_return"].numpy().copy(),
        discounted_return=returns["discounted_return"].numpy().copy(),
        scalarised=float(scalars["scalarised"]),
        scalarised_discounted=float(scalars["scalarised_discounted"]),
        metrics=metrics_of(record, "metrics"),
        env_steps=scalars.get("env_steps"),
    )


def personal_model_request() -> RecordDict:
    """A ``query`` that asks a node for its client's private personal model (the run's ``models/``)."""
    return RecordDict({"ask": ConfigRecord({"personal_model": True})})


def asks_personal_model(record: RecordDict) -> bool:
    """Whether a ``query``'s content asks for the client's personal model (:func:`personal_model_request`).

    :param record: the query's content
    """
    return "ask" in record and bool(config_of(record, "ask").get("personal_model", False))


def personal_model_to_record(cid: int, model: torch.Tensor | None) -> RecordDict:
    """A client's answer to :func:`personal_model_request`: its id and its personal model (``None``: none yet).

    :param cid: the client
    :param model: its ``[d]`` personal model
    """
    return RecordDict({"client": ConfigRecord({"cid": cid}), "model": _arrays(params=model)})


def personal_model_from_record(record: RecordDict) -> tuple[int, torch.Tensor | None]:
    """Inverse of :func:`personal_model_to_record`.

    :param record: the reply's content
    """
    return int(config_of(record, "client")["cid"]), _tensor(record_of(record, "model", ArrayRecord), "params")
