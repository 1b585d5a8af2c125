"""Build a client's environments from an :class:`~morlfed.envs.spec.EnvSpec`.

* :func:`make_train_env` -- ``mo_gymnasium.make(gym_id, **env_kwargs)`` with the spec's
  TimeLimit, scalarised by ``mo_gymnasium.wrappers.LinearReward`` with the client's weights (SB3
  needs a scalar reward; the vector reward stays in ``info["vector_reward"]``), then SB3's
  ``Monitor``.
* :func:`make_eval_env` -- the same env with the vector reward.
* :func:`reset_env` -- the seeded reset to use before every evaluation episode.
* :func:`known_front` -- ``env.unwrapped.pareto_front(gamma)`` for envs that have one.

**Numpy's global RNG.** Minecart draws from ``np.random.*`` (the process-wide legacy RNG), not
from ``env.np_random``: its constructor places mines and picks colours with it (the config files
then overwrite both), and every mining action samples ore yields with ``scipy.stats.norm.rvs``,
which also uses the global RNG (random in ``minecart-v0``; zero-variance, hence fixed, in
``minecart-deterministic-v0``). Seeding ``reset(seed=...)`` therefore does not make minecart-v0
reproducible, and with several clients in one process (sequential executor) one client's episodes
would change another's, so results would depend on the executor. For specs flagged
``seeds_global_numpy`` the factory adds :class:`GlobalNumpyRNGIsolation`: the env gets a private
legacy RNG (a ``np.random.RandomState``), and ``reset(seed=s)`` re-seeds it exactly as
``np.random.seed(s)`` would. The env is then reproducible per seed, independent of other clients,
and leaves the process' global RNG untouched. Where the wrapper knows every draw a step makes
(minecart: its mines' ``scipy.stats`` distributions) it hands the private RNG to those draws
(``rv_frozen.random_state``), so a step costs nothing extra; for any other env it swaps the
private state into ``np.random`` around each call (two state copies, about 100 us a step).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import warnings
from collections.abc import Iterator, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from morlfed.core.commands import pip_install

from .registry import get_spec
from .spec import EnvSpec

if TYPE_CHECKING:
    from stable_baselines3.common.monitor import Monitor

__all__ = [
    "GlobalNumpyRNGIsolation",
    "MissingDependencyError",
    "check_dependencies",
    "known_front",
    "make_eval_env",
    "make_train_env",
    "missing_dependencies",
    "reset_env",
    "validate_weights",
]

# Python module -> how to install it, per family of MO-Gymnasium env (chosen by entry point).
_BOX2D_HINT = f"{pip_install('box2d==2.3.10')} (a wheel, part of `pip install -e .`; not mo-gymnasium[box2d])"
_MUJOCO_HINT = f"{pip_install('-e', '.[mujoco]')} (mujoco and imageio)"


class MissingDependencyError(ImportError):
    """An optional simulator (Box2D, MuJoCo) needed by an environment is not installed."""


class GlobalNumpyRNGIsolation(gym.Wrapper):
    """Give an env that uses ``np.random.*`` internally its own, seedable legacy RNG.

    The private RNG is a ``np.random.RandomState``. ``reset(seed=s)`` first re-seeds it as
    ``np.random.seed(s)`` would, so the env sees the very stream it would see after that call. A
    ``reset`` runs with the private state swapped into ``np.random`` (the caller's state is saved
    and restored around it). A ``step`` does too, unless the env's draws during a step are known
    and routed to the private RNG (:meth:`_route_step_draws`): then the step runs as is.

    :param env: the env to wrap
    :param seed: initial seed of the private RNG (used until a ``reset(seed=...)``)
    """

    def __init__(self, env: gym.Env, seed: int | None = None) -> None:
        super().__init__(env)
        self._rng = np.random.RandomState(seed)
        self._steps_routed = self._route_step_draws()

    def seed_global_numpy(self, seed: int | None) -> None:
        """Re-seed the private legacy RNG (``np.random.seed(seed)`` semantics)."""
        self._rng.seed(seed)

    def _route_step_draws(self) -> bool:
        """Point every random draw the env makes in ``step`` at the private RNG, where known.

        Minecart's only draws after construction are its mines' ore yields,
        ``scipy.stats.norm(...).rvs()``, which take the frozen distribution's ``random_state``
        (the global RNG when unset). The mines are built once, in the constructor.
        """
        from mo_gymnasium.envs.minecart.minecart import Minecart

        base = self.env.unwrapped
        if not isinstance(base, Minecart):
            return False
        for mine in base.mines:
            for distribution in mine.distributions:
                distribution.random_state = self._rng
        return True

    @contextlib.contextmanager
    def _private_rng(self) -> Iterator[None]:
        saved = np.random.get_state(legacy=False)
        np.random.set_state(self._rng.get_state(legacy=False))
        try:
            yield
        finally:
            self._rng.set_state(np.random.get_state(legacy=False))
            np.random.set_state(saved)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the env with its private RNG (re-seeded first if ``seed`` is given)."""
        if seed is not None:
            self.seed_global_numpy(seed)
        with self._private_rng():
            return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step the env with its private RNG."""
        if self._steps_routed:
            return self.env.step(action)
        with self._private_rng():
            return self.env.step(action)


@contextlib.contextmanager
def _preserve_global_numpy_rng(seed: int | None = None) -> Iterator[None]:
    """Run the block with numpy's global RNG seeded by ``seed`` (if given), then restore it."""
    saved = np.random.get_state(legacy=False)
    try:
        if seed is not None:
            np.random.seed(seed)
        yield
    finally:
        np.random.set_state(saved)


# --------------------------------------------------------------------------------------------
# dependencies
# --------------------------------------------------------------------------------------------
def _entry_point(gym_id: str) -> str:
    import mo_gymnasium  # noqa: F401  (registers the MO-Gymnasium ids)

    try:
        ep = gym.spec(gym_id).entry_point
    except gym.error.Error as exc:
        raise ValueError(f"gym id {gym_id!r} is not registered in gymnasium/mo-gymnasium: {exc}") from exc
    return ep if isinstance(ep, str) else f"{ep.__module__}.{getattr(ep, '__name__', '')}"


def _module_available(name: str) -> bool:
    """True if ``import name`` would find the module (without importing it)."""
    return importlib.util.find_spec(name) is not None


def missing_dependencies(spec: EnvSpec) -> list[str]:
    """Names of the simulator modules the spec's env needs but cannot import (``[]``: all there)."""
    ep = _entry_point(spec.gym_id)
    needed = []
    if "lunar_lander" in ep or "box2d" in ep.lower() or "bipedal" in ep or "car_racing" in ep:
        needed.append("Box2D")
    if "mujoco" in ep:
        needed.append("mujoco")
    return [m for m in needed if not _module_available(m)]


def check_dependencies(spec: EnvSpec) -> None:
    """Raise :class:`MissingDependencyError` naming the pip command when a simulator is missing."""
    missing = missing_dependencies(spec)
    if not missing:
        return
    hints = [_BOX2D_HINT if m == "Box2D" else _MUJOCO_HINT for m in missing]
    raise MissingDependencyError(
        f"environment {spec.name!r} ({spec.gym_id}) needs {', '.join(missing)}, which is not "
        f"installed: {'; '.join(hints)}"
    )


#: what ``gymnasium.make`` takes itself, whatever the env's constructor takes
_MAKE_KEYWORDS = ("max_episode_steps", "disable_env_checker", "render_mode")


def check_env_kwargs(spec: EnvSpec) -> None:
    """Raise ``ValueError`` unless the spec's gym id is registered and its constructor takes every ``env_kwargs`` key.

    The message names the keys it does not take and those it does. A constructor that takes
    ``**kwargs`` takes every key, and an env whose simulator is missing is left to
    :func:`check_dependencies` (its constructor cannot be imported).

    :param spec: the env spec
    """
    from gymnasium.envs.registration import load_env_creator

    _entry_point(spec.gym_id)  # registered, else ValueError
    if missing_dependencies(spec) or not spec.env_kwargs:
        return
    entry = gym.spec(spec.gym_id).entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    if creator is None:
        return
    params = inspect.signature(creator).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    takes = sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    unknown = sorted(set(spec.env_kwargs) - set(takes) - set(_MAKE_KEYWORDS))
    if unknown:
        raise ValueError(
            f"env_kwargs {', '.join(unknown)}: not an argument of {spec.gym_id} "
            f"({getattr(creator, '__qualname__', creator)}), which takes {', '.join(takes) or 'none'}"
        )


# --------------------------------------------------------------------------------------------
# factories
# --------------------------------------------------------------------------------------------
def _as_spec(spec: EnvSpec | str) -> EnvSpec:
    return get_spec(spec) if isinstance(spec, str) else spec


def validate_weights(spec: EnvSpec, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Check a preference vector against the spec and return it as ``float32 [m]``.

    :raises ValueError: wrong number of entries (``"weights have 3 entries but deep-sea-treasure has
        2 objectives (treasure, time)"``) or non-finite values
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(
            f"weights must be a vector with one entry per objective of {spec.name} "
            f"({', '.join(spec.objectives)}), got shape {w.shape}"
        )
    if w.shape[0] != spec.n_objectives:
        n = w.shape[0]
        raise ValueError(
            f"weights have {n} entries but {spec.name} has {spec.n_objectives} objectives "
            f"({', '.join(spec.objectives)})"
        )
    if not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be finite, got {w.tolist()}")
    return w.astype(np.float32)


def _quiet_make(gym_id: str, **kwargs: Any) -> gym.Env:
    """``mo_gymnasium.make`` without gymnasium's warning about DST's float64 bounds on a float32 Box.

    Gymnasium repeats that warning at every construction.
    """
    import mo_gymnasium

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
        return mo_gymnasium.make(gym_id, **kwargs)


def _make_base(spec: EnvSpec, seed: int | None) -> gym.Env:
    """``mo_gymnasium.make`` with the spec's TimeLimit, RNG isolation and seeded spaces."""
    check_dependencies(spec)
    kwargs: dict[str, Any] = dict(spec.env_kwargs)
    if spec.max_episode_steps is not None:
        kwargs["max_episode_steps"] = spec.max_episode_steps  # replaces the registered TimeLimit
    # Minecart's constructor draws mine positions and yield distributions from np.random (the
    # shipped configs overwrite them, a config without mines would keep them): build it from a
    # seeded global state so the same seed gives the same env, and restore the caller's state.
    guard = _preserve_global_numpy_rng(seed) if spec.seeds_global_numpy else contextlib.nullcontext()
    try:
        with guard:
            env = _quiet_make(spec.gym_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:  # pragma: no cover - caught by check above
        hint = _MUJOCO_HINT if "mujoco" in str(exc).lower() else _BOX2D_HINT
        raise MissingDependencyError(f"environment {spec.name!r} ({spec.gym_id}): {exc}; {hint}") from exc
    if spec.seeds_global_numpy:
        env = GlobalNumpyRNGIsolation(env, seed=seed)
    if seed is not None:
        env.action_space.seed(seed)
        env.observation_space.seed(seed)
    return env


def make_train_env(spec: EnvSpec | str, weights: Sequence[float] | np.ndarray, seed: int | None) -> Monitor:
    """The env a client trains on: scalar reward ``w . r`` for SB3.

    ``mo_gymnasium.make(gym_id)`` (TimeLimit ``max_episode_steps``) -> [global-RNG isolation for
    flagged specs] -> ``LinearReward(weight=w)`` -> ``stable_baselines3.common.monitor.Monitor``.
    The vector reward of each step is in ``info["vector_reward"]``. The action and observation
    spaces are seeded with ``seed``; seed the episodes through ``reset(seed=...)`` (SB3 does this
    when the model is created with ``seed=``).

    :param spec: the env spec (or its name)
    :param weights: the client's preference, one entry per objective
    :param seed: seed of the spaces (and of the private global-numpy state of flagged envs)
    :raises ValueError: ``weights`` has the wrong number of entries
    :raises MissingDependencyError: Box2D / MuJoCo not installed
    """
    from mo_gymnasium.wrappers import LinearReward
    from stable_baselines3.common.monitor import Monitor

    spec = _as_spec(spec)
    w = validate_weights(spec, weights)
    env = _make_base(spec, seed)
    env = LinearReward(env, weight=w)
    return Monitor(env)


def make_eval_env(spec: EnvSpec | str, seed: int | None) -> gym.Env:
    """The env a client is evaluated on: vector reward, same TimeLimit as training.

    Reset every episode with :func:`reset_env` (seeded).

    :raises MissingDependencyError: Box2D / MuJoCo not installed
    """
    return _make_base(_as_spec(spec), seed)


def _find_isolation(env: gym.Env) -> GlobalNumpyRNGIsolation | None:
    e: Any = env
    while e is not None:
        if isinstance(e, GlobalNumpyRNGIsolation):
            return e
        e = getattr(e, "env", None)
    return None


@cache
def _global_numpy_gym_ids() -> frozenset[str]:
    from .registry import available

    ids = {get_spec(n).gym_id for n in available() if get_spec(n).seeds_global_numpy}
    return frozenset(ids | {"minecart-v0", "minecart-rgb-v0"})


def reset_env(env: gym.Env, seed: int | None) -> tuple[Any, dict[str, Any]]:
    """Reset ``env`` for a new episode, seeding everything that needs seeding.

    ``env.reset(seed=seed)`` seeds the env's own ``np_random``. Envs that draw from numpy's *global*
    RNG (minecart; spec flag ``seeds_global_numpy``) need more: if the env was built by this
    factory its private global-RNG state is re-seeded by that reset (see
    :class:`GlobalNumpyRNGIsolation`); for such an env built elsewhere ``np.random.seed(seed)`` is
    called, the only way to make its episode reproducible.

    :return: ``(observation, info)`` of the reset
    """
    if seed is not None and _find_isolation(env) is None:
        gym_id = getattr(getattr(env.unwrapped, "spec", None), "id", None)
        if gym_id in _global_numpy_gym_ids():
            np.random.seed(seed)
    return env.reset(seed=seed)


@cache
def _known_front_cached(gym_id: str, gamma: float, n_objectives: int, env_kwargs_json: str) -> np.ndarray:
    with _preserve_global_numpy_rng(0):  # minecart's constructor and pareto_front draw from np.random
        env = _quiet_make(gym_id, **json.loads(env_kwargs_json))
        try:
            # mo_gymnasium ships no types: its envs' pareto_front is not on gymnasium's Env
            front = env.unwrapped.pareto_front(gamma=gamma)  # type: ignore[attr-defined]
        finally:
            env.close()
    arr = np.asarray(front, dtype=np.float64).reshape(-1, n_objectives)
    arr.setflags(write=False)
    return arr


def known_front(spec: EnvSpec | str, gamma: float | None = None) -> np.ndarray | None:
    """The known Pareto front ``[k, m]`` of returns discounted with ``gamma``, or ``None`` if there is none.

    ``gamma`` defaults to ``spec.gamma``; 1.0 gives undiscounted returns.

    ``env.unwrapped.pareto_front(gamma=gamma)``: 10 points for deep-sea-treasure; an
    approximate front (convex coverage set of mine trips) for minecart, returned as is (not
    filtered for dominance). The result is cached; a fresh writable copy is returned.
    """
    spec = _as_spec(spec)
    if not spec.known_front:
        return None
    check_dependencies(spec)
    g = spec.gamma if gamma is None else float(gamma)
    key = json.dumps(spec.env_kwargs, sort_keys=True, default=str)
    return _known_front_cached(spec.gym_id, g, spec.n_objectives, key).copy()
