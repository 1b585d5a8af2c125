"""Variant labels: the configuration settings that tell runs apart, and repeated runs.

Runs of one strategy that differ in a configuration setting (a sweep over ``local_steps``, an
engine) are different variants: :func:`variant_labels` gives each run its row label, the strategy's
label plus the settings that set it apart, so differently configured runs are never averaged
together. A run with the same configuration and seed as another would count twice in a mean over
seeds: :func:`split_duplicates` keeps the first. Settings that do not change results
(:data:`IGNORED_CONFIG_KEYS`, :data:`IGNORED_CONFIG_PREFIXES`) make no variant.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from morlfed.analysis.runs import Run, VisionRun
from morlfed.cli.config_groups import groups, top_level_keys

#: An RL or a vision run (:func:`split_duplicates` returns runs of the type it is given).
_RunT = TypeVar("_RunT", bound="Run | VisionRun")

#: Config keys that never distinguish one algorithm variant from another (the seed, and
#: settings that do not change results: logging, learning curves, threads, checkpointing,
#: resuming or branching from a checkpoint, the executor, the experiment tracker).
IGNORED_CONFIG_KEYS: frozenset[str] = frozenset(
    {
        "seed",
        "progress",
        "eval_every",
        "torch_threads",
        "save_similarity",
        "checkpoint_every",
        "resume",
        "branch_from",
        "branch_siblings",
    }
)
IGNORED_CONFIG_PREFIXES: tuple[str, ...] = ("executor.", "logger.")
#: The budget: a run's clients, rounds and local steps. Runs of one table or figure (an
#: environment and distribution) that differ in it are labelled with it, whatever their strategy.
BUDGET_KEYS: frozenset[str] = frozenset({"n_clients", "rounds", "local_steps"})


def _flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """Dotted keys to printable values (``{"algo": {"top_r": 0.1}}`` -> ``{"algo.top_r": "0.1"}``)."""
    if isinstance(config, dict):
        out: dict[str, str] = {}
        for key, value in config.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: str(config)}


def _setting(key: str, value: str) -> str:
    """A config setting as the command line writes it.

    ``engine=vectorised`` for the option of a config group (``engine.name`` in ``config.yaml``),
    ``algo.top_r=0.5`` for any other key.
    """
    group, _, field = key.partition(".")
    return f"{group}={value}" if field == "name" and group in groups() else f"{key}={value}"


class Labelled(Protocol):
    """What a row label is made of: a run's configuration and identity (a finished or a partial run)."""

    config: dict[str, Any]

    @property
    def env(self) -> str:
        """The environment or dataset."""

    @property
    def dist(self) -> str:
        """The preference distribution or label partition."""

    @property
    def label(self) -> str:
        """The strategy with the "+FT" variant marked."""


def variant_labels(runs: Sequence[Labelled]) -> list[str]:
    """Row labels: each run's ``label``, plus the config settings that set it apart.

    A config key is a *variant key* when it takes different values among runs that share
    environment, preference distribution and label (e.g. a sweep over ``local_steps`` or
    ``algo.top_r``); a budget key (:data:`BUDGET_KEYS`) is one when it differs among runs that
    share environment and preference distribution at all, so that strategies run on different
    budgets are never compared in one table or figure under bare names. Seeds and execution
    settings are ignored, and so are keys that are no
    setting of morlfed (an unknown key a run's command line added, ``+evn=...``: such runs predate
    the check that refuses them). Each run's label gets ``" (key=value, ...)"`` for the variant
    keys, written as the command line writes them (``engine=vectorised``), so differently
    configured runs are never averaged together.

    :param runs: loaded runs (finished or partial)
    """
    known = top_level_keys()
    flat = [{k: v for k, v in _flatten(r.config).items() if k.split(".")[0] in known} for r in runs]
    groups: dict[tuple[str, str, str], list[int]] = {}
    tables: dict[tuple[str, str], list[int]] = {}  # the runs of one table or figure
    for i, r in enumerate(runs):
        groups.setdefault((r.env, r.dist, r.label), []).append(i)
        tables.setdefault((r.env, r.dist), []).append(i)

    def varies(key: str, among: dict[Any, list[int]]) -> bool:
        return any(len({flat[i].get(key) for i in members}) > 1 for members in among.values())

    keys = sorted({k for f in flat for k in f})
    varying = [
        k
        for k in keys
        if k not in IGNORED_CONFIG_KEYS
        and not k.startswith(IGNORED_CONFIG_PREFIXES)
        and (varies(k, groups) or (k in BUDGET_KEYS and varies(k, tables)))
    ]
    labels = []
    for run, f in zip(runs, flat):
        extra = ", ".join(_setting(k, f.get(k, "-")) for k in varying)
        labels.append(f"{run.label} ({extra})" if extra else run.label)
    return labels


def split_duplicates(runs: Sequence[_RunT]) -> tuple[list[_RunT], list[tuple[str, str]]]:
    """Keep the first of runs with the same configuration and seed; return the kept runs and the rest.

    A repeated run would be counted twice in a mean over seeds. The rest are returned as
    ``(path, reason)``.

    :param runs: loaded runs (RL or vision)
    """
    kept: list[_RunT] = []
    seen: dict[frozenset[tuple[str, str]], Path] = {}
    skipped = []
    for run in runs:
        key = frozenset(
            (k, v)
            for k, v in _flatten(run.config).items()
            if k == "seed" or (k not in IGNORED_CONFIG_KEYS and not k.startswith(IGNORED_CONFIG_PREFIXES))
        )
        if key in seen:
            skipped.append((str(run.path), f"duplicate: same configuration and seed as {seen[key]}"))
        else:
            seen[key] = run.path
            kept.append(run)
    return kept, skipped
