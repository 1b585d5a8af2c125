"""Accuracy metrics of a vision run (docs/vision.md#metrics).

Every client evaluates the model it deploys (:meth:`morlfed.tasks.vision.client.VisionClient.evaluate`)
and reports, in percent:

* ``l_acc``: L-acc, accuracy on its own test data (the personalisation score the FedFew and
  FedMHC papers report as "mean client accuracy");
* ``s_acc``: FedPG's S-acc, accuracy on its own test data pooled with the test data of a share
  ``c`` (``data.s_share``) of the other clients, drawn at random per client;
* ``g_acc``: G-acc, accuracy on every client's test data (generalisation).

Over the clients, :func:`accuracy_summary` gives the mean, the population standard deviation
(``ddof = 0``, as PFLlib reports it), the minimum and the maximum of each: the keys of
``metrics.json``'s ``accuracy`` section and of :data:`ACCURACY_METRICS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

#: Per-client accuracies a vision client reports: ``(title, what it is measured on)``.
ACCURACIES: dict[str, tuple[str, str]] = {
    "l_acc": ("L-acc", "its own test data"),
    "s_acc": ("S-acc", "its own test data pooled with that of a share c of the other clients"),
    "g_acc": ("G-acc", "every client's test data"),
}
#: Statistics over clients: ``(title word, definition word)``.
STATISTICS: dict[str, tuple[str, str]] = {
    "mean": ("Mean", "mean over clients of the"),
    "std": ("Std", "standard deviation (ddof 0) over clients of the"),
    "min": ("Min", "the worst client's"),
    "max": ("Max", "the best client's"),
}


def _metric_names() -> dict[str, tuple[str, bool, str]]:
    names = {}
    for acc, (title, data) in ACCURACIES.items():
        for stat, (word, definition) in STATISTICS.items():
            names[f"{acc}_{stat}"] = (
                f"{word} {title} (%)",
                stat != "std",
                f"{definition} accuracy (%) of the deployed model on {data}",
            )
    return names


#: Every key of :func:`accuracy_summary`: ``(title, higher_is_better, definition)``. A smaller
#: spread over clients is the fairer outcome, so ``*_std`` is better lower.
ACCURACY_METRICS: dict[str, tuple[str, bool, str]] = _metric_names()


def accuracy_summary(per_client: Mapping[str, Sequence[float] | np.ndarray]) -> dict[str, float]:
    """Mean, std (``ddof = 0``), min and max over clients of every accuracy in :data:`ACCURACIES`.

    :param per_client: ``{"l_acc": [...], "s_acc": [...], "g_acc": [...]}``, one value per client
    :raises ValueError: an accuracy missing, no clients, or a non-finite value
    """
    out: dict[str, float] = {}
    for acc in ACCURACIES:
        if acc not in per_client:
            raise ValueError(f"per-client accuracies need {acc!r}; got {sorted(per_client)}")
        values = np.asarray(per_client[acc], dtype=float)
        if values.ndim != 1 or values.size == 0 or not np.isfinite(values).all():
            raise ValueError(f"{acc} must be a non-empty list of finite numbers, got {values.tolist()!r}")
        stats = {"mean": values.mean(), "std": values.std(), "min": values.min(), "max": values.max()}
        out |= {f"{acc}_{stat}": float(stats[stat]) for stat in STATISTICS}
    return out
