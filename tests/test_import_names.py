"""One name per module: every source file imports under exactly one module name.

envs/, baselines/ and analysis/ sit at the repository root and are the subpackages morlfed.envs,
morlfed.baselines and morlfed.analysis (morlfed/<name> links to them). From the repository root
(``python -m ...``, ``python -c ...``: the working directory is on ``sys.path``) a second route
exists, ``import envs``; it must fail with an ImportError that names the right import, never load
a second copy of the module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import package_modules

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("envs", "baselines", "analysis")


# Runs in a fresh interpreter from the repository root: imports every module by its one name, then
# tries every other route and records what each gave.
PROBE = """
import importlib, json, sys
names = json.loads(sys.argv[1])
linked = json.loads(sys.argv[2])
out = {"files": {}, "second_routes": {}}
for name in names:
    out["files"][name] = importlib.import_module(name).__file__
for name in names:
    if name.count(".") and name.split(".")[1] in linked:
        route = name.removeprefix("morlfed.")
        try:
            module = importlib.import_module(route)
            out["second_routes"][route] = "imported " + module.__file__
        except ImportError as exc:
            out["second_routes"][route] = "ImportError: " + str(exc)
out["left_in_sys_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in linked)
from morlfed import envs
import morlfed.envs
out["same_object"] = envs is morlfed.envs is sys.modules["morlfed.envs"]
print(json.dumps(out))
"""


def test_every_module_has_one_name_and_a_second_route_fails_with_the_right_import() -> None:
    names = {name: str(path.resolve()) for name, path in package_modules().items()}
    assert {"morlfed.envs.factory", "morlfed.baselines.cfl", "morlfed.analysis.runs"} <= set(names)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(sorted(names)), json.dumps(LINKED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name, path in names.items():  # the one name loads the file itself
        assert str(Path(out["files"][name]).resolve()) == path, name
    routes = out["second_routes"]
    assert len(routes) == sum(name.count(".") > 0 and name.split(".")[1] in LINKED for name in names) > 20
    for route, result in routes.items():
        top = route.split(".")[0]
        assert result == f"ImportError: '{top}' is the package morlfed.{top}: import it as morlfed.{top}", route
    assert out["left_in_sys_modules"] == []  # not even half a second copy stays behind
    assert out["same_object"]
