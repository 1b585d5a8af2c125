"""Statistical agreement of the two RL engines: the same default run, several seeds, each engine.

Runs ``python -m morlfed.run env=<env> engine=<engine> seed=<s>`` (the env's default budget,
FedPref, equidistant preferences) for every engine and seed, then writes

* ``<out>/runs.csv``: one row per run: engine, seed, mean scalarised reward, known-front points
  reached, zero-regret clients, hypervolume (undiscounted returns), env steps per client, wall time,
  and the commit of the code that ran it (the working directory's ``git rev-parse --short HEAD``);
  rows of engines not run this time are kept from the existing ``runs.csv``, so one engine can be
  re-measured after a change to it alone;
* ``<out>/agreement.md``: the engines side by side (mean ± std over seeds) and a two-sided
  Mann-Whitney U test per metric (the seeds of the two engines are independent samples: the
  engines draw their exploration and replay samples from different streams).

Usage::

    python bench/engine_agreement.py --seeds 0 1 2 3 4 --out docs/results/engine-agreement
    python bench/engine_agreement.py --engines vectorised --out docs/results/engine-agreement  # re-measure one
    python bench/engine_agreement.py --env minecart --overrides rounds=10 local_steps=2500 \
        --out docs/results/engine-agreement-minecart          # another env, at a stated budget
    python bench/engine_agreement.py --report-only --out docs/results/engine-agreement

A run directory that already holds ``metrics.json`` is not run again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from scipy.stats import mannwhitneyu

from morlfed.rundir import atomic_write_text

METRICS = {
    "mean_scalarised": "mean scalarised reward ↑",
    "front_points_reached": "known-front points reached ↑",
    "zero_regret_clients": "zero-regret clients ↑",
    "hypervolume": "hypervolume ↑",
}


def run_one(env: str, engine: str, seed: int, runs: Path, executor: str, overrides: list[str]) -> Path:
    """Run (or reuse) one default run, with the budget ``overrides`` if any; return its directory."""
    path = runs / f"{env}_{engine}_seed{seed}"
    if not (path / "metrics.json").exists():
        args = [f"env={env}", f"engine={engine}", f"seed={seed}", f"executor={executor}", *overrides]
        args += ["progress=false", f"hydra.run.dir={path}"]
        subprocess.run([sys.executable, "-m", "morlfed.run", *args], check=True, stdout=subprocess.DEVNULL)
    return path


def current_commit() -> str:
    """The short commit hash of the working directory's checkout (the code ``morlfed.run`` runs)."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def row(path: Path, engine: str, commit: str) -> dict[str, object]:
    """One ``runs.csv`` row from a run directory."""
    metrics = json.loads((path / "metrics.json").read_text())
    final = pd.read_csv(path / "final.csv")
    und = metrics["undiscounted"]
    out: dict[str, object] = {"engine": engine, "seed": metrics["seed"]}
    out |= {key: und[key] for key in METRICS}
    if "env_steps" in final:
        out["env_steps_per_client"] = float(final["env_steps"].mean())
    out["wall_time_s"] = metrics["wall_time_s"]
    out["commit"] = commit
    return out


def report(table: pd.DataFrame, env: str, overrides: list[str]) -> str:
    """The side-by-side markdown table with a Mann-Whitney U test per metric."""
    engines = sorted(table.engine.unique())
    budget = " ".join(overrides) if overrides else "the env spec's budget"
    lines = [
        f"# Engine agreement on {env} (default run: FedPref, equidistant preferences, {budget})",
        "",
        "Undiscounted returns; mean ± std over seeds (n per engine in the header). p: two-sided",
        "Mann-Whitney U test of the two engines' seeds; p >= 0.05 means no detectable difference",
        "at that sample size (not proof of equality).",
        "",
        "| metric | " + " | ".join(f"{e} (n={int((table.engine == e).sum())})" for e in engines) + " | p |",
        "|---|" + "---|" * len(engines) + "---|",
    ]
    for key, title in METRICS.items():
        groups = [table.loc[table.engine == e, key].astype(float) for e in engines]
        cells = [f"{g.mean():.3g} ± {g.std(ddof=1):.2g}" for g in groups]
        p = mannwhitneyu(*groups, alternative="two-sided").pvalue if len(engines) == 2 else float("nan")
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {p:.2f} |")
    for key, title in (("env_steps_per_client", "env steps per client"), ("wall_time_s", "wall time (s)")):
        if key in table:
            groups = [table.loc[table.engine == e, key].astype(float) for e in engines]
            cells = [f"{g.mean():.0f}" if g.notna().all() else "not recorded" for g in groups]
            lines.append(f"| {title} | " + " | ".join(cells) + " | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the study (or only rebuild its report) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="deep-sea-treasure")
    parser.add_argument("--engines", nargs="+", default=["sb3", "vectorised"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--executor", default="process", help="sequential | process (default)")
    parser.add_argument("--runs", type=Path, default=Path("multirun/engine-agreement"), help="run directories")
    parser.add_argument("--out", type=Path, default=Path("docs/results/engine-agreement"))
    parser.add_argument("--report-only", action="store_true", help="only rebuild agreement.md from runs.csv")
    parser.add_argument(
        "--overrides", nargs="*", default=[], metavar="KEY=VALUE", help="budget overrides of every run (rounds=10 ...)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        table = pd.read_csv(args.out / "runs.csv")
    else:
        commit = current_commit()
        rows = [
            row(run_one(args.env, engine, seed, args.runs, args.executor, args.overrides), engine, commit)
            for seed in args.seeds
            for engine in args.engines
        ]
        table = pd.DataFrame(rows)
        existing = args.out / "runs.csv"
        if existing.exists():
            kept = pd.read_csv(existing)
            table = pd.concat([kept[~kept.engine.isin(args.engines)], table], ignore_index=True)
        atomic_write_text(args.out / "runs.csv", table.to_csv(index=False))
    text = report(table, args.env, args.overrides)
    atomic_write_text(args.out / "agreement.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
