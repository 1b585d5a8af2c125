"""Experiment tracking: where a run reports as it goes, beside its run directory.

The run directory (``rounds.csv``, ``clusters.jsonl``, ``final.csv``, ``metrics.json``,
``run.log``) is always written; it is the run's record. ``logger=`` adds a live view:

* ``logger=csv`` (the default): the run directory alone, :class:`Tracker` itself;
* ``logger=tensorboard``: TensorBoard event files in ``RUN_DIR/tensorboard``
  (:class:`morlfed.tracking.tensorboard.TensorBoardTracker`; the ``tensorboard`` extra);
* ``logger=wandb``: a Weights & Biases run with its files in ``RUN_DIR/wandb``
  (:class:`morlfed.tracking.wandb.WandbTracker`; the ``wandb`` extra).

The federation loop reports every round through :meth:`Tracker.log_round` (the scalars of
:func:`round_scalars`), the run its end through :meth:`Tracker.log_final`. A tracker lives in the
main process only; clients never see it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from morlfed.core.commands import pip_install
from morlfed.core.protocol import FitResult


class Tracker:
    """A run's experiment tracker.

    This base class is ``logger=csv``: the run directory's own files are the whole record, so
    every method does nothing; a backend overrides them.

    :param run_dir: the run directory (a backend writes inside it)
    :param name: the run's name: environment or dataset, variant, distribution, seed
    :param config: the resolved configuration (a backend stores it with the run)
    """

    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any]) -> None:
        self.run_dir, self.name, self.config = Path(run_dir), name, config

    def log_round(self, rnd: int, scalars: Mapping[str, float]) -> None:
        """Record one round's scalars at step ``rnd``.

        The scalars map ``section/name`` to a value (see :func:`round_scalars`).

        :param rnd: the round (1-based)
        :param scalars: the round's finite scalars
        """

    def log_final(self, step: int, metrics: Mapping[str, float], figures: Sequence[Path]) -> None:
        """Record the run's final metrics and figures.

        :param step: the step to record them at (the last round)
        :param metrics: ``section/name -> value`` (:func:`flat_scalars` of ``metrics.json``)
        :param figures: PNG files of the run directory (``front.png``, ...)
        """

    def close(self, failed: bool = False) -> None:
        """Flush everything and release the backend (also after a failed or stopped run).

        :param failed: the run raised or was stopped before it completed; a backend that records a
            run's outcome records it as failed
        """


def tracker_class(target: str, option: str) -> type[Tracker]:
    """The tracker class named ``target`` (``module.Class``), imported.

    :param target: the ``_target_`` of ``conf/logger/<option>.yaml``
    :param option: the ``logger=`` option, also the name of the extra that installs its package
    :raises ImportError: the backend's package is missing; the message names the extra to install
    """
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ImportError(
            f"logger={option} needs the optional package {option!r} ({exc}); "
            f"install it with: {pip_install('-e', f'.[{option}]')} (or {pip_install(f'morlfed[{option}]')})"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Tracker)):
        raise ImportError(f"logger={option}: {target} is not a morlfed.tracking.Tracker")
    return cls


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def flat_scalars(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a nested mapping (e.g. ``metrics.json``), keys joined by ``/``.

    Strings, booleans, ``None`` and non-finite values are left out.

    :param values: the mapping
    :param prefix: prepended to every key (``"final/"``)
    """
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out |= flat_scalars(value, f"{prefix}{key}/")
        elif _finite(value):
            out[f"{prefix}{key}"] = float(value)
    return out


def round_scalars(
    ok: Mapping[int, FitResult],
    failed: Mapping[int, str],
    participants: int,
    aggregated: int,
    n_clusters: int,
    evaluated: float | None,
    seconds: float,
) -> dict[str, float]:
    """The scalars a tracker records for one round.

    ``train/reward_mean|min|max``: the scalarised training reward over the round's usable
    results (vision: training accuracy); ``federation/participants|aggregated|failed|seconds``
    and ``federation/n_clusters`` (strategies that cluster); ``eval/mean_scalarised`` when the
    deployed models were evaluated (``eval_every``); and per client ``client_<cid>/<key>`` for
    every finite ``FitResult.metrics`` and ``FitResult.learner_stats`` value (SB3's ``loss``,
    ``actor_loss``, ``critic_loss``, ``exploration_rate``).

    :param ok: the round's usable results by client
    :param failed: the failed clients and why
    :param participants: the clients asked to train
    :param aggregated: the results aggregated (0 in a "+FT" run's last round)
    :param n_clusters: the strategy's clusters after the round (0: it does not cluster)
    :param evaluated: the deployed models' mean scalarised evaluation, if evaluated this round
    :param seconds: the round's wall time
    """
    out: dict[str, float] = {}
    rewards = [r.metrics["train_reward"] for r in ok.values() if _finite(r.metrics.get("train_reward"))]
    if rewards:
        out |= {
            "train/reward_mean": sum(rewards) / len(rewards),
            "train/reward_min": min(rewards),
            "train/reward_max": max(rewards),
        }
    out |= {
        "federation/participants": float(participants),
        "federation/aggregated": float(aggregated),
        "federation/failed": float(len(failed)),
        "federation/seconds": seconds,
    }
    if n_clusters:
        out["federation/n_clusters"] = float(n_clusters)
    if evaluated is not None and math.isfinite(evaluated):
        out["eval/mean_scalarised"] = evaluated
    for cid, result in sorted(ok.items()):
        out |= flat_scalars({**result.metrics, **result.learner_stats}, f"client_{cid}/")
    return out


def round_line(rnd: int, rounds: int, scalars: dict[str, float]) -> str:
    """A round's summary line for ``run.log``, from its :func:`~morlfed.tracking.round_scalars`.

    :param rnd: the round
    :param rounds: the run's rounds
    :param scalars: the round's scalars
    """
    parts = [f"round {rnd}/{rounds}:"]
    if "train/reward_mean" in scalars:
        parts.append(
            f"scalarised training reward mean {scalars['train/reward_mean']:.4g} "
            f"(min {scalars['train/reward_min']:.4g}, max {scalars['train/reward_max']:.4g}),"
        )
    parts.append(
        f"{scalars['federation/aggregated']:.0f}/{scalars['federation/participants']:.0f} aggregated, "
        f"{scalars['federation/failed']:.0f} failed,"
    )
    if "federation/n_clusters" in scalars:
        k = int(scalars["federation/n_clusters"])
        parts.append(f"{k} cluster{'s' if k != 1 else ''},")
    if "eval/mean_scalarised" in scalars:
        parts.append(f"deployed models' mean scalarised evaluation {scalars['eval/mean_scalarised']:.4g},")
    parts.append(f"{scalars['federation/seconds']:.1f} s")
    return " ".join(parts)


#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 2
