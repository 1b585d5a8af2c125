"""The studies of docs/results.md as hydra experiments (``-m +experiment=NAME``).

Every point of every experiment's sweep (seeds aside) must compose into a run the CLI accepts,
each paper row (``+variant=``) must set the strategy, its ablation switches and "+FT" as named,
and one experiment runs end to end (tiny budget) into its own multirun folder.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import compose_config
from hydra.core.override_parser.overrides_parser import OverridesParser

from morlfed.analysis.evaluate import main as evaluate
from morlfed.cli.config_groups import group_options
from morlfed.cli.execute import build_plan

ROOT = Path(__file__).resolve().parents[1]
#: The experiments that template a study for any environment; a published study's own config
#: (named after its docs/results/ folder) is tested by tests/test_studies.py.
EXPERIMENTS = [e for e in group_options("experiment") if not (ROOT / "docs" / "results" / e).is_dir()]
#: Jobs per experiment at its own sweep (seeds included), and the paper rows it covers.
EXPECTED_JOBS = {
    "comparison": 5 * 3 * 10,
    "comparison_all": 6 * 3 * 18,
    "ablation": 5 * 6,
    "sensitivity_top_r": 5 * 6,
    "sensitivity_s_min": 5 * 7,
    "clustering_validation": 3 * 2,
    "fedpref_search": 3 * 27,
    "fedpref_search_relative": 5 * 9,
    "fedpref_threshold": 3 * 5,
    "convergence": 3,
}


def sweep_points(experiment: str) -> tuple[list[list[str]], int]:
    """Every combination of the experiment's sweep parameters but the seed, and the sweep's number of jobs.

    The combinations are override lists; the number of jobs is the whole sweep's.
    """
    params = compose_config([f"+experiment={experiment}"]).hydra.sweeper.params
    parser = OverridesParser.create()
    axes, jobs = [], 1
    for key, value in params.items():
        (override,) = parser.parse_overrides([f"{key}={value}"])
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        jobs *= len(values)
        if key != "seed":
            axes.append([f"{key}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*axes)], jobs


def test_experiment_list():
    assert sorted(EXPECTED_JOBS) == EXPERIMENTS


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_sweep_point_builds_a_valid_run(experiment):
    points, jobs = sweep_points(experiment)
    assert jobs == EXPECTED_JOBS[experiment]
    assert compose_config([f"+experiment={experiment}"]).executor.name == "process"
    for point in points:
        cfg = compose_config([f"+experiment={experiment}", "executor=sequential", *point])
        plan = build_plan(cfg)  # raises ConfigError on anything the CLI would reject
        assert plan.fed.n_clients == cfg.n_clients


@pytest.mark.parametrize("variant", group_options("variant"))
def test_variant_sets_strategy_switches_and_finetune(variant):
    cfg = compose_config([f"+variant={variant}"])
    if variant == "ft":  # the "+FT" switch alone: the chosen strategy (the default, fedpref) with finetune
        assert cfg.finetune is True and cfg.algo == compose_config([]).algo
        return
    row = variant.removesuffix("_ft").removesuffix("_clustering_only").removesuffix("_weighting_only")
    # a study's strategy with its thresholds pinned: FedPref's absolute or relative one, an environment's own
    algo = re.sub(r"_(absolute|relative|lunar)$", "", row)
    assert cfg.algo._target_.rsplit(".", 1)[1].lower() == algo
    assert cfg.finetune is variant.endswith("_ft")
    if algo == "fedpref":
        assert cfg.algo.clustering is ("weighting_only" not in variant)
        assert cfg.algo.weighting is ("clustering_only" not in variant)


def test_command_line_narrows_an_experiments_sweep(tmp_path, morlfed_cli):
    """``-m +experiment=ablation seed=0`` (tiny budget) runs the six ablation rows, kept apart by evaluate.

    The six rows go into multirun/ablation/<env>/, each +FT row branched from its plain row's
    checkpoint before the last round with exactly the numbers of the +FT row trained from scratch,
    and analysis.evaluate keeps all six apart.
    """
    tiny = ["seed=0", "executor=sequential", "n_clients=3", "rounds=2", "local_steps=100"]
    done = morlfed_cli(["-m", "+experiment=ablation", *tiny], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "multirun" / "ablation" / "deep-sea-treasure"
    runs = {p.parent.name.split("_", 1)[1].removesuffix("_seed0"): p.parent for p in folder.glob("*/metrics.json")}
    assert len(runs) == 6
    seen = set()
    for variant, run in runs.items():
        config = yaml.safe_load((run / "config.yaml").read_text())
        info = json.loads((run / "metrics.json").read_text())
        assert info["dist"] == "dirichlet" and info["seed"] == 0 and info["algo"] == "fedpref"
        assert config["finetune"] is variant.endswith("_ft")
        if variant.endswith("_ft"):
            assert info["branched_from"] == str(runs[variant.removesuffix("_ft")])
        else:
            assert "branched_from" not in info and (run / "checkpoints" / "round_1" / "server.safetensors").is_file()
        seen.add((config["algo"]["clustering"], config["algo"]["weighting"], config["finetune"]))
    assert len(seen) == 6
    # the sweep's own list of its jobs: the only siblings a +FT row branches from
    assert len((folder / "sweep_jobs.jsonl").read_text().splitlines()) == 6
    scratch = tmp_path / "scratch"
    done = morlfed_cli(
        ["+experiment=ablation", "+variant=fedpref_ft", "branch_siblings=false", *tiny, f"hydra.run.dir={scratch}"],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (scratch / "final.csv").read_bytes() == (runs["fedpref_ft"] / "final.csv").read_bytes()
    assert (scratch / "final.csv").read_bytes() != (runs["fedpref"] / "final.csv").read_bytes()
    assert evaluate([str(folder), "--out", str(tmp_path / "eval")]) == 0
    summary = pd.read_csv(tmp_path / "eval" / "summary.csv")
    assert summary["variant"].nunique() == 6 and len(summary) == 6


def test_unknown_experiment_is_one_line(morlfed_cli):
    done = morlfed_cli(["-m", "+experiment=comparsion"])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"morlfed: error: unknown experiment 'comparsion'; valid: {', '.join(group_options('experiment'))}"
    ]
