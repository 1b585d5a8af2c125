"""``logger=wandb``: a Weights & Biases run (``wandb`` extra).

One W&B run per morlfed run, its local files in ``RUN_DIR/wandb``: the resolved configuration as
the run's config, the per-round scalars (:func:`morlfed.tracking.round_scalars`) at step = round,
the final metrics in the run summary (``final/...``) and the run's figures as images.
``logger.mode=offline`` keeps everything on disk (``wandb sync RUN_DIR/wandb/offline-run-*``
uploads it later); ``online`` needs ``wandb login`` first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import wandb

from morlfed.tracking import Tracker


class WandbTracker(Tracker):
    """Logs the run to Weights & Biases with ``wandb.init``.

    :param run_dir: the run directory (``wandb.init(dir=run_dir)``)
    :param name: the W&B run's display name
    :param config: the resolved configuration (the W&B run's config)
    :param project: the W&B project
    :param entity: the W&B team or user (``None``: the default of the logged-in user)
    :param group: groups runs in the W&B interface (e.g. one sweep)
    :param tags: the run's tags
    :param mode: ``online``, ``offline`` or ``disabled``
    """

    def __init__(
        self,
        run_dir: Path,
        name: str,
        config: Mapping[str, Any],
        project: str = "morlfed",
        entity: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        mode: str = "online",
    ) -> None:
        super().__init__(run_dir, name, config)
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.mode must be online, offline or disabled, got {mode!r}")
        self.run = wandb.init(
            project=project,
            entity=entity,
            group=group,
            tags=list(tags),
            name=name,
            config=dict(config),
            dir=str(self.run_dir),
            mode=mode,  # type: ignore[arg-type]  # checked above
        )

    def log_round(self, rnd: int, scalars: Mapping[str, float]) -> None:
        """Log the round's scalars to the W&B run's history at step ``rnd``."""
        self.run.log(dict(scalars), step=rnd)

    def log_final(self, step: int, metrics: Mapping[str, float], figures: Sequence[Path]) -> None:
        """Put the final metrics into the W&B run's summary and log the figures as images at ``step``.

        A figure's key is ``figures/<file stem>``.
        """
        self.run.summary.update(dict(metrics))
        self.run.log({f"figures/{path.stem}": wandb.Image(str(path)) for path in figures}, step=step)

    def close(self, failed: bool = False) -> None:
        """Finish the W&B run: exit code 1 for a run that failed or was stopped, so W&B shows it failed.

        :param failed: the run raised or was stopped before it completed
        """
        self.run.finish(exit_code=1 if failed else 0)
