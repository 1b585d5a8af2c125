"""The command line refuses what it does not understand, before anything runs.

An unknown key with or without ``+`` (the closest valid keys suggested), an option of another config
group's choice, and a value of the wrong type or range, every value of a sweep; the CLI says so in
one line, exit status 2, leaving no run directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from morlfed.cli.overrides import check_overrides, closest
from morlfed.core.settings import ConfigError, check_setting

REFUSED = [
    (["evn=mo-lunar-lander"], "unknown key evn (in evn=mo-lunar-lander); did you mean env?"),
    (["+evn=mo-lunar-lander"], "unknown key evn (in +evn=mo-lunar-lander); did you mean env?"),
    (["+n_client=5"], "unknown key n_client (in +n_client=5); did you mean n_clients?"),
    (["nclients=5"], "did you mean n_clients?"),
    (
        ["algo.topr=0.5"],
        "algo=fedpref has top_r, s_min, eps, patience, eps_mode, clustering, weighting; did you mean algo.top_r?",
    ),
    (
        ["executor=sequential", "executor.workers=2"],
        "executor=sequential has name, client_timeout; workers is a setting of executor=auto and executor=process",
    ),
    (["dist.alpha=0.5"], "dist=equidistant has name; alpha is a setting of dist=dirichlet"),
    (
        ["-m", "algo=fedavg,fedfew", "algo.n_models=2"],
        "algo=fedavg has no settings; n_models is a setting of algo=fedfew",
    ),
    (["+n_clients=4"], "+n_clients=4 adds a key, but n_clients exists: write n_clients=4"),
    (["+algo=fedavg"], "+algo=fedavg: algo= is chosen by default: write algo=fedavg"),
    (["experiment=comparison"], "experiment is added to the configuration: write +experiment=comparison"),
    (["env.agent_kwargs.tau=0.5"], "env.agent_kwargs.tau is not set by default: add it with +env.agent_kwargs.tau=0.5"),
    (["seed=0,1"], "seed=0,1 is a sweep: add -m (--multirun)"),
    (["finetune=maybe"], "finetune must be true or false, got 'maybe'"),
    (["finetune=1"], "finetune must be true or false, got 1"),
    (["participation=abc"], "participation must be in (0, 1], got 'abc'"),
    (["torch_threads=two"], "torch_threads must be a positive integer or auto (one per worker), got 'two'"),
    (["torch_threads=0"], "torch_threads must be a positive integer or auto (one per worker), got 0"),
    (["n_clients=2.5"], "n_clients must be a positive integer, got 2.5"),
    (["-m", "seed=0,1,x"], "seed must be an integer >= 0 (the root seed), got 'x'"),
    (["save_similarity=yes"], "save_similarity must be true or false, got 'yes'"),
    (["device=gpu"], "device must be cpu, cuda or auto, got 'gpu'"),
]


@pytest.mark.parametrize("argv, message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_what_the_configuration_does_not_have_is_refused(argv: list[str], message: str):
    with pytest.raises(ConfigError) as info:
        check_overrides(argv)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


ACCEPTED = [
    ["env=mo-lunar-lander", "dist=dirichlet", "dist.alpha=0.5"],
    ["algo=fedpref", "algo.top_r=0.5", "algo.s_min=-0.5", "n_clients=20", "rounds=30"],
    ["+env.agent_kwargs.tau=0.5", "env.agent_kwargs.learning_rate=0.001"],  # SB3's own keyword arguments
    ["executor=process", "executor.workers=2", "torch_threads=auto", "finetune=true"],
    ["-m", "algo=fedavg,fedfew", "seed=range(0,3)", "participation=0.5,1"],
    ["-m", "+experiment=comparison", "env=deep-sea-treasure"],
    ["task=vision", "data=digits", "model=cnn", "partition=pathological", "partition.classes_per_client=2"],
    ["rounds=${env.rounds}", "hydra.run.dir=/tmp/x", "--cfg", "job"],
]


@pytest.mark.parametrize("argv", ACCEPTED, ids=[" ".join(a) for a in ACCEPTED])
def test_what_the_configuration_has_passes(argv: list[str]):
    check_overrides(argv)


def test_settings_check_types_and_ranges():
    for key, value in (("finetune", False), ("torch_threads", "auto"), ("torch_threads", 4), ("participation", 1)):
        check_setting(key, value)
    for key, value in (("rounds", True), ("seed", -1), ("checkpoint_every", 0.5), ("resume", 3)):
        with pytest.raises(ValueError, match=f"^{key} must be"):
            check_setting(key, value)
    check_setting("a_key_without_a_fixed_type", object())


def test_suggestions_are_the_closest_keys_only():
    assert closest("evn", ["env", "dist", "env.name", "seed"]) == ["env"]
    assert closest("n_client", ["n_clients", "env.n_clients", "rounds"]) == ["n_clients"]
    assert closest("zzz", ["env", "dist"]) == []


CLI_REFUSED = [["evn=mo-lunar-lander"], ["+evn=mo-lunar-lander"], ["+n_client=5"], ["finetune=maybe"]]


@pytest.mark.parametrize("args", CLI_REFUSED, ids=[" ".join(a) for a in CLI_REFUSED])
def test_the_cli_refuses_in_one_line_with_exit_2_and_no_run_directory(args: list[str], tmp_path: Path, morlfed_cli):
    proc = morlfed_cli([*args, "rounds=1", "local_steps=100"], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("morlfed: error: "), proc.stderr
    assert list(tmp_path.iterdir()) == []
