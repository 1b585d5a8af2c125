"""The analysis commands and libraries on planted run directories.

analysis.evaluate (the command), analysis.campaign, analysis.tables, analysis.comparison and
analysis.runs on planted run directories (the metric additions they use: test_evaluate_metrics.py;
variant labels and repeated runs: test_variants.py). ``dst`` (Deep Sea Treasure's spec and known
fronts) is a fixture of conftest.py.

The run directories here are written by hand in the format of morlfed.run (test_sweep.py checks
the real thing): planted client returns give known answers (clients sitting on their optimal
Deep Sea Treasure front points have zero regret; a set equal to the campaign front has IGD 0).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from morlfed import envs
from morlfed.analysis.campaign import evaluate_runs
from morlfed.analysis.comparison import comparison_markdown
from morlfed.analysis.evaluate import main
from morlfed.analysis.rebuild import main as rebuild
from morlfed.analysis.run_files import RunDirError
from morlfed.analysis.runs import find_run_dirs, load_run, load_runs
from morlfed.analysis.tables import metric_table
from morlfed.metrics import (
    METRICS,
    ReferencePointWarning,
    compute_metrics,
    equally_spaced_weights,
    eu_weights,
    hypervolume,
)


def write_run(
    path: Path,
    spec: envs.EnvSpec,
    weights: np.ndarray,
    disc: np.ndarray,
    undisc: np.ndarray,
    algo: str = "fedpref",
    seed: int = 0,
    finetune: bool = False,
    dist: str = "equidistant",
    local_steps: int = 100,
    front: np.ndarray | None = None,
    front_undisc: np.ndarray | None = None,
    extra: dict | None = None,
) -> Path:
    """A completed run directory in morlfed.run's format (metrics.json as run.py computes it).

    ``extra``: more top-level config keys.
    """
    path.mkdir(parents=True)
    n, m = weights.shape
    config = {
        "env": spec.to_dict(),
        "dist": {"name": dist},
        "algo": {"_target_": f"x.{algo}"},
        "n_clients": n,
        "rounds": 3,
        "local_steps": local_steps,
        "seed": seed,
        "finetune": finetune,
        "participation": 1.0,
        "save_similarity": False,
        "progress": False,
        "torch_threads": 1,
        "executor": {"name": "sequential"},
        **(extra or {}),
    }
    (path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    final = pd.DataFrame({"client": range(n)})
    for k in range(m):
        final[f"w_{k}"] = weights[:, k]
    for k in range(m):
        final[f"return_{k}"] = undisc[:, k]
    for k in range(m):
        final[f"disc_return_{k}"] = disc[:, k]
    final["scalarised"] = np.einsum("ij,ij->i", weights, undisc)
    final["scalarised_discounted"] = np.einsum("ij,ij->i", weights, disc)
    final["model"] = 0
    final["env_steps"] = 3 * local_steps  # every client: 3 rounds of local_steps
    final.to_csv(path / "final.csv", index=False)
    pd.DataFrame({"round": [1, 2, 3], "mean_train_reward": [0.0, 1.0, 2.0]}).to_csv(path / "rounds.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReferencePointWarning)
        info = {
            "algo": algo,
            "finetune": finetune,
            "label": algo + ("+FT" if finetune else ""),
            "env": spec.name,
            "dist": dist,
            "seed": seed,
            "discounted": compute_metrics(weights, disc, spec.ref_point, front=front),
            "undiscounted": compute_metrics(weights, undisc, spec.reference_point("undiscounted"), front=front_undisc),
        }
    (path / "metrics.json").write_text(json.dumps(info))
    return path


def optimal_points(weights: np.ndarray, front: np.ndarray) -> np.ndarray:
    return front[np.argmax(weights @ front.T, axis=1)]


@pytest.fixture(scope="module")
def campaign_dir(tmp_path_factory, dst) -> Path:
    """DST, 4 equidistant clients: `fedpref` on their optimal front points, `fedavg` on one treasure.

    `fedpref` puts every client on its optimal front point (seed 0) or all but client 3 (seed 1);
    `fedavg` puts everyone on the nearest treasure (0.7, -1).
    """
    spec, front, front_u = dst
    root = tmp_path_factory.mktemp("campaign")
    w = equally_spaced_weights(2, 4)
    best, best_u = optimal_points(w, front), optimal_points(w, front_u)
    kw = dict(front=front, front_undisc=front_u)
    write_run(root / "a" / "0", spec, w, best, best_u, "fedpref", 0, **kw)
    off, off_u = best.copy(), best_u.copy()
    off[3], off_u[3] = front[0], front_u[0]
    write_run(root / "a" / "1", spec, w, off, off_u, "fedpref", 1, **kw)
    for seed in (0, 1):
        write_run(
            root / "b" / str(seed),
            spec,
            w,
            np.repeat(front[:1], 4, 0),
            np.repeat(front_u[:1], 4, 0),
            "fedavg",
            seed,
            **kw,
        )
    write_run(root / "b" / "ft", spec, w, best, best_u, "fedavg", 0, finetune=True, **kw)
    # hydra's own copy of the config is not a run; an unfinished run is reported and skipped
    (root / "a" / ".hydra").mkdir()
    (root / "a" / ".hydra" / "config.yaml").write_text("a: 1\n")
    unfinished = root / "c" / "unfinished"
    unfinished.mkdir(parents=True)
    (unfinished / "config.yaml").write_text((root / "a" / "0" / "config.yaml").read_text())
    return root


def test_find_and_load_runs(campaign_dir):
    dirs, problems = find_run_dirs([campaign_dir])
    assert [d.relative_to(campaign_dir).as_posix() for d in dirs] == [
        "a/0",
        "a/1",
        "b/0",
        "b/1",
        "b/ft",
        "c/unfinished",
    ]
    assert problems == []
    runs, skipped = load_runs([str(campaign_dir / "*" / "*")])
    assert [r.name for r in runs] == ["a-0", "a-1", "b-0", "b-1", "b-ft"]
    assert skipped == [(str(campaign_dir / "c" / "unfinished"), "incomplete: no metrics.json (the run did not finish)")]
    run = runs[0]
    assert (run.env, run.algo, run.label, run.dist, run.seed, run.finetune) == (
        "deep-sea-treasure",
        "fedpref",
        "fedpref",
        "equidistant",
        0,
        False,
    )
    np.testing.assert_allclose(run.weights[:, 0], [0, 1 / 3, 2 / 3, 1])
    assert run.returns_of("discounted").shape == (4, 2)
    assert run.clusters_at(2) == [[0, 1, 2, 3]]  # no clusters logged: one cluster of everyone
    _, problems = find_run_dirs(
        [campaign_dir / "nope", str(campaign_dir / "zz*"), campaign_dir / "a" / "0" / "final.csv"]
    )
    assert [p[1] for p in problems] == [
        "no such file or directory",
        "no file or directory matches this pattern",
        "not a directory",
    ]


def test_evaluate_planted_campaign_known_answers(campaign_dir, dst):
    spec, front, _ = dst
    runs, _ = load_runs([campaign_dir])
    campaign = evaluate_runs(runs)
    s = campaign.summary.set_index("name")
    assert campaign.mismatches == []
    assert list(s.index) == ["b-0", "b-1", "b-ft", "a-0", "a-1"]  # fedavg, fedavg+FT, fedpref
    assert set(s["front"]) == {"known"} and set(s["front_size"]) == {10} and set(s["gamma"]) == {0.99}
    assert s.loc["a-0", "zero_regret_clients"] == 4 and s.loc["a-0", "mean_regret"] == pytest.approx(0, abs=1e-12)
    assert s.loc["a-1", "zero_regret_clients"] == 3
    assert s.loc["b-0", "cardinality"] == 1 and np.isnan(s.loc["b-0", "sparsity"])  # one point: not defined
    w = equally_spaced_weights(2, 4)
    assert s.loc["a-0", "cardinality"] == len(np.unique(np.argmax(w @ front.T, axis=1)))
    assert s.loc["a-0", "hypervolume"] == pytest.approx(hypervolume(optimal_points(w, front), spec.ref_point))
    # the comparison table: seeds, mean +- sample std over them, marked against fedpref (paired by seed)
    hv = [s.loc["a-0", "hypervolume"], s.loc["a-1", "hypervolume"]]
    table = metric_table(campaign.summary, "equidistant", "hypervolume").splitlines()
    assert table[:2] == ["| algorithm | n | deep-sea-treasure |", "|---|---|---|"]
    assert table[2] == f"| fedavg | 2 | {s.loc['b-0', 'hypervolume']:.2f} ± 0.00 |"  # below in both seeds: 2 pairs
    assert table[3] == f"| fedavg+FT | 1 | {hv[0]:.2f} |"  # one seed: no std, no test
    assert table[4] == f"| fedpref | 2 | {np.mean(hv):.2f} ± {np.std(hv, ddof=1):.2f} |"
    assert table[5] == "" and table[6].startswith("n: seeds per row") and "sign-flip permutation test" in table[6]
    assert "**n too small for 0.05: no cell can be marked.**" in table[6]
    regret = metric_table(campaign.summary, "equidistant", "zero_regret_clients", decimals=1).splitlines()
    assert regret[2:5] == ["| fedavg | 2 | 1.0 ± 0.0 |", "| fedavg+FT | 1 | 4.0 |", "| fedpref | 2 | 3.5 ± 0.7 |"]
    igd_rows = metric_table(campaign.summary, "equidistant", "igd", level=0.6).splitlines()
    assert igd_rows[2].endswith(" ▼ |") and "**" not in "".join(igd_rows)  # fedavg's IGD is higher: worse
    sparsity = metric_table(campaign.summary, "equidistant", "sparsity").splitlines()
    assert sparsity[2] == "| fedavg | 2 | n/a |"  # collapsed onto one point: never "best"
    assert "No variant shares 2 or more seeds with fedpref, so none is tested" in sparsity[-1]


def test_undiscounted_returns_are_selectable(campaign_dir, dst):
    spec, _, front_u = dst
    runs, _ = load_runs([campaign_dir])
    s = evaluate_runs(runs, returns="undiscounted").summary.set_index("name")
    assert set(s["gamma"]) == {1.0} and set(s["returns"]) == {"undiscounted"}
    w = equally_spaced_weights(2, 4)
    assert s.loc["a-0", "hypervolume"] == pytest.approx(hypervolume(optimal_points(w, front_u), spec.ref_point))
    assert s.loc["a-0", "zero_regret_clients"] == 4  # against the gamma = 1 front


def test_cli_writes_summary_and_comparison_and_reports_skipped(campaign_dir, tmp_path, capsys):
    assert main([str(campaign_dir), "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {campaign_dir / 'c' / 'unfinished'}: incomplete: no metrics.json" in err
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert len(summary) == 5 and "unfinished" not in " ".join(summary["run"])
    for _, row in summary.iterrows():  # one row per run, the stored metrics reproduced
        stored = json.loads((Path(row["run"]) / "metrics.json").read_text())["discounted"]
        for key in METRICS:  # None (not defined) is an empty cell
            assert np.isnan(row[key]) if stored[key] is None else row[key] == pytest.approx(stored[key])
    assert (summary["env_steps_per_client"] == 300).all()
    weights = pd.read_csv(tmp_path / "eu_weights.csv")  # the expected utility's weights, beside it
    assert list(weights.columns) == ["objectives", "index", "w_0", "w_1"] and set(weights["objectives"]) == {2}
    np.testing.assert_array_equal(weights[["w_0", "w_1"]], eu_weights(2))
    np.testing.assert_allclose(weights["w_0"], np.linspace(0.0, 1.0, 100))
    stats = pd.read_csv(tmp_path / "stats.csv")
    hv = stats[(stats["metric"] == "hypervolume") & (stats["variant"] == "fedavg")].iloc[0]
    assert (hv["reference"], hv["n"], hv["test"]) == ("fedpref", 2, "sign-flip") and pd.isna(hv["direction"])
    assert (hv["p_value"], hv["smallest_p"], hv["significant"]) == (0.5, 0.5, False)  # lower in both seeds
    assert set(stats["variant"]) == {"fedavg", "fedavg+FT"} and set(stats["level"]) == {0.05}
    md = (tmp_path / "comparison.md").read_text()
    assert "| deep-sea-treasure | equidistant | all | 4 | 3 | 100 | 300 | 1200 | 5 | — | — |" in md  # no wall times
    assert "## Preference distribution: equidistant" in md and "### Hypervolume (↑ higher is better)" in md
    assert "### IGD (↓ lower is better)" in md and "### Sparsity (↓ lower is better)" in md
    assert "- deep-sea-treasure (gamma 0.99): known front, 10 points" in md
    assert "c/unfinished`: incomplete" in md


def test_kept_logs_are_run_directories_that_evaluate_to_the_same_metrics(campaign_dir, tmp_path, capsys):
    out = tmp_path / "study"
    (out / "runs" / "stale").mkdir(parents=True)  # a previous archive is replaced as a whole
    assert main([str(campaign_dir), "--out", str(out), "--keep-logs"]) == 0
    kept = sorted(p.name for p in (out / "runs").iterdir())
    assert kept == ["a-0", "a-1", "b-0", "b-1", "b-ft"]  # not the unfinished run, nor hydra's folder
    assert sorted(p.name for p in (out / "runs" / "a-0").iterdir()) == [
        "config.yaml",
        "final.csv",
        "metrics.json",
        "rounds.csv",
    ]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    assert main([str(out / "runs"), "--out", str(tmp_path / "again")]) == 0
    first, again = pd.read_csv(out / "summary.csv"), pd.read_csv(tmp_path / "again" / "summary.csv")
    columns = ["label", "seed", *METRICS]
    pd.testing.assert_frame_equal(
        first[columns].sort_values(["label", "seed"]).reset_index(drop=True),
        again[columns].sort_values(["label", "seed"]).reset_index(drop=True),
    )
    assert (tmp_path / "again" / "stats.csv").read_text() == (out / "stats.csv").read_text()


def test_rebuild_rewrites_tests_and_tables_from_the_summary_alone(campaign_dir, tmp_path, capsys):
    out = tmp_path / "study"
    assert main([str(campaign_dir), "--out", str(out), "--reference", "fedavg", "--level", "0.1"]) == 0
    written = {name: (out / name).read_text() for name in ("summary.csv", "stats.csv", "comparison.md")}
    skipped = "\n\nSkipped run directories (not averaged in):\n\n- `" + str(campaign_dir / "c" / "unfinished")
    (out / "stats.csv").write_text("stale\n")
    (out / "comparison.md").unlink()
    assert rebuild([str(out), "--reference", "fedavg", "--level", "0.1"]) == 0
    assert f"{out}: wrote stats.csv, comparison.md" in capsys.readouterr().out
    assert (out / "summary.csv").read_text() == written["summary.csv"]  # never written
    assert (out / "stats.csv").read_text() == written["stats.csv"]
    # the same tables; only the skipped run directories are unknown to a summary
    before = written["comparison.md"]
    start = before.index(skipped)
    assert (out / "comparison.md").read_text() == before[:start] + before[before.index("\n\n## Budget", start) :]
    assert rebuild([str(tmp_path / "nothing")]) == 1
    assert "holds no summary.csv or vision_summary.csv" in capsys.readouterr().err


def test_campaign_front_for_an_env_without_known_front(tmp_path, dst):
    spec = envs.get_spec("mo-halfcheetah")
    assert envs.known_front(spec) is None
    w = np.array([[0.2, 0.8], [0.8, 0.2]])
    a, b = np.array([[1.0, 4.0], [3.0, 3.0]]), np.array([[4.0, 1.0], [2.0, 2.0]])
    write_run(tmp_path / "a", spec, w, a, a, "fedpref")
    write_run(tmp_path / "b", spec, w, b, b, "fedavg")
    dst_spec, front, front_u = dst
    write_run(tmp_path / "c", dst_spec, w, front[:2], front_u[:2], "fedavg", front=front, front_undisc=front_u)
    write_run(tmp_path / "d", spec, w, b, b, "fedavg", dist="dirichlet")
    runs, _ = load_runs([tmp_path])
    campaign = evaluate_runs(runs)
    cf = campaign.fronts["mo-halfcheetah", spec.gamma]
    assert cf.source == "campaign" and cf.n_runs == 3  # every run on the env, whatever its dist
    np.testing.assert_array_equal(cf.points, [[1.0, 4.0], [3.0, 3.0], [4.0, 1.0]])
    s = campaign.summary.set_index("name")
    assert s.loc["a", "front"] == "campaign" and s.loc["a", "front_size"] == 3
    # brute force: front points (1,4) (3,3) (4,1) to their nearest obtained point
    assert s.loc["a", "igd"] == pytest.approx(np.sqrt(5) / 3)  # 0, 0, |(4,1) - (3,3)|
    assert s.loc["b", "igd"] == pytest.approx((np.sqrt(5) + np.sqrt(2) + 0.0) / 3)  # (2,2), (2,2), (4,1)
    assert np.isnan(s.loc["a", "mean_regret"])
    table = metric_table(campaign.summary, "equidistant", "mean_regret").splitlines()
    assert table[0] == "| algorithm | n | deep-sea-treasure | mo-halfcheetah |"
    assert table[2].startswith("| fedavg | ") and table[2].endswith(" | — |")  # halfcheetah: no regret
    assert metric_table(campaign.summary, "dirichlet", "mean_regret") is None  # no known front there
    md = comparison_markdown(campaign)
    assert md.index("## Preference distribution: dirichlet") < md.index("## Preference distribution: equidistant")
    dirichlet = md[
        md.index("## Preference distribution: dirichlet") : md.index("## Preference distribution: equidistant")
    ]
    assert "### Mean regret" not in dirichlet and "### Hypervolume" in dirichlet
    # client 0: 0.2 * 4 + 0.8 * 1 = 1.6; client 1: 0.8 * 2 + 0.2 * 2 = 2.0; one run, no std
    assert metric_table(campaign.summary, "dirichlet", "max_scalarised") == (
        "| algorithm | n | mo-halfcheetah |\n|---|---|---|\n| fedavg | 1 | 2.00 |\n\n"
        "n: seeds per row; (n=k): a cell with fewer defined values. "
        "No reference row in this table: no paired test, nothing marked."
    )
    assert "| fedavg | 1 | 1.80 |" in metric_table(campaign.summary, "dirichlet", "mean_scalarised")
    assert "- mo-halfcheetah (gamma 0.99): campaign front (non-dominated union of 3 runs), 3 points" in md


def test_undiscounted_returns_use_the_undiscounted_reference_point(tmp_path):
    spec = envs.get_spec("mo-halfcheetah")  # 1000-step episodes: its own undiscounted reference point
    w = np.array([[0.2, 0.8], [0.8, 0.2]])
    disc, undisc = np.array([[10.0, -300.0], [30.0, -400.0]]), np.array([[100.0, -3000.0], [300.0, -4000.0]])
    write_run(tmp_path / "a", spec, w, disc, undisc)
    runs, _ = load_runs([tmp_path])
    for kind, points in (("discounted", disc), ("undiscounted", undisc)):
        campaign = evaluate_runs(runs, returns=kind)
        row = campaign.summary.iloc[0]
        assert row["hypervolume"] == pytest.approx(hypervolume(points, spec.reference_point(kind)))
        assert row["hypervolume"] > 0 and row["outside_ref"] == 0 and campaign.mismatches == []


def test_malformed_runs_are_named_and_skipped(tmp_path, dst, capsys):
    spec, front, front_u = dst
    w = equally_spaced_weights(2, 3)
    pts, pts_u = front[:3], front_u[:3]
    good = write_run(tmp_path / "good", spec, w, pts, pts_u, front=front, front_undisc=front_u)
    bad = {
        name: write_run(tmp_path / name, spec, w, pts, pts_u, front=front, front_undisc=front_u)
        for name in ("nocol", "nan", "json", "envmix", "rows", "negw")
    }
    final = pd.read_csv(good / "final.csv")
    final.drop(columns="disc_return_1").to_csv(bad["nocol"] / "final.csv", index=False)
    final.assign(return_0=[1.0, np.nan, 2.0]).to_csv(bad["nan"] / "final.csv", index=False)
    (bad["json"] / "metrics.json").write_text("{not json")
    info = json.loads((good / "metrics.json").read_text())
    (bad["envmix"] / "metrics.json").write_text(json.dumps({**info, "env": "minecart"}))
    final.iloc[:2].to_csv(bad["rows"] / "final.csv", index=False)
    final.assign(w_0=[-0.5, 0.5, 1.0]).to_csv(bad["negw"] / "final.csv", index=False)
    reasons = {}
    for name, path in bad.items():
        with pytest.raises(RunDirError) as exc:
            load_run(path)
        assert str(exc.value).startswith(str(path))
        reasons[name] = exc.value.reason
    assert reasons == {
        "nocol": "malformed final.csv: missing column(s) ['disc_return_1'] (deep-sea-treasure has 2 objectives)",
        "nan": "malformed final.csv: clients [1] have non-finite weights or returns",
        "json": reasons["json"],
        "envmix": "malformed: metrics.json says env 'minecart' but config.yaml says 'deep-sea-treasure'",
        "rows": "malformed final.csv: 2 client rows but config.yaml has n_clients=3",
        "negw": "malformed final.csv: negative preference weights",
    }
    assert reasons["json"].startswith("malformed metrics.json:")
    out = tmp_path / "out"
    assert main([str(tmp_path / "*"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    for path in bad.values():
        assert f"skipped {path}: malformed" in err
    assert pd.read_csv(out / "summary.csv")["name"].tolist() == ["good"]  # never averaged in
    # nothing valid: exit status 1 and a message
    assert main([str(bad["nan"]), str(bad["json"]), "--out", str(out)]) == 1
    assert "error: no valid run directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main([str(good), str(bad["nan"])])  # two inputs and no --out
    assert exit_.value.code == 2
    assert "--out is required" in capsys.readouterr().err
