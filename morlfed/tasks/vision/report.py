"""What a vision run writes into its run directory, besides the loop's ``rounds.csv`` and ``clusters.jsonl``.

* ``label_histogram.csv``: one row per client: ``client, n_train, n_test`` and the count of each
  class ``class_0 .. class_{C-1}`` over its train and test samples; ``label_histogram.png``
  shows it as stacked bars (written before training);
* ``final.csv``: one row per client: ``client, n_train, n_test, l_acc, s_acc, g_acc, test_loss,
  model`` (accuracies in percent; ``model`` the deployed model id or cluster, -1 for a "+FT"
  client's own model);
* ``metrics.json`` (last, only when the run completed): the run's identity (``task: vision``,
  ``algo``, ``label``, ``data``, ``model``, ``partition``, ``seed``, sizes, wall time) and the
  ``accuracy`` section of :func:`morlfed.metrics.accuracy_summary`.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from morlfed.federation import FederationOutcome
from morlfed.metrics import ACCURACIES, accuracy_summary
from morlfed.storage.rundir import RunDirectory, atomic_write_bytes
from morlfed.tasks.vision.data import VisionDataset
from morlfed.tasks.vision.partition import Partition


def histogram_rows(dataset: VisionDataset, partition: Partition) -> list[dict[str, int]]:
    """The rows of ``label_histogram.csv``."""
    counts = partition.histogram(dataset.labels.numpy(), dataset.n_classes)
    return [
        {
            "client": cid,
            "n_train": len(partition.train[cid]),
            "n_test": len(partition.test[cid]),
            **{f"class_{c}": int(counts[cid, c]) for c in range(dataset.n_classes)},
        }
        for cid in range(partition.n_clients)
    ]


def label_histogram_figure(counts: np.ndarray, title: str = "") -> Figure:
    """Stacked horizontal bars: one bar per client, one colour per class.

    :param counts: ``[n_clients, n_classes]`` label counts
    """
    n_clients, n_classes = counts.shape
    fig = Figure(figsize=(7.5, max(2.5, 0.28 * n_clients + 1.2)))
    ax = fig.add_subplot()
    cmap = colormaps["tab10" if n_classes <= 10 else "tab20" if n_classes <= 20 else "viridis"]
    left = np.zeros(n_clients)
    clients = np.arange(n_clients)
    for c in range(n_classes):
        colour = cmap(c if n_classes <= 20 else c / max(1, n_classes - 1))
        ax.barh(clients, counts[:, c], left=left, color=colour, height=0.8, label=str(c))
        left += counts[:, c]
    ax.set_yticks(clients)
    ax.invert_yaxis()
    ax.set_xlabel("samples (train + test)")
    ax.set_ylabel("client")
    if n_classes <= 20:
        ax.legend(title="class", bbox_to_anchor=(1.01, 1), loc="upper left", fontsize="small")
    ax.set_title(title or "label histogram per client")
    fig.tight_layout()
    return fig


def write_partition(run_dir: RunDirectory, dataset: VisionDataset, partition: Partition, title: str = "") -> None:
    """Write ``label_histogram.csv`` and ``label_histogram.png``."""
    rows = histogram_rows(dataset, partition)
    run_dir.write_csv("label_histogram.csv", rows)
    counts = np.array([[row[f"class_{c}"] for c in range(dataset.n_classes)] for row in rows])
    buf = io.BytesIO()
    label_histogram_figure(counts, title).savefig(buf, format="png", dpi=110)
    atomic_write_bytes(run_dir.path / "label_histogram.png", buf.getvalue())


def write_results(
    run_dir: RunDirectory, partition: Partition, outcome: FederationOutcome, info: dict[str, Any]
) -> dict[str, Any]:
    """Write ``final.csv`` and (last) ``metrics.json``; return the metrics.

    :param info: the run's identity and settings, stored first in ``metrics.json``
    """
    cids = sorted(outcome.evaluations)
    rows = []
    for cid in cids:
        ev = outcome.evaluations[cid].metrics
        rows.append(
            {
                "client": cid,
                "n_train": len(partition.train[cid]),
                "n_test": len(partition.test[cid]),
                **{acc: ev[acc] for acc in ACCURACIES},
                "test_loss": ev["test_loss"],
                "model": outcome.model_ids[cid],
            }
        )
    run_dir.write_csv("final.csv", rows)
    accuracy = accuracy_summary({acc: [row[acc] for row in rows] for acc in ACCURACIES})
    metrics = {
        **info,
        **outcome.time_record(),
        **outcome.strategy_record(),
        "accuracy": accuracy,
    }
    run_dir.write_json("metrics.json", metrics)
    return metrics


def print_summary(outcome: FederationOutcome, metrics: dict[str, Any], path: Any) -> None:
    """The per-client accuracy table and the mean / std / min / max lines."""
    print(f"\n{'client':>6}  {'L-acc':>7}  {'S-acc':>7}  {'G-acc':>7}  model")
    for cid in sorted(outcome.evaluations):
        ev = outcome.evaluations[cid].metrics
        print(f"{cid:>6}  {ev['l_acc']:7.2f}  {ev['s_acc']:7.2f}  {ev['g_acc']:7.2f}  {outcome.model_ids[cid]}")
    print(outcome.model_id_note)
    print()
    acc = metrics["accuracy"]
    for key, (title, _) in ACCURACIES.items():
        print(
            f"{title}: mean={acc[f'{key}_mean']:.2f} std={acc[f'{key}_std']:.2f} "
            f"min={acc[f'{key}_min']:.2f} max={acc[f'{key}_max']:.2f}"
        )
    print(f"run directory: {path}  ({outcome.seconds:.1f} s)")
