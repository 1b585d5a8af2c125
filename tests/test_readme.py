"""Every command README.md shows runs as written in a fresh shell after its set-up line.

Each names the virtual environment's own tools (never a bare ``python`` or ``pip``), an existing
module, script, file or extra, and for ``morlfed.run`` existing config groups, options and keys with
values of the right type, a configuration that validates (``build_plan``), and run directories that
an earlier command writes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from conftest import compose_config

from morlfed.cli.execute import build_plan
from morlfed.cli.overrides import SHOW_FLAGS, check_overrides

ROOT = Path(__file__).resolve().parents[1]
VENV = ".venv/bin/"


def readme_commands() -> list[list[str]]:
    """The commands of README.md's code blocks, one entry per command.

    Comments dropped, continued lines joined, one entry per command of a ``&&`` chain, ``VAR=value``
    prefixes dropped.
    """
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                command, words = words[:cut], words[cut + 1 :]
                while command and re.fullmatch(r"[A-Z_]+=.*", command[0]):
                    command = command[1:]
                commands.append(command)
    return [c for c in commands if c]


COMMANDS = readme_commands()
# the keys of pyproject.toml's [project.optional-dependencies] (tomllib is Python 3.11+, morlfed 3.10+)
_EXTRAS_TABLE = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
EXTRAS = set(re.findall(r"^([\w-]+)\s*=", _EXTRAS_TABLE, flags=re.M))
TOOLS = {ep.name for ep in importlib.metadata.entry_points(group="console_scripts")} | {"python"}
RUN_DIRS = [w.split("=", 1)[1] for c in COMMANDS for w in c if w.startswith("hydra.run.dir=")]


def test_the_readme_has_its_commands():
    assert len(COMMANDS) > 30 and ["python3", "-m", "venv", ".venv"] in COMMANDS
    assert {"dev", "mujoco", "ray", "notebooks", "vision"} <= EXTRAS
    assert [f"{VENV}ray", "start", "--head"] in COMMANDS  # the cluster section starts Ray, then joins it
    assert any("executor.address=auto" in c for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c)[:70] for c in COMMANDS])
def test_every_readme_command_names_what_exists(command: list[str]):
    tool, *args = command
    if command[:3] == ["python3", "-m", "venv"]:  # the set-up line, before .venv exists
        return
    assert tool.startswith(VENV), f"{tool}: not the virtual environment's (a fresh shell has not activated it)"
    tool = tool.removeprefix(VENV)
    assert tool in TOOLS, f"{tool}: no installed command of that name"
    if tool == "pip":
        for word in args:
            extras = re.fullmatch(r"\.\[(.+)\]", word)
            assert extras is None or set(extras.group(1).split(",")) <= EXTRAS, f"{word}: not extras of pyproject.toml"
    elif tool == "jupyter":
        assert (ROOT / args[1]).exists(), args[1]
    elif tool == "python" and args[0] != "-m":
        assert (ROOT / args[0]).is_file(), f"{args[0]}: no such script"
    elif tool == "python":
        module, rest = args[1], args[2:]
        assert importlib.util.find_spec(module) is not None, f"{module}: no such module"
        if module == "morlfed.run":
            check_run(rest)
        elif module.startswith("morlfed.analysis."):
            importlib.import_module(module)._parser().parse_args(rest)  # exits on an unknown option


def check_run(args: list[str]) -> None:
    """Check a ``morlfed.run`` command line: its keys, options and values exist and validate.

    A ``resume=``/``branch_from=`` must name a run directory that an earlier README command writes.
    """
    for word in args:
        key, _, value = word.partition("=")
        if key in ("resume", "branch_from"):
            assert value in RUN_DIRS, f"{word}: no README command writes {value}"
    overrides = [w for w in args if w.split("=")[0] not in ("resume", "branch_from")]
    check_overrides(overrides)
    if any(w in SHOW_FLAGS for w in overrides):  # --help, --cfg job: nothing runs
        return
    jobs = [w for w in overrides if w not in ("-m", "--multirun")]
    first = [re.sub(r"=([^,\[\]{}']+),.*", r"=\1", w) for w in jobs]  # a sweep's first job
    build_plan(compose_config(first))
