"""``logger=tensorboard``: TensorBoard event files in the run directory (``tensorboard`` extra).

``tensorboard --logdir runs/`` then shows every run below ``runs/`` live: the per-round scalars
(:func:`morlfed.tracking.round_scalars`) at step = round, the final metrics (``final/...``) and
the run's figures at the last round, and the resolved configuration as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from matplotlib.image import imread
from torch.utils.tensorboard import SummaryWriter

from morlfed.tracking import Tracker


class TensorBoardTracker(Tracker):
    """Writes the run's scalars and figures with torch's :class:`SummaryWriter`.

    :param run_dir: the run directory
    :param name: the run's name (written with the configuration)
    :param config: the resolved configuration
    :param subdir: the event files' folder inside the run directory
    """

    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any], subdir: str = "tensorboard") -> None:
        super().__init__(run_dir, name, config)
        self.writer = SummaryWriter(log_dir=str(self.run_dir / subdir))
        text = yaml.safe_dump(dict(config), sort_keys=False)
        self.writer.add_text("config", f"**{name}**\n\n```\n{text}\n```", 0)

    def log_round(self, rnd: int, scalars: Mapping[str, float]) -> None:
        """Add each scalar under its key as the tag at step ``rnd``, then flush the event file."""
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, rnd)
        self.writer.flush()

    def log_final(self, step: int, metrics: Mapping[str, float], figures: Sequence[Path]) -> None:
        """Add the final metrics as scalars and each figure as an image at ``step``, then flush.

        A figure's tag is ``figures/<file stem>``; only its first three (RGB) channels are kept.
        """
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)
        for path in figures:
            self.writer.add_image(f"figures/{path.stem}", imread(path)[..., :3], step, dataformats="HWC")
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        """Close the :class:`SummaryWriter`, flushing what it still holds (event files record no outcome).

        :param failed: the run raised or was stopped before it completed
        """
        self.writer.close()
