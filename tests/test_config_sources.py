"""One source of truth per default: Python defaults are the YAML's, "+FT" variants reuse their base.

Every class a config instantiates (``_target_``) takes, as its Python defaults, exactly the values
its YAML file writes down, and every "+FT" variant composes its base variant with the ``ft`` switch
instead of spelling the strategy again.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from conftest import compose_config
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "morlfed" / "conf"
# a task's YAML names its class, which the run builds from the whole config (Task.from_config):
# its settings are checked against the composed config below, not against the file
TARGET_CONFIGS = sorted(
    p for p in CONF.glob("*/*.yaml") if p.parent.name != "task" and "_target_" in yaml.safe_load(p.read_text())
)
VARIANTS = sorted(p.stem for p in (CONF / "variant").glob("*.yaml"))


def constructor_defaults(target: str) -> dict[str, Any]:
    """The keyword parameters of ``target``'s constructor that have a default, and their defaults.

    The parameters without one (a tracker's run directory, a task's config) are the caller's to
    pass when it instantiates the class; they are no setting of the config file.
    """
    module, name = target.rsplit(".", 1)
    signature = inspect.signature(getattr(importlib.import_module(module), name))
    return {
        key: param.default
        for key, param in signature.parameters.items()
        if param.default is not param.empty and param.kind is not param.VAR_KEYWORD
    }


def test_the_configs_with_a_target_are_found() -> None:
    names = {f"{p.parent.name}/{p.stem}" for p in TARGET_CONFIGS}
    assert {"algo/fedpref", "algo/fedavg", "algo/cfl", "logger/csv", "logger/wandb"} <= names


@pytest.mark.parametrize("path", TARGET_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_config_writes_down_exactly_its_classes_defaults(path: Path) -> None:
    # resolved on its own: a setting that an env spec can set (FedPref's eps) falls back to its default
    written = cast("dict[str, Any]", OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    target = written.pop("_target_")
    defaults = constructor_defaults(target)
    assert set(written) == set(defaults), (
        f"{path.relative_to(ROOT)}: settings {sorted(set(written) ^ set(defaults))} are in one of the YAML and "
        f"{target}'s constructor defaults but not the other"
    )
    # a YAML list is a tuple default in Python (an immutable default argument)
    differing = {
        key: (value, defaults[key])
        for key, value in written.items()
        if (tuple(value) if isinstance(value, list) else value) != defaults[key]
    }
    assert not differing, f"{path.relative_to(ROOT)}: YAML value != Python default for {differing}"


def test_an_rl_task_built_in_python_trains_as_the_command_line_would() -> None:
    from morlfed.tasks.rl.task import RLTask

    composed = compose_config([])
    defaults = constructor_defaults("morlfed.tasks.rl.task.RLTask")
    # dist only records the distribution that drew the preferences (config.yaml); it trains nothing
    assert defaults.pop("dist") is None
    assert defaults == {"engine": composed.engine.name, "device": composed.device, "precision": composed.precision}
    assert RLTask.__init__.__defaults__ == (*defaults.values(), None)


def test_fedpref_built_with_no_arguments_is_the_configured_fedpref() -> None:
    from morlfed.strategies.fedpref import FedPref

    configured = compose_config(["algo=fedpref", "task=vision"]).algo  # no env spec to set eps
    plain = FedPref()
    for key in ("top_r", "s_min", "eps", "patience", "eps_mode", "clustering", "weighting"):
        assert getattr(plain, key) == configured[key], key


def test_fedpref_takes_the_env_specs_threshold_and_the_command_line_overrides_it() -> None:
    from morlfed.envs import get_spec

    for env in ("deep-sea-treasure", "mo-lunar-lander", "minecart"):
        spec, algo = get_spec(env), compose_config([f"env={env}"]).algo
        assert (algo.eps, algo.patience) == (spec.fedpref.get("eps", 0.1), spec.fedpref.get("patience", 2)), env
    overridden = compose_config(["env=deep-sea-treasure", "algo.eps=0.3", "algo.patience=1"]).algo
    assert (overridden.eps, overridden.patience) == (0.3, 1)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.endswith("_ft")])
def test_a_plus_ft_variant_composes_its_base_and_the_switch(variant: str) -> None:
    base = variant.removesuffix("_ft")
    text = yaml.safe_load((CONF / "variant" / f"{variant}.yaml").read_text())
    assert text == {"defaults": [base, "ft"]}, f"{variant}.yaml must only compose {base} and ft"
    composed = compose_config([f"+variant={variant}"])
    plain = compose_config([f"+variant={base}"])
    assert OmegaConf.to_container(composed.algo) == OmegaConf.to_container(plain.algo)
    assert composed.finetune is True and plain.finetune is False


def test_every_base_variant_has_its_plus_ft_or_is_a_method_without_one() -> None:
    bases = {v for v in VARIANTS if not v.endswith("_ft") and v != "ft"}
    without_ft = {v for v in bases if f"{v}_ft" not in VARIANTS}
    # no communication has nothing to fine-tune after
    assert without_ft == {"local"}


def test_each_strategy_explains_its_own_model_column() -> None:
    from morlfed.strategies.base import Strategy

    notes = {}
    for path in sorted((CONF / "algo").glob("*.yaml")):
        target = yaml.safe_load(path.read_text())["_target_"]
        module, name = target.rsplit(".", 1)
        notes[path.stem] = getattr(importlib.import_module(module), name).model_id_note
    # the one global model is the default; every method with clusters, server models or personal
    # models says what its ids are
    assert notes["fedavg"] == notes["fedprox"] == Strategy.model_id_note
    personal_or_clustered = ("fedpref", "cfl", "matfl", "ifca", "fedfew", "fedmhc", "fedpg", "local")
    assert all(notes[algo] != Strategy.model_id_note for algo in personal_or_clustered)
    assert "cluster" in notes["fedpref"] and "cluster" in notes["cfl"] and "own id" in notes["local"]


def test_each_task_composes_its_own_groups_and_no_other_tasks() -> None:
    rl, vision = compose_config([]), compose_config(["task=vision"])
    assert {"env", "dist", "engine", "precision", "device"} <= set(rl) and not {"data", "model", "partition"} & set(rl)
    assert {"data", "model", "partition"} <= set(vision)
    assert not {"env", "dist", "engine", "precision", "device"} & set(vision)
    assert (rl.n_clients, rl.rounds, rl.local_steps) == (rl.env.n_clients, rl.env.rounds, rl.env.local_steps)


def test_the_vision_job_config_lists_no_rl_setting(morlfed_cli) -> None:
    done = morlfed_cli(["task=vision", "--cfg", "job"])
    assert done.returncode == 0, done.stderr[-2000:]
    top = {line.split(":")[0] for line in done.stdout.splitlines() if line and not line.startswith((" ", "#"))}
    assert {"task", "data", "model", "partition", "n_clients"} <= top
    assert not {"env", "engine", "dist", "precision", "device"} & top
