"""Resume and branch command handling: ``resume=RUN_DIR`` and ``branch_from=RUN_DIR``.

:func:`resume_argv` rewrites such a command line into the run's own (its saved hydra overrides
plus the settings that may change); :func:`resume_point`, :func:`branch_point` and
:func:`sibling_source` (``branch_siblings=true``) find the checkpoint a run starts from, after
checking that the configuration composed now matches the saved one. The checkpoints themselves
are read and written by :mod:`morlfed.federation.checkpoint`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from pathlib import Path
from typing import Any, cast

from morlfed.core.commands import python
from morlfed.federation.checkpoint import Checkpointer, checkpoint_round

#: Top-level config keys a resumed run may change (they do not change its results).
RESUME_MAY_CHANGE = ("executor", "progress", "checkpoint_every", "branch_siblings")
#: Top-level config keys a branch (``branch_from=``) may change besides :data:`RESUME_MAY_CHANGE`:
#: settings that act only after the checkpoint it starts from ("+FT" acts in the last round only).
BRANCH_MAY_CHANGE = ("finetune",)
#: The error for a command line that sets both ``resume`` and ``branch_from`` (a resumed branch sets both itself).
RESUME_OR_BRANCH = "resume= continues a run in place and branch_from= starts a new one from it: give one of them"


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _quote(value: str) -> str:
    """A hydra override value: as is when plain, else single-quoted."""
    return value if re.fullmatch(r"[\w./-]+", value) else "'" + value.replace("'", "\\'") + "'"


def _saved_command_line(argv: list[str], key: str, may_change: tuple[str, ...]) -> tuple[Path, list[str]] | None:
    """For a ``KEY=RUN_DIR`` command line: ``RUN_DIR`` and the run's own command line; ``None`` without it.

    ``RUN_DIR`` is made absolute. The run's own command line is its saved hydra overrides
    (``RUN_DIR/.hydra/overrides.yaml``) followed by the command line's other overrides, which may
    only set keys of ``may_change`` (or ``hydra.*``) and replace the saved overrides of those keys.
    A saved ``resume=`` is dropped: it says how the run was last continued, not how it is configured
    (hydra saves a resumed run's rewritten command line, so a branch of a run that was once resumed
    would otherwise both resume and branch).
    """
    given = [a for a in argv if _override_key(a) == key]
    if not given:
        return None
    path = Path(given[-1].split("=", 1)[1].strip("'\"")).absolute()
    saved_file = path / ".hydra" / "overrides.yaml"
    if not path.is_dir():
        raise ValueError(f"{key}={path}: no such directory (give the directory of the run to continue)")
    if not saved_file.is_file():
        raise ValueError(f"{key}={path}: not a morlfed run directory (no .hydra/overrides.yaml)")
    extra = [a for a in argv if _override_key(a) != key]
    bad = [a for a in extra if _override_key(a).split(".")[0] not in (*may_change, "hydra")]
    if bad:
        raise ValueError(
            f"{key}= continues a run with its saved configuration; only {', '.join(may_change)} "
            f"may be changed, got {' '.join(bad)}"
        )
    replaced = {_override_key(a) for a in extra} | {key, "resume"}

    def kept(override: str) -> bool:  # a new executor=<kind> also drops the old kind's options
        k = _override_key(override)
        return k not in replaced and not any(k.startswith(f"{r}.") for r in replaced)

    saved = _load_yaml(saved_file, key)
    if not isinstance(saved, list) or not all(isinstance(o, str) for o in saved):
        raise ValueError(f"{saved_file}: not a list of overrides (the file is damaged or not morlfed's)")
    return path, [*[o for o in saved if kept(o)], *extra]


def _load_yaml(path: Path, key: str) -> Any:
    """The plain contents of a run's YAML file; ``ValueError`` naming it when it cannot be read."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        return OmegaConf.to_container(OmegaConf.load(path))
    except (OSError, UnicodeDecodeError, YAMLError, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{key}=: {path}: unreadable ({first})") from None


def resume_command(run_path: Path) -> str:
    """The shell command that continues the run in ``run_path``, with the Python interpreter running now.

    That interpreter is the one whose packages the run needs, a virtual environment's when it runs
    one.

    :param run_path: the run directory
    """
    return python("-m", "morlfed.run", f"resume={Path(run_path).absolute()}")


def resume_argv(argv: list[str]) -> list[str]:
    """Rewrite a ``resume=RUN_DIR`` or ``branch_from=RUN_DIR`` command line into the run's own.

    The run's own is its saved hydra overrides (``RUN_DIR/.hydra/overrides.yaml``) and the given
    overrides.

    ``resume=`` may change only :data:`RESUME_MAY_CHANGE` and writes into ``RUN_DIR`` itself;
    ``branch_from=`` may also change :data:`BRANCH_MAY_CHANGE` and writes a new run directory.
    Command lines with neither are returned unchanged.

    :param argv: the command line's hydra overrides
    :raises ValueError: ``RUN_DIR`` is not a run directory, another setting is overridden, or both keys are given
    """
    if any(_override_key(a) == "resume" for a in argv) and any(_override_key(a) == "branch_from" for a in argv):
        raise ValueError(RESUME_OR_BRANCH)
    campaign = campaign_argv(argv)
    if campaign is not None:
        return campaign
    resumed = _saved_command_line(argv, "resume", RESUME_MAY_CHANGE)
    if resumed is not None:
        path, overrides = resumed
        if any(_override_key(a).startswith("hydra.run.dir") for a in overrides):
            raise ValueError(
                "resume= writes into the run directory itself; to continue elsewhere with another "
                "finetune=, use branch_from=RUN_DIR"
            )
        return [*overrides, f"resume={_quote(str(path))}", f"hydra.run.dir={_quote(str(path))}"]
    branched = _saved_command_line(argv, "branch_from", (*RESUME_MAY_CHANGE, *BRANCH_MAY_CHANGE))
    if branched is not None:
        path, overrides = branched
        return [*overrides, f"branch_from={_quote(str(path))}"]
    return argv


#: The hydra overrides a campaign's resume sets itself (:func:`campaign_argv`).
_CAMPAIGN_SETS = ("hydra.mode", "hydra/launcher", "hydra.launcher.resume", "hydra.sweep.dir")


def campaign_argv(argv: list[str]) -> list[str] | None:
    """For ``resume=SWEEP_DIR`` (a sweep's folder, its ``multirun.yaml``): the command line that continues the campaign.

    That is the sweep's saved overrides (``multirun.yaml``'s) run again in the same folder by the
    batched launcher with ``hydra.launcher.resume=true`` (:mod:`morlfed.cli.launcher`): a finished
    job is skipped, a started one resumes from its latest checkpoint, the rest start. Besides
    ``resume=``, the command line may set only :data:`RESUME_MAY_CHANGE` and ``hydra.launcher.*``.
    ``None`` for any other command line (a run directory's ``resume=`` included).

    :param argv: the command line's hydra overrides
    :raises ValueError: another setting is overridden, or ``multirun.yaml`` is unreadable
    """
    given = [a for a in argv if _override_key(a) == "resume"]
    if not given:
        return None
    path = Path(given[-1].split("=", 1)[1].strip("'\"")).absolute()
    saved_file = path / "multirun.yaml"
    if not saved_file.is_file() or (path / ".hydra" / "overrides.yaml").is_file():
        return None
    extra = [a for a in argv if _override_key(a) != "resume" and a not in ("-m", "--multirun")]
    bad = [
        a
        for a in extra
        if _override_key(a).split(".")[0] not in RESUME_MAY_CHANGE and not a.startswith("hydra.launcher.")
    ]
    if bad:
        raise ValueError(
            f"resume={path} continues a campaign with its saved sweep; only {', '.join(RESUME_MAY_CHANGE)} "
            f"and hydra.launcher.* may be changed, got {' '.join(bad)}"
        )
    saved = _load_yaml(saved_file, "resume")
    try:
        task, hydra = saved["hydra"]["overrides"]["task"], saved["hydra"]["overrides"]["hydra"]
    except (TypeError, KeyError):
        raise ValueError(f"{saved_file}: no hydra.overrides (the file is damaged or not hydra's)") from None
    replaced = {_override_key(a) for a in extra}
    kept = [o for o in [*task, *hydra] if _override_key(o) not in (*_CAMPAIGN_SETS, *replaced)]
    folder = f"hydra.sweep.dir={_quote(str(path))}"
    return ["-m", *kept, *extra, "hydra/launcher=batched", "hydra.launcher.resume=true", folder]


def branch_point(source: Path, config_yaml: str) -> Path:
    """The checkpoint a ``branch_from=RUN_DIR`` run starts from: ``RUN_DIR``'s latest before its last round.

    First checks that ``config_yaml`` (the new run's resolved config) equals ``RUN_DIR/config.yaml``
    outside :data:`RESUME_MAY_CHANGE` and :data:`BRANCH_MAY_CHANGE`, and that the checkpoint
    precedes the last round (the only one that "+FT" changes).

    :param source: the run directory to branch from
    :param config_yaml: the new run's resolved config as YAML
    :raises ValueError: no saved config, a changed setting, or no checkpoint before the last round
    """
    source = Path(source)
    now = _check_same_config(source, config_yaml, "branch_from", _BRANCH_IGNORES)
    rounds = int(now["rounds"])
    checkpoints = Checkpointer(source)
    start, refused = checkpoints.usable(before=rounds)
    if start is None:
        latest = checkpoints.latest()
        found = "none" if latest is None else f"the only one is after round {checkpoint_round(latest)}"
        found = "; ".join(refused) if refused else found
        raise ValueError(
            f"branch_from={source}: needs an intact checkpoint from before the last round {rounds} ({found}); "
            f"run it with checkpoint_every={rounds - 1}"
        )
    return start


#: Top-level config keys a branch and its source may differ in.
_BRANCH_IGNORES = {*RESUME_MAY_CHANGE, *BRANCH_MAY_CHANGE, "branch_from", "resume"}


#: The list of a sweep's jobs, in its folder: one JSON line per job, written as the job starts.
SWEEP_JOBS = "sweep_jobs.jsonl"


def record_sweep_job(run_path: Path) -> None:
    """Record the job directory ``run_path`` in its sweep folder's :data:`SWEEP_JOBS` (the sweep's own manifest).

    :param run_path: a sweep job's directory
    """
    run_path = Path(run_path).absolute()
    line = json.dumps({"job": run_path.name, "pid": os.getpid(), "host": socket.gethostname()}) + "\n"
    fd = os.open(run_path.parent / SWEEP_JOBS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line.encode())  # one short append: whole, even beside another job's
    finally:
        os.close(fd)


def sweep_jobs(folder: Path) -> set[str]:
    """The job directories a sweep recorded in ``folder`` (:func:`record_sweep_job`); none without its list.

    :param folder: a sweep folder
    """
    try:
        lines = (Path(folder) / SWEEP_JOBS).read_text().splitlines()
    except OSError:
        return set()
    jobs = set()
    for line in lines:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            jobs.add(str(json.loads(line)["job"]))
    return jobs


def sibling_source(run_path: Path, config_yaml: str) -> Path | None:
    """For ``branch_siblings=true``: a finished run of the same sweep to branch from, or ``None``.

    The run is one that this sweep created (recorded in its folder's :data:`SWEEP_JOBS`; nothing
    else in the folder counts) and that :func:`branch_point` accepts as the source of a run with
    config ``config_yaml`` (the same config outside the keys a branch may change, an intact
    checkpoint before the last round), the one with the latest such checkpoint (then by name); a
    "+FT" run started from it gets exactly its from-scratch numbers. ``None`` if there is none (the
    run then trains from scratch).

    :param run_path: the new run's directory
    :param config_yaml: the new run's resolved config as YAML
    """
    run_path = Path(run_path).absolute()
    found = []
    for name in sorted(sweep_jobs(run_path.parent) - {run_path.name}):
        other = run_path.parent / name
        if "/" in name or name in ("", ".", "..") or not (other / "metrics.json").is_file():
            continue
        try:
            point = branch_point(other, config_yaml)
        except ValueError:
            continue
        found.append((-checkpoint_round(point), other.name, other))
    return min(found)[2] if found else None


def _check_same_config(run_path: Path, config_yaml: str, key: str, ignore: set[str]) -> dict[str, Any]:
    """The config composed now (``config_yaml``) as a dict, checked against the run's saved one.

    It must equal the saved ``run_path/config.yaml`` outside the top-level keys ``ignore``, else
    ``ValueError`` names the keys that differ (or says the saved config is missing).
    """
    from omegaconf import OmegaConf

    saved_file = run_path / "config.yaml"
    if not saved_file.is_file():
        raise ValueError(f"{key}={run_path}: no config.yaml (the run never started)")
    saved = _load_yaml(saved_file, key)
    now = OmegaConf.to_container(OmegaConf.create(config_yaml))
    if not isinstance(saved, dict):
        raise ValueError(f"{key}={run_path}: config.yaml is not a mapping")
    assert isinstance(now, dict), "a composed configuration is a mapping"
    changed = sorted(k for k in set(saved) | set(now) if k not in ignore and saved.get(k) != now.get(k))
    if changed:
        raise ValueError(
            f"{key}={run_path}: the configuration composed now differs from the saved config.yaml in "
            f"{', '.join(changed)} (were the defaults or the code changed?)"
        )
    return cast("dict[str, Any]", now)  # a YAML mapping's keys are strings


def resume_point(run_path: Path, config_yaml: str) -> tuple[Path | None, list[str]]:
    """The checkpoint a ``resume=RUN_DIR`` run continues from, and why any later one was refused.

    First checks that the run is unfinished and that ``config_yaml`` (the resumed run's resolved
    config) matches the saved ``RUN_DIR/config.yaml`` outside :data:`RESUME_MAY_CHANGE` (a run
    killed before it wrote its config.yaml has nothing to match). The checkpoint is the latest
    intact one (:meth:`~morlfed.federation.checkpoint.Checkpointer.usable`); ``None`` is for a run that kept
    none (stopped or killed before its first checkpoint was complete): it starts again from the
    beginning, in place.

    :param run_path: the run directory to resume
    :param config_yaml: the resumed run's resolved config as YAML
    :return: the checkpoint (``None``: from the beginning) and the damaged later ones, each naming its file
    :raises ValueError: finished run, changed configuration, or every checkpoint damaged (the message names the file)
    """
    run_path = Path(run_path)
    if (run_path / "metrics.json").exists():
        raise ValueError(f"resume={run_path}: the run already completed (metrics.json exists)")
    if (run_path / "config.yaml").exists():
        _check_same_config(run_path, config_yaml, "resume", {*RESUME_MAY_CHANGE, "resume", "branch_from"})
    latest, refused = Checkpointer(run_path).usable()
    if latest is None and refused:
        raise ValueError(
            f"resume={run_path}: its checkpoint is damaged, and no earlier one is intact: {refused[0]} "
            "(nothing was changed; run it again in a new directory)"
        )
    return latest, refused
