"""What Flower adds to a small federation: ``flwr run`` of examples/flower/ against the native run.

    python bench/flower_overhead.py                      # 4 clients, 2 rounds, 300 local steps
    python bench/flower_overhead.py --clients 2 --rounds 2 --local-steps 200

It runs the same federation (deep-sea-treasure, FedPref) three times, each in its own processes:
natively (``python -m morlfed.run``), with ``flwr run`` on Flower's local simulation starting its
own SuperLink, and with ``flwr run`` again on the SuperLink that is now up. It prints each run's
wall time and the ``flwr run`` log's milestones (seconds from the command's start, when each line
reached the terminal), then stops the SuperLink. Flower's home and state live in a temporary
folder (``FLWR_HOME``), its SuperLink on ports of its own, so a Flower setup of the user's is
neither read nor changed. The functions here (:func:`flwr_env`, :func:`flwr_run`,
:func:`stop_local_superlink`) are also what ``tests/test_flower_app.py`` runs the app with.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "flower"
#: the ``flwr run --stream`` log lines whose arrival is a milestone, and what each marks
MILESTONES = {
    "Starting local SuperLink": "SuperLink starting",
    "Successfully started run": "run submitted (FAB built and sent)",
    "Starting Flower Simulation": "simulation process up",
    "Successfully installed": "FAB installed",
    "[ROUND 1/": "ServerApp built, round 1 starts",
    "[ROUND 2/": "round 2 starts",
    "Strategy execution finished": "last round done",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def flwr_env(home: Path) -> dict[str, str]:
    """The environment of a ``flwr run`` that keeps to ``home`` and this machine.

    Flower's home (config, installed apps, the local SuperLink's database and log) is ``home``;
    the local SuperLink listens on free ports; no telemetry, update check or runtime dependency
    installation (which would call a package index: the app runs in this Python environment,
    where morlfed is installed); the worktree's ``morlfed`` wins, as it does in this process.

    :param home: Flower's home folder for this run (``FLWR_HOME``)
    """
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return env


@dataclass
class FlwrRun:
    """What one ``flwr run --stream`` printed, and when.

    :param returncode: the command's exit status
    :param wall: seconds from start to exit
    :param output: everything it printed (stdout and stderr)
    :param marks: each milestone's seconds from the start (:data:`MILESTONES`)
    """

    returncode: int
    wall: float
    output: str
    marks: dict[str, float] = field(default_factory=dict)


def flwr_run(env: dict[str, str], run_config: str, supernodes: int, timeout: float = 600.0) -> FlwrRun:
    """``flwr run examples/flower --stream`` on Flower's local simulation, timed line by line.

    :param env: its environment (:func:`flwr_env`)
    :param run_config: ``--run-config``, e.g. ``"n-clients=2 rounds=2"``
    :param supernodes: the simulated SuperNodes: one per client
    :param timeout: seconds before the command is killed
    """
    command = [
        str(Path(sys.executable).parent / "flwr"),
        "run",
        str(APP),
        "--run-config",
        run_config,
        "--federation-config",
        f"num-supernodes={supernodes}",
        "--stream",
    ]
    start = time.perf_counter()
    lines, marks = [], {}
    with subprocess.Popen(
        command, env=env, cwd=APP, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            for text in MILESTONES:
                if text in line and text not in marks:
                    marks[text] = time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                process.kill()
        returncode = process.wait()
    return FlwrRun(returncode, time.perf_counter() - start, "".join(lines), marks)


def local_superlinks(home: Path) -> list[int]:
    """The process ids of the local SuperLinks that ``flwr run`` started for Flower home ``home``.

    Found by their command line, which names their log file inside ``home`` (Linux's ``/proc``).

    :param home: the runs' ``FLWR_HOME``
    """
    log_file = str(home / "local-superlink" / "superlink.log")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            words = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # it ended, or it is not ours to read
        if any(word.endswith("flower-superlink") for word in words) and log_file in words:
            found.append(int(proc.name))
    return found


def stop_local_superlink(home: Path, wait: float = 20.0) -> list[int]:
    """Stop the local SuperLinks of Flower home ``home`` (their SuperExec and simulation end with them).

    SIGTERM first, SIGKILL after ``wait`` seconds.

    :param home: the runs' ``FLWR_HOME``
    :param wait: seconds to wait for each to exit
    :return: the process ids it stopped
    """
    pids = local_superlinks(home)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and local_superlinks(home):
        time.sleep(0.2)
    for pid in local_superlinks(home):
        os.kill(pid, signal.SIGKILL)
    return pids


def native_run(settings: list[str], run_dir: Path) -> float:
    """Seconds ``python -m morlfed.run`` takes for the settings, process start included.

    :param settings: ``key=value`` settings
    :param run_dir: its run directory
    """
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "morlfed.run", *settings, f"hydra.run.dir={run_dir}", "progress=false"],
        env=flwr_env(run_dir.parent),
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def run_config(settings: dict[str, str | int]) -> str:
    """``--run-config``'s text for the settings (TOML values: strings quoted).

    :param settings: run-config keys and values
    """
    return " ".join(
        f'{key}="{value}"' if isinstance(value, str) else f"{key}={value}" for key, value in settings.items()
    )


def round_seconds(output: str) -> list[float]:
    """The strategy's execution time that Flower's ServerApp logged (``Strategy execution finished in Xs``).

    :param output: the ``flwr run --stream`` output
    """
    return [float(s) for s in re.findall(r"Strategy execution finished in ([0-9.]+)s", output)]


def main(argv: list[str] | None = None) -> int:
    """Run the federation natively and with ``flwr run`` twice; print the figures.

    :param argv: the arguments (default: the command line's)
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=300)
    args = parser.parse_args(argv)
    settings: dict[str, str | int] = {"env": "deep-sea-treasure", "algo": "fedpref", "n-clients": args.clients}
    settings.update({"rounds": args.rounds, "local-steps": args.local_steps})
    with tempfile.TemporaryDirectory(prefix="flower-overhead-") as tmp:
        home = Path(tmp)
        native = native_run([f"{k.replace('-', '_')}={v}" for k, v in settings.items()], home / "native")
        env = flwr_env(home)
        try:
            runs = {
                "flwr run, SuperLink started": flwr_run(
                    env, run_config({**settings, "run-dir": f"{home}/cold"}), args.clients
                ),
                "flwr run, SuperLink up": flwr_run(
                    env, run_config({**settings, "run-dir": f"{home}/warm"}), args.clients
                ),
            }
        finally:
            stop_local_superlink(home)
    print(f"{args.clients} clients, {args.rounds} rounds, {args.local_steps} local steps (deep-sea-treasure, fedpref)")
    print(f"{'native (python -m morlfed.run)':34} {native:6.1f} s")
    for name, run in runs.items():
        status = "" if run.returncode == 0 else f"  (exit {run.returncode})"
        print(f"{name:34} {run.wall:6.1f} s   +{run.wall - native:.1f} s{status}")
        for text, what in MILESTONES.items():
            if text in run.marks:
                print(f"    {run.marks[text]:6.1f} s  {what}")
        for seconds in round_seconds(run.output):
            print(f"    ServerApp: strategy ran {seconds:.1f} s (Flower's log)")
    return 0 if all(run.returncode == 0 for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
