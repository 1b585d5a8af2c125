"""Every published study is one experiment config that pins what it ran.

Each folder of ``docs/results/`` with a ``summary.csv`` is a study, and ``conf/experiment/<folder>.yaml``
is its configuration. The results pages document its command(s),
``python -m morlfed.run -m +experiment=<folder> [overrides]``. Every job of those commands is
composed as ``--cfg job`` would compose it (hydra's compose API) and compared with what the study
ran:

- the rows of its ``summary.csv``: environment, preference distribution, variant row, seed, clients,
  rounds and local steps, job for job;
- for a folder that keeps its runs (``runs/*/config.yaml``): every setting of each run that changes
  results, run for run;
- for a folder without runs: the strategies' settings of the time the study ran
  (:data:`RAN_WITH`, read from the algo configs at the commits that published it);
- a study whose FedPref ran the absolute split threshold says so in every section of the results
  pages that runs it or shows its tables.

So a default that changes under a study (FedPref's split threshold, a budget, CFL's thresholds)
fails here until the study's config pins the value it ran.
"""

from __future__ import annotations

import functools
import itertools
import re
import shlex
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pytest
import yaml
from conftest import compose_config
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from morlfed.analysis.variants import IGNORED_CONFIG_KEYS, IGNORED_CONFIG_PREFIXES, variant_labels
from morlfed.cli.config_groups import group_options
from morlfed.cli.execute import build_plan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "docs" / "results.md", *sorted(RESULTS.glob("*.md"))]
STUDIES = sorted(p.parent.name for p in RESULTS.glob("*/summary.csv"))
COMMAND = re.compile(r"python -m morlfed\.run -m \+experiment=(\S+)(.*)")

#: Settings a run's config.yaml lacks because the run predates them, and the value that reproduces
#: what the run did (FedPref's threshold was a norm before eps_mode existed).
#: ``{setting: (value, a setting the run has where it applies)}``.
PREDATES = {"precision": ("fp32", "engine.name"), "algo.eps_mode": ("absolute", "algo.eps")}

FEDPREF_ABSOLUTE = {"top_r": 0.1, "s_min": -0.2, "eps": 1.0, "eps_mode": "absolute", "patience": 2}
FEDPREF_RELATIVE = {"top_r": 0.1, "s_min": -0.2, "eps": 0.1, "eps_mode": "relative", "patience": 2}
CFL = {"eps1": 0.4, "eps2": 1.6, "warmup": 5}
FEDPROX = {"mu": 0.01}
MATFL = {"mode": "soft-grouping", "th": 0.0, "cluster_num": 2}
#: The strategies' settings in each study that keeps no runs, by the algo label of its rows: the
#: algo configs at the commit that published it (``git log -- docs/results/<folder>``).
RAN_WITH: dict[str, dict[str, dict[str, Any]]] = {
    "dst-convergence": {},
    "dst-equidistant": {
        "fedpref": FEDPREF_ABSOLUTE,
        "fedprox": FEDPROX,
        "matfl": MATFL,
        "ifca": {"n_models": 3},
        "fedpg": {"lr": 1.0, "fair": True, "tau": None, "line_search": False, "search_range": 2},
        # then: CFL's warm-up 20 (never split at 10 rounds; refused today), FedFew's and FedMHC's
        # models each trained the full local steps (the page says so beside its table)
        "cfl": {"eps1": 0.4, "eps2": 1.6},
        "fedfew": {"n_models": 3, "mu": 0.01, "server_lr": 1.0, "init_noise": 0.01},
        "fedmhc": {"n_groups": 4, "lam": 1.0},
    },
    "dst-comparison": {"fedpref": FEDPREF_ABSOLUTE, "cfl": CFL, "fedprox": FEDPROX, "matfl": MATFL},
    "dst-ablation": {"fedpref": FEDPREF_ABSOLUTE},
    "dst-clustering-validation": {"fedpref": FEDPREF_ABSOLUTE},
    "dst-fedpref-search": {"fedpref": {"patience": 2, "eps_mode": "absolute"}},
    "dst-comparison-all": {
        "fedpref": FEDPREF_RELATIVE,
        "cfl": CFL,
        "fedprox": FEDPROX,
        "matfl": MATFL,
        "fedfew": {"n_models": 3, "mu": 0.01, "server_lr": 1.0, "init_noise": 0.01, "equal_budget": True},
        "fedmhc": {"n_groups": 4, "lam": 1.0, "equal_budget": True},
        "fedpg": {"lr": 1.0, "fair": True, "tau": None, "line_search": False, "search_range": 2},
        "ifca": {"n_models": 3},
    },
    "minecart-convergence": {},
    "minecart-convergence-250k": {},
    "minecart-comparison": {"fedpref": FEDPREF_ABSOLUTE, "cfl": CFL},
    "minecart-comparison-250k-dirichlet": {"fedpref": FEDPREF_ABSOLUTE, "cfl": CFL},
}


@dataclass(frozen=True)
class Job:
    """One composed job of a study's sweep, as analysis.variants labels a run."""

    config: dict[str, Any]
    env: str
    dist: str
    label: str


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to values (``{"algo": {"eps": 1.0}}`` -> ``{"algo.eps": 1.0}``)."""
    if isinstance(config, dict) and config:
        out: dict[str, Any] = {}
        for key, value in config.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: config}


def documented_commands() -> dict[str, list[list[str]]]:
    """``{study: [overrides of each documented command]}`` from the results pages."""
    found: dict[str, list[list[str]]] = {}
    for page in PAGES:
        for line in page.read_text().replace("\\\n", " ").splitlines():  # continued lines joined
            if match := COMMAND.search(line):
                rest = [word for word in shlex.split(match.group(2).split("`")[0], comments=True) if "=" in word]
                commands = found.setdefault(match.group(1), [])
                if rest not in commands:
                    commands.append(rest)
    return found


COMMANDS = documented_commands()


def sweep(study: str, overrides: list[str]) -> tuple[list[list[str]], list[Any]]:
    """The jobs of ``python -m morlfed.run -m +experiment=STUDY OVERRIDES``: override lists and seeds.

    Every override list (the sweep's points but the seed) runs with every seed. The command line's
    value of a key replaces the config's sweep of that key, as hydra's basic sweeper does.
    """
    parser = OverridesParser.create()
    params = dict(compose_config([f"+experiment={study}"]).hydra.sweeper.params)
    fixed: list[str] = []
    for override in parser.parse_overrides(overrides):
        key = override.get_key_element()
        if key in params or override.is_sweep_override():
            params[key] = str(override.input_line).partition("=")[2]  # a sweep has no value string
        else:
            fixed.append(str(override.input_line))
    axes: dict[str, list[Any]] = {}
    for key, value in params.items():
        (override,) = parser.parse_overrides([f"{key}={value}"])
        axes[key] = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
    seeds = [int(str(s)) for s in axes.pop("seed", [compose_config([f"+experiment={study}", *fixed]).seed])]
    points = [[f"{k}={v}" for k, v in zip(axes, combo)] for combo in itertools.product(*axes.values())]
    return [[f"+experiment={study}", *fixed, *point] for point in points], seeds


@functools.cache
def compose_jobs(study: str) -> tuple[Job, ...]:
    """Every job of every documented command of ``study``, composed and resolved (hydra's node dropped)."""
    jobs = []
    for command in COMMANDS[study]:
        points, seeds = sweep(study, command)
        for point in points:
            cfg = compose_config(point)
            algo = cfg.hydra.runtime.choices.algo
            with open_dict(cfg):
                del cfg["hydra"]
            for seed in seeds:
                cfg.seed = seed
                config = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
                label = algo + ("+FT" if config["finetune"] else "")
                jobs.append(Job(config, config["env"]["name"], config["dist"]["name"], label))
    return tuple(jobs)


def strategy(job: Job) -> str:
    """The strategy's name (the algo option) of a job: its label without "+FT"."""
    return job.label.removesuffix("+FT")


def test_every_study_has_its_config_and_a_documented_command():
    assert STUDIES, "no study found under docs/results/"
    experiments = group_options("experiment")
    assert [s for s in STUDIES if s not in experiments] == [], "a study without conf/experiment/<folder>.yaml"
    assert [s for s in STUDIES if s not in COMMANDS] == [], "a study whose command no results page shows"
    assert [c for c in COMMANDS if c not in experiments] == [], "a page shows an experiment that does not exist"


@pytest.mark.parametrize("study", STUDIES)
def test_the_study_command_composes_what_its_summary_records(study):
    jobs = compose_jobs(study)
    labels = variant_labels(jobs)
    composed = Counter(
        (j.env, j.dist, label, j.config["seed"], j.config["n_clients"], j.config["rounds"], j.config["local_steps"])
        for j, label in zip(jobs, labels)
    )
    summary = pd.read_csv(RESULTS / study / "summary.csv")
    ran = Counter(
        (r.env, r.dist, r.variant, r.seed, r.n_clients, r.rounds, r.local_steps) for r in summary.itertuples()
    )
    assert composed - ran == Counter(), f"{study}: jobs the study did not run"
    assert ran - composed == Counter(), f"{study}: rows of summary.csv the command does not run"
    first = compose_config(sweep(study, COMMANDS[study][0])[0][0])
    assert build_plan(first).fed.n_clients == first.n_clients  # the CLI accepts it


def results_changing(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run config that change its results (analysis.variants' rule), flattened."""
    flat = flatten(config)
    keep = {
        k: v
        for k, v in flat.items()
        if k not in IGNORED_CONFIG_KEYS and not k.startswith(IGNORED_CONFIG_PREFIXES) and k != "device"
    }
    if flat.get("engine.name") != "auto":
        keep.pop("env.engine", None)  # the env spec's engine is only read by engine=auto
    return keep


def differences(ran: dict[str, Any], job: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{setting: (ran, composed)}`` where a kept run's setting differs from the composed job's.

    A setting the run predates (:data:`PREDATES`) must compose to the value that reproduces the run.
    """
    composed = results_changing(job)
    out = {k: (v, composed.get(k, "<absent>")) for k, v in ran.items() if composed.get(k, "<absent>") != v}
    for key, (then, applies) in PREDATES.items():
        if key not in ran and key in composed and applies in ran and composed[key] != then:
            out[key] = (f"<absent: {then}>", composed[key])
    return out


@pytest.mark.parametrize("study", [s for s in STUDIES if (RESULTS / s / "runs").is_dir()])
def test_the_study_command_composes_each_kept_run(study):
    jobs = compose_jobs(study)
    unmatched = list(range(len(jobs)))
    runs = sorted((RESULTS / study / "runs").glob("*/config.yaml"))
    assert len(runs) == len(jobs), f"{study}: {len(runs)} kept runs, {len(jobs)} jobs"
    for path in runs:
        ran = results_changing(yaml.safe_load(path.read_text()))
        best = min(unmatched, key=lambda i: len(differences(ran, jobs[i].config)))
        diff = differences(ran, jobs[best].config)
        assert diff == {}, f"{path.parent.name} differs from every job; from the closest: {diff}"
        unmatched.remove(best)


@pytest.mark.parametrize("study", sorted(RAN_WITH))
def test_a_study_without_runs_composes_the_strategy_settings_of_its_time(study):
    assert not (RESULTS / study / "runs").is_dir()
    ran_with = RAN_WITH[study]
    for job in compose_jobs(study):
        algo = job.config["algo"]
        assert strategy(job) in ran_with or set(algo) == {"_target_"}, f"{study}: {job.label}'s settings unrecorded"
        expected = ran_with.get(strategy(job), {})
        assert {k: algo.get(k) for k in expected} == expected, f"{study}: {job.label}"


def test_every_study_without_runs_has_its_settings_recorded():
    assert sorted(RAN_WITH) == [s for s in STUDIES if not (RESULTS / s / "runs").is_dir()]


def sections_showing(study: str) -> list[str]:
    """The ``##`` sections of the results pages that run ``study`` or show a table of its summary."""
    name = re.escape(study)
    shows = re.compile(rf"\+experiment={name}(?![\w-])|csv=[^ ]*(?<![\w-]){name}/summary\.csv")
    return [
        section
        for page in PAGES
        for section in re.split(r"^(?=## )", page.read_text(), flags=re.M)
        if shows.search(section)
    ]


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_that_ran_the_absolute_threshold_says_so_beside_its_tables(study):
    jobs = [j for j in compose_jobs(study) if strategy(j) == "fedpref"]
    if not any(j.config["algo"]["eps_mode"] == "absolute" for j in jobs):
        return
    sections = sections_showing(study)
    assert sections, f"{study}: no results page shows it"
    for section in sections:
        assert "absolute split threshold" in section, f"{study}: {section.splitlines()[0]} does not say it ran it"
