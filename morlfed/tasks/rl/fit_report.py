"""What an RL client reports from a fit in every engine: a received model's loss and its trainings' metrics."""

from __future__ import annotations

from collections.abc import Callable

import torch

from morlfed.core.protocol import Evaluation
from morlfed.core.seeding import derive_seed
from morlfed.envs import EnvSpec
from morlfed.runtime.client import TrainOutput, mean_or_nan


class RLFitReport:
    """Mixin of the RL engines' clients: the loss of a model and the fit's training metrics.

    It mixes into :class:`~morlfed.runtime.client.Client` subclasses with ``spec``, ``seed`` and
    ``evaluate_client``.

    * **Loss of a model** (IFCA, FedFew, FedMHC, FedPG): ``-(w_i . R) / spec.return_scale``, where
      ``R`` is the mean undiscounted vector return of ``spec.eval_episodes`` deterministic episodes
      seeded ``derive_seed(seed, "loss", cid, round, k)``; their env steps are counted
      (``FitResult.loss_steps_spent``).
    * **Training metrics**: ``train_reward`` (mean scalarised return of the training episodes that
      finished during the fit's shared-model trainings, every model pooled) and ``episodes``;
      ``personal_train_reward`` and ``personal_episodes`` for the personal model. A job's
      ``stats["rewards"]`` lists those returns.
    * ``num_samples``: the env steps that trained the returned model(s).
    """

    spec: EnvSpec
    seed: int

    stream_key: Callable[[int], tuple[int, int]]  # the client's (root seed, client id)
    evaluate_client: Callable[[int, torch.Tensor | None, int], Evaluation]  # the engine's client class

    def _loss(self, cid: int, params: torch.Tensor, keys: tuple[int, int]) -> tuple[float, int | None]:
        root, key = self.stream_key(cid)
        seed = derive_seed(root, "loss", key, *keys)
        evaluation = self.evaluate_client(cid, params, seed)
        return -evaluation.scalarised / self.spec.return_scale, evaluation.env_steps

    def _fit_metrics(self, cid: int, outputs: list[TrainOutput], serving: int) -> dict[str, float]:
        rewards = [r for out in outputs for r in out.stats["rewards"]]
        return {"train_reward": mean_or_nan(rewards), "episodes": float(len(rewards))}

    def _personal_metrics(self, cid: int, output: TrainOutput) -> dict[str, float]:
        rewards = output.stats["rewards"]
        return {"personal_train_reward": mean_or_nan(rewards), "personal_episodes": float(len(rewards))}

    def _num_samples(self, cid: int, steps: int, trained: int) -> int:
        return steps * trained
