"""Shared test fixtures, and helpers the test modules import (``from conftest import ...``)."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from morlfed import envs
from morlfed.envs import factory as envs_factory
from morlfed.storage.safestate import state_from_bytes, state_to_bytes

if TYPE_CHECKING:
    from morlfed.core.protocol import FitTask
    from morlfed.tasks.rl.vectorised.engine import VectorisedClients

ROOT = Path(__file__).resolve().parents[1]

CliRunner = Callable[..., subprocess.CompletedProcess]
#: A test module's vectorised engine with its spec bound: ``build(cids, seed)``, both optional.
EngineBuilder = Callable[..., "VectorisedClients"]

#: The environments the envs package ships, by canonical name.
CANONICAL_ENVS = [
    "deep-sea-treasure",
    "minecart",
    "mo-lunar-lander",
    "mo-lunar-lander-continuous",
    "mo-halfcheetah",
]
HAS_MUJOCO = importlib.util.find_spec("mujoco") is not None
NO_MUJOCO_REASON = "mujoco is not installed (pip install -e .[mujoco])"


@pytest.fixture(autouse=True)
def no_hydra_state_left_behind() -> Iterator[None]:
    """Clear hydra's process-wide config after each test.

    A test that composes a configuration in-process sets it, and the API's tests check that a call
    leaves the process as it was: under ``pytest -n``, any test may run before them in one worker.
    """
    yield
    HydraConfig.instance().cfg = None
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def morlfed_cli() -> CliRunner:
    """``morlfed_cli(args, cwd=ROOT)`` runs ``python -m morlfed.run ARGS`` in a subprocess.

    This checkout comes first on the path and hydra's errors are the short ones; it returns the
    completed process (``timeout``, 900 s by default, bounds the run).
    """

    def run(args: list[str], cwd: Path = ROOT, timeout: float = 900) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": "0"}
        return subprocess.run(
            [sys.executable, "-m", "morlfed.run", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture(scope="module")
def dst() -> tuple[envs.EnvSpec, np.ndarray, np.ndarray]:
    """Deep Sea Treasure's spec and its known fronts of discounted and of undiscounted returns."""
    spec = envs.get_spec("deep-sea-treasure")
    front, undiscounted = envs.known_front(spec), envs.known_front(spec, gamma=1.0)
    assert front is not None and undiscounted is not None
    return spec, front, undiscounted


def load_bench(name: str) -> ModuleType:
    """The script ``bench/<name>.py`` imported as module ``name``.

    It is registered in ``sys.modules``, which its dataclasses need.

    :param name: the script's file name without ``.py``
    """
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def skip_if_unavailable(name: str) -> None:
    """Skip the test when the environment ``name`` needs MuJoCo and it is not installed.

    :param name: a canonical environment name
    """
    if "mujoco" in envs_factory._entry_point(envs.get_spec(name).gym_id) and not HAS_MUJOCO:
        pytest.skip(NO_MUJOCO_REASON)


@functools.cache
def package_modules() -> dict[str, Path]:
    """Every module under morlfed/ (through the links to envs/, baselines/, analysis/), by its name."""
    modules = {}
    for folder, _, names in os.walk(ROOT / "morlfed", followlinks=True):
        for name in sorted(names):
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = list(path.relative_to(ROOT).with_suffix("").parts)
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def compose_config(overrides: list[str]) -> DictConfig:
    """The run config ``python -m morlfed.run OVERRIDES`` composes, also set as the current hydra config.

    Hydra's own node is included.

    :param overrides: hydra overrides (``key=value``, ``+experiment=NAME``)
    """
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "morlfed" / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def assert_same_results_whatever_the_batch(
    build: EngineBuilder, work: dict[int, FitTask], alone: Sequence[int], seed: int
) -> None:
    """A vectorised engine's fit of ``work`` is deterministic and changes with the seed.

    It also gives a client trained alone what it gets in the whole batch (params and metrics).

    :param build: the engine: ``build()`` of every client at ``seed``, ``build([cid])`` of one,
        ``build(seed=...)`` at another seed
    :param work: a task per client of ``build()``
    :param alone: the clients also trained alone
    :param seed: the seed ``build()`` uses (the other seed is ``seed + 1``)
    """
    together = build().fit_many(work)
    again = build().fit_many(work)
    alone_results = {cid: build([cid]).fit_many({cid: work[cid]})[cid] for cid in alone}
    other_seed = build(seed=seed + 1).fit_many(work)
    for cid in work:
        assert torch.equal(together[cid].params, again[cid].params)
        assert together[cid].metrics == again[cid].metrics
        assert not torch.equal(together[cid].params, other_seed[cid].params)
    for cid, result in alone_results.items():
        assert torch.equal(together[cid].params, result.params)
        assert together[cid].metrics == result.metrics


def saved_states(engine: VectorisedClients) -> dict[int, dict[str, Any]]:
    """Every client's :meth:`~VectorisedClients.get_state`, written to a state file and read back, as a checkpoint does.

    :param engine: the engine whose clients' states are saved
    """
    return {cid: state_from_bytes(state_to_bytes(engine.get_state(cid))) for cid in engine.cids}


def assert_restored_engine_fits_alike(
    first: VectorisedClients, states: dict[int, dict[str, Any]], build: EngineBuilder, work: dict[int, FitTask]
) -> VectorisedClients:
    """``first`` fits ``work``, and a new engine given ``states`` fits it to the same params and metrics.

    ``states`` are :func:`saved_states` of ``first``. Returns the new engine.

    :param first: the engine the states were saved from
    :param states: its clients' saved states
    :param build: builds the new engine (``build()``, as ``first`` was built)
    :param work: a task per client
    """
    expected = first.fit_many(work)
    restored = build()
    for cid, state in states.items():
        restored.set_state(cid, state)
    got = restored.fit_many(work)
    for cid in work:
        assert torch.equal(got[cid].params, expected[cid].params)
        assert got[cid].metrics == expected[cid].metrics
    return restored


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that runs the CLI in a subprocess ``slow``.

    ``pytest -m "not slow"`` is the quick loop (tests that start worker processes or Ray carry the
    marker themselves).
    """
    for item in items:
        if "morlfed_cli" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
