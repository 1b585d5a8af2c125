"""The commands morlfed prints for its user to run (hints in messages, the resume command).

They use the Python interpreter running now (``sys.executable``), never a bare ``python`` or
``pip``: in a fresh shell after the README's set-up line those are the system's, not the virtual
environment's that has morlfed and its dependencies.
"""

from __future__ import annotations

import shlex
import sys


def python(*args: str) -> str:
    """``<this interpreter> ARGS``, each argument quoted for a POSIX shell where it needs it.

    :param args: the interpreter's arguments (``-m``, ``morlfed.run``, ...)
    """
    return " ".join(shlex.quote(word) for word in (sys.executable, *args))


def pip_install(*args: str) -> str:
    """``<this interpreter> -m pip install ARGS``: installs into the environment running now.

    :param args: pip's arguments (``-e``, ``.[ray]``)
    """
    return python("-m", "pip", "install", *args)
