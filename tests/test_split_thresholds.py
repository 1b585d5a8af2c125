"""Each environment's FedPref split threshold: what a run composes, and the selection that chose it.

An env spec's ``fedpref: {eps, patience}`` is what ``algo=fedpref`` runs with on that environment
(the command line's ``algo.eps=`` still wins, a spec without one takes 0.1 and 2), and the value a
spec carries is the one its published selection runs give under the rule of
``conf/experiment/fedpref_threshold.yaml``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config

from morlfed.envs import get_spec

ROOT = Path(__file__).resolve().parents[1]
#: Each environment's published threshold selection (docs/results/<folder>/summary.csv).
SELECTIONS = {"mo-lunar-lander": "mo-lunar-lander-fedpref-threshold", "minecart": "minecart-fedpref-threshold"}


@pytest.mark.parametrize(
    ("env", "eps", "patience"),
    [("deep-sea-treasure", 0.1, 2), ("mo-lunar-lander", 0.3, 2), ("minecart", 0.3, 2), ("mo-halfcheetah", 0.1, 2)],
)
def test_a_run_takes_its_env_specs_threshold_and_the_command_line_overrides_it(env, eps, patience):
    algo = compose_config([f"env={env}", "algo=fedpref"]).algo
    assert (algo.eps, algo.patience, algo.eps_mode) == (eps, patience, "relative")
    assert compose_config([f"env={env}", "algo=fedpref", "algo.eps=0.25"]).algo.eps == 0.25


def select(summary: pd.DataFrame) -> float:
    """The rule of fedpref_threshold.yaml applied to a selection's runs: the eps it selects.

    A setting is admissible when each of its runs split (more than one final cluster) and none ends
    with every client alone; the admissible one with the best mean scalarised reward wins, a tie
    going to the smaller eps. The weighting-only runs are the ablation, not a candidate.
    """
    runs = summary.assign(eps=summary["variant"].str.extract(r"algo\.eps=([0-9.]+)")[0].astype(float))
    candidates = runs[~runs["variant"].str.contains("clustering=False")]
    admissible = candidates.groupby("eps").filter(
        lambda g: bool((g["final_clusters"] > 1).all() and (g["final_clusters"] < g["n_clients"]).all())
    )
    means = admissible.groupby("eps")["mean_scalarised"].mean()
    return float(means[means == means.max()].index.min())


def test_the_rule_gives_back_a_hand_made_answer():
    rows = [  # eps 0.3 wins over 0.4 by the mean; 0.5 has a run with every client alone; 0.2 never splits
        (0.2, 1, 9.0),
        (0.2, 1, 9.0),
        (0.3, 2, 5.0),
        (0.3, 3, 3.0),
        (0.4, 4, 4.0),
        (0.4, 5, 3.0),
        (0.5, 10, 8.0),
        (0.5, 6, 8.0),
    ]
    summary = pd.DataFrame(
        [
            {"variant": f"fedpref (algo.eps={e})", "final_clusters": c, "n_clients": 10, "mean_scalarised": m}
            for e, c, m in rows
        ]
    )
    assert select(summary) == 0.3
    tied = summary.assign(mean_scalarised=4.0)
    assert select(tied) == 0.3  # the smaller of two equal admissible settings


@pytest.mark.parametrize("env", sorted(SELECTIONS))
def test_the_spec_carries_what_its_selection_runs_select(env):
    summary = pd.read_csv(ROOT / "docs" / "results" / SELECTIONS[env] / "summary.csv")
    assert set(summary["seed"]) == {1000, 1001, 1002}  # the selection seeds, no comparison's
    assert get_spec(env).fedpref["eps"] == select(summary)
