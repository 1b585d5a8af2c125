"""Which engine trains a run: ``engine=auto`` follows the env spec's ``engine``, and the run records it.

The vectorised engine runs only where it is validated against SB3; fault injection, which wraps one
client at a time, refuses a batched engine before anything runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from morlfed import envs
from morlfed.tasks.rl.task import ENGINES, RLTask

PREFS_2 = np.array([[0.5, 0.5], [1.0, 0.0]])


def test_auto_is_the_env_specs_engine() -> None:
    auto = {
        "deep-sea-treasure": "vectorised",
        "minecart": "vectorised",
        "mo-lunar-lander": "vectorised",
        "mo-lunar-lander-continuous": "sb3",
        "mo-halfcheetah": "sb3",
    }
    for name, engine in auto.items():
        spec = envs.get_spec(name)
        prefs = np.full((2, spec.n_objectives), 1 / spec.n_objectives)
        assert RLTask(spec, prefs, "auto").engine == engine, name
    # an explicit choice wins over the spec's
    assert RLTask(envs.get_spec("deep-sea-treasure"), PREFS_2, "sb3").engine == "sb3"
    assert RLTask(envs.get_spec("minecart"), np.full((2, 3), 1 / 3), "sb3").engine == "sb3"
    assert RLTask(envs.get_spec("mo-lunar-lander"), np.full((2, 4), 1 / 4), "sb3").engine == "sb3"
    spec = envs.get_spec("mo-lunar-lander-continuous")
    assert RLTask(spec, np.full((2, 4), 1 / 4), "vectorised").engine == "vectorised"


def test_spec_engines_are_the_tasks_engines() -> None:
    assert tuple(ENGINES) == envs.SPEC_ENGINES
    with pytest.raises(ValueError, match="engine must be one of sb3, vectorised, got 'auto'"):
        envs.get_spec("deep-sea-treasure").replace(engine="auto")
    with pytest.raises(ValueError, match=r"engine=jax is not an engine; valid: auto, sb3, vectorised"):
        RLTask(envs.get_spec("deep-sea-treasure"), PREFS_2, "jax")


def test_fault_injection_needs_per_client_hosts() -> None:
    spec = envs.get_spec("deep-sea-treasure")
    RLTask(spec, PREFS_2, "sb3").check_fault_injection()  # SB3 clients take faults
    with pytest.raises(ValueError, match=r"engine=vectorised trains a worker's clients as one batch.*add engine=sb3"):
        RLTask(spec, PREFS_2, "auto").check_fault_injection()
