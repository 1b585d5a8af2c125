"""Variant labels and repeated runs on planted run directories.

Runs that differ in a setting get labels that tell them apart (analysis.variants.variant_labels);
settings that change no result (branching from a checkpoint, checkpointing, the executor) make no
variant, so a run repeated with them is a duplicate that analysis.evaluate skips; a recomputed
metric that differs from a run's metrics.json is warned about. The run directories are written by
test_evaluate.py's ``write_run``.
"""

from __future__ import annotations

import json

import pandas as pd
from test_evaluate import write_run

from morlfed.analysis.evaluate import main
from morlfed.analysis.runs import load_runs
from morlfed.analysis.variants import variant_labels
from morlfed.metrics import equally_spaced_weights


def test_variants_duplicates_and_stored_metric_mismatch(tmp_path, dst, capsys):
    spec, front, front_u = dst
    w = equally_spaced_weights(2, 3)
    kw = dict(front=front, front_undisc=front_u)
    for steps in (100, 200):
        write_run(tmp_path / f"s{steps}", spec, w, front[:3], front_u[:3], local_steps=steps, **kw)
    write_run(tmp_path / "s200copy", spec, w, front[:3], front_u[:3], local_steps=200, **kw)
    runs, _ = load_runs([tmp_path])
    assert variant_labels(runs) == [
        "fedpref (local_steps=100)",
        "fedpref (local_steps=200)",
        "fedpref (local_steps=200)",
    ]
    info = json.loads((tmp_path / "s100" / "metrics.json").read_text())
    info["discounted"]["hypervolume"] += 1.0
    (tmp_path / "s100" / "metrics.json").write_text(json.dumps(info))
    assert main([str(tmp_path)]) == 0  # one directory: the output goes there
    err = capsys.readouterr().err
    assert f"skipped {tmp_path / 's200copy'}: duplicate: same configuration and seed as {tmp_path / 's200'}" in err
    assert f"warning: {tmp_path / 's100'}: recomputed discounted hypervolume" in err
    md = (tmp_path / "comparison.md").read_text()
    assert "| fedpref (local_steps=100) |" in md and "| fedpref (local_steps=200) |" in md
    assert len(pd.read_csv(tmp_path / "summary.csv")) == 2


def test_a_branched_run_is_the_same_variant_as_one_from_scratch(tmp_path, dst, capsys):
    """branch_from= never makes a variant: a branched +FT run and the same run from scratch are duplicates.

    Like resume=, checkpoint_every and the executor, branch_from= is no part of a variant: a +FT run
    branched from a checkpoint and the same +FT run from scratch are duplicates.
    """
    spec, front, front_u = dst
    w = equally_spaced_weights(2, 3)
    kw = dict(front=front, front_undisc=front_u, finetune=True)
    write_run(
        tmp_path / "branched",
        spec,
        w,
        front[:3],
        front_u[:3],
        extra={"branch_from": "/runs/plain", "checkpoint_every": 2},
        **kw,
    )
    write_run(
        tmp_path / "scratch", spec, w, front[:3], front_u[:3], extra={"branch_from": None, "checkpoint_every": 0}, **kw
    )
    write_run(tmp_path / "seed1", spec, w, front[:3], front_u[:3], seed=1, extra={"branch_from": "/runs/plain1"}, **kw)
    runs, _ = load_runs([tmp_path])
    assert variant_labels(runs) == ["fedpref+FT"] * 3
    assert main([str(tmp_path)]) == 0
    assert (
        f"skipped {tmp_path / 'scratch'}: duplicate: same configuration and seed as {tmp_path / 'branched'}"
        in capsys.readouterr().err
    )


def test_strategies_on_different_budgets_are_labelled_with_them(tmp_path, dst):
    """Two strategies of one table on different budgets: never two bare names side by side."""
    spec, front, front_u = dst
    w = equally_spaced_weights(2, 3)
    kw = dict(front=front, front_undisc=front_u)
    write_run(tmp_path / "a", spec, w, front[:3], front_u[:3], algo="fedpref", local_steps=100, **kw)
    write_run(tmp_path / "b", spec, w, front[:3], front_u[:3], algo="fedavg", local_steps=300, **kw)
    write_run(tmp_path / "c", spec, w, front[:3], front_u[:3], algo="fedavg", local_steps=300, dist="dirichlet", **kw)
    runs, _ = load_runs([tmp_path])
    assert variant_labels(runs) == ["fedpref (local_steps=100)", "fedavg (local_steps=300)", "fedavg (local_steps=300)"]
    same, _ = load_runs([tmp_path / "b", tmp_path / "c"])  # one budget: the names alone
    assert variant_labels(same) == ["fedavg", "fedavg"]
