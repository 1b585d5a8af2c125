"""The run's top-level settings as a plain object: :class:`Settings`, checked as the command line checks them.

The same checks (:mod:`morlfed.core.settings`) and the same projection of the run's size
(:mod:`morlfed.core.projection`) whichever way the settings arrive, so a bad value is the same one-line
:class:`~morlfed.core.settings.ConfigError` from Python as on the command line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from morlfed.core.projection import Projection, physical_memory
from morlfed.core.settings import ConfigError, check_settings
from morlfed.federation import FederationConfig, round_budgets
from morlfed.tasks.base import Task


@dataclass(frozen=True)
class Settings:
    """The top-level settings of ``morlfed/conf/config.yaml``, with its defaults.

    :param n_clients: number of clients
    :param rounds: communication rounds
    :param local_steps: local budget per client per round (the task's unit: env steps, epochs)
    :param seed: the root seed; every random draw derives from it
    :param finetune: "+FT": the last round is not aggregated, each client keeps its own last model
    :param participation: fraction of clients sampled each round, in (0, 1]
    :param save_similarity: write ``similarity_<round>.npy`` every round
    :param progress: show a progress bar
    :param eval_every: also evaluate the deployed models after every k-th round (0: only at the end)
    :param torch_threads: torch intra-op threads per worker: a positive integer, or ``"auto"``
    :param checkpoint_every: keep the checkpoint of every k-th round once the run completes (0: none)
    """

    n_clients: int
    rounds: int
    local_steps: int
    seed: int = 0
    finetune: bool = False
    participation: float = 1.0
    save_similarity: bool = False
    progress: bool = True
    eval_every: int = 0
    torch_threads: int | str = "auto"
    checkpoint_every: int = 0

    def check(self) -> None:
        """Raise :class:`ConfigError` for the first setting of the wrong type or range (the command line's message)."""
        try:
            check_settings(asdict(self))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def federation(self, kind: type[Task]) -> tuple[FederationConfig, str | None]:
        """The loop's settings for a task of class ``kind``, and what the projection of the run's size warns of.

        :param kind: the task's class (its round metrics, budget unit and rate)
        :raises ConfigError: a bad setting, or a run whose rounds' records would not fit in memory
        """
        self.check()
        fed = FederationConfig(
            n_clients=self.n_clients,
            rounds=self.rounds,
            local_steps=self.local_steps,
            seed=self.seed,
            participation=float(self.participation),
            finetune=self.finetune,
            save_similarity=self.save_similarity,
            progress=self.progress,
            eval_every=self.eval_every,
            round_metrics=kind.round_metrics,
            budget_unit=kind.budget_unit,
        )
        projection = Projection(self.rounds, round_budgets(fed).total(), kind.budget_unit, kind.budget_rate)
        try:  # before anything is built: no budget holds up the start
            return fed, projection.check(physical_memory())
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
