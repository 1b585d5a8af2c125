"""A run never writes into a directory that holds another run.

It stops before training with one line naming the directory and what to do (``resume=`` or a new
directory), and the first run's files stay byte for byte as they were; runs started in the same
second get directories of their own, and so do the jobs of a sweep.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import setup_globals
from omegaconf import OmegaConf

import morlfed.run  # noqa: F401  (registers the configuration's resolvers)
from morlfed.cli.config_groups import CONF_DIR
from morlfed.cli.overrides import parse, sweep_dir
from morlfed.storage.runstatus import StopRecord, write_stopped

TINY = ["n_clients=3", "rounds=2", "local_steps=100", "progress=false"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (hydra's own included) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, morlfed_cli) -> Path:
    out = tmp_path_factory.mktemp("first") / "run"
    done = morlfed_cli([*TINY, f"hydra.run.dir={out}"])
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("morlfed: error: "), proc.stderr
    return lines[0]


def test_a_second_run_into_a_finished_runs_directory_is_refused_and_changes_nothing(finished, morlfed_cli):
    before = snapshot(finished)
    line = one_error_line(morlfed_cli([*TINY, "seed=1", f"hydra.run.dir={finished}"]))
    assert f"hydra.run.dir={finished} already holds a finished run (metrics.json)" in line
    assert "give a new hydra.run.dir" in line
    assert snapshot(finished) == before


def test_a_stopped_runs_directory_offers_its_resume_command(finished, tmp_path, morlfed_cli):
    stopped = tmp_path / "stopped"
    shutil.copytree(finished, stopped)
    (stopped / "metrics.json").unlink()
    write_stopped(stopped, StopRecord("SIGTERM", 1, 2, "checkpoints/round_1", "..."))
    line = one_error_line(morlfed_cli([*TINY, f"hydra.run.dir={stopped}"]))
    assert "already holds a run stopped by SIGTERM after 1 of 2 rounds" in line
    assert f"continue it with `{sys.executable} -m morlfed.run resume={stopped}`" in line


def test_a_directory_with_other_files_is_refused(tmp_path, morlfed_cli):
    (tmp_path / "notes.txt").write_text("mine")
    line = one_error_line(morlfed_cli([*TINY, f"hydra.run.dir={tmp_path}"]))
    assert "already holds files of its own (notes.txt)" in line and "give a new or empty directory" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_sweep_into_another_sweeps_folder_is_refused_and_changes_nothing(tmp_path, morlfed_cli):
    sweep = ["-m", *TINY, "seed=0", f"hydra.sweep.dir={tmp_path}"]
    assert morlfed_cli(sweep).returncode == 0
    before = snapshot(tmp_path)
    line = one_error_line(morlfed_cli([*sweep[:-2], "seed=0,1", "algo=fedavg", f"hydra.sweep.dir={tmp_path}"]))
    assert f"hydra.sweep.dir={tmp_path} already holds a sweep (multirun.yaml)" in line
    assert snapshot(tmp_path) == before  # multirun.yaml included: hydra never got to rewrite it
    # without the sweep's records, each job still refuses a folder that holds a run
    (tmp_path / "multirun.yaml").unlink()
    (tmp_path / "sweep_jobs.jsonl").unlink()
    job = tmp_path / "0_fedpref_equidistant_seed0"
    results = {n: (job / n).read_bytes() for n in ("config.yaml", "rounds.csv", "final.csv", "metrics.json")}
    line = one_error_line(morlfed_cli(sweep))
    assert f"hydra.sweep.dir={job} already holds a finished run" in line
    assert {n: (job / n).read_bytes() for n in results} == results


def test_an_experiments_own_sweep_folder_is_known_before_hydra_runs():
    assert sweep_dir(parse(["+experiment=comparison", "env=minecart"])) == Path("multirun/comparison/minecart")
    assert sweep_dir(parse(["seed=0,1"])) is None  # the default folder names the time: always new
    # a sweep only hydra can expand (a glob of options) leaves the folder unknown, not an error
    assert sweep_dir(parse(["algo=glob(fed*)", "hydra.sweep.dir=/tmp/x"])) is None


def run_dir_of(overrides: list[str], key: str) -> str:
    """The run (or sweep) directory a fresh composition resolves, as a new process would."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    OmegaConf.register_new_resolver("now", lambda pattern: "2030-01-01_00-00-00", replace=True)  # one second
    try:
        return str(OmegaConf.select(cfg, key))
    finally:
        setup_globals()  # hydra's own now= again


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_runs_started_in_the_same_second_get_directories_of_their_own(key):
    first, second = run_dir_of([], key), run_dir_of([], key)
    assert first != second and first.startswith(second[: -len("_xxxxxx")])
    assert run_dir_of(["task=vision"], key) != run_dir_of(["task=vision"], key)
