"""morlfed environment specs and factories.

One YAML spec per supported MO-Gymnasium environment lives in ``envs/conf/env/`` (a hydra config
group: put :data:`CONF_DIR` on hydra's search path and select one with ``env=<name>``); the same
specs are available in Python::

    from morlfed import envs
    spec = envs.get_spec("deep-sea-treasure")        # aliases and gym ids work too
    env = envs.make_train_env(spec, weights=[0.3, 0.7], seed=0)   # scalar reward w . r
    ev = envs.make_eval_env(spec, seed=0)                          # vector reward
    front = envs.known_front(spec)                                 # [10, 2] for DST

This package depends only on gymnasium, mo-gymnasium, stable-baselines3 and omegaconf.
"""

if __name__ != "morlfed.envs":
    # the folder also sits at the repository root, where `import envs` would load a second copy
    # of every module (a second class for each class: isinstance fails across the two)
    raise ImportError(f"{__name__!r} is the package morlfed.envs: import it as morlfed.envs")

from .factory import (
    GlobalNumpyRNGIsolation,
    MissingDependencyError,
    check_dependencies,
    check_env_kwargs,
    known_front,
    make_eval_env,
    make_train_env,
    missing_dependencies,
    reset_env,
    validate_weights,
)
from .registry import aliases, available, get_spec, register, resolve_name
from .spec import AGENTS, CONF_DIR, ENV_CONF_DIR, SPEC_ENGINES, EnvSpec

__all__ = [
    "AGENTS",
    "CONF_DIR",
    "ENV_CONF_DIR",
    "SPEC_ENGINES",
    "EnvSpec",
    "GlobalNumpyRNGIsolation",
    "MissingDependencyError",
    "aliases",
    "available",
    "check_dependencies",
    "check_env_kwargs",
    "get_spec",
    "known_front",
    "make_eval_env",
    "make_train_env",
    "missing_dependencies",
    "register",
    "reset_env",
    "resolve_name",
    "validate_weights",
]

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 2
