"""``python -m morlfed.analysis.results``: the tables of the results pages rebuilt from committed CSVs.

A small planted summary (two environments, two preference distributions, four variants, two
seeds) gives hand-computable means, ranks and budgets; the committed docs/results.md and
docs/results/*.md must be exactly what their own CSVs regenerate.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from morlfed.analysis.published import ResultsError, parse_blocks, ranking, read_summaries, regenerate
from morlfed.analysis.results import main
from morlfed.analysis.tables import budget_table

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("fedavg", "fedpref", "fedpref+FT", "local")
#: mean_scalarised per (env, dist, variant): seed 0 gets value - 1, seed 1 value + 1 (std sqrt 2).
PLANTED = {
    ("alpha", "dirichlet"): {"fedavg": 1.0, "fedpref": 3.0, "fedpref+FT": 5.0, "local": 2.0},
    ("alpha", "equidistant"): {"fedavg": 0.0, "fedpref": 4.0, "fedpref+FT": 2.0, "local": 4.0},
    ("beta", "dirichlet"): {"fedavg": 7.0, "fedpref": 6.0, "fedpref+FT": 1.0, "local": 9.0},
}


@pytest.fixture()
def summary() -> pd.DataFrame:
    rows = []
    for (env, dist), values in PLANTED.items():
        for variant, value in values.items():
            for seed, offset in ((0, -1.0), (1, 1.0)):
                rows.append(
                    {
                        "env": env,
                        "dist": dist,
                        "algo": variant.removesuffix("+FT"),
                        "label": variant,
                        "variant": variant,
                        "finetune": variant.endswith("+FT"),
                        "seed": seed,
                        "n_clients": 10,
                        "rounds": 5 if env == "alpha" else 8,
                        "local_steps": 100,
                        "env_steps_per_client": (5 if env == "alpha" else 8) * 100.0,
                        "wall_time_s": 30.0 + 30.0 * seed,
                        "mean_scalarised": value + offset,
                        "igd": 10.0 - value,
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture()
def results_md(tmp_path, summary) -> Path:
    """The path of a document to write, beside ``runs.csv`` holding ``summary``."""
    summary.to_csv(tmp_path / "runs.csv", index=False)
    return tmp_path / "results.md"


@pytest.fixture()
def doc(tmp_path, results_md) -> Path:
    pd.DataFrame(
        [
            {"metric": "mean_scalarised", "env": "alpha", "dist": "dirichlet", "first": "fedpref*", "source": "T1"},
            {"metric": "mean_scalarised", "env": "beta", "dist": "dirichlet", "first": "fedavg", "source": "T1"},
        ]
    ).to_csv(tmp_path / "claims.csv", index=False)
    results_md.write_text(
        "# Results\n\nProse stays.\n\n"
        "<!-- results:table csv=runs.csv metric=mean_scalarised dist=dirichlet -->\nstale\n<!-- /results -->\n\n"
        "Between blocks.\n\n"
        "<!-- results:ranking csv=runs.csv metric=mean_scalarised claims=claims.csv -->\n<!-- /results -->\n"
        "<!-- results:ranking csv=runs.csv metric=igd focus=local -->\n<!-- /results -->\n"
        "<!-- results:budget csv=runs.csv -->\n<!-- /results -->\n\nEnd.\n"
    )
    return results_md


def table_cells(text: str, header_start: str, key_columns: int = 1) -> dict:
    """``{first cell (or tuple of the first key_columns cells): other cells}`` of a markdown table.

    The table is the one whose header starts with ``header_start``.
    """
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        key = cells[0] if key_columns == 1 else tuple(cells[:key_columns])
        rows[key] = cells[key_columns:]
    return rows


def rendered(path: Path, blocks: str) -> str:
    """The text of the document ``path`` holding ``blocks``, once the command has regenerated it."""
    path.write_text(blocks)
    assert main([str(path)]) == 0
    return path.read_text()


def test_table_block_has_seeds_mean_std_and_marks_against_fedpref(doc):
    assert main([str(doc)]) == 0
    text = doc.read_text()
    assert "stale" not in text and "Prose stays." in text and "Between blocks." in text and text.endswith("End.\n")
    cells = table_cells(text, "| algorithm |")
    # columns n, alpha, beta; std of (v - 1, v + 1) is sqrt(2). Every seed is v +- 1 for every
    # variant, so the paired difference to fedpref is the same in both seeds: yet 2 pairs cannot
    # reach p < 0.05 (the smallest two-sided p is 2/2^2), so the table says so and marks nothing
    assert cells["fedpref+FT"] == ["2", "5.00 ± 1.41", "1.00 ± 1.41"]
    assert cells["fedpref"] == ["2", "3.00 ± 1.41", "6.00 ± 1.41"]  # the reference itself
    assert "sign-flip permutation test of the mean difference, p < 0.05" in text
    assert "**n too small for 0.05: no cell can be marked.** Every cell here is tested over 2 pairs" in text
    # at a level 2 pairs can reach, the block marks the differences of the same sign in both seeds
    doc.write_text(
        doc.read_text().replace(
            "metric=mean_scalarised dist=dirichlet", "metric=mean_scalarised dist=dirichlet level=0.6"
        )
    )
    assert main([str(doc)]) == 0
    cells = table_cells(doc.read_text(), "| algorithm |")
    assert cells["fedpref+FT"] == ["2", "**5.00 ± 1.41** ▲", "1.00 ± 1.41 ▼"]
    assert cells["local"] == ["2", "2.00 ± 1.41 ▼", "**9.00 ± 1.41** ▲"]
    assert cells["fedpref"] == ["2", "3.00 ± 1.41", "6.00 ± 1.41"]


def test_metrics_block_has_one_column_per_metric_with_its_direction(results_md):
    text = rendered(
        results_md,
        "<!-- results:metrics csv=runs.csv env=alpha dist=dirichlet metrics=mean_scalarised,igd decimals=1 level=0.6 -->\n"
        "<!-- /results -->\n",
    )
    cells = table_cells(text, "| algorithm | n | Mean scalarised")
    # igd = 10 - value (the same for both seeds): lower is better, so IGD is marked as the reward is
    # (at a level that 2 pairs can reach: p = 2/2^2 when both differences share a sign)
    assert cells["fedpref+FT"] == ["2", "**5.0 ± 1.4** ▲", "**5.0 ± 0.0** ▲"]
    assert cells["fedavg"] == ["2", "1.0 ± 1.4 ▼", "9.0 ± 0.0 ▼"]
    assert list(cells) == ["fedavg", "fedpref", "fedpref+FT", "local"]
    text = rendered(
        results_md,
        "<!-- results:metrics csv=runs.csv env=alpha dist=dirichlet metrics=igd reference=local level=0.7 -->\n"
        "<!-- /results -->\n",
    )
    assert table_cells(text, "| algorithm | n | IGD")["fedpref"] == ["2", "**7.00 ± 0.00** ▲"]  # 10 - 3 < 10 - 2
    assert "worse than local, paired by seed: exact two-sided sign-flip permutation test" in text and "p < 0.7" in text


def test_untuned_rows_are_marked_in_both_table_kinds(results_md):
    text = rendered(
        results_md,
        "<!-- results:metrics csv=runs.csv env=alpha dist=dirichlet metrics=igd untuned=fedavg*,loc* level=0.6 -->\n"
        "<!-- /results -->\n"
        "<!-- results:table csv=runs.csv metric=igd dist=dirichlet untuned=fedavg -->\n<!-- /results -->\n",
    )
    first, second = text.split("<!-- results:table")
    cells = table_cells(first, "| algorithm | n | IGD")
    # the mark goes on the label only: the cells and their paired tests are unchanged
    assert cells == {
        "fedavg †": ["2", "9.00 ± 0.00 ▼"],
        "fedpref": ["2", "7.00 ± 0.00"],
        "fedpref+FT": ["2", "**5.00 ± 0.00** ▲"],
        "local †": ["2", "8.00 ± 0.00 ▼"],
    }
    assert "†: untuned: the strategy ran its default settings" in first
    assert list(table_cells(second, "| algorithm | n | alpha")) == ["fedavg †", "fedpref", "fedpref+FT", "local"]
    # without the argument nothing is marked and the note has no such sentence
    assert "†" not in rendered(
        results_md, "<!-- results:table csv=runs.csv metric=igd dist=dirichlet -->\n<!-- /results -->\n"
    )


def test_rows_keeps_the_matching_variants_of_joined_studies_and_their_paired_tests(tmp_path, summary, results_md):
    # two studies on the same seeds: the full method in one, its ablation in the other
    ablation = summary[summary["variant"] == "fedpref"].assign(variant="fedpref (clustering off)", label="x")
    ablation = ablation.assign(igd=ablation["igd"] + 1.0)
    ablation.to_csv(tmp_path / "ablation.csv", index=False)
    text = rendered(
        results_md,
        "<!-- results:metrics csv=runs.csv,ablation.csv rows=fedpref* env=alpha dist=dirichlet metrics=igd level=0.6 -->\n"
        "<!-- /results -->\n"
        "<!-- results:budget csv=runs.csv,ablation.csv rows=fedpref?(clustering* -->\n<!-- /results -->\n",
    )
    metrics, budget = text.split("<!-- results:budget")
    # fedavg and local are left out; the cells and marks are those of the whole table
    assert table_cells(metrics, "| algorithm | n | IGD") == {
        "fedpref": ["2", "7.00 ± 0.00"],
        "fedpref (clustering off)": ["2", "8.00 ± 0.00 ▼"],
        "fedpref+FT": ["2", "**5.00 ± 0.00** ▲"],
    }
    # the budget of the ablation's 2 runs alone (of the 10 the two csvs hold under alpha, dirichlet)
    assert table_cells(budget, "| environment |", key_columns=2)["alpha", "dirichlet"][-3] == "2"


def test_ranking_finds_first_and_focus_rank(summary):
    ranks = ranking(summary, "mean_scalarised").set_index(["env", "dist"])
    assert ranks.loc[("alpha", "dirichlet"), ["first", "focus", "rank"]].tolist() == ["fedpref+FT", "fedpref+FT", 1]
    # a tie at the shown precision: both first, and FedPref's rank is 1
    assert ranks.loc[("alpha", "equidistant"), ["first", "focus", "rank"]].tolist() == ["fedpref = local", "fedpref", 1]
    # local 9 > fedavg 7 > fedpref 6: FedPref's best is third of four
    assert ranks.loc[("beta", "dirichlet"), ["first", "focus", "rank", "variants"]].tolist() == [
        "local",
        "fedpref",
        3,
        4,
    ]
    # lower is better for IGD: the order reverses with the direction
    igd = ranking(summary, "igd", focus="local").set_index(["env", "dist"])
    assert igd.loc[("beta", "dirichlet"), ["first", "rank"]].tolist() == ["local", 1]
    assert igd.loc[("alpha", "dirichlet"), ["first", "rank"]].tolist() == ["fedpref+FT", 3]


def test_ranking_without_the_focus_variant_in_one_group_says_so(tmp_path, summary):
    """A group with no variant matching ``focus`` shows "—"; the other groups keep integer ranks."""
    no_fedpref = summary[~((summary["env"] == "beta") & summary["variant"].str.startswith("fedpref"))]
    no_fedpref.to_csv(tmp_path / "runs.csv", index=False)
    block = "<!-- results:ranking csv=runs.csv metric=mean_scalarised -->\n<!-- /results -->\n"
    cells = table_cells(regenerate(block, tmp_path), "| environment", key_columns=2)
    assert cells[("beta", "dirichlet")] == ["local (9.00)", "—", "—"]
    assert cells[("alpha", "dirichlet")] == ["fedpref+FT (5.00)", "fedpref+FT", "1 of 4"]


def test_ranking_ranks_the_values_the_tables_print(summary):
    """0.015 prints as 0.01 (binary float): the ranking must not see 0.02 and split a tie the table shows."""
    part = summary[(summary["env"] == "alpha") & (summary["dist"] == "dirichlet")].copy()
    part["mean_scalarised"] = part["variant"].map({"fedavg": 0.015, "fedpref": 0.01, "fedpref+FT": 0.0, "local": 0.0})
    ranks = ranking(part, "mean_scalarised").iloc[0]
    assert f"{0.015:.2f}" == "0.01" and (ranks["first"], ranks["rank"]) == ("fedavg = fedpref", 1)


def test_joined_summaries_with_a_run_twice_are_refused(tmp_path, summary):
    summary.to_csv(tmp_path / "a.csv", index=False)
    summary[summary["env"] == "beta"].to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(ResultsError, match=r"csv=a.csv,b.csv: 16 runs share a \(dist, env, variant, seed\)"):
        read_summaries(tmp_path, "a.csv,b.csv")


def test_ranking_block_compares_with_the_papers_claims(doc):
    assert main([str(doc)]) == 0
    rows = table_cells(doc.read_text(), "| environment | preferences | first (Mean scalarised", key_columns=2)
    assert rows["alpha", "dirichlet"] == ["fedpref+FT (5.00)", "fedpref+FT", "1 of 4", "fedpref* (T1)", "yes"]
    assert rows["alpha", "equidistant"] == ["fedpref = local (4.00)", "fedpref", "1 of 4", "—", "—"]
    assert rows["beta", "dirichlet"] == ["local (9.00)", "fedpref", "3 of 4", "fedavg (T1)", "**no**"]


def test_budget_block_sums_wall_time(doc):
    assert main([str(doc)]) == 0
    rows = table_cells(doc.read_text(), "| environment | preferences | algorithms | clients |", key_columns=2)
    # alpha/dirichlet: 4 variants x 2 seeds, all 500 env steps per client (5 rounds x 100), wall
    # 30 s and 60 s each -> mean 45 s, total 360 s = 6 min
    assert rows["alpha", "dirichlet"] == ["all", "10", "5", "100", "500", "5000", "8", "45 (min 30, max 60)", "6"]
    assert rows["beta", "dirichlet"][:6] == ["all", "10", "8", "100", "800", "8000"]


def test_budget_gives_each_method_that_measured_losses_a_row_of_its_own(summary):
    # alpha/dirichlet's 500 training env steps per client; two variants also measured losses
    part = summary[(summary["env"] == "alpha") & (summary["dist"] == "dirichlet")].copy()
    part["loss_env_steps_per_client"] = part["variant"].map({"fedavg": 40.0, "local": 10.0}).fillna(0.0)
    part.loc[(part["variant"] == "local") & (part["seed"] == 1), "loss_env_steps_per_client"] = 30.0
    part["env_steps_per_client"] += part["loss_env_steps_per_client"]
    rows = [line.split(" | ") for line in budget_table(part).splitlines()[2:]]
    assert [(r[2], r[6], r[7], r[8]) for r in rows] == [
        ("fedpref, fedpref+FT", "500", "0", "5000"),  # the methods that measured none share a row
        ("fedavg", "500", "40", "5400"),
        ("local", "500", "20 (min 10, max 30)", "5200"),
    ]


def test_check_mode_detects_stale_tables_and_writes_nothing(doc, capsys):
    assert main([str(doc), "--check"]) == 1
    assert "stale" in doc.read_text()
    assert main([str(doc)]) == 0
    assert main([str(doc), "--check"]) == 0
    once = doc.read_text()
    assert regenerate(once, doc.parent) == once  # idempotent
    doc.write_text(once.replace("5.00 ± 1.41", "5.10 ± 1.41"))
    assert main([str(doc), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err


@pytest.mark.parametrize(
    "block, message",
    [
        ("<!-- results:chart csv=runs.csv -->\n<!-- /results -->", "unknown block kind results:chart"),
        ("<!-- results:table csv=runs.csv metric=mean_scalarised dist=dirichlet -->\n", "is not closed"),
        ("<!-- /results -->", "without an opening block"),
        ("<!-- results:table csv=nope.csv metric=igd dist=dirichlet -->\n<!-- /results -->", "no such file"),
        (
            "<!-- results:table csv=runs.csv metric=speed dist=dirichlet -->\n<!-- /results -->",
            "metric='speed' is not a metric",
        ),
        (
            "<!-- results:table csv=runs.csv metric=igd dist=gaussian -->\n<!-- /results -->",
            "dist='gaussian' has no runs",
        ),
        ("<!-- results:budget csv=runs.csv colour=red -->\n<!-- /results -->", "does not take colour"),
        (
            "<!-- results:table csv=runs.csv metric=igd dist=dirichlet level=5 -->\n<!-- /results -->",
            "level='5' must be a number in (0, 1)",
        ),
        ("<!-- results:table metric=igd dist=dirichlet -->\n<!-- /results -->", "needs csv="),
        (
            "<!-- results:table csv=runs.csv metric=igd dist=dirichlet untuned=fedavg,fedmhc -->\n<!-- /results -->",
            "untuned=fedmhc matches no variant of the csv; it has fedavg, fedpref, fedpref+FT, local",
        ),
        ("<!-- results:table csv=runs.csv metric igd -->\n<!-- /results -->", "is not key=value"),
        (
            "<!-- results:budget csv=runs.csv rows=fedpref,ifca* -->\n<!-- /results -->",
            "rows=ifca* matches no variant of the csv; it has fedavg, fedpref, fedpref+FT, local",
        ),
        (
            "<!-- results:metrics csv=runs.csv env=beta dist=equidistant metrics=igd -->\n<!-- /results -->",
            "env='beta' dist='equidistant' has no runs in the csv; it has env=alpha dist=dirichlet, env=alpha dist=equidistant",
        ),
        ("<!-- results:metrics csv=runs.csv env=beta dist=dirichlet -->\n<!-- /results -->", "needs metrics=M1,M2"),
        (
            "<!-- results:metrics csv=runs.csv env=beta dist=dirichlet metrics=igd,speed -->\n<!-- /results -->",
            "metric='speed' is not a metric",
        ),
    ],
)
def test_bad_blocks_are_named_and_nothing_is_written(results_md, capsys, block, message):
    results_md.write_text("# R\n\n" + block + "\n")
    before = results_md.read_text()
    assert main([str(results_md)]) == 2
    err = capsys.readouterr().err
    assert message in err and f"{results_md}:3" in err
    assert results_md.read_text() == before


def test_parse_blocks_positions_and_foreign_csv(tmp_path):
    lines = ["a", "<!-- results:budget csv=x.csv -->", "old", "<!-- /results -->", "b"]
    (block,) = parse_blocks(lines)
    assert (block.kind, block.args, block.start, block.end) == ("budget", {"csv": "x.csv"}, 1, 3)
    pd.DataFrame({"env": ["a"], "score": [1.0]}).to_csv(tmp_path / "other.csv", index=False)
    with pytest.raises(ResultsError, match=r"not an analysis.evaluate summary .no column dist, variant, seed"):
        read_summaries(tmp_path, "other.csv")


def test_several_documents_each_read_their_csvs_from_their_own_folder(doc, summary, capsys):
    page = doc.parent / "env" / "page.md"
    page.parent.mkdir()
    summary.to_csv(page.parent / "runs.csv", index=False)
    page.write_text("# Env\n\n<!-- results:budget csv=runs.csv -->\nstale\n<!-- /results -->\n")
    assert main([str(doc), str(page), "--check"]) == 1
    assert capsys.readouterr().err.count("out of date") == 2
    assert main([str(doc), str(page)]) == 0
    assert main([str(doc), str(page), "--check"]) == 0
    assert "stale" not in page.read_text() and "| alpha |" in page.read_text()


def test_a_bad_block_in_any_document_writes_no_document(doc, tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_text("# Bad\n\n<!-- results:chart csv=runs.csv -->\n<!-- /results -->\n")
    before = doc.read_text()
    assert main([str(doc), str(bad)]) == 2
    assert doc.read_text() == before


def test_committed_results_are_what_their_csvs_give():
    """The generated tables of docs/results.md and of every page in docs/results/ equal a regeneration."""
    pages = [ROOT / "docs" / "results.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
    assert len(pages) > 2
    assert main([*map(str, pages), "--check"]) == 0
