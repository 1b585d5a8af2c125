"""analysis.stats and the marks of the comparison tables.

Paired tests against a reference variant on planted per-seed values (known answers), the budget
table's env steps per client, and the mark of rows whose runs reported their strategy inert.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from morlfed.analysis.comparison import run_notes
from morlfed.analysis.stats import (
    EXACT_MAX_PAIRS,
    RESAMPLES,
    campaign_stats,
    compare_to_reference,
    fewest_pairs,
    paired_test,
    smallest_p,
)
from morlfed.analysis.tables import INERT_NOTE, budget_table, metric_table, metrics_table
from morlfed.metrics import METRICS


def test_three_equal_positive_differences_are_not_significant_six_are():
    three = paired_test(np.ones(3))  # no spread, yet no certainty: 2 of the 8 sign flips are as extreme
    assert (three.n, three.test, three.p_value, three.significant) == (3, "sign-flip", 0.25, False)
    assert three.smallest_p == 0.25
    six = paired_test(np.ones(6))
    assert (six.p_value, six.significant) == (2 / 2**6, True)
    # the same p-value as the exact Wilcoxon signed-rank test, whose ranks tie here
    assert six.p_value == pytest.approx(stats.wilcoxon(np.arange(1.0, 7.0), method="exact").pvalue)
    assert paired_test(-np.ones(6)).significant  # two-sided
    same = paired_test(np.zeros(7))  # identical runs: nothing to find
    assert (same.p_value, same.significant) == (1.0, False)


def test_sign_flip_p_value_is_the_share_of_sign_assignments_as_extreme():
    diffs = np.array([2.0, 1.5, -0.5, 3.0, 0.25, 1.0, -1.0])
    means = [np.mean(diffs * signs) for signs in itertools.product((-1.0, 1.0), repeat=len(diffs))]
    by_hand = np.mean(np.abs(means) >= abs(diffs.mean()) - 1e-12)
    test = paired_test(diffs)
    assert test.p_value == pytest.approx(by_hand) and test.mean_diff == pytest.approx(diffs.mean())
    assert test.significant == (by_hand < 0.05)
    one = paired_test(np.array([5.0]))
    assert (one.test, one.significant, one.smallest_p) == ("", False, 1.0) and np.isnan(one.p_value)
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
        paired_test(np.array([1.0, 2.0]), level=0.0)


def test_smallest_p_and_the_fewest_pairs_that_can_reach_a_level():
    assert [smallest_p(n) for n in (1, 2, 3, 5, 6)] == [1.0, 0.5, 0.25, 0.0625, 0.03125]
    assert (fewest_pairs(0.05), fewest_pairs(0.1), fewest_pairs(0.01)) == (6, 5, 8)
    assert not paired_test(np.arange(1.0, 6.0)).significant  # 5 pairs, every one positive: p = 0.0625
    # above EXACT_MAX_PAIRS the flips are drawn from a seeded generator: the same p-value every time,
    # near its floor 2 (1 + draws as extreme) / (RESAMPLES + 1)
    many = [paired_test(np.arange(1.0, EXACT_MAX_PAIRS + 3)).p_value for _ in range(2)]
    assert many[0] == many[1] and 2 / (RESAMPLES + 1) <= many[0] < 10 / (RESAMPLES + 1)


def _planted(seeds: int = 6) -> pd.DataFrame:
    """Fedpref and three variants on one env, the rows shuffled (pairs by seed).

    `up` is fedpref + 1 (+ noise) in every seed, `down` fedpref - 1, `noise` fedpref +- 0.5 in
    alternate seeds.
    """
    rng = np.random.default_rng(0)
    base = rng.normal(10.0, 3.0, seeds)  # large seed-to-seed spread: only pairing sees the shifts
    shifts = {
        "fedpref": np.zeros(seeds),
        "up": 1.0 + 0.1 * rng.normal(size=seeds),
        "down": -1.0 + 0.1 * rng.normal(size=seeds),
        "noise": 0.5 * (-1.0) ** np.arange(seeds),
    }
    rows = [
        {"env": "e", "dist": "d", "variant": v, "algo": v, "finetune": False, "seed": s, "hypervolume": base[s] + d[s]}
        for v, d in shifts.items()
        for s in range(seeds)
    ]
    frame = pd.DataFrame(rows)
    frame["igd"] = -frame["hypervolume"]  # lower is better: the same ranking
    return frame.sample(frac=1.0, random_state=1).reset_index(drop=True)


def test_compare_to_reference_pairs_by_seed_and_knows_directions():
    summary = _planted()
    hv = compare_to_reference(summary, "hypervolume", METRICS["hypervolume"]).set_index("variant")
    assert list(hv.index) == ["down", "noise", "up"] and set(hv["reference"]) == {"fedpref"}
    assert hv.loc["up", "direction"] == "better" and hv.loc["down", "direction"] == "worse"
    assert hv.loc["noise", "direction"] == "" and hv.loc["up", "test"] == "sign-flip"
    assert hv.loc["up", "mean_diff"] == pytest.approx(1.0, abs=0.2)
    igd = compare_to_reference(summary, "igd", METRICS["igd"]).set_index("variant")
    assert igd.loc["up", "direction"] == "better" and igd.loc["up", "mean_diff"] < 0  # lower IGD: better
    fewer = summary[~((summary["variant"] == "up") & (summary["seed"] == 5))]
    up = compare_to_reference(fewer, "hypervolume", METRICS["hypervolume"]).set_index("variant").loc["up"]
    assert (up["n"], up["test"], up["direction"], up["smallest_p"]) == (5, "sign-flip", "", 0.0625)  # n too small
    ambiguous = compare_to_reference(summary, "hypervolume", METRICS["hypervolume"], reference="*o*")
    assert ambiguous.empty  # "down", "noise": a reference glob must name one variant
    both = campaign_stats(summary, {m: METRICS[m] for m in ("hypervolume", "igd")}, level=0.01)
    assert len(both) == 6 and set(both["level"]) == {0.01}


def test_the_mark_is_the_side_of_the_mean_difference():
    # 10 small gains and two large losses: the mean difference is negative and the sign flips of
    # the two losses decide it, so nothing is marked; a steady gain in every seed is
    rows = [
        {"env": "e", "dist": "d", "variant": v, "seed": s, "hypervolume": 100.0 + (d if v == "up" else 0.0)}
        for s, d in enumerate([1.0] * 10 + [-1000.0, -1000.0])
        for v in ("fedpref", "up")
    ]
    up = compare_to_reference(pd.DataFrame(rows), "hypervolume", METRICS["hypervolume"]).iloc[0]
    assert up["mean_diff"] < 0 and up["p_value"] > 0.05 and up["direction"] == ""
    steady = pd.DataFrame(rows).assign(hypervolume=lambda f: 100.0 + (f["variant"] == "up") * (1.0 + f["seed"] % 2))
    up = compare_to_reference(steady, "hypervolume", METRICS["hypervolume"]).iloc[0]
    assert up["mean_diff"] > 0 and up["p_value"] == pytest.approx(2 / 2**12) and up["direction"] == "better"


def test_two_runs_of_one_seed_are_refused_not_paired_twice():
    summary = _planted(3)
    twice = pd.concat([summary, summary[(summary["variant"] == "up") & (summary["seed"] == 0)]])
    with pytest.raises(
        ValueError, match=r"2 runs share a \(dist, env, variant, seed\), e.g. dist=d, env=e, variant=up, seed=0"
    ):
        compare_to_reference(twice, "hypervolume", METRICS["hypervolume"])
    with pytest.raises(ValueError, match="each variant may have one run per seed"):
        metrics_table(twice, "e", "d", ["hypervolume"])


def test_tables_mark_significant_cells_and_state_the_test():
    table = metrics_table(_planted(), "e", "d", ["hypervolume", "igd"]).split("\n")
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in table[2:6]}
    assert rows["up"].count("** ▲") == 2 and rows["up"].startswith("| up | 6 | **")
    assert rows["down"].count(" ▼") == 2 and "**" not in rows["down"]
    assert "▲" not in rows["noise"] + rows["fedpref"] and "▼" not in rows["noise"] + rows["fedpref"]
    assert "exact two-sided sign-flip permutation test of the mean difference, p < 0.05" in table[-1]
    assert table[-1].endswith("Unmarked: no significant difference.")
    short = metrics_table(_planted(3), "e", "d", ["hypervolume"], level=0.1).split("\n")
    assert "▲" not in "".join(short[2:6]) and "▼" not in "".join(short[2:6])  # up and down in every seed
    assert "**n too small for 0.1: no cell can be marked.** Every cell here is tested over 3 pairs" in short[-1]
    assert "(0.25 at 3); 5 pairs are the fewest that can reach 0.1" in short[-1]
    mixed = _planted().drop(index=_planted().query("variant == 'down' and seed > 2").index)
    note = metrics_table(mixed, "e", "d", ["hypervolume"]).split("\n")[-1]
    assert "Cells tested over fewer than 6 pairs (their p cannot go below 2/2^n) are n too small for 0.05" in note


def test_budget_table_shows_the_env_steps_of_each_group():
    summary = pd.DataFrame(
        {
            "env": "e",
            "dist": "d",
            "variant": ["fedavg", "fedavg", "fedfew", "old"],
            "algo": ["fedavg", "fedavg", "fedfew", "old"],
            "finetune": False,
            "seed": [0, 1, 0, 0],
            "n_clients": 10,
            "rounds": 20,
            "local_steps": 2000,
            "env_steps_per_client": [40000.0, 40000.0, 120000.0, np.nan],
            "wall_time_s": [60.0, 120.0, 300.0, 30.0],
        }
    )
    lines = budget_table(summary).split("\n")
    assert lines[2] == "| e | d | fedavg | 10 | 20 | 2000 | 40000 | 400000 | 2 | 90 (min 60, max 120) | 3 |"
    assert lines[3] == "| e | d | fedfew | 10 | 20 | 2000 | 120000 | 1200000 | 1 | 300 (min 300, max 300) | 5 |"
    assert lines[4].startswith("| e | d | old | 10 | 20 | 2000 | not recorded | — | 1 |")


def test_rows_with_inert_runs_are_marked_and_the_runs_listed():
    summary = _planted(3).assign(name=lambda f: f["variant"] + "_s" + f["seed"].astype(str), inert_warning=None)
    down = (summary["variant"] == "down") & (summary["seed"] < 2)
    summary.loc[down, "inert_warning"] = "down: never split"
    summary.loc[summary["variant"] == "up", "inert_warning"] = ""  # empty text (a CSV's blank cell): not inert
    for table in (metrics_table(summary, "e", "d", ["hypervolume"]), metric_table(summary, "d", "hypervolume")):
        lines = table.split("\n")
        labels = [line.split(" | ")[0].removeprefix("| ") for line in lines[2:6]]
        assert labels == ["down ⚠ 2/3", "fedpref", "noise", "up"]
        assert lines[-1].endswith(INERT_NOTE)
    listed = run_notes(summary, skipped=[("multirun/x/3", "no metrics.json")])
    assert [line for line in listed if line.startswith("- ")] == ["- `multirun/x/3`: no metrics.json"] + [
        f"- `down_s{s}` (down, d, seed {s}): down: never split" for s in (0, 1)
    ]
    # a summary written before runs recorded the warning, or one without inert runs: no mark, no note
    for plain in (summary.drop(columns="inert_warning"), summary.assign(inert_warning=None)):
        table = metrics_table(plain, "e", "d", ["hypervolume"])
        assert "⚠" not in table and INERT_NOTE not in table and run_notes(plain) == []
