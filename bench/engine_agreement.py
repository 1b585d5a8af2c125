"""Do the two RL engines agree? Paired runs of the engines and an equivalence test (TOST).

The runs pair ``engine=sb3`` with ``engine=vectorised`` (and ``precision=bf16``), and the test's
margin is fixed in advance.

For every (env, budget, algo, seed) the study runs ``python -m morlfed.run`` once per arm (``ARMS``:
sb3, the reference; vectorised; vectorised in bfloat16) with the same overrides, so the runs of a
pair share the seed, hence the preferences, the initial network and every env seed; only the
engines' own random streams (exploration, replay sampling) differ. The outcome of a run is the mean
scalarised undiscounted return of its deployed models (``metrics.json``), with the hypervolume
beside it.

The rule, fixed before any run was looked at (docs/results/engine-agreement/README.md):

* margin = 0.5 x the standard deviation over seeds of the sb3 runs' outcome at that budget;
* the engines are *equivalent* when the 90% confidence interval of the mean paired difference
  (vectorised - sb3) lies inside +- margin (TOST at 0.05, :mod:`morlfed.analysis.equivalence`);
* the ``reduced`` budget (``BUDGETS``: far past the exploration phase, a fraction of the default
  run's cost) is tested with every seed given; the ``full`` budget (the env spec's default run)
  is reported on a few seeds, not tested.

Every run evaluates its deployed models every few rounds (``eval_every``): ``learning.png``
draws both engines' learning curves (mean +- std over seeds) per env, budget and algo.

Usage::

    python bench/engine_agreement.py --env deep-sea-treasure --budget reduced --seeds 0-29 --jobs 2
    python bench/engine_agreement.py --env deep-sea-treasure --budget full --seeds 0-2
    python bench/engine_agreement.py --env mo-lunar-lander --arms sb3 vectorised vectorised-bf16 --seeds 0-29
    python bench/engine_agreement.py --report-only        # rebuild agreement.md and learning.png

Each run directory (``--runs``) that already holds ``metrics.json`` is reused, and one that a run
left unfinished (stopped by a signal or killed) is continued with ``resume=`` from its latest
checkpoint, so a study can be extended seed by seed and across working sessions; ``runs.csv`` keeps
one row per run with the commit that produced it (the one its ``metrics.json`` records under
``code``; the study's checkout for a run older than that). Runs use one torch thread, the sequential
executor and the CPU (``device=cpu``, also on a machine with a GPU), so that every run of an engine
computes the same bits on any machine with the same core type.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from morlfed.analysis.equivalence import Equivalence, paired_equivalence, standardised_margin
from morlfed.core.provenance import code_version
from morlfed.storage.rundir import atomic_write_text

#: The arms of the study: the reference (sb3) and each candidate, by the overrides that select it.
ARMS: dict[str, list[str]] = {
    "sb3": ["engine=sb3"],
    "vectorised": ["engine=vectorised", "precision=fp32"],  # fp32 also where a spec's precision=auto would say bf16
    "vectorised-bf16": ["engine=vectorised", "precision=bf16"],
}
REFERENCE = "sb3"
#: The budgets of the study per env: ``reduced`` (tested) and ``full`` (the spec's default run,
#: reported). A reduced budget keeps the spec's learning settings and ends far past the exploration
#: phase (epsilon's decay covers ``exploration_fraction`` of the client's budget). It has 5 clients:
#: a run's outcome is a mean over its clients, so its seed-to-seed spread, hence the margin, and
#: the paired differences' spread all shrink alike with more clients, and a verdict needs about as
#: many seeds either way. Fewer clients make each run cheaper; the margin, in the outcome's units,
#: widens as 1 / sqrt(clients), so the claim is looser. 5 clients keep a federation for FedPref.
BUDGETS: dict[str, dict[str, list[str]]] = {
    "deep-sea-treasure": {
        "reduced": ["n_clients=5", "rounds=20", "local_steps=1000", "eval_every=4"],
        "full": ["eval_every=4"],
    },
    "minecart": {
        "reduced": ["n_clients=5", "rounds=10", "local_steps=5000", "eval_every=2"],
        "full": ["eval_every=10"],
    },
    "mo-lunar-lander": {
        "reduced": ["n_clients=5", "rounds=5", "local_steps=5000", "eval_every=1"],
        "full": ["eval_every=4"],
    },
    # DDPG: no exploration schedule, but learning_starts random steps (10 000 in both specs) before
    # the first gradient step; the reduced budget trains 10 000 gradient steps per client past them
    "mo-lunar-lander-continuous": {
        "reduced": ["n_clients=5", "rounds=4", "local_steps=5000", "eval_every=1"],
        "full": ["eval_every=5"],
    },
    "mo-halfcheetah": {
        "reduced": ["n_clients=5", "rounds=4", "local_steps=5000", "eval_every=1"],
        "full": ["eval_every=10"],
    },
}
#: The margin's fraction of the sb3 runs' seed-to-seed standard deviation.
MARGIN_FRACTION = 0.5
#: The planned looks: the paired seeds at which a tested row gets its verdict. A study reads its
#: verdict at 30 pairs; one that is inconclusive there is extended to 60 and read once more. Rows
#: with fewer than 30 pairs are pending, rows between two looks are interim: reading a verdict at
#: every new seed would test again and again until a chance "equivalent" came up.
LOOKS = (30, 60)
#: The level of each one-sided test at the 95% interval: two looks at 0.025 hold 0.05 in all
#: (Bonferroni), which a study extended after an inconclusive first look needs
STRICT_ALPHA = 0.025
#: The outcomes per run: (metrics.json key under ``undiscounted``, label); the first is tested.
OUTCOMES = {"mean_scalarised": "mean scalarised return", "hypervolume": "hypervolume"}


def parse_seeds(items: list[str]) -> list[int]:
    """Seeds given as numbers or ranges (``0-29``)."""
    seeds: list[int] = []
    for item in items:
        first, _, last = item.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def run_dir(runs: Path, env: str, budget: str, algo: str, engine: str, seed: int) -> Path:
    """Where one run of the study lives."""
    return runs / env / budget / algo / f"{engine}_seed{seed}"


def run_command(path: Path, env: str, budget: str, algo: str, engine: str, seed: int) -> list[str]:
    """The command line of one run of the study, writing to ``path``."""
    return [
        sys.executable,
        "-m",
        "morlfed.run",
        *run_overrides(env, budget, algo, engine, seed),
        f"hydra.run.dir={path}",
    ]


def run_overrides(env: str, budget: str, algo: str, engine: str, seed: int) -> list[str]:
    """The hydra overrides of one run of the study (its output directory aside)."""
    args = [f"env={env}", f"algo={algo}", *ARMS[engine], f"seed={seed}", *BUDGETS[env][budget]]
    # device=cpu: the study validates the CPU engines, also where a GPU would be the default
    return [*args, "executor=sequential", "torch_threads=1", "device=cpu", "progress=false"]


def run_one(path: Path, env: str, budget: str, algo: str, engine: str, seed: int) -> Path:
    """Run, continue or reuse one run of the study; return its directory.

    A directory holding ``metrics.json`` is reused. One that a run left unfinished (stopped by a
    signal, as at the end of a working session, or killed) is continued in place with ``resume=``
    from its latest checkpoint, which computes exactly what an uninterrupted run does
    (docs/scale.md), so a long study goes on where it stopped; its saved overrides must be the ones
    this run of the study would be given.
    """
    if (path / "metrics.json").exists():
        return path
    saved = path / ".hydra" / "overrides.yaml"
    if saved.is_file():
        overrides = [o for o in yaml.safe_load(saved.read_text()) if not o.startswith("resume=")]
        expected = run_overrides(env, budget, algo, engine, seed)
        if overrides != expected:
            raise RuntimeError(
                f"{path}: an unfinished run with other overrides ({' '.join(overrides)}) than this study's "
                f"({' '.join(expected)}); move it away or give another --runs"
            )
        command = [sys.executable, "-m", "morlfed.run", f"resume={path}"]
    else:
        command = run_command(path, env, budget, algo, engine, seed)
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{path}: morlfed.run exited with {done.returncode}:\n{done.stderr[-2000:]}")
    return path


def current_commit() -> str:
    """The short commit hash of the checkout that runs the study.

    It is :func:`morlfed.core.provenance.code_version`, the record its new runs keep; a study outside a
    git checkout is refused.
    """
    commit = code_version()["commit"]
    if commit is None:
        raise SystemExit("bench/engine_agreement.py: run it from a git checkout, so that every row names its commit")
    return str(commit)


def run_commit(metrics: dict[str, object], fallback: str) -> str:
    """The commit that produced a run, as its ``metrics.json`` records it.

    ``+modified`` when tracked files differed from it; ``fallback`` for a run written before runs
    recorded their code.
    """
    code = metrics.get("code")
    if not isinstance(code, dict) or not code.get("commit"):
        return fallback
    return str(code["commit"]) + ("+modified" if code.get("modified") else "")


def row(path: Path, budget: str, arm: str, commit: str) -> dict[str, object]:
    """One ``runs.csv`` row from a finished run directory.

    A run in which a client fit failed is no sample of either engine's training and stops the study.
    ``commit``: the study's checkout, recorded for a run whose ``metrics.json`` does not name its
    own (:func:`run_commit`).
    """
    failed = pd.read_csv(path / "rounds.csv")["failed"].dropna()
    if not failed.empty:
        raise RuntimeError(f"{path}: client fits failed in round(s) {failed.index.tolist()}: {failed.iloc[0]}")
    metrics = json.loads((path / "metrics.json").read_text())
    out: dict[str, object] = {key: metrics[key] for key in ("env", "algo", "seed")}
    out |= {"engine": arm, "budget": budget}
    out |= {key: metrics["undiscounted"][key] for key in OUTCOMES}
    out["rounds"] = metrics["rounds"]
    out["env_steps_per_client"] = metrics["env_steps_per_client"]["mean"]
    out["wall_time_s"] = metrics["wall_time_s"]
    out["commit"] = run_commit(metrics, commit)
    return out


def lock_path(path: Path) -> Path:
    """The lock file that guards ``runs.csv`` at ``path`` (one per resolved path)."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"morlfed-engine-agreement-{digest}.lock"


def append_row(path: Path, new: dict[str, object]) -> None:
    """Add one row to ``runs.csv``.

    The file is re-read and rewritten under an exclusive lock, so that several studies started in
    one checkout (other envs, other arms) never drop each other's rows.
    """
    with open(lock_path(path), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        table = pd.read_csv(path) if path.exists() else pd.DataFrame()
        table = pd.concat([table, pd.DataFrame([new])], ignore_index=True)
        atomic_write_text(path, table.to_csv(index=False))


def curves(runs: Path, table: pd.DataFrame) -> pd.DataFrame:
    """The learning curves of the runs in ``table``: ``mean_eval_scalarised`` per evaluated round."""
    frames = []
    for r in table.to_dict("records"):
        path = run_dir(runs, str(r["env"]), str(r["budget"]), str(r["algo"]), str(r["engine"]), int(r["seed"]))
        rounds_csv = path / "rounds.csv"
        if not rounds_csv.exists():
            continue
        rounds = pd.read_csv(rounds_csv)
        if "mean_eval_scalarised" not in rounds:
            continue
        rounds = rounds.dropna(subset=["mean_eval_scalarised"])
        steps = float(r["env_steps_per_client"]) / int(r["rounds"])
        frames.append(
            pd.DataFrame(
                {
                    "env": r["env"],
                    "budget": r["budget"],
                    "algo": r["algo"],
                    "engine": r["engine"],
                    "seed": r["seed"],
                    "round": rounds["round"],
                    "env_steps_per_client": rounds["round"] * steps,
                    "mean_eval_scalarised": rounds["mean_eval_scalarised"],
                }
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def merged_curves(fresh: pd.DataFrame, committed: Path) -> pd.DataFrame:
    """The curves read from run directories, plus the committed ``curves.csv`` rows of runs now gone.

    The committed rows kept are those of every run whose directory is gone: run directories are not
    committed, so a study grown in a later session keeps the curves of its earlier seeds.
    """
    if not committed.exists():
        return fresh
    old = pd.read_csv(committed)
    if fresh.empty or old.empty:
        return fresh if old.empty else old
    keys = ["env", "budget", "algo", "engine", "seed"]
    seen = set(fresh[keys].itertuples(index=False, name=None))
    kept = old[[key not in seen for key in old[keys].itertuples(index=False, name=None)]]
    return pd.concat([kept, fresh], ignore_index=True).sort_values([*keys, "round"], ignore_index=True)


def agreement(table: pd.DataFrame) -> pd.DataFrame:
    """The equivalence results: one row per (env, budget, algo, candidate arm, outcome).

    Each row holds the reference's and the candidate's means, the margin, the interval and the
    verdict over the seeds that both arms ran.
    """
    out = []
    for env, budget, algo, arm in sorted(
        set(table[["env", "budget", "algo", "engine"]].itertuples(index=False, name=None))
    ):
        if arm == REFERENCE:
            continue
        both = table[(table.env == env) & (table.budget == budget) & (table.algo == algo)]
        both = both[both.engine.isin([REFERENCE, arm])]
        paired = both.pivot_table(index="seed", columns="engine", values=list(OUTCOMES)).dropna()
        for key, label in OUTCOMES.items():
            if (key, REFERENCE) not in paired or (key, arm) not in paired or len(paired) < 2:
                continue
            sb3, vec = paired[(key, REFERENCE)].to_numpy(), paired[(key, arm)].to_numpy()
            margin = standardised_margin(sb3, MARGIN_FRACTION)
            result = paired_equivalence(sb3, vec, margin) if margin > 0 else None
            # the interval a study extended once (30, then 60 pairs) must pass for 0.05 over both looks
            strict = paired_equivalence(sb3, vec, margin, alpha=STRICT_ALPHA) if margin > 0 else None
            tested = budget == "reduced" and key == next(iter(OUTCOMES))
            out.append(
                {
                    "env": env,
                    "budget": budget,
                    "algo": algo,
                    "candidate": arm,
                    "outcome": label,
                    "n": len(paired),
                    "sb3": f"{sb3.mean():.3g} ± {sb3.std(ddof=1):.2g}",
                    "candidate's": f"{vec.mean():.3g} ± {vec.std(ddof=1):.2g}",
                    "margin": f"{margin:.3g}",
                    "difference": f"{vec.mean() - sb3.mean():+.3g}",
                    "90% CI": "-" if result is None else f"[{result.low:+.3g}, {result.high:+.3g}]",
                    "95% CI": "-" if strict is None else f"[{strict.low:+.3g}, {strict.high:+.3g}]",
                    "verdict": verdict(result, len(paired)) if tested else "reported, not tested",
                }
            )
    return pd.DataFrame(out)


def verdict(result: Equivalence | None, n: int) -> str:
    """The tested row's verdict at a planned look (:data:`LOOKS`, or past the last).

    Before the first look ``pending``, between two looks ``interim`` (a study still growing).
    """
    if n < LOOKS[0]:
        return f"pending (n < {LOOKS[0]})"
    if n not in LOOKS and n < LOOKS[-1]:
        return f"interim (next look at n = {min(look for look in LOOKS if look > n)})"
    return "-" if result is None else result.verdict


def markdown(frame: pd.DataFrame) -> str:
    """A data frame as a markdown table."""
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in values) + " |" for values in frame.itertuples(index=False)]
    return "\n".join(lines)


def figure(curve: pd.DataFrame, path: Path) -> None:
    """Both engines' learning curves (mean ± std over seeds), one panel per (env, budget, algo)."""
    keys = curve[["env", "budget", "algo"]].drop_duplicates()
    panels: list[tuple[str, str, str]] = sorted(keys.itertuples(index=False, name=None))
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (env, budget, algo) in zip(axes.flat, panels):
        panel = curve[(curve.env == env) & (curve.budget == budget) & (curve.algo == algo)]
        for engine, colour in zip(ARMS, ("tab:blue", "tab:orange", "tab:green")):
            stats = panel[panel.engine == engine].groupby("env_steps_per_client")["mean_eval_scalarised"]
            mean, std, count = stats.mean(), stats.std(ddof=1).fillna(0.0), stats.count()
            if mean.empty:
                continue
            ax.plot(mean.index, mean.to_numpy(), color=colour, label=f"{engine} (n={int(count.max())})")
            ax.fill_between(mean.index, (mean - std).to_numpy(), (mean + std).to_numpy(), color=colour, alpha=0.2)
        ax.set_title(f"{env}, {algo}, {budget} budget", fontsize=9)
        ax.set_xlabel("env steps per client")
        ax.set_ylabel("mean scalarised return")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(out: Path, runs: Path) -> str:
    """Rebuild ``agreement.md`` and ``learning.png`` from ``runs.csv``; return the markdown.

    For the curves it also reads the run directories' ``rounds.csv``.
    """
    table = pd.read_csv(out / "runs.csv")
    result = agreement(table)
    text = [
        "# Engine agreement: sb3 against vectorised, paired seeds",
        "",
        f"Generated by `python bench/engine_agreement.py --report-only` from `runs.csv`. Margin: {MARGIN_FRACTION}",
        "x the sb3 runs' standard deviation over seeds; 90% CI: Student's t interval of the mean",
        "paired difference (vectorised - sb3); equivalent: the CI lies inside +- margin (TOST at 0.05).",
        "Undiscounted returns. Only the reduced budget's mean scalarised return is tested, at the",
        f"planned looks: n = {' and '.join(map(str, LOOKS))} pairs (the second only after an inconclusive first; a row",
        f"with fewer than {LOOKS[0]} is pending, one between two looks interim: its study is still growing). 95% CI:",
        "the interval a row must lie inside (+- margin) for 0.05 over two looks, where a study was extended",
        "after an inconclusive first look (the verdict column reads the 90% interval, the rule as fixed).",
        "",
        markdown(result) if not result.empty else "(no paired runs yet)",
        "",
    ]
    curve = merged_curves(curves(runs, table), out / "curves.csv")
    if not curve.empty:
        atomic_write_text(out / "curves.csv", curve.to_csv(index=False))
        figure(curve, out / "learning.png")
        text += ["![learning curves](learning.png)", ""]
    markdown_text = "\n".join(text)
    atomic_write_text(out / "agreement.md", markdown_text)
    return markdown_text


def main(argv: list[str] | None = None) -> int:
    """Run the study's runs (or only rebuild its report) and print the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=sorted(BUDGETS), default="deep-sea-treasure")
    parser.add_argument("--budget", choices=("reduced", "full"), default="reduced")
    parser.add_argument("--algos", nargs="+", default=["local", "fedpref"])
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["sb3", "vectorised"])
    parser.add_argument("--seeds", nargs="+", default=["0-29"], help="seeds or ranges (default: 0-29)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one core each)")
    parser.add_argument("--runs", type=Path, default=Path("multirun/engine-agreement"), help="run directories")
    parser.add_argument("--out", type=Path, default=Path("docs/results/engine-agreement"))
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report from runs.csv")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        commit = current_commit()
        work = [
            (run_dir(args.runs, args.env, args.budget, algo, engine, seed), args.env, args.budget, algo, engine, seed)
            for seed in parse_seeds(args.seeds)
            for algo in args.algos
            for engine in args.arms
        ]
        existing = args.out / "runs.csv"
        table = pd.read_csv(existing) if existing.exists() else pd.DataFrame()
        keys = ["env", "budget", "algo", "engine", "seed"]
        done = set() if table.empty else set(table[keys].itertuples(index=False, name=None))
        # a run already in runs.csv keeps its row (and the commit that produced it)
        work = [job for job in work if (job[1], job[2], job[3], job[4], job[5]) not in done]
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for job, path in zip(work, pool.map(lambda job: run_one(*job), work)):
                added = row(path, args.budget, job[4], commit)
                append_row(existing, added)
                print(f"{path}: {added['mean_scalarised']:.3f}", flush=True)
    print(report(args.out, args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
