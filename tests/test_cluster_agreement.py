"""The final clusters of a clustered strategy scored against planted preference groups.

The groups read off the weights, the adjusted Rand index against hand-computed values, and the
summary and table columns that carry it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_evaluate import write_run

from morlfed import envs
from morlfed.analysis.campaign import evaluate_runs
from morlfed.analysis.campaign_figures import learning_curves, write_figures
from morlfed.analysis.clustering import (
    final_clusters,
    labels_of,
    planted_ari,
    planted_ari_by_round,
    planted_groups,
    similarity_ari_by_round,
)
from morlfed.analysis.runs import load_runs
from morlfed.analysis.tables import metrics_table

#: four groups of three clients (as the clustering validation plants them), interleaved
WEIGHTS = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.1, 0.9]])[[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]]


def test_planted_groups_are_equal_weights_labelled_by_first_appearance():
    assert planted_groups(WEIGHTS).tolist() == [0, 1, 2, 3] * 3
    assert planted_groups(np.array([[0.2, 0.8], [0.7, 0.3], [0.2, 0.8]])).tolist() == [0, 1, 0]


def test_labels_of_a_partition_and_what_is_not_one():
    assert labels_of([[2, 0], [1]], 3).tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="not a partition"):
        labels_of([[0, 1], [1, 2]], 3)
    with pytest.raises(ValueError, match="leave out clients \\[2\\]"):
        labels_of([[0, 1]], 3)


def write_clustered_run(path, clusters: list[list[int]], dist: str = "groups", seed: int = 0):
    spec = envs.get_spec("deep-sea-treasure")
    returns = np.tile([[0.7, -1.0]], (len(WEIGHTS), 1))
    run = write_run(path, spec, WEIGHTS, returns, returns, algo="fedpref", dist=dist, seed=seed)
    records = [{"round": 1, "clusters": [list(range(len(WEIGHTS)))]}, {"round": 3, "clusters": clusters}]
    (run / "clusters.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.mark.parametrize(
    ("clusters", "ari"),
    [
        ([[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]], 1.0),  # exactly the planted groups
        ([list(range(12))], 0.0),  # never split
        ([[c] for c in range(12)], 0.0),  # every client alone
        # groups 0 and 1 together, group 2 split 2+1, group 3 whole. By hand: pairs together in both
        # = 3+3+1+3 = 10; in the same group = 4 x 3 = 12; in the same cluster = 15+1+0+3 = 19;
        # all pairs 66: expected 12 x 19 / 66 = 3.4545, max (12 + 19) / 2 = 15.5,
        # ARI = (10 - 3.4545) / (15.5 - 3.4545) = 0.54340
        ([[0, 4, 8, 1, 5, 9], [2, 6], [10], [3, 7, 11]], 0.54340),
    ],
)
def test_planted_ari_of_known_partitions(tmp_path, clusters, ari):
    (run,), _ = load_runs([write_clustered_run(tmp_path / "run", clusters)])
    assert planted_ari(run) == pytest.approx(ari, abs=1e-5)


def test_planted_ari_round_by_round_follows_the_cluster_records(tmp_path):
    # one cluster until the record of round 3 (ARI 0), then the planted groups apart (ARI 1) to the end
    truth = [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    (run,), _ = load_runs([write_clustered_run(tmp_path / "run", truth)])
    assert planted_ari_by_round(run) == {1: 0.0, 2: 0.0, **{r: 1.0 for r in range(3, 4)}}
    (plain,), _ = load_runs([write_clustered_run(tmp_path / "plain", truth, dist="equidistant")])
    assert planted_ari_by_round(plain) == {}  # no planted groups to score against


def test_the_agreement_curve_is_the_ari_of_each_round_and_its_figure_is_written(tmp_path):
    truth = [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    runs, _ = load_runs([write_clustered_run(tmp_path / f"run{s}", truth, seed=s) for s in (0, 1)])
    (plain,), _ = load_runs([write_clustered_run(tmp_path / "plain", truth, dist="equidistant")])
    curves = learning_curves([*runs, plain], ["fedpref", "fedpref", "fedpref"], "planted_ari")
    per_seed = [[0.0, 0.0, 1.0]] * 2  # one cluster before round 3, then the groups; none for the plain run
    assert curves.pivot(index="seed", columns="round", values="value").values.tolist() == per_seed
    written = write_figures(runs, tmp_path / "figures", kinds=["agreement"], formats=["png"])
    assert [p.name for p in written] == [f"agreement_{runs[0].env}_groups.png"]


def test_summary_and_table_carry_final_clusters_and_the_ari(tmp_path):
    truth = [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    for seed in range(3):
        write_clustered_run(tmp_path / f"groups{seed}", truth if seed < 2 else [list(range(12))], seed=seed)
    write_clustered_run(tmp_path / "plain", truth, dist="equidistant")  # no planted groups: no ARI
    runs, _ = load_runs([tmp_path])
    summary = evaluate_runs(runs).summary.set_index("name")
    groups = summary[summary["dist"] == "groups"].sort_values("seed")
    assert groups["final_clusters"].tolist() == [4, 4, 1]
    assert groups["planted_ari"].tolist() == [1.0, 1.0, 0.0]
    assert np.isnan(summary.loc[summary["dist"] == "equidistant", "planted_ari"]).all()
    table = metrics_table(summary.reset_index(), "deep-sea-treasure", "groups", ["final_clusters", "planted_ari"])
    assert table is not None and "| Final clusters | ARI with the planted groups |" in table
    assert "| fedpref | 3 | 3.00 ± 1.73 | 0.67 ± 0.58 |" in table


def test_final_clusters_leave_out_models_no_client_deploys(tmp_path):
    # IFCA logs one list per model: with K = 3 and model 1 unused, its clients form 2 groups
    write_clustered_run(tmp_path / "run", [[0, 1, 4, 5, 6, 7, 8, 9, 10, 11], [], [2, 3]])
    (run,), _ = load_runs([tmp_path / "run"])
    assert final_clusters(run) == [[0, 1, 4, 5, 6, 7, 8, 9, 10, 11], [2, 3]]
    assert evaluate_runs([run]).summary["final_clusters"].tolist() == [2]


def test_the_similarity_separates_the_groups_where_its_blocks_do(tmp_path):
    truth = [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    path = write_clustered_run(tmp_path / "run", truth)
    groups = planted_groups(WEIGHTS)
    blocks = np.where(groups[:, None] == groups[None, :], 0.9, 0.1)
    np.save(path / "similarity_1.npy", blocks)  # the four groups as blocks: recovered exactly
    # groups 0 and 1 alike, client 3 unlike anyone: the 4 clusters are groups 0+1, group 2, {7, 11} and
    # {3}. By hand: pairs together in both 3 + 3 + 3 + 1 = 10, in the same group 12, in the same
    # cluster 15 + 3 + 1 = 19, of 66: expected 12 x 19 / 66 = 3.4545, max 15.5, ARI 0.54340
    merged = blocks.copy()
    merged[np.ix_(groups < 2, groups < 2)] = 0.9
    merged[3, :] = merged[:, 3] = 0.1
    merged[3, 3] = 1.0
    np.save(path / "similarity_2.npy", merged)
    split = blocks.copy()
    split[0, 1] = split[1, 0] = np.nan  # after a split: pairs across clusters are not compared
    np.save(path / "similarity_3.npy", split)
    (run,), _ = load_runs([path])
    assert similarity_ari_by_round(run) == pytest.approx({1: 1.0, 2: 0.54340}, abs=1e-5)
    (plain,), _ = load_runs([write_clustered_run(tmp_path / "plain", truth, dist="equidistant")])
    assert similarity_ari_by_round(plain) == {}
