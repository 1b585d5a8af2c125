"""The RL task (``task=rl``, the default): every client trains an agent on an MO-Gymnasium environment.

Each client trains on the environment chosen by ``env=`` under its private linear preference drawn
by ``dist=``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from morlfed.core.seeding import generator
from morlfed.envs import EnvSpec, check_env_kwargs, get_spec
from morlfed.federation import FederationConfig, FederationOutcome
from morlfed.storage.rundir import RunDirectory
from morlfed.tasks.base import RunInfo, Task
from morlfed.tasks.rl import report
from morlfed.tasks.rl.client import RLClientFactory
from morlfed.tasks.rl.factory import RLFactory
from morlfed.tasks.rl.precision import resolve_precision
from morlfed.tasks.rl.preferences import sample_preferences


def _sb3_factory() -> type[RLFactory]:
    return RLClientFactory


def _vectorised_factory() -> type[RLFactory]:
    from morlfed.tasks.rl.vectorised.factory import VectorisedClientFactory

    return VectorisedClientFactory


#: the preference distributions' configs, whose values are the defaults of :meth:`RLTask.create`
DIST_DIR = Path(__file__).resolve().parents[2] / "conf" / "dist"
#: engine name -> its client factory class (imported when chosen)
ENGINES: dict[str, Callable[[], type[RLFactory]]] = {"sb3": _sb3_factory, "vectorised": _vectorised_factory}


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda`` for the ``device`` setting (``auto``: cuda when available)."""
    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device must be cpu, cuda or auto, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but torch sees no CUDA device; use device=cpu or device=auto")
    return device


class RLTask(Task):
    """Federated multi-objective RL.

    :param spec: the environment spec (``env=``, with its overrides)
    :param preferences: ``[n, m]`` private weights, one row per client
    :param engine: how a worker trains its clients: ``sb3`` (one SB3 agent per client),
        ``vectorised`` (all of them as one batched computation) or ``auto`` (the env spec's
        ``engine``: ``vectorised`` where it is validated against ``sb3``); an engine that does not
        implement what the spec asks for raises ``ValueError`` here
        (:meth:`~morlfed.tasks.rl.factory.RLFactory.check_spec`)
    :param device: the torch device of the clients' networks: ``cpu``, ``cuda`` or ``auto`` (``cuda``
        when available)
    :param precision: the vectorised engine's arithmetic: ``fp32``, ``bf16`` (bfloat16 matrix
        products; refused with ``sb3``) or ``auto`` (the env spec's ``precision`` where the engine is
        the vectorised one and the device computes bfloat16 natively, else ``fp32``:
        :func:`~morlfed.tasks.rl.precision.resolve_precision`)
    :param dist: how ``preferences`` were drawn, as ``config.yaml`` records it (``{"name":
        "dirichlet", "alpha": 1.0}``); by default ``fixed`` with these rows as its weights
    """

    name = "rl"
    heterogeneity = "dist"
    open_nodes = ("env.agent_kwargs", "env.env_kwargs")
    budget_unit = "env steps"
    budget_rate = 1e6  # env steps a second: far above any measured engine (docs/engines.md: 2 843 on a GPU)

    def __init__(
        self,
        spec: EnvSpec,
        preferences: np.ndarray,
        engine: str = "auto",
        device: str = "auto",
        precision: str = "auto",
        dist: Mapping[str, Any] | None = None,
    ) -> None:
        device = resolve_device(device)
        if engine == "auto":
            engine = spec.engine
        if engine not in ENGINES:
            raise ValueError(f"engine={engine} is not an engine; valid: auto, {', '.join(ENGINES)}")
        check_env_kwargs(spec)
        ENGINES[engine]().check_spec(spec)
        precision = resolve_precision(precision, spec, engine, device)
        if precision != "fp32" and engine != "vectorised":
            raise ValueError(
                f"precision={precision} is implemented by the vectorised engine; this run has "
                f"engine={engine} (env {spec.name}): add engine=vectorised, or precision=fp32"
            )
        #: the gradient steps' arithmetic (``auto`` resolved)
        self.precision = precision
        #: the engine that trains the clients (``auto`` resolved)
        self.engine = engine
        self.spec, self.preferences, self.device = spec, preferences, device
        #: the preference distribution, as ``config.yaml``'s ``dist`` records it
        self.dist = dict(dist) if dist is not None else {"name": "fixed", "weights": np.asarray(preferences).tolist()}

    @classmethod
    def from_config(cls, cfg: DictConfig, n_clients: int, seed: int) -> RLTask:
        """Build the task from the env spec in ``cfg.env`` and preferences drawn with ``cfg.dist``.

        The preferences are drawn from ``generator(seed, "preferences")``; ``cfg.engine.name``,
        ``cfg.device`` and ``cfg.precision`` choose how the clients train.
        """
        try:
            spec = EnvSpec.from_config(cfg.env)
        except ValueError as exc:
            raise ValueError(f"env: {exc}") from exc
        dist: dict[str, Any] = OmegaConf.to_container(cfg.dist, resolve=True)  # type: ignore[assignment]
        return cls._drawn(spec, dist, n_clients, seed, cfg.engine.name, cfg.device, cfg.precision)

    @classmethod
    def create(
        cls,
        env: str | EnvSpec,
        n_clients: int | None = None,
        seed: int = 0,
        dist: str | Mapping[str, Any] = "equidistant",
        engine: str = "auto",
        device: str = "auto",
        precision: str = "auto",
    ) -> RLTask:
        """The task from Python values, with the command line's defaults (``env=NAME dist=NAME``).

        ``RLTask.create("deep-sea-treasure", n_clients=4, dist={"name": "dirichlet", "alpha": 0.5})``
        draws the preferences the command line's ``env=deep-sea-treasure n_clients=4 dist=dirichlet
        dist.alpha=0.5`` draws.

        :param env: an env spec's name (packaged or :func:`~morlfed.envs.register`-ed) or an :class:`EnvSpec`
        :param n_clients: the number of clients (default: the spec's)
        :param seed: the run's root seed; the preferences are drawn from ``generator(seed, "preferences")``
        :param dist: the preference distribution: a name of ``morlfed/conf/dist`` (with that config's
            parameters), or a mapping with its ``name`` and the parameters that differ
        :param engine: ``auto``, ``sb3`` or ``vectorised``
        :param device: ``cpu``, ``cuda`` or ``auto``
        :param precision: ``fp32``, ``bf16`` or ``auto``
        :raises ValueError: an unknown env or distribution, or a bad parameter (``env: ...``, ``dist: ...``)
        """
        try:
            spec = env if isinstance(env, EnvSpec) else get_spec(env)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"env: {exc}") from exc
        given = {"name": dist} if isinstance(dist, str) else dict(dist)
        path = DIST_DIR / f"{given.get('name')}.yaml"
        defaults = yaml.safe_load(path.read_text()) if path.is_file() else {}
        n = spec.n_clients if n_clients is None else n_clients
        return cls._drawn(spec, {**defaults, **given}, n, seed, engine, device, precision)

    @classmethod
    def _drawn(
        cls, spec: EnvSpec, dist: dict[str, Any], n_clients: int, seed: int, engine: str, device: str, precision: str
    ) -> RLTask:
        """The task with preferences drawn from ``dist`` (its ``name`` and parameters)."""
        params = dict(dist)
        name = params.pop("name", None)
        try:
            prefs = sample_preferences(name, n_clients, len(spec.objectives), generator(seed, "preferences"), **params)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"dist: {exc}") from exc
        return cls(spec, prefs, engine, device, precision, dist={"name": name, **params})

    def record(self) -> dict[str, Any]:
        """``task``, ``env`` (the whole spec), ``dist``, ``engine``, ``precision`` and ``device``, as composed runs record them."""
        engine = {"name": self.engine}
        return (
            super().record()
            | {"env": self.spec.to_dict(), "dist": dict(self.dist), "engine": engine}
            | {
                "precision": self.precision,
                "device": self.device,
            }
        )

    def describe(self) -> str:
        """The env spec's canonical name (``deep-sea-treasure``)."""
        return self.spec.name

    @property
    def gpu_batched(self) -> bool:
        """The vectorised engine on CUDA: every worker's clients are one batch on the GPU."""
        return self.engine == "vectorised" and self.device == "cuda"

    def describe_training(self) -> str:
        """The engine and device, plus the resolved precision for the vectorised engine.

        For example ``engine=vectorised, precision=bf16, device=cuda`` or ``engine=sb3, device=cpu``.
        """
        # the precision is the vectorised engine's only (sb3 always trains in float32), and
        # precision=auto resolves it from the spec and the processor: say what it became
        precision = f", precision={self.precision}" if self.engine == "vectorised" else ""
        return f"engine={self.engine}{precision}, device={self.device}"

    def check_fault_injection(self) -> None:
        """Refuse fault injection unless the engine is ``sb3``: faults are injected into SB3 clients only.

        The vectorised engine's hosts train a worker's clients as one batch.
        """
        if self.engine != "sb3":
            raise ValueError(
                f"faults= wraps one client at a time, but engine={self.engine} trains a worker's "
                f"clients as one batch ({self.spec.name}'s engine=auto picks it): add engine=sb3"
            )

    def write_inputs(self, run_dir: RunDirectory, run: RunInfo) -> None:
        """``preferences.csv``: each client's weights."""
        m = self.preferences.shape[1]
        rows = [{"client": i, **{f"w_{k}": w[k] for k in range(m)}} for i, w in enumerate(self.preferences)]
        run_dir.write_csv("preferences.csv", rows)

    def client_factory(self, fed: FederationConfig, torch_threads: int) -> Any:
        """The engine's factory, with each client's budget of ``fed.rounds * fed.local_steps`` env steps.

        :class:`RLClientFactory` (``sb3``) or
        :class:`~morlfed.tasks.rl.vectorised.factory.VectorisedClientFactory` (which also gets the
        precision).
        """
        factory = ENGINES[self.engine]()
        extra = {"precision": self.precision} if self.engine == "vectorised" else {}
        return factory(
            self.spec, self.preferences, fed.seed, fed.local_steps, fed.rounds, torch_threads, self.device, **extra
        )

    def write_results(self, run_dir: RunDirectory, outcome: FederationOutcome, run: RunInfo) -> dict[str, Any]:
        """Write ``final.csv``, ``front.png`` and (last) ``metrics.json``; return the metrics.

        ``metrics.json`` also records the engine, precision and device
        (:func:`morlfed.tasks.rl.report.write_results`).
        """
        return report.write_results(
            run_dir, self.spec, self.preferences, outcome, run, self.engine, self.precision, self.device
        )

    def print_summary(self, outcome: FederationOutcome, metrics: dict[str, Any], path: Path) -> None:
        """Print each client's weights, returns, scalarised scores and model, then the headline metrics.

        The metrics are shown on undiscounted and on discounted returns
        (:func:`morlfed.tasks.rl.report.print_summary`).
        """
        report.print_summary(self.preferences, outcome, metrics, path)
