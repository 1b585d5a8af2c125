"""Environment specs: one YAML per supported environment, read into a frozen :class:`EnvSpec`.

The YAML files live in ``envs/conf/env/`` (a hydra config group: ``env=<name>``). A canonical spec
is a flat mapping of the fields of :class:`EnvSpec`. An *alias* is a YAML whose only content is a
defaults list naming the canonical spec (``defaults: [mo-lunar-lander]``), so that hydra's
``env=mo-lunar-lander-v2`` composes to the same node as ``env=mo-lunar-lander``;
:mod:`morlfed.envs.registry` reads the folder, resolves the same aliases in Python and registers
specs of one's own.

This module depends only on the standard library, numpy and omegaconf (no morlfed import).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = [
    "AGENTS",
    "CONF_DIR",
    "ENV_CONF_DIR",
    "SPEC_ENGINES",
    "EnvSpec",
]

#: ``envs/conf``: the folder to put on hydra's search path (it holds the ``env`` config group).
CONF_DIR: Path = Path(__file__).resolve().parent / "conf"
#: ``envs/conf/env``: one YAML per environment (canonical specs and aliases).
ENV_CONF_DIR: Path = CONF_DIR / "env"
#: The SB3 agents a spec can name.
AGENTS: tuple[str, ...] = ("dqn", "ddpg")
#: Engines an env spec can name as its default (``engine=auto``); see morlfed/tasks/rl/task.py.
SPEC_ENGINES: tuple[str, ...] = ("sb3", "vectorised")
#: Precisions an env spec can name as its default (``precision=auto``); see morlfed/tasks/rl/precision.py.
SPEC_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")

# agent_kwargs keys that morlfed's RL client consumes itself instead of passing them to SB3.
_NON_SB3_KWARGS = {"ddpg": {"action_noise_std"}, "dqn": set()}
_DQN_ONLY_KWARGS = {
    "exploration_fraction",
    "exploration_initial_eps",
    "exploration_final_eps",
    "target_update_interval",
    "max_grad_norm",
}
_DDPG_ONLY_KWARGS = {"action_noise_std"}
#: FedPref's settings an env spec can set for its environment (``fedpref:``), with their checks.
FEDPREF_SETTINGS: tuple[str, ...] = ("eps", "patience")


@dataclass(frozen=True)
class EnvSpec:
    """Everything morlfed needs to know about one environment.

    The fields mirror ``envs/conf/env/<name>.yaml`` (see the comments there). The dataclass is
    frozen; ``agent_kwargs`` is a plain ``dict`` (copy it before changing it), so a spec is not
    hashable.

    :ivar name: canonical morlfed name (``deep-sea-treasure``).
    :ivar gym_id: MO-Gymnasium id passed to ``mo_gymnasium.make``.
    :ivar agent: ``"dqn"`` (discrete actions) or ``"ddpg"`` (continuous actions).
    :ivar objectives: names of the reward components, in reward-vector order.
    :ivar gamma: discount factor of the discounted returns, of the known front and of the agent.
    :ivar ref_point: hypervolume reference point of the discounted returns (maximisation: every
        sensible return dominates it).
    :ivar known_front: MO-Gymnasium provides ``env.unwrapped.pareto_front(gamma)``.
    :ivar max_episode_steps: TimeLimit applied for training and evaluation (``None``: the registered
        default of the gym id).
    :ivar eval_episodes: deterministic, seeded evaluation episodes per client evaluation.
    :ivar return_scale: typical magnitude of a scalarised return; RL "losses" are
        ``-scalarised_return / return_scale`` so that loss temperatures mean the same across envs.
    :ivar n_clients: default number of clients of a run.
    :ivar rounds: default number of federated rounds.
    :ivar local_steps: default environment steps of local training per round.
    :ivar engine: the engine ``engine=auto`` (the default) trains this env's clients with:
        ``vectorised`` where its paired equivalence study with ``sb3`` allows it
        (docs/results/engine-agreement; docs/engines.md, Validation), ``sb3`` elsewhere.
    :ivar precision: the arithmetic ``precision=auto`` (the default) trains this env's clients with
        when the engine is the vectorised one and the device computes bfloat16 natively:
        ``bf16`` (a spec with ``engine: vectorised`` only) where the paired study found the
        ``vectorised-bf16`` arm equivalent to ``sb3``, ``fp32`` elsewhere.
    :ivar seeds_global_numpy: the env draws from numpy's *global* RNG internally; the factory
        isolates and seeds that RNG per env (see :mod:`morlfed.envs.factory`).
    :ivar ref_point_undiscounted: the reference point of the undiscounted returns, where their
        scale differs from the discounted ones' (``None``: ``ref_point`` serves both);
        :meth:`reference_point` picks the one for a kind of returns.
    :ivar env_kwargs: keyword arguments for the env constructor (``mo_gymnasium.make(gym_id,
        **env_kwargs)``), e.g. ``float_state: true`` for deep-sea-treasure.
    :ivar agent_kwargs: keyword arguments for the SB3 constructor (``action_noise_std`` for DDPG is
        the exception: the client turns it into ``NormalActionNoise``).
    :ivar fedpref: FedPref's split threshold for this environment, as the FedPref paper tunes one
        per environment: ``eps`` (relative: a fraction of the largest cluster-mean update norm seen)
        and ``patience``, selected by ``conf/experiment/fedpref_threshold.yaml``'s rule. Either may be
        left out; ``conf/algo/fedpref.yaml`` reads them (``algo.eps=``/``algo.patience=`` override).
    """

    name: str
    gym_id: str
    agent: str
    objectives: tuple[str, ...]
    gamma: float
    ref_point: tuple[float, ...]
    known_front: bool
    max_episode_steps: int | None
    eval_episodes: int
    return_scale: float
    n_clients: int
    rounds: int
    local_steps: int
    engine: str = "sb3"
    precision: str = "fp32"
    seeds_global_numpy: bool = False
    ref_point_undiscounted: tuple[float, ...] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    fedpref: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Normalise types (lists to tuples, numbers to float/int) and validate every field."""
        set_ = object.__setattr__  # frozen dataclass: normalise through object.__setattr__
        where = f"env spec {self.name!r}"

        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"env spec name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.gym_id, str) or not self.gym_id:
            raise ValueError(f"{where}: gym_id must be a non-empty string, got {self.gym_id!r}")
        if self.agent not in AGENTS:
            raise ValueError(f"{where}: agent must be one of {', '.join(AGENTS)}, got {self.agent!r}")
        if self.engine not in SPEC_ENGINES:
            raise ValueError(f"{where}: engine must be one of {', '.join(SPEC_ENGINES)}, got {self.engine!r}")
        if self.precision not in SPEC_PRECISIONS:
            raise ValueError(f"{where}: precision must be one of {', '.join(SPEC_PRECISIONS)}, got {self.precision!r}")
        if self.precision != "fp32" and self.engine != "vectorised":
            raise ValueError(
                f"{where}: precision {self.precision} is implemented by the vectorised engine; this spec "
                f"has engine {self.engine}: set precision: fp32"
            )

        objectives = tuple(str(o) for o in _as_sequence(self.objectives, "objectives", where))
        if len(objectives) < 2:
            raise ValueError(f"{where}: needs at least 2 objectives, got {list(objectives)}")
        if len(set(objectives)) != len(objectives):
            raise ValueError(f"{where}: objective names must be unique, got {list(objectives)}")
        set_(self, "objectives", objectives)

        gamma = _as_float(self.gamma, "gamma", where)
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"{where}: gamma must be in (0, 1], got {gamma}")
        set_(self, "gamma", gamma)

        for key in ("ref_point", "ref_point_undiscounted"):
            if getattr(self, key) is None and key == "ref_point_undiscounted":
                continue
            ref = tuple(_as_float(r, key, where) for r in _as_sequence(getattr(self, key), key, where))
            if len(ref) != len(objectives):
                raise ValueError(
                    f"{where}: {key} has {len(ref)} entries but there are {len(objectives)} "
                    f"objectives ({', '.join(objectives)})"
                )
            set_(self, key, ref)

        for flag in ("known_front", "seeds_global_numpy"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{where}: {flag} must be true or false, got {getattr(self, flag)!r}")

        if self.max_episode_steps is not None:
            set_(self, "max_episode_steps", _as_positive_int(self.max_episode_steps, "max_episode_steps", where))
        for count in ("eval_episodes", "n_clients", "rounds", "local_steps"):
            set_(self, count, _as_positive_int(getattr(self, count), count, where))

        scale = _as_float(self.return_scale, "return_scale", where)
        if not scale > 0:
            raise ValueError(f"{where}: return_scale must be > 0, got {scale}")
        set_(self, "return_scale", scale)

        env_kwargs = _to_plain(self.env_kwargs) if self.env_kwargs is not None else {}
        if not isinstance(env_kwargs, dict) or "max_episode_steps" in env_kwargs:
            raise ValueError(
                f"{where}: env_kwargs must be a mapping of env constructor arguments "
                f"(set the episode cap with max_episode_steps), got {self.env_kwargs!r}"
            )
        set_(self, "env_kwargs", copy.deepcopy(env_kwargs))
        set_(self, "agent_kwargs", _normalise_agent_kwargs(self.agent_kwargs, self.agent, where))
        set_(self, "fedpref", _normalise_fedpref(self.fedpref, where))

    # ----------------------------------------------------------------------------------------
    @property
    def n_objectives(self) -> int:
        """Number of reward components."""
        return len(self.objectives)

    def reference_point(self, returns: str = "discounted") -> tuple[float, ...]:
        """The hypervolume reference point of ``returns``.

        ``ref_point`` for ``"discounted"``, ``ref_point_undiscounted`` (else ``ref_point``) for
        ``"undiscounted"``.

        :param returns: ``"discounted"`` or ``"undiscounted"``
        """
        if returns not in ("discounted", "undiscounted"):
            raise ValueError(f"returns must be discounted or undiscounted, got {returns!r}")
        if returns == "undiscounted" and self.ref_point_undiscounted is not None:
            return self.ref_point_undiscounted
        return self.ref_point

    @property
    def sb3_kwargs(self) -> dict[str, Any]:
        """``agent_kwargs`` without the keys the client consumes itself (``action_noise_std``)."""
        skip = _NON_SB3_KWARGS[self.agent]
        return {k: copy.deepcopy(v) for k, v in self.agent_kwargs.items() if k not in skip}

    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML/JSON-friendly dict of every field (lists instead of tuples)."""
        d = asdict(self)
        d["objectives"] = list(self.objectives)
        d["ref_point"] = list(self.ref_point)
        if self.ref_point_undiscounted is not None:
            d["ref_point_undiscounted"] = list(self.ref_point_undiscounted)
        d["env_kwargs"] = _to_plain(self.env_kwargs)
        d["agent_kwargs"] = _to_plain(self.agent_kwargs)
        d["fedpref"] = _to_plain(self.fedpref)
        return d

    def replace(self, **changes: Any) -> EnvSpec:
        """Return a validated copy with some fields changed (``spec.replace(local_steps=500)``)."""
        d = asdict(self)
        unknown = set(changes) - set(d)
        if unknown:
            raise ValueError(f"unknown EnvSpec field(s) {sorted(unknown)}; valid: {sorted(d)}")
        d.update(changes)
        return EnvSpec(**d)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | DictConfig) -> EnvSpec:
        """Build a spec from a composed hydra/omegaconf node (``cfg.env``) or a plain mapping.

        Interpolations are resolved (``agent_kwargs.gamma: ${..gamma}`` follows ``env.gamma``).
        Every field except ``engine``, ``precision``, ``seeds_global_numpy``, ``ref_point_undiscounted``,
        ``env_kwargs``, ``agent_kwargs`` and ``fedpref`` is required;
        unknown keys raise ``ValueError`` so that a typo in an override does not pass silently.
        """
        if isinstance(cfg, DictConfig):
            data = OmegaConf.to_container(cfg, resolve=True)
        elif isinstance(cfg, Mapping):
            data = _to_plain(dict(cfg))
        else:
            raise TypeError(f"EnvSpec.from_config expects a mapping or DictConfig, got {type(cfg).__name__}")
        assert isinstance(data, dict)
        data.pop("defaults", None)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown env spec field(s) {unknown}; valid: {sorted(names)}")
        optional = {
            "engine",
            "precision",
            "seeds_global_numpy",
            "ref_point_undiscounted",
            "env_kwargs",
            "agent_kwargs",
            "fedpref",
        }
        missing = sorted(names - optional - set(data))
        if missing:
            label = data.get("name", "<unnamed>")
            raise ValueError(f"env spec {label!r} is missing field(s) {missing}")
        return cls(**{name: data[name] for name in names if name in data})  # data has no other keys (checked above)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _to_plain(value: Any) -> Any:
    """Convert omegaconf containers and tuples to plain dicts/lists (recursively)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _as_sequence(value: Any, what: str, where: str) -> list[Any]:
    """``value`` as a list; strings and scalars are rejected."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{where}: {what} must be a list, got {value!r}")
    return list(value)


def _as_float(value: Any, what: str, where: str) -> float:
    """``value`` as a finite float (booleans rejected)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: {what} must be a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {what} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{where}: {what} must be finite, got {value!r}")
    return out


def _as_positive_int(value: Any, what: str, where: str) -> int:
    """``value`` as an int >= 1 (integral floats accepted, booleans rejected)."""
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral:
        raise ValueError(f"{where}: {what} must be a positive integer, got {value!r}")
    if int(value) < 1:
        raise ValueError(f"{where}: {what} must be a positive integer, got {value!r}")
    return int(value)


def _normalise_agent_kwargs(kwargs: Any, agent: str, where: str) -> dict[str, Any]:
    """Plain-dict copy of ``agent_kwargs``; ``train_freq: [1, episode]`` becomes a tuple (SB3)."""
    if kwargs is None:
        return {}
    kw = _to_plain(kwargs)
    if not isinstance(kw, dict):
        raise ValueError(f"{where}: agent_kwargs must be a mapping, got {kwargs!r}")
    kw = copy.deepcopy(kw)
    wrong = _DDPG_ONLY_KWARGS if agent == "dqn" else _DQN_ONLY_KWARGS
    bad = sorted(set(kw) & wrong)
    if bad:
        raise ValueError(f"{where}: agent_kwargs {bad} do not apply to agent {agent!r}")
    if isinstance(kw.get("train_freq"), list):
        # SB3 accepts an int or a tuple (n, "step"|"episode"); YAML can only give a list.
        kw["train_freq"] = tuple(kw["train_freq"])
    if "action_noise_std" in kw:
        std = _as_float(kw["action_noise_std"], "agent_kwargs.action_noise_std", where)
        if std < 0:
            raise ValueError(f"{where}: agent_kwargs.action_noise_std must be >= 0, got {std}")
        kw["action_noise_std"] = std
    if "gamma" in kw:
        g = _as_float(kw["gamma"], "agent_kwargs.gamma", where)
        if not 0.0 < g <= 1.0:
            raise ValueError(f"{where}: agent_kwargs.gamma must be in (0, 1], got {g}")
    return kw


def _normalise_fedpref(settings: Any, where: str) -> dict[str, Any]:
    """Plain-dict copy of the spec's ``fedpref`` block: ``eps`` a fraction in (0, 1], ``patience`` an integer >= 1."""
    if settings is None:
        return {}
    plain = _to_plain(settings)
    if not isinstance(plain, dict):
        raise ValueError(f"{where}: fedpref must be a mapping of {', '.join(FEDPREF_SETTINGS)}, got {settings!r}")
    unknown = sorted(set(plain) - set(FEDPREF_SETTINGS))
    if unknown:
        raise ValueError(f"{where}: fedpref has unknown setting(s) {unknown}; valid: {', '.join(FEDPREF_SETTINGS)}")
    out: dict[str, Any] = {}
    if "eps" in plain:
        eps = _as_float(plain["eps"], "fedpref.eps", where)
        if not 0.0 < eps <= 1.0:
            raise ValueError(
                f"{where}: fedpref.eps is a fraction of the largest update norm seen, in (0, 1], got {eps}"
            )
        out["eps"] = eps
    if "patience" in plain:
        out["patience"] = _as_positive_int(plain["patience"], "fedpref.patience", where)
    return out
