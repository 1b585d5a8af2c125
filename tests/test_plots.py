"""morlfed.metrics.figures, analysis.charts, analysis.campaign_figures and the analysis.plot CLI.

Planted cluster structure must be laid out contiguously, rings must mark exactly the non-dominated
points, curves must show the mean and std over seeds, and the CLI must write every figure of a real
(tiny) FedPref run as PNG and PDF.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from morlfed.analysis.campaign_figures import default_rounds, partial_figures
from morlfed.analysis.charts import (
    cluster_evolution_figure,
    cluster_order,
    fronts_comparison_figure,
    metric_bars_figure,
    preference_groups,
    similarity_figure,
)
from morlfed.analysis.curves import learning_curves_figure
from morlfed.analysis.partial import load_partial_run
from morlfed.analysis.plot import main
from morlfed.analysis.runs import load_run
from morlfed.api import ExperimentResult
from morlfed.metrics import hypervolume
from morlfed.metrics.figures import front_figure, plot_front, save_figure
from morlfed.storage.runstatus import StopRecord, write_stopped

ROOT = Path(__file__).resolve().parents[1]
# Three preference groups, interleaved by client id: {0, 3}, {1, 4}, {2, 5}.
GROUP_WEIGHTS = np.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9]] * 2)
GROUP_CLUSTERS = [[4, 1], [2, 5, 0, 3]]


def test_preference_groups_and_cluster_order():
    np.testing.assert_array_equal(preference_groups(GROUP_WEIGHTS), [2, 1, 0, 2, 1, 0])
    order, sizes = cluster_order(GROUP_CLUSTERS, GROUP_WEIGHTS)
    # Within a cluster by preference (lexicographic weights, then id); clusters by their first client.
    assert order.tolist() == [2, 5, 0, 3, 1, 4] and sizes == [4, 2]
    order, sizes = cluster_order([[1, 4]], GROUP_WEIGHTS)  # missing clients come as singletons
    assert sorted(order.tolist()) == list(range(6)) and sizes == [1, 1, 2, 1, 1]
    assert order.tolist() == [2, 5, 1, 4, 0, 3]
    with pytest.raises(ValueError, match=r"distinct client ids in 0\.\.5"):
        cluster_order([[0, 1], [1, 2]], GROUP_WEIGHTS)
    with pytest.raises(ValueError, match=r"distinct client ids"):
        cluster_order([[0, 9]], GROUP_WEIGHTS)


def test_similarity_heatmap_is_block_diagonal_in_cluster_order():
    groups = preference_groups(GROUP_WEIGHTS)
    same = groups[:, None] == groups[None, :]
    planted = np.where(same, 0.9, np.nan)  # compared only within clusters (like FedPref's blocks)
    np.fill_diagonal(planted, 1.0)
    clusters = [[c for c in range(6) if groups[c] == g] for g in range(3)]
    fig = similarity_figure({1: np.full((6, 6), 0.2), 5: planted}, {5: clusters}, GROUP_WEIGHTS)
    axes = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in axes] == ["round 1 (1 cluster)", "round 5 (3 clusters)"]
    shown = axes[1].images[0].get_array()
    expected_blocks = np.kron(np.eye(3), np.ones((2, 2))).astype(bool)  # three contiguous 2x2 blocks
    np.testing.assert_array_equal(~np.ma.getmaskarray(shown), expected_blocks)
    assert [t.get_text() for t in axes[1].get_xticklabels()] == ["2", "5", "1", "4", "0", "3"]
    with pytest.raises(ValueError, match=r"shape \(2, 2\), expected \(6, 6\)"):
        similarity_figure({1: np.eye(2)}, {}, GROUP_WEIGHTS)


def test_cluster_evolution_draws_a_bar_per_cluster_and_a_box_per_client():
    history = {1: [list(range(6))], 2: [[0, 1, 3, 4], [2, 5]], 3: [[0, 3], [1, 4], [2, 5]]}
    fig = cluster_evolution_figure(history, GROUP_WEIGHTS)
    rects = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    outlines = [r for r in rects if not r.get_fill()]
    boxes = [r for r in rects if r.get_fill()]
    assert len(outlines) == 1 + 2 + 3 and len(boxes) == 6 * 3
    # Clients of one preference group share a colour; the three groups get three colours.
    final = [b for b in boxes if abs(b.get_x() - (2 - 0.35)) < 1e-9]
    assert len({tuple(b.get_facecolor()) for b in final}) == 3
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "3"]


@pytest.mark.parametrize("m, panels", [(2, 1), (3, 3), (4, 6)])
def test_front_figure_pairwise_grid_and_non_dominated_rings(m, panels):
    rng = np.random.default_rng(m)
    front = rng.dirichlet(np.ones(m), size=5) * 10  # mutually non-dominated (constant sum)
    returns = np.vstack([front, front[:2] - 1.0])  # + two dominated points
    weights = rng.dirichlet(np.ones(m), size=len(returns))
    fig = front_figure(returns, weights, front=front, objectives=[f"o{k}" for k in range(m)])
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_xlabel().startswith("o")]
    assert len(axes) == panels
    assert {(ax.get_xlabel(), ax.get_ylabel()) for ax in axes} == {
        (f"o{i}", f"o{j}") for i in range(m) for j in range(i + 1, m)
    }
    rings = [c for c in axes[0].collections if c.get_label() == "non-dominated"]
    assert len(rings) == 1 and len(rings[0].get_offsets()) == 5
    with pytest.raises(ValueError, match=r"both be \[n_clients, m\]"):
        front_figure(returns, weights[:3])


def test_fronts_comparison_one_row_per_algorithm_and_seeds_in_the_legends():
    front = np.array([[0.0, 3.0], [2.0, 2.0], [3.0, 0.0]])
    w = np.array([[0.2, 0.8], [0.8, 0.2]])
    sets = {"fedavg": [(front[:2], w), (front[1:], w)], "fedpref": [(front[[0, 2]], w)]}
    fig = fronts_comparison_figure(
        sets, front, ["a", "b"], front_label="campaign front", seeds={"fedavg": [3, 7], "fedpref": [7]}
    )
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["fedavg", "fedpref"]
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend()]
    assert legends[0] == ["campaign front", "seed 3", "non-dominated", "seed 7"] and "seed 7" in legends[1]
    # a seed keeps its marker shape in every row
    markers: dict[str, set] = {}
    for ax in fig.axes:
        for c in ax.collections:
            if c.get_label().startswith("seed"):
                markers.setdefault(c.get_label(), set()).add(str(c.get_paths()[0].vertices.tolist()))
    assert len(markers["seed 7"]) == 1 and markers["seed 7"] != markers["seed 3"]
    with pytest.raises(ValueError, match=r"one seed per run"):
        fronts_comparison_figure(sets, seeds={"fedavg": [3]})


def overlapping_texts(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of drawn texts (titles, labels, drawn tick labels, legends) whose boxes overlap."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    hidden = set()  # tick labels outside the axis' view are not drawn
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for loc, label in zip(axis.get_majorticklocs(), axis.get_majorticklabels()):
                if not lo - 1e-9 * (hi - lo) <= loc <= hi + 1e-9 * (hi - lo):
                    hidden.add(id(label))
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in hidden]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]


def test_fronts_of_four_objectives_are_readable_parallel_coordinates():
    rng = np.random.default_rng(4)
    names = ["landed", "shaping", "main_engine_fuel", "side_engine_fuel"]  # mo-lunar-lander's
    front = rng.dirichlet(np.ones(4), size=12) * [100, 1000, 100, 100] - [0, 500, 100, 100]
    sets = {
        label: [(front[rng.choice(12, 5)] + rng.normal(0, 3, (5, 4)), rng.dirichlet(np.ones(4), 5)) for _ in range(3)]
        for label in ("fedpref (algo.top_r=0.5, local_steps=100)", "fedavg+FT", "local")
    }
    seeds = {label: [0, 1, 2] for label in sets}
    fig = fronts_comparison_figure(sets, front, names, "mo-lunar-lander / dirichlet", "campaign front", seeds)
    assert overlapping_texts(fig) == []
    width, height = fig.get_size_inches()
    assert width <= 13 and height <= 10  # two panels to a row, not six in one
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["fedpref (algo.top_r=0.5, local_steps=100)", "fedavg+FT", "local"]
    for ax in panels:
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert [t.split("\n")[0] for t in ticks] == ["landed", "shaping", "main engine", "side engine"]
        assert len(ax.get_lines()) == len(front) + 3 * 5  # the front, then a line per client of each seed
    assert [t.get_text() for t in panels[0].get_legend().get_texts()][:4] == [
        "campaign front",
        "seed 0",
        "seed 1",
        "seed 2",
    ]


def test_learning_curves_mean_and_std_band():
    curves = pd.DataFrame(
        {
            "label": ["a"] * 4 + ["b"] * 2,
            "seed": [0, 0, 1, 1, 0, 0],
            "round": [1, 2, 1, 2, 1, 2],
            "value": [1.0, 2.0, 3.0, 6.0, 5.0, 5.0],
        }
    )
    fig = learning_curves_figure(curves)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"a (2 seeds)", "b (1 seed)"}
    np.testing.assert_allclose(lines["a (2 seeds)"].get_ydata(), [2.0, 4.0])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]  # one band: a's, two seeds
    assert len(ax.collections) == 1
    assert band.min() == pytest.approx(2.0 - np.std([1, 3], ddof=1))
    assert band.max() == pytest.approx(4.0 + np.std([2, 6], ddof=1))
    with pytest.raises(ValueError, match=r"missing \['seed'\]"):
        learning_curves_figure(curves.drop(columns="seed"))


def test_learning_curves_past_three_labels_are_small_multiples_over_env_steps():
    labels = [f"variant {k}" for k in range(5)]
    curves = pd.DataFrame(
        [
            {"label": label, "seed": seed, "round": r, "env_steps": 300 * r, "value": k + r + seed}
            for k, label in enumerate(labels)
            for seed in (0, 1)
            for r in (1, 2, 3)
        ]
    )
    fig = learning_curves_figure(curves, title="dst / dirichlet", x="env_steps")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [f"{label} (2 seeds)" for label in labels]
    assert {ax.get_xlabel() for ax in panels} == {"training env steps per client (budgeted)"}
    for k, ax in enumerate(panels):  # its own mean and band in colour, the four others faint
        own = [line for line in ax.get_lines() if line.get_label() == f"variant {k} (2 seeds)"]
        assert len(own) == 1 and len(ax.get_lines()) == 5 and len(ax.collections) == 1
        np.testing.assert_allclose(own[0].get_xdata(), [300, 600, 900])
        np.testing.assert_allclose(own[0].get_ydata(), [k + 1.5, k + 2.5, k + 3.5])
    few = learning_curves_figure(curves[curves["label"].isin(labels[:3])])
    styles = [line.get_linestyle() for line in few.axes[0].get_lines()]
    assert len(set(styles)) == 3 and len(few.axes[0].collections) == 3  # told apart without colour
    assert few.axes[0].get_legend().get_title().get_text() == "mean, +- std over seeds"


def test_fronts_of_many_algorithms_are_a_grid():
    front = np.array([[0.0, 3.0], [2.0, 2.0], [3.0, 0.0]])
    weights = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    sets = {f"algo {k}": [(front + 0.1 * k, weights)] for k in range(6)}
    fig = fronts_comparison_figure(sets, front, ["treasure", "time"])
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert len(panels) == 6
    columns = {round(ax.get_position().x0, 3) for ax in panels}
    rows = {round(ax.get_position().y0, 3) for ax in panels}
    assert (len(columns), len(rows)) == (3, 2)
    width, height = fig.get_size_inches()
    assert width > height  # not one tall column


def test_cluster_figures_say_what_the_colours_are_with_the_objectives_names():
    history = {1: [list(range(6))], 2: [[0, 3], [1, 4], [2, 5]]}
    fig = cluster_evolution_figure(history, GROUP_WEIGHTS, "dst / fedpref: clusters", objectives=["treasure", "time"])
    assert fig.get_suptitle() == "dst / fedpref: clusters"  # the legend's title is its own
    legend = fig.axes[0].get_legend()
    assert legend.get_title().get_text() == "weights (treasure, time)"
    assert [t.get_text() for t in legend.get_texts()] == ["(0.10, 0.90)", "(0.50, 0.50)", "(0.90, 0.10)"]
    many = np.stack([np.linspace(0, 1, 20), 1 - np.linspace(0, 1, 20)], axis=1)
    fig = cluster_evolution_figure({1: [list(range(20))]}, many, objectives=["treasure", "time"])
    colour_bars = [ax for ax in fig.axes if ax.get_ylabel() == "client's weight on treasure"]
    assert len(colour_bars) == 1


def test_metric_bars_and_saving(tmp_path):
    summary = pd.DataFrame({"variant": ["x", "x", "y"], "hypervolume": [1.0, 3.0, 5.0], "igd": [0.5, 0.5, None]})
    fig = metric_bars_figure(summary, ["hypervolume", "igd"])
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [2.0, 5.0]
    assert fig.axes[1].get_title() == "IGD (↓)"
    paths = save_figure(fig, tmp_path / "sub" / "bars")
    assert [p.name for p in paths] == ["bars.png", "bars.pdf"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[1].read_bytes()[:5] == b"%PDF-"
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["bars.pdf", "bars.png"]  # no temp files
    with pytest.raises(ValueError, match=r"formats must be a non-empty subset of png, pdf, svg"):
        save_figure(fig, tmp_path / "x", ["jpg"])
    with pytest.raises(ValueError, match=r"unknown_metric"):
        metric_bars_figure(summary, ["unknown_metric"])
    # plot_front keeps the signature morlfed.run uses
    plot_front(np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([[0.5, 0.5], [1.0, 0.0]]), None, tmp_path / "f.pdf")
    assert (tmp_path / "f.pdf").read_bytes()[:5] == b"%PDF-"


def test_default_rounds():
    assert default_rounds([]) == []
    assert default_rounds([1, 2]) == [1, 2]
    assert default_rounds(range(1, 12)) == [1, 6, 11]
    assert default_rounds([2, 4, 6, 8, 10], k=2) == [2, 10]
    assert default_rounds([2, 4, 6], k=1) == [6]
    with pytest.raises(ValueError, match=r"k \(number of rounds\) must be >= 1"):
        default_rounds([1, 2], k=0)


@pytest.fixture(scope="module")
def fedpref_run(tmp_path_factory) -> Path:
    """A real tiny FedPref run on DST: 4 clients in 2 preference groups.

    Similarity is saved, and the deployed models are evaluated every round.
    """
    out = tmp_path_factory.mktemp("plots") / "run"
    cmd = [
        sys.executable,
        "-m",
        "morlfed.run",
        "algo=fedpref",
        "dist=groups",
        "dist.n_groups=2",
        "n_clients=4",
        "rounds=4",
        "local_steps=100",
        "save_similarity=true",
        "eval_every=1",
        "progress=false",
        f"hydra.run.dir={out}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_plot_cli_writes_every_figure_of_a_real_run(fedpref_run, tmp_path, capsys):
    run = load_run(fedpref_run)
    assert run.similarity_rounds() == [1, 2, 3, 4] and sorted(run.cluster_history()) == [1, 2, 3, 4]
    assert main([str(fedpref_run), "--out", str(tmp_path), "--rounds", "1", "3"]) == 0
    assert "wrote 18 files for 1 run to" in capsys.readouterr().out
    stems = [
        "front_deep-sea-treasure_fedpref_groups_seed0",
        "similarity_deep-sea-treasure_fedpref_groups_seed0",
        "clusters_deep-sea-treasure_fedpref_groups_seed0",
        "fronts_deep-sea-treasure_groups",
        "learning_deep-sea-treasure_groups",
        "evaluation_deep-sea-treasure_groups",
        "hypervolume_deep-sea-treasure_groups",
        "agreement_deep-sea-treasure_groups",  # planted groups: the ARI of the clusters per round ...
        "separability_deep-sea-treasure_groups",  # ... and of the similarity matrices
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{s}.{f}" for s in stems for f in ("png", "pdf"))
    for mistyped in ([str(fedpref_run / "nope"), "--out", str(tmp_path)], [str(fedpref_run / "nope")]):
        with pytest.raises(SystemExit) as exit:  # named as such, with or without --out
            main(mistyped)
        assert exit.value.code == 2
        assert capsys.readouterr().err.endswith(f"error: {fedpref_run / 'nope'}: no such file or directory\n")


def test_plot_writes_only_the_kinds_of_figure_asked_for(fedpref_run, tmp_path, capsys):
    out = tmp_path / "some"
    assert main([str(fedpref_run), "--out", str(out), "--formats", "png", "--figures", "learning", "clusters"]) == 0
    assert "wrote 2 files for 1 run to" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [
        "clusters_deep-sea-treasure_fedpref_groups_seed0.png",
        "learning_deep-sea-treasure_groups.png",
    ]
    with pytest.raises(SystemExit) as exit_:  # argparse: one usage line, status 2
        main([str(fedpref_run), "--out", str(tmp_path / "bad"), "--figures", "heatmap"])
    assert exit_.value.code == 2 and "invalid choice: 'heatmap'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_plot_shows_a_run_stopped_after_2_of_4_rounds(fedpref_run, tmp_path, capsys):
    """A stopped run gets its learning curves and cluster evolution, titled and announced as partial.

    The stopped run has no metrics.json; rounds.csv and clusters.jsonl hold the rounds done.
    """
    stopped = tmp_path / "stopped"
    shutil.copytree(fedpref_run, stopped)
    (stopped / "metrics.json").unlink()
    for name in ("rounds.csv", "clusters.jsonl"):
        lines = (stopped / name).read_text().splitlines()
        (stopped / name).write_text("\n".join(lines[: 3 if name == "rounds.csv" else 2]) + "\n")
    partial = load_partial_run(stopped)
    assert (partial.env, partial.label, partial.dist, partial.seed) == ("deep-sea-treasure", "fedpref", "groups", 0)
    assert (partial.rounds_done, partial.rounds_total, partial.status) == (2, 4, "partial run: 2 of 4 rounds")
    figures = partial_figures(partial)
    stem = "deep-sea-treasure_fedpref_groups_seed0"
    assert sorted(figures) == [f"clusters_{stem}", f"evaluation_{stem}", f"hypervolume_{stem}", f"learning_{stem}"]
    assert sorted(partial_figures(partial, kinds=["learning", "front"])) == [f"learning_{stem}"]
    with pytest.raises(ValueError, match=r"unknown figure kind\(s\) heatmap; valid: front, similarity"):
        partial_figures(partial, kinds=["heatmap"])
    curve = figures[f"learning_{stem}"]
    assert curve.get_suptitle() == f"deep-sea-treasure / fedpref / groups / seed 0: {partial.status}"
    np.testing.assert_allclose(curve.axes[0].get_lines()[0].get_ydata(), partial.rounds["mean_train_reward"])
    assert curve.axes[0].get_xlim() == (0.5, 4.5)

    out = tmp_path / "figures"
    assert main([str(stopped), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "partial run: 2 of 4 rounds (no metrics.json yet)" in printed
    assert "wrote 8 files for 0 runs and 1 partial run to" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{s}.{f}" for s in figures for f in ("png", "pdf"))
    (stopped / "rounds.csv").unlink()  # nothing to show before the first round: skipped, said why
    assert main([str(stopped), "--out", str(out)]) == 1
    assert "no metrics.json and no rounds.csv" in capsys.readouterr().err


@pytest.mark.slow
def test_a_stopped_run_beside_a_finished_one_of_the_same_configuration_overwrites_nothing(
    fedpref_run, tmp_path, capsys
):
    """Both runs have the same label, distribution and seed: each figure name gets its run directory's name.

    The count printed is the files on disk.
    """
    runs = tmp_path / "runs"
    finished, stopped = runs / "finished", runs / "stopped"
    shutil.copytree(fedpref_run, finished)
    shutil.copytree(fedpref_run, stopped)
    (stopped / "metrics.json").unlink()
    lines = (stopped / "rounds.csv").read_text().splitlines()
    (stopped / "rounds.csv").write_text("\n".join(lines[:3]) + "\n")
    write_stopped(stopped, StopRecord("SIGINT", 2, 4, "checkpoints/round_2", "..."))
    out = tmp_path / "figures"
    assert main([str(runs), "--out", str(out), "--formats", "png"]) == 0
    printed = capsys.readouterr().out
    assert "partial run: stopped by SIGINT after 2 of 4 rounds (no metrics.json yet)" in printed
    files = sorted(p.name for p in out.iterdir())
    assert f"wrote {len(files)} files for 1 run and 1 partial run" in printed
    stem = "deep-sea-treasure_fedpref_groups_seed0"
    for kind in ("clusters", "learning"):
        assert f"{kind}_{stem}_stopped.png" in files
    assert f"clusters_{stem}_finished.png" in files and f"front_{stem}_finished.png" in files


def test_the_apis_figures_are_titled_and_labelled_as_the_command_lines(fedpref_run):
    result = ExperimentResult.load(fedpref_run)
    title = "deep-sea-treasure / fedpref / groups / seed 0"  # the command line's run_title
    assert result.plot_front().get_suptitle() == f"{title} (discounted returns)"
    curve = result.plot_learning()
    assert curve.get_suptitle() == title and str(fedpref_run) not in curve.get_suptitle()
    assert curve.axes[0].get_ylabel() == "mean scalarised training reward"
    evaluation = result.plot_learning("mean_eval_scalarised", x="env_steps")
    assert evaluation.axes[0].get_ylabel() == "mean scalarised return of the deployed models"
    np.testing.assert_allclose(evaluation.axes[0].get_lines()[0].get_xdata(), [100, 200, 300, 400])


@pytest.mark.filterwarnings("ignore::morlfed.metrics.ReferencePointWarning")  # a round at (0, -100)
def test_the_deployed_models_hypervolume_over_rounds_is_a_curve(fedpref_run):
    """``evaluations.csv`` holds every client's evaluation of each round; its last round is final.csv."""
    evaluations = pd.read_csv(fedpref_run / "evaluations.csv")
    assert sorted(evaluations["round"].unique()) == [1, 2, 3, 4] and len(evaluations) == 16
    final = pd.read_csv(fedpref_run / "final.csv")
    last = evaluations[evaluations["round"] == 4].reset_index(drop=True)
    np.testing.assert_allclose(
        last[["discounted_return_0", "discounted_return_1"]], final[["disc_return_0", "disc_return_1"]]
    )
    curve = ExperimentResult.load(fedpref_run).plot_learning("hypervolume")
    values = curve.axes[0].get_lines()[0].get_ydata()
    spec_ref = [0.0, -25.0]
    expected = [
        hypervolume(
            evaluations.loc[evaluations["round"] == r, ["discounted_return_0", "discounted_return_1"]], spec_ref
        )
        for r in (1, 2, 3, 4)
    ]
    np.testing.assert_allclose(values, expected)
    stored = json.loads((fedpref_run / "metrics.json").read_text())["discounted"]["hypervolume"]
    assert values[-1] == pytest.approx(stored)
