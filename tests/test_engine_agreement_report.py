"""The engine-agreement study's report (``bench/engine_agreement.py``).

Pairing by seed, the verdict on the tested outcome only, and curves that survive their run
directories.
"""

from __future__ import annotations

import fcntl
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
from conftest import load_bench

from morlfed import envs

BENCH = Path(__file__).resolve().parents[1] / "bench" / "engine_agreement.py"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    return load_bench("engine_agreement")


def _runs(sb3: list[float], vec: list[float], seeds: list[int] | None = None) -> pd.DataFrame:
    seeds = seeds or list(range(len(sb3)))
    rows = []
    for arm, values, arm_seeds in (("sb3", sb3, list(range(len(sb3)))), ("vectorised", vec, seeds)):
        for seed, value in zip(arm_seeds, values):
            rows.append(
                {"env": "deep-sea-treasure", "algo": "local", "seed": seed, "engine": arm, "budget": "reduced"}
                | {"mean_scalarised": value, "hypervolume": 10 * value}
            )
    return pd.DataFrame(rows)


def test_paired_differences_inside_the_margin_are_equivalent(study: ModuleType) -> None:
    rng = np.random.default_rng(0)
    sb3 = list(rng.normal(5.0, 2.0, 30))
    vec = [v + d for v, d in zip(sb3, rng.normal(0.0, 0.1, 30))]  # paired, tiny differences
    table = study.agreement(_runs(sb3, vec))
    tested = table[table.outcome == "mean scalarised return"].iloc[0]
    assert tested.n == 30 and tested.verdict == "equivalent"
    # the hypervolume is reported beside it, never tested
    assert table[table.outcome == "hypervolume"].iloc[0].verdict == "reported, not tested"


def test_the_strict_interval_holds_the_verdicts_interval(study: ModuleType) -> None:
    rng = np.random.default_rng(3)
    sb3 = list(rng.normal(5.0, 2.0, 30))
    vec = [v + d for v, d in zip(sb3, rng.normal(0.2, 1.0, 30))]
    table = study.agreement(_runs(sb3, vec))
    row = table[table.outcome == "mean scalarised return"].iloc[0]

    def bounds(text: str) -> tuple[float, float]:
        low, high = text.strip("[]").split(", ")
        return float(low), float(high)

    (low90, high90), (low95, high95) = bounds(row["90% CI"]), bounds(row["95% CI"])
    assert low95 < low90 < high90 < high95
    # both centre on the mean paired difference
    assert (low95 + high95) / 2 == pytest.approx((low90 + high90) / 2, abs=0.01)


@pytest.mark.parametrize("n, expected", [(29, "pending (n < 30)"), (36, "interim (next look at n = 60)")])
def test_only_the_planned_looks_get_a_verdict(study: ModuleType, n: int, expected: str) -> None:
    assert study.LOOKS == (30, 60)
    rng = np.random.default_rng(2)
    sb3 = list(rng.normal(5.0, 2.0, n))
    table = study.agreement(_runs(sb3, list(sb3)))  # identical: equivalent, were it read here
    assert table[table.outcome == "mean scalarised return"].iloc[0].verdict == expected


@pytest.mark.parametrize("n", [30, 60, 64])
def test_a_shift_beyond_the_margin_is_different_and_unpaired_seeds_are_dropped(study: ModuleType, n: int) -> None:
    rng = np.random.default_rng(1)
    sb3 = list(rng.normal(5.0, 2.0, n))
    vec = [v + 3.0 + d for v, d in zip(sb3, rng.normal(0.0, 0.1, n))]  # margin = 0.5 x ~2 = ~1
    # the candidate also ran 5 more seeds, which sb3 did not: they pair with nothing
    table = study.agreement(_runs(sb3, vec + [0.0] * 5, list(range(n + 5))))
    tested = table[table.outcome == "mean scalarised return"].iloc[0]
    assert tested.n == n and tested.verdict == "different"


def test_curves_of_runs_whose_directories_are_gone_are_kept(study: ModuleType, tmp_path: Path) -> None:
    keys = {"env": "minecart", "budget": "reduced", "algo": "local", "engine": "sb3"}
    old = pd.DataFrame(
        [
            keys | {"seed": s, "round": r, "env_steps_per_client": r * 10.0, "mean_eval_scalarised": s + r}
            for s in (0, 1)
            for r in (1, 2)
        ]
    )
    committed = tmp_path / "curves.csv"
    old.to_csv(committed, index=False)
    # seed 1 was run again (its directory exists), seed 2 is new; seed 0's directory is gone
    fresh = pd.DataFrame(
        [
            keys | {"seed": s, "round": r, "env_steps_per_client": r * 10.0, "mean_eval_scalarised": -1.0}
            for s in (1, 2)
            for r in (1, 2)
        ]
    )
    merged = study.merged_curves(fresh, committed)
    assert sorted(set(merged.seed)) == [0, 1, 2] and len(merged) == 6
    assert (merged[merged.seed == 0].mean_eval_scalarised == [1.0, 2.0]).all()  # kept from curves.csv
    assert (merged[merged.seed == 1].mean_eval_scalarised == -1.0).all()  # the run directory wins


def test_a_row_waits_for_another_study_that_is_writing(study: ModuleType, tmp_path: Path) -> None:
    # two studies in one checkout (say minecart and mo-lunar-lander) append to one runs.csv: while
    # one holds the file (read, append, write), the other's row waits, then lands next to it
    runs_csv = tmp_path / "runs.csv"
    study.append_row(runs_csv, {"env": "minecart", "seed": 0})
    code = (
        "import importlib.util; from pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('engine_agreement', {str(BENCH)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"m.append_row(Path({str(runs_csv)!r}), {{'env': 'mo-lunar-lander', 'seed': 0}})\n"
    )
    with open(study.lock_path(runs_csv), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        other = subprocess.Popen([sys.executable, "-c", code])
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=5)  # it waits on the lock (importing the study takes ~2 s)
        assert len(pd.read_csv(runs_csv)) == 1
        # this study's own row, written while it holds the file
        table = pd.concat([pd.read_csv(runs_csv), pd.DataFrame([{"env": "minecart", "seed": 1}])])
        table.to_csv(runs_csv, index=False)
    assert other.wait(timeout=60) == 0
    table = pd.read_csv(runs_csv)
    assert list(zip(table.env, table.seed)) == [("minecart", 0), ("minecart", 1), ("mo-lunar-lander", 0)]


def _validated(study: ModuleType, candidate: str) -> dict[str, dict[str, str]]:
    """Per env, the committed reduced-budget verdicts of ``candidate`` against sb3 by algo."""
    table = study.agreement(pd.read_csv(BENCH.parents[1] / "docs" / "results" / "engine-agreement" / "runs.csv"))
    tested = table[(table.budget == "reduced") & (table.candidate == candidate)]
    tested = tested[tested.outcome == study.OUTCOMES["mean_scalarised"]]
    return {name: dict(zip(rows.algo, rows.verdict)) for name, rows in tested.groupby("env")}


def _both_equivalent(verdicts: dict[str, str]) -> bool:
    return verdicts.get("local") == "equivalent" and verdicts.get("fedpref") == "equivalent"


def test_a_spec_says_vectorised_only_where_the_committed_study_found_equivalence(study: ModuleType) -> None:
    # the rule: an env spec's engine follows the committed verdicts, both ways (a spec may
    # not say vectorised without them, nor stay sb3 once both reduced-budget rows are equivalent)
    verdicts = _validated(study, "vectorised")
    assert any(_both_equivalent(v) for v in verdicts.values())  # the committed table has verdicts to follow
    for name in envs.available():
        v = verdicts.get(name, {})
        assert (envs.get_spec(name).engine == "vectorised") == _both_equivalent(v), (name, v)


def test_a_spec_says_bf16_only_where_the_committed_study_found_the_bf16_arm_equivalent(study: ModuleType) -> None:
    # the same rule for precision=auto: bf16 becomes an env's default once both reduced-budget rows
    # of the vectorised-bf16 arm are equivalent to sb3, never before
    verdicts = _validated(study, "vectorised-bf16")
    for name in envs.available():
        v = verdicts.get(name, {})
        assert (envs.get_spec(name).precision == "bf16") == _both_equivalent(v), (name, v)


def test_a_row_names_the_commit_its_run_records(study: ModuleType) -> None:
    """A reused run keeps its own commit, not the checkout's that extends the study."""
    code = {"morlfed": "0.1.0", "commit": "abc1234", "modified": False}
    assert study.run_commit({"code": code}, "fff0000") == "abc1234"
    assert study.run_commit({"code": code | {"modified": True}}, "fff0000") == "abc1234+modified"
    # runs written before metrics.json recorded its code, or outside a checkout: the study's commit
    assert study.run_commit({}, "fff0000") == "fff0000"
    assert study.run_commit({"code": code | {"commit": None, "modified": None}}, "fff0000") == "fff0000"


def test_an_unfinished_run_with_other_overrides_is_refused(study: ModuleType, tmp_path: Path) -> None:
    """The study continues an unfinished run only when it is the run the study would start there."""
    path = tmp_path / "local" / "vectorised_seed0"
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("- env=deep-sea-treasure\n- algo=fedavg\n- seed=0\n")
    with pytest.raises(RuntimeError, match="an unfinished run with other overrides"):
        study.run_one(path, "deep-sea-treasure", "reduced", "local", "vectorised", 0)
    assert not (path / "metrics.json").exists()


@pytest.mark.slow
def test_a_stopped_run_is_continued_and_ends_as_an_uninterrupted_one(
    study: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped by SIGTERM (a working session's end) is resumed in place by the study.

    It is not refused or started over, and its final table is the uninterrupted run's.
    """
    tiny = ["n_clients=2", "rounds=3", "local_steps=3000"]
    monkeypatch.setitem(study.BUDGETS, "deep-sea-treasure", {"reduced": tiny})
    key = ("deep-sea-treasure", "reduced", "local", "vectorised", 0)
    whole = study.run_one(tmp_path / "whole", *key)
    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(study.run_command(stopped, *key), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (stopped / "checkpoints" / "round_1" / "manifest.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its round-1 checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert (stopped / "stopped.json").exists() and not (stopped / "metrics.json").exists()
    study.run_one(stopped, *key)
    assert (stopped / "metrics.json").exists() and not (stopped / "stopped.json").exists()
    pd.testing.assert_frame_equal(pd.read_csv(stopped / "final.csv"), pd.read_csv(whole / "final.csv"))
