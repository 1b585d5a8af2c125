"""Users' own environments without editing the package, and their arguments checked before anything runs.

Known answers: a copy of deep-sea-treasure's spec under another name, in a folder on hydra's search
path or registered from Python, runs and is recorded under its own name, with morlfed's packaged
specs still on the path; such a spec meets the packaged specs' checks (its name is its file's,
its fields valid); a constructor or SB3 keyword that does not exist is one error line naming it
and what is accepted, on both engines, with no run directory.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.core.config_store import ConfigStore

import morlfed
from morlfed import envs
from morlfed.core.settings import ConfigError
from morlfed.envs import registry

TINY: dict[str, Any] = {"n_clients": 2, "rounds": 1, "local_steps": 100, "progress": False}
DST = envs.ENV_CONF_DIR / "deep-sea-treasure.yaml"


def user_conf(tmp_path: Path, name: str, changes: dict[str, object] | None = None) -> str:
    """A config folder holding ``env/<name>.yaml``: DST's spec renamed, with ``changes``; its searchpath override."""
    spec = yaml.safe_load(DST.read_text()) | {"name": name} | (changes or {})
    folder = tmp_path / "conf"
    (folder / "env").mkdir(parents=True, exist_ok=True)
    (folder / "env" / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return f"hydra.searchpath=[file://{folder}]"


def test_a_spec_on_the_search_path_runs_from_the_command_line(tmp_path: Path, morlfed_cli) -> None:
    out = tmp_path / "run"
    searchpath = user_conf(tmp_path, "my-dst")
    done = morlfed_cli(["env=my-dst", searchpath, *(f"{k}={v}" for k, v in TINY.items()), f"hydra.run.dir={out}"])
    assert done.returncode == 0, done.stderr
    result = morlfed.ExperimentResult.load(out)
    assert result.metrics["env"] == "my-dst" and len(result.final) == 2


def test_the_packaged_specs_stay_on_a_users_search_path(tmp_path: Path) -> None:
    searchpath = user_conf(tmp_path, "my-dst")
    result = morlfed.run_experiment(**TINY, env="deep-sea-treasure", overrides=[searchpath], run_dir=tmp_path / "run")
    assert result.metrics["env"] == "deep-sea-treasure"


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("my-dst", {"name": "deep-sea-treasure"}, "env=my-dst: its config says name: deep-sea-treasure"),
        ("my-dst", {"gamma": 2.0}, "gamma"),
        ("my-dst", {"env_kwargs": {"depth": 3}}, "env_kwargs depth: not an argument of deep-sea-treasure-v0"),
    ],
)
def test_a_users_spec_meets_the_packaged_specs_checks(
    tmp_path: Path, name: str, changes: dict[str, object], message: str
) -> None:
    searchpath = user_conf(tmp_path, name, changes)
    with pytest.raises(ConfigError, match=message):
        morlfed.run_experiment(**TINY, env=name, overrides=[searchpath], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"unknown env 'my-dsx'; valid: .*deep-sea-treasure.*my-dst"):
        morlfed.run_experiment(**TINY, env="my-dsx", overrides=[searchpath])


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Specs registered by the test are forgotten after it (hydra's store and morlfed's)."""
    store = ConfigStore.instance()
    monkeypatch.setattr(store, "repo", copy.deepcopy(store.repo))
    monkeypatch.setattr(registry, "_REGISTERED", {})


def test_a_registered_spec_runs_by_name(tmp_path: Path, clean_registry: None) -> None:
    mine = envs.get_spec("deep-sea-treasure").replace(name="my-registered-dst", gamma=0.9)
    envs.register(mine)
    assert envs.get_spec("my-registered-dst") == mine and "my-registered-dst" in envs.available()
    result = morlfed.run_experiment(**TINY, env="my-registered-dst", run_dir=tmp_path / "run")
    assert result.metrics["env"] == "my-registered-dst"
    assert "gamma: 0.9" in (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ValueError, match="packaged spec's name"):
        envs.register(envs.get_spec("deep-sea-treasure"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["engine=sb3", "+env.agent_kwargs.foo=5"],
            "agent_kwargs foo: not an argument of stable_baselines3.DQN, which takes .*batch_size",
        ),
        (
            ["engine=sb3", "+env.agent_kwargs.policy_kwargs.depth=5"],
            "agent_kwargs.policy_kwargs depth: not an argument of DQNPolicy, which takes .*net_arch",
        ),
        (["engine=vectorised", "+env.agent_kwargs.foo=5"], "does not implement agent_kwargs foo"),
        (
            ["env.gym_id=resource-gathering-v0"],
            r"env_kwargs float_state: not an argument of resource-gathering-v0 \(ResourceGathering\), which takes render_mode",
        ),
        (["env.gym_id=no-such-env-v0"], "gym id 'no-such-env-v0' is not registered"),
    ],
)
def test_unknown_arguments_are_refused_before_anything_is_written(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        morlfed.run_experiment(**TINY, overrides=overrides, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_sb3_unknown_keyword_command_exits_2_and_leaves_no_directory(tmp_path: Path, morlfed_cli) -> None:
    out = tmp_path / "run"
    done = morlfed_cli(["engine=sb3", "+env.agent_kwargs.foo=5", "rounds=1", f"hydra.run.dir={out}"])
    assert done.returncode == 2
    assert done.stderr.startswith("morlfed: error: agent_kwargs foo: not an argument of stable_baselines3.DQN")
    assert len(done.stderr.splitlines()) == 1 and not out.exists()
