"""Tests of the envs package: YAML specs, aliases (Python and hydra), known fronts, dependencies.

Factories and seeding: ``tests/test_env_factory.py``.
"""

from __future__ import annotations

import dataclasses
import re
import sys

import numpy as np
import pytest
from conftest import CANONICAL_ENVS

from morlfed import envs
from morlfed.envs import factory as envs_factory


# ------------------------------------------------------------------------------------------
# specs
# ------------------------------------------------------------------------------------------
def test_available_lists_the_canonical_names() -> None:
    assert envs.available() == sorted(CANONICAL_ENVS)


@pytest.mark.parametrize("name", CANONICAL_ENVS)
def test_spec_loads_with_typed_fields(name: str) -> None:
    spec = envs.get_spec(name)
    assert spec.name == name
    assert spec.agent in ("dqn", "ddpg")
    assert isinstance(spec.objectives, tuple) and len(spec.objectives) == spec.n_objectives >= 2
    assert isinstance(spec.ref_point, tuple) and len(spec.ref_point) == spec.n_objectives
    assert all(isinstance(r, float) for r in spec.ref_point)
    assert 0 < spec.gamma <= 1
    assert spec.return_scale > 0
    for count in ("eval_episodes", "n_clients", "rounds", "local_steps"):
        assert isinstance(getattr(spec, count), int) and getattr(spec, count) >= 1
    assert isinstance(spec.agent_kwargs, dict)
    # the agent discount follows the spec's gamma through the ${..gamma} interpolation
    assert spec.agent_kwargs["gamma"] == spec.gamma
    assert "net_arch" in spec.agent_kwargs["policy_kwargs"]
    if spec.agent == "ddpg":
        assert "action_noise_std" in spec.agent_kwargs
        assert "action_noise_std" not in spec.sb3_kwargs
    else:
        assert "exploration_final_eps" in spec.agent_kwargs
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.gamma = 0.5  # type: ignore[misc]


def test_design_table_values() -> None:
    dst = envs.get_spec("deep-sea-treasure")
    assert (dst.gym_id, dst.agent, dst.gamma, dst.ref_point, dst.known_front) == (
        "deep-sea-treasure-v0",
        "dqn",
        0.99,
        (0.0, -25.0),
        True,
    )
    mc = envs.get_spec("minecart")
    assert (mc.gym_id, mc.agent, mc.gamma, mc.ref_point, mc.known_front, mc.seeds_global_numpy) == (
        "minecart-deterministic-v0",
        "dqn",
        0.98,
        (-1.0, -1.0, -200.0),
        True,
        True,
    )
    for name, agent in [("mo-lunar-lander", "dqn"), ("mo-lunar-lander-continuous", "ddpg")]:
        ll = envs.get_spec(name)
        assert ll.agent == agent and ll.gamma == 0.99 and not ll.known_front
        assert ll.ref_point == (-101.0, -1001.0, -101.0, -101.0)
    hc = envs.get_spec("mo-halfcheetah")
    assert (hc.gym_id, hc.agent, hc.n_objectives, hc.known_front) == ("mo-halfcheetah-v5", "ddpg", 2, False)


def test_train_freq_list_becomes_tuple_for_sb3() -> None:
    spec = envs.get_spec("mo-lunar-lander-continuous")
    assert spec.agent_kwargs["train_freq"] == (1, "episode")


@pytest.mark.parametrize("name", CANONICAL_ENVS)
def test_every_yaml_field_has_a_comment(name: str) -> None:
    text = (envs.ENV_CONF_DIR / f"{name}.yaml").read_text()
    for line in text.splitlines():
        if re.match(r"^\s*[A-Za-z_][\w]*\s*:", line):
            assert "#" in line, f"{name}.yaml: field without a comment: {line!r}"


# ------------------------------------------------------------------------------------------
# aliases and names
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("mo-lunar-lander-v2", "mo-lunar-lander"),
        ("mo-lunar-lander-continuous-v2", "mo-lunar-lander-continuous"),
        ("mo-lunar-lander-v3", "mo-lunar-lander"),
        ("mo-lunar-lander-continuous-v3", "mo-lunar-lander-continuous"),
        ("deep-sea-treasure-v0", "deep-sea-treasure"),
        ("minecart-deterministic-v0", "minecart"),
        ("mo-halfcheetah-v5", "mo-halfcheetah"),
    ],
)
def test_aliases_resolve(alias: str, canonical: str) -> None:
    assert envs.resolve_name(alias) == canonical
    assert envs.get_spec(alias) == envs.get_spec(canonical)
    assert envs.aliases()[alias] == canonical


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        envs.get_spec("mo-lunar-landr")
    msg = str(err.value)
    assert "mo-lunar-landr" in msg
    for name in CANONICAL_ENVS:
        assert name in msg


def test_hydra_alias_composes_to_the_canonical_spec() -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(envs.CONF_DIR), version_base="1.3"):
        for alias, canonical in [
            ("mo-lunar-lander-v2", "mo-lunar-lander"),
            ("mo-lunar-lander-continuous-v2", "mo-lunar-lander-continuous"),
            ("deep-sea-treasure-v0", "deep-sea-treasure"),
        ]:
            cfg = compose(overrides=[f"+env={alias}"])
            assert envs.EnvSpec.from_config(cfg.env) == envs.get_spec(canonical)
        cfg = compose(overrides=["+env=mo-lunar-lander-v2", "env.local_steps=500", "env.gamma=0.95"])
        spec = envs.EnvSpec.from_config(cfg.env)
        assert spec.name == "mo-lunar-lander" and spec.local_steps == 500
        assert spec.gamma == 0.95 and spec.agent_kwargs["gamma"] == 0.95  # interpolation follows


def test_hydra_search_path_from_a_primary_config(tmp_path) -> None:
    from hydra import compose, initialize_config_dir

    (tmp_path / "config.yaml").write_text(
        f"defaults:\n  - env: deep-sea-treasure\n  - _self_\nhydra:\n  searchpath:\n    - file://{envs.CONF_DIR}\n"
    )
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        assert envs.EnvSpec.from_config(compose("config").env) == envs.get_spec("deep-sea-treasure")
        cfg = compose("config", overrides=["env=mo-lunar-lander-continuous-v2"])
        assert envs.EnvSpec.from_config(cfg.env).name == "mo-lunar-lander-continuous"


# ------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------
def _dst_dict() -> dict:
    return envs.get_spec("deep-sea-treasure").to_dict()


@pytest.mark.parametrize(
    "change, match",
    [
        ({"ref_point": [0.0, -25.0, 1.0]}, "ref_point has 3 entries but there are 2 objectives"),
        ({"gamma": 0.0}, r"gamma must be in \(0, 1\]"),
        ({"gamma": 1.5}, r"gamma must be in \(0, 1\]"),
        ({"n_clients": 0}, "n_clients must be a positive integer"),
        ({"rounds": -1}, "rounds must be a positive integer"),
        ({"local_steps": 2.5}, "local_steps must be a positive integer"),
        ({"eval_episodes": 0}, "eval_episodes must be a positive integer"),
        ({"max_episode_steps": 0}, "max_episode_steps must be a positive integer"),
        ({"return_scale": 0.0}, "return_scale must be > 0"),
        ({"agent": "ppo"}, "agent must be one of dqn, ddpg"),
        ({"objectives": ["a"], "ref_point": [0.0]}, "at least 2 objectives"),
        ({"known_front": "yes"}, "known_front must be true or false"),
        ({"local_step": 5}, r"unknown env spec field\(s\) \['local_step'\]"),
        ({"agent_kwargs": {"action_noise_std": 0.1}}, "do not apply to agent 'dqn'"),
        (
            {"fedpref": {"eps": 0.3, "s_min": 0.0}},
            r"fedpref has unknown setting\(s\) \['s_min'\]; valid: eps, patience",
        ),
        ({"fedpref": {"eps": 1.5}}, r"fedpref.eps is a fraction of the largest update norm seen, in \(0, 1\]"),
        ({"fedpref": {"patience": 0}}, "fedpref.patience must be a positive integer"),
        ({"fedpref": 0.3}, "fedpref must be a mapping of eps, patience"),
    ],
)
def test_from_config_validation(change: dict, match: str) -> None:
    data = _dst_dict()
    data.update(change)
    with pytest.raises(ValueError, match=match):
        envs.EnvSpec.from_config(data)


def test_from_config_missing_field() -> None:
    data = _dst_dict()
    del data["gamma"]
    with pytest.raises(ValueError, match=r"missing field\(s\) \['gamma'\]"):
        envs.EnvSpec.from_config(data)


def test_replace_and_round_trip() -> None:
    spec = envs.get_spec("mo-lunar-lander-continuous")
    assert envs.EnvSpec.from_config(spec.to_dict()) == spec
    short = spec.replace(local_steps=500)
    assert short.local_steps == 500 and spec.local_steps != 500
    with pytest.raises(ValueError, match="unknown EnvSpec field"):
        spec.replace(local_step=5)


# ------------------------------------------------------------------------------------------
# fronts and dependencies
# ------------------------------------------------------------------------------------------
def test_dst_known_front_has_10_points() -> None:
    front = envs.known_front(envs.get_spec("deep-sea-treasure"))
    assert front is not None and front.shape == (10, 2)
    np.testing.assert_allclose(front[0], [0.7, -1.0])
    # the farthest treasure 23.7 is 19 steps away: discounted by gamma^18, time by sum gamma^t
    g = 0.99
    np.testing.assert_allclose(front[-1], [23.7 * g**18, -sum(g**t for t in range(19))], rtol=1e-6)
    front[0, 0] = -1.0  # a writable copy: the cached front is untouched
    again = envs.known_front("deep-sea-treasure")
    assert again is not None and again[0, 0] == pytest.approx(0.7)


def test_known_front_with_another_gamma() -> None:
    undiscounted = envs.known_front("deep-sea-treasure", gamma=1.0)
    assert undiscounted is not None
    np.testing.assert_allclose(undiscounted[:, 0], [0.7, 8.2, 11.5, 14.0, 15.1, 16.1, 19.6, 20.3, 22.4, 23.7])
    np.testing.assert_allclose(undiscounted[:, 1], [-1, -3, -5, -7, -8, -9, -13, -14, -17, -19])


def test_minecart_front_and_no_front() -> None:
    front = envs.known_front("minecart")
    assert front is not None and front.ndim == 2 and front.shape[1] == 3 and len(front) > 3
    assert envs.known_front("mo-lunar-lander") is None
    assert envs.known_front("mo-halfcheetah") is None


def test_missing_simulator_raises_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envs_factory, "_module_available", lambda name: name not in ("mujoco", "Box2D"))
    with pytest.raises(envs.MissingDependencyError, match=re.escape(f"{sys.executable} -m pip install -e '.[mujoco]'")):
        envs.make_eval_env("mo-halfcheetah", seed=0)
    with pytest.raises(ImportError, match=r"box2d==2\.3\.10"):
        envs.make_train_env("mo-lunar-lander", [0.25] * 4, seed=0)
    assert envs.missing_dependencies(envs.get_spec("deep-sea-treasure")) == []
