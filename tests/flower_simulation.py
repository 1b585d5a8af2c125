"""Run a morlfed federation on Flower's simulation engine in one process (``FlowerApps.run_simulation``).

    python tests/flower_simulation.py env=deep-sea-treasure algo=fedpref n_clients=4 rounds=2 local_steps=300

``tests/test_flower.py``'s helper: Flower 1.42 calls the in-process simulation deprecated (users
run ``examples/flower/`` with ``flwr run``), but it hands back the final models in this process.

The arguments are the command line's ``key=value`` settings (``python -m morlfed.run``'s): the same
preferences, clients, strategy and seeds, with Flower's ServerApp, ClientApps and simulation
engine carrying the messages (one Flower node per client). It prints each client's evaluation of
the model it deploys; ``--save FILE`` also writes the final models and evaluations
(``torch.save``), which ``tests/test_flower.py`` compares with morlfed's own sequential executor.
Needs the ``flower`` extra: ``pip install -e ".[flower]"``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from morlfed.core.settings import ConfigError
from morlfed.flower import flower_apps


def main(argv: list[str] | None = None) -> int:
    """Run the federation the settings describe on Flower's simulation engine.

    :param argv: the arguments (default: the command line's)
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="*", help="key=value settings of python -m morlfed.run, e.g. algo=fedpref")
    parser.add_argument("--save", type=Path, help="write the final models and evaluations to this file (torch.save)")
    args = parser.parse_args(argv)
    try:
        apps = flower_apps(overrides=args.settings)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    apps.run_simulation()
    evaluations = apps.final_evaluations
    print(f"{'client':>6} {'scalarised':>11} {'discounted':>11}  vector return")
    for cid, evaluation in sorted(evaluations.items()):
        returns = " ".join(f"{r:8.3f}" for r in evaluation.vector_return)
        print(f"{cid:>6} {evaluation.scalarised:11.4g} {evaluation.scalarised_discounted:11.4g}  {returns}")
    if args.save is not None:
        torch.save({"models": apps.final_models, "evaluations": evaluations}, args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
