"""The generated blocks of a results document (``docs/results.md``, ``docs/results/*.md``), parsed and rebuilt.

They are rebuilt from committed CSV summaries: the library behind
``python -m morlfed.analysis.results``.

``python -m morlfed.analysis.results DOC`` (:mod:`morlfed.analysis.results`) rewrites every generated block of
a document in place, or with ``--check`` proves that the published tables are the committed data's.
A generated block is::

    <!-- results:KIND key=value key=value ... -->
    ...markdown, replaced on every regeneration...
    <!-- /results -->

Its CSVs (``csv=a.csv,b.csv``, paths relative to the document) are ``summary.csv`` files written by
``python -m morlfed.analysis.evaluate`` (one row per run: identity, budget, wall time, every metric), so
the tables can be rebuilt without rerunning anything. Every kind also takes ``rows=G1,G2,...``
(globs over variant labels): only the runs of the matching variants are read, so that a block can
show a few rows of a study beside another study's rows (an ablation beside the full method's row of
a comparison, paired by seed). Kinds:

* ``table metric=M dist=D [decimals=2] [reference=fedpref] [level=0.05] [untuned=G1,G2,...]``: rows
  algorithm variants and their seeds n, columns environments, cells mean ± sample std over seeds,
  marked ▲ (bold) / ▼ where significantly better / worse than the variant matching the glob
  ``reference`` in a paired test over seeds at ``level``, the test named under the table
  (:func:`morlfed.analysis.tables.metric_table`, the same table ``comparison.md`` has). The rows
  whose labels match a glob of ``untuned`` are marked † (their strategy ran its defaults, where
  the others' settings were selected for the study).
* ``metrics env=E dist=D metrics=M1,M2,... [decimals=2] [reference=fedpref] [level=0.05]
  [untuned=G1,G2,...]``: one environment under one preference distribution; rows algorithm
  variants and their seeds n, columns the metrics, cells and rows marked as in ``table``
  (:func:`morlfed.analysis.tables.metrics_table`).
* ``ranking metric=M [focus=fedpref*] [claims=paper.csv] [decimals=2]``: per environment and
  preference distribution, the first-ranked variant, the best-ranked variant matching ``focus``
  (a glob over labels) and its rank. With ``claims`` (a CSV with columns ``metric env dist first
  source``, ``first`` a label glob), also what the paper ranks first and whether morlfed agrees.
* ``budget``: per environment, distribution and number of env steps per client, the variants
  that took it, the clients, rounds, local steps, env steps per client and per run, number of
  runs and their wall time (the federation loop's, from ``metrics.json``)
  (:func:`morlfed.analysis.tables.budget_table`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from morlfed.analysis.clustering import TABLE_METRICS
from morlfed.analysis.stats import LEVEL, REFERENCE, check_one_run_per_seed
from morlfed.analysis.tables import aggregate_over_seeds, budget_table, metric_table, metrics_table

_OPEN = re.compile(r"^<!--\s*results:(?P<kind>\w+)(?P<args>.*?)-->\s*$")
_CLOSE = re.compile(r"^<!--\s*/results\s*-->\s*$")
#: Columns a ``claims=`` CSV must have.
CLAIM_COLUMNS: tuple[str, ...] = ("metric", "env", "dist", "first", "source")
#: Columns of an evaluation summary the blocks read.
SUMMARY_NEEDS: tuple[str, ...] = ("env", "dist", "variant", "seed")


class ResultsError(ValueError):
    """A malformed block or unusable CSV; the message names the document line and the problem."""


@dataclass(frozen=True)
class Block:
    """One generated block of a document.

    :param kind: ``table``, ``ranking`` or ``budget``
    :param args: its ``key=value`` arguments
    :param start: index of its opening line
    :param end: index of its closing line
    """

    kind: str
    args: dict[str, str]
    start: int
    end: int


def parse_blocks(lines: Sequence[str]) -> list[Block]:
    """Every generated block of a document's ``lines`` (without line ends), in order.

    :param lines: the document's lines
    """
    blocks, i = [], 0
    while i < len(lines):
        if _CLOSE.match(lines[i]):
            raise ResultsError(f"line {i + 1}: '<!-- /results -->' without an opening block")
        opened = _OPEN.match(lines[i])
        if not opened:
            i += 1
            continue
        args = {}
        for token in opened["args"].split():
            key, sep, value = token.partition("=")
            if not sep or not key or not value:
                raise ResultsError(f"line {i + 1}: argument {token!r} is not key=value")
            args[key] = value
        end = next((j for j in range(i + 1, len(lines)) if _CLOSE.match(lines[j]) or _OPEN.match(lines[j])), None)
        if end is None or not _CLOSE.match(lines[end]):
            raise ResultsError(f"line {i + 1}: block results:{opened['kind']} is not closed by '<!-- /results -->'")
        blocks.append(Block(opened["kind"], args, i, end))
        i = end + 1
    return blocks


def read_summaries(base: Path, spec: str) -> pd.DataFrame:
    """The rows of the comma-separated CSVs ``spec`` (paths relative to ``base``), concatenated.

    :param base: the document's folder
    :param spec: the block's ``csv=`` argument
    """
    frames = []
    for name in spec.split(","):
        path = base / name
        if not path.is_file():
            raise ResultsError(f"csv {name!r}: no such file {path}")
        frame = pd.read_csv(path)
        missing = [c for c in SUMMARY_NEEDS if c not in frame.columns]
        if missing:
            raise ResultsError(f"csv {name!r}: not an analysis.evaluate summary (no column {', '.join(missing)})")
        frames.append(frame)
    summary = pd.concat(frames, ignore_index=True)
    try:
        check_one_run_per_seed(summary)
    except ValueError as exc:
        raise ResultsError(f"csv={spec}: {exc}") from None
    return summary


def _metric(args: dict[str, str]) -> str:
    metric = args.get("metric")
    if metric not in TABLE_METRICS:
        raise ResultsError(f"metric={metric!r} is not a metric; valid: {', '.join(TABLE_METRICS)}")
    return metric


def _decimals(args: dict[str, str]) -> int:
    text = args.get("decimals", "2")
    if not text.isdigit():
        raise ResultsError(f"decimals={text!r} must be a non-negative integer")
    return int(text)


def _level(args: dict[str, str]) -> float:
    text = args.get("level", str(LEVEL))
    try:
        level = float(text)
    except ValueError:
        level = -1.0
    if not 0.0 < level < 1.0:
        raise ResultsError(f"level={text!r} must be a number in (0, 1)")
    return level


def _check_keys(kind: str, args: dict[str, str], allowed: set[str]) -> None:
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise ResultsError(f"results:{kind} does not take {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}")
    if "csv" not in args:
        raise ResultsError(f"results:{kind} needs csv=FILE[,FILE...]")


def _globs(summary: pd.DataFrame, args: dict[str, str], key: str) -> list[str]:
    """The globs of ``KEY=G1,G2,...`` (none without the argument), each of which must match a variant of the csv.

    :param summary: the block's CSV rows
    :param args: the block's arguments
    :param key: ``untuned`` or ``rows``
    """
    globs = [g for g in args.get(key, "").split(",") if g]
    variants = sorted(summary["variant"].unique())
    unmatched = [g for g in globs if not any(fnmatch.fnmatchcase(v, g) for v in variants)]
    if unmatched:
        raise ResultsError(f"{key}={','.join(unmatched)} matches no variant of the csv; it has {', '.join(variants)}")
    return globs


def _rows(summary: pd.DataFrame, args: dict[str, str]) -> pd.DataFrame:
    """The runs of the variants matching a glob of ``rows=G1,G2,...`` (all runs without the argument).

    :param summary: the block's CSV rows
    :param args: the block's arguments
    """
    globs = _globs(summary, args, "rows")
    if not globs:
        return summary
    return summary[[any(fnmatch.fnmatchcase(v, g) for g in globs) for v in summary["variant"]]]


def render_table(summary: pd.DataFrame, args: dict[str, str]) -> str:
    """The ``table`` block: one metric under one preference distribution.

    :param summary: the block's CSV rows
    :param args: the block's arguments
    """
    metric, decimals = _metric(args), _decimals(args)
    dists = sorted(summary["dist"].unique())
    dist = args.get("dist")
    if dist is None or dist not in dists:
        raise ResultsError(f"dist={dist!r} has no runs in the csv; it has {', '.join(dists)}")
    table = metric_table(
        summary,
        dist,
        metric,
        decimals,
        registry=TABLE_METRICS,
        reference=args.get("reference", REFERENCE),
        level=_level(args),
        untuned=_globs(summary, args, "untuned"),
    )
    if table is None:
        raise ResultsError(f"no run has a value of {metric} under dist={dist}")
    return table


def render_metrics(summary: pd.DataFrame, args: dict[str, str]) -> str:
    """The ``metrics`` block: several metrics of one environment under one preference distribution.

    :param summary: the block's CSV rows
    :param args: the block's arguments
    """
    decimals = _decimals(args)
    metrics = [m for m in args.get("metrics", "").split(",") if m]
    if not metrics:
        raise ResultsError(f"results:metrics needs metrics=M1,M2,...; valid: {', '.join(TABLE_METRICS)}")
    for metric in metrics:
        _metric({"metric": metric})
    env, dist = args.get("env"), args.get("dist")
    pairs = sorted(set(zip(summary["env"], summary["dist"])))
    if env is None or dist is None or (env, dist) not in pairs:
        raise ResultsError(
            f"env={env!r} dist={dist!r} has no runs in the csv; it has "
            f"{', '.join(f'env={e} dist={d}' for e, d in pairs)}"
        )
    table = metrics_table(
        summary,
        env,
        dist,
        metrics,
        decimals,
        reference=args.get("reference", REFERENCE),
        level=_level(args),
        untuned=_globs(summary, args, "untuned"),
    )
    if table is None:
        raise ResultsError(f"env={env} dist={dist} has no runs in the csv")
    return table


def ranking(summary: pd.DataFrame, metric: str, focus: str = "fedpref*", decimals: int = 2) -> pd.DataFrame:
    """Per ``(env, dist)``: the first-ranked variant, the best one matching ``focus`` and its rank.

    The first-ranked variant is by mean over seeds of ``metric`` (ties at ``decimals`` all first);
    the rank of the best variant whose label matches the glob ``focus`` is 1 + the number of
    variants strictly better at that precision. The number of variants is given too.

    :param summary: ``summary.csv`` rows
    :param metric: a key of :data:`morlfed.analysis.clustering.TABLE_METRICS`
    :param focus: a glob over variant labels
    :param decimals: the precision of the comparison
    """
    higher = TABLE_METRICS[metric].higher_is_better
    stats = aggregate_over_seeds(summary, metric).reset_index()
    # ranked on the values as the tables print them (f"{x:.2f}" and Series.round differ at ties)
    stats = stats[stats["count"] > 0].assign(shown=lambda f: [float(f"{m:.{decimals}f}") for m in f["mean"]])
    rows = []
    for (env, dist), part in stats.groupby(["env", "dist"], sort=True):
        best = part["shown"].max() if higher else part["shown"].min()
        first = sorted(part.loc[part["shown"] == best, "variant"])
        mine = part[[fnmatch.fnmatchcase(v, focus) for v in part["variant"]]]
        if mine.empty:
            top, rank = "", None
        else:
            top_row = mine.sort_values("shown", ascending=not higher, kind="stable").iloc[0]
            better = part["shown"] > top_row["shown"] if higher else part["shown"] < top_row["shown"]
            top, rank = top_row["variant"], 1 + int(better.sum())
        rows.append(
            {
                "env": env,
                "dist": dist,
                "first": " = ".join(first),
                "best": best,
                "focus": top,
                "rank": rank,
                "variants": len(part),
            }
        )
    return pd.DataFrame(rows)


def read_claims(path: Path) -> pd.DataFrame:
    """A ``claims=`` CSV: :data:`CLAIM_COLUMNS`, one row per (metric, env, dist) the paper ranks.

    :param path: the CSV file
    """
    if not path.is_file():
        raise ResultsError(f"claims {path.name!r}: no such file {path}")
    claims = pd.read_csv(path, dtype=str).fillna("")
    missing = [c for c in CLAIM_COLUMNS if c not in claims.columns]
    if missing:
        raise ResultsError(
            f"claims {path.name!r}: missing column {', '.join(missing)}; needs {', '.join(CLAIM_COLUMNS)}"
        )
    return claims


def render_ranking(summary: pd.DataFrame, args: dict[str, str], base: Path) -> str:
    """The ``ranking`` block.

    :param summary: the block's CSV rows
    :param args: the block's arguments
    :param base: the document's folder (``claims=`` is relative to it)
    """
    metric, decimals = _metric(args), _decimals(args)
    focus = args.get("focus", "fedpref*")
    ranks = ranking(summary, metric, focus, decimals)
    claims = None
    if "claims" in args:
        claims = read_claims(base / args["claims"])
        claims = claims[claims["metric"] == metric].set_index(["env", "dist"])
    header = ["environment", "preferences", f"first ({TABLE_METRICS[metric].title})", f"best {focus}", "its rank"]
    if claims is not None:
        header += ["paper: first", "agrees"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in ranks.to_dict("records"):
        first = str(row["first"])  # ranking() joins the first-ranked labels into one string
        # a group without a focus variant has no rank (NaN once pandas has made the column float)
        rank = "—" if pd.isna(row["rank"]) else f"{int(row['rank'])} of {int(row['variants'])}"
        cells = [row["env"], row["dist"], f"{first} ({row['best']:.{decimals}f})", row["focus"] or "—", rank]
        if claims is not None:
            if (row["env"], row["dist"]) in claims.index:
                claim = claims.loc[(row["env"], row["dist"])]  # one row of the (env, dist) MultiIndex
                agrees = any(fnmatch.fnmatchcase(v, claim["first"]) for v in first.split(" = "))
                cells += [f"{claim['first']} ({claim['source']})", "yes" if agrees else "**no**"]
            else:
                cells += ["—", "—"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def render_budget(summary: pd.DataFrame, args: dict[str, str]) -> str:
    """The ``budget`` block: what each environment's runs cost.

    :param summary: the block's CSV rows
    :param args: the block's arguments
    """
    missing = [c for c in ("wall_time_s", "env_steps_per_client") if c not in summary.columns]
    if missing:
        raise ResultsError(f"the csv has no {' or '.join(missing)} column (re-run analysis.evaluate to add it)")
    return budget_table(summary)


RENDERERS: dict[str, tuple[set[str], Callable[[pd.DataFrame, dict[str, str], Path], str]]] = {
    "table": (
        {"csv", "rows", "metric", "dist", "decimals", "reference", "level", "untuned"},
        lambda s, a, b: render_table(s, a),
    ),
    "metrics": (
        {"csv", "rows", "env", "dist", "metrics", "decimals", "reference", "level", "untuned"},
        lambda s, a, b: render_metrics(s, a),
    ),
    "ranking": ({"csv", "rows", "metric", "focus", "claims", "decimals"}, render_ranking),
    "budget": ({"csv", "rows"}, lambda s, a, b: render_budget(s, a)),
}


def regenerate(text: str, base: Path) -> str:
    """``text`` with every generated block rebuilt from its CSVs (relative to ``base``).

    :param text: the document
    :param base: the document's folder
    """
    lines = text.splitlines()
    out, done = [], 0
    for block in parse_blocks(lines):
        try:
            if block.kind not in RENDERERS:
                raise ResultsError(f"unknown block kind results:{block.kind}; valid: {', '.join(RENDERERS)}")
            allowed, render = RENDERERS[block.kind]
            _check_keys(block.kind, block.args, allowed)
            body = render(_rows(read_summaries(base, block.args["csv"]), block.args), block.args, base)
        except ResultsError as exc:
            raise ResultsError(f"line {block.start + 1}: {exc}") from None
        out += [*lines[done : block.start + 1], "", body, ""]
        done = block.end
    out += lines[done:]
    return "\n".join(out) + "\n"
