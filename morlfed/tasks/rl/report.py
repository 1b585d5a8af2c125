"""What an RL run reports: ``final.csv``, ``front.png``, ``metrics.json`` and the console summary.

``final.csv`` holds, per client, the weights, vector returns, scalarised scores, deployed model and
env steps taken. ``metrics.json`` holds the clients' env steps, in all and by purpose, and every
metric on discounted and on undiscounted returns, each kind against its own reference point.

Every env step a client's strategy makes it take is counted: its trainings' and the evaluation
episodes that measure the losses of the models it receives (IFCA, FedFew, FedMHC, FedPG). The
final evaluation of the deployed models, and the learning curve's (``eval_every``), measure the
run and are not counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from morlfed.envs import EnvSpec, known_front
from morlfed.federation import FederationOutcome
from morlfed.metrics import compute_metrics
from morlfed.metrics.figures import plot_front
from morlfed.storage.rundir import RunDirectory
from morlfed.tasks.base import RunInfo


def write_results(
    run_dir: RunDirectory,
    spec: EnvSpec,
    preferences: np.ndarray,
    outcome: FederationOutcome,
    run: RunInfo,
    engine: str,
    precision: str = "fp32",
    device: str = "cpu",
) -> dict[str, Any]:
    """Write ``final.csv``, ``front.png`` and (last) ``metrics.json``; return the metrics.

    :param engine: the engine that trained the clients (recorded in ``metrics.json``)
    :param precision: the engine's arithmetic (recorded in ``metrics.json``)
    :param device: where the clients' networks were trained, ``cpu`` or ``cuda`` (recorded in
        ``metrics.json``)
    """
    m = len(spec.objectives)
    cids = sorted(outcome.evaluations)
    total_steps = env_steps_total(outcome)
    rows = []
    for cid in cids:
        ev = outcome.evaluations[cid]
        row: dict[str, Any] = {"client": cid}
        row.update({f"w_{k}": preferences[cid, k] for k in range(m)})
        row.update({f"return_{k}": ev.vector_return[k] for k in range(m)})
        row.update({f"disc_return_{k}": ev.discounted_return[k] for k in range(m)})
        row.update({"scalarised": ev.scalarised, "scalarised_discounted": ev.scalarised_discounted})
        row["model"] = outcome.model_ids[cid]
        row["env_steps"] = total_steps.get(cid)
        row["loss_env_steps"] = outcome.loss_steps_spent.get(cid)
        rows.append(row)
    run_dir.write_csv("final.csv", rows)
    returns = np.array([outcome.evaluations[c].vector_return for c in cids])
    disc = np.array([outcome.evaluations[c].discounted_return for c in cids])
    front = known_front(spec)
    front_undisc = known_front(spec, gamma=1.0)
    plot_front(
        disc,
        preferences,
        front,
        run_dir.path / "front.png",
        objectives=spec.objectives,
        title=f"{spec.name} / {run.label} / {run.heterogeneity} / seed {run.fed.seed} (discounted returns, gamma {spec.gamma:g})",
    )
    metrics = {
        **run.fields(env=spec.name, engine=engine, precision=precision, device=device),
        **outcome.time_record(),
        **outcome.strategy_record(),
        **run.branched(),
        "env_steps_per_client": env_steps_summary(total_steps),
        "env_steps_by_purpose": {
            "training": env_steps_summary(outcome.steps_spent),
            "loss_evaluation": env_steps_summary(outcome.loss_steps_spent),
        },
        "discounted": compute_metrics(preferences, disc, spec.reference_point("discounted"), front=front),
        "undiscounted": compute_metrics(preferences, returns, spec.reference_point("undiscounted"), front=front_undisc),
    }
    run_dir.write_json("metrics.json", metrics)
    return metrics


def env_steps_total(outcome: FederationOutcome) -> dict[int, int | None]:
    """Each client's env steps over the run, every purpose counted.

    That is training plus the evaluation episodes of its loss measurements (``None`` when either is
    unknown).

    :param outcome: the finished run
    """
    return {
        cid: None if steps is None or loss is None else steps + loss
        for cid, steps in outcome.steps_spent.items()
        for loss in [outcome.loss_steps_spent.get(cid)]
    }


def env_steps_summary(steps: dict[int, int | None]) -> dict[str, float] | None:
    """Mean, min and max over clients of the env steps each took, ``None`` when a count is missing.

    :param steps: each client's env steps over the run (in all, or for one purpose)
    """
    known = [v for v in steps.values() if v is not None]
    if not known or len(known) < len(steps):
        return None
    return {"mean": float(np.mean(known)), "min": min(known), "max": max(known)}


def print_summary(preferences: np.ndarray, outcome: FederationOutcome, metrics: dict[str, Any], path: Path) -> None:
    """The per-client table and the headline metrics."""
    m = preferences.shape[1]
    header = f"{'client':>6}  {'weights':<{8 * m}}  {'return (undiscounted)':<{10 * m}}  scalarised  discounted  model"
    print(f"\n{header}")
    for cid in sorted(outcome.evaluations):
        ev = outcome.evaluations[cid]
        w = " ".join(f"{x:7.3f}" for x in preferences[cid])
        r = " ".join(f"{x:9.2f}" for x in ev.vector_return)
        scores = f"{ev.scalarised:10.3f}  {ev.scalarised_discounted:10.3f}"
        print(f"{cid:>6}  {w:<{8 * m}}  {r:<{10 * m}}  {scores}  {outcome.model_ids[cid]}")
    print(
        "scalarised: w . return (undiscounted); discounted: w . discounted return, the returns front.png plots "
        "(final.csv has both vector returns)"
    )
    print(outcome.model_id_note)
    print()
    for section in ("undiscounted", "discounted"):
        shown = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics[section].items() if v is not None
        )
        print(f"{section}: {shown}")
    print(f"run directory: {path}  ({outcome.seconds:.1f} s)")
