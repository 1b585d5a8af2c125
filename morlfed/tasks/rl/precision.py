"""The arithmetic of the vectorised engine's gradient steps: ``precision=fp32 | bf16 | auto``.

``fp32`` is SB3's arithmetic. ``bf16`` computes the hidden layers of a DQN or DDPG gradient step
in bfloat16 (mixed precision, :class:`~morlfed.tasks.rl.vectorised.dqn.StackedDQN`,
:class:`~morlfed.tasks.rl.vectorised.ddpg.StackedDDPG`). ``auto`` (the
default) trains with the env spec's ``precision`` where that can pay and is allowed: the engine is
the vectorised one and the device computes bfloat16 natively; everywhere else it is ``fp32``. A
spec names ``bf16`` only where the engine-agreement study found the ``vectorised-bf16`` arm
equivalent to sb3 (docs/results/engine-agreement, checked by
``tests/test_engine_agreement_report.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from morlfed.core.parallelism import cpuinfo_field
from morlfed.envs import EnvSpec
from morlfed.tasks.rl.vectorised.low_precision import PRECISIONS

#: The ``precision`` settings a run accepts.
SETTINGS: tuple[str, ...] = (*PRECISIONS, "auto")
#: ``/proc/cpuinfo`` flags of x86 instructions that compute bfloat16 products natively (AVX-512
#: BF16, AMX); without them torch emulates bfloat16 products, slower than float32 ones.
BF16_FLAGS: frozenset[str] = frozenset({"avx512_bf16", "amx_bf16"})


def bf16_native(device: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether ``device`` computes bfloat16 matrix products natively.

    That is a CUDA device that supports bfloat16, or a processor whose ``cpuinfo`` flags name
    bfloat16 instructions (:data:`BF16_FLAGS`; ``False`` where the kernel does not describe its
    processors there).

    :param device: ``cpu`` or ``cuda``
    :param cpuinfo: where the kernel describes the processors
    """
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    flags = cpuinfo_field("flags", cpuinfo)
    return flags is not None and not BF16_FLAGS.isdisjoint(flags.split())


def resolve_precision(setting: str, spec: EnvSpec, engine: str, device: str) -> str:
    """The precision a run trains with (see the module docstring).

    :param setting: the run's ``precision`` setting: ``fp32``, ``bf16`` (kept as given; the task
        refuses ``bf16`` where the engine does not implement it) or ``auto``
    :param spec: the env spec (its ``precision``)
    :param engine: the run's engine, ``auto`` resolved
    :param device: the run's device, ``auto`` resolved
    :raises ValueError: an unknown setting
    """
    if setting not in SETTINGS:
        raise ValueError(f"precision must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting != "auto":
        return setting
    if spec.precision == "fp32" or engine != "vectorised" or not bf16_native(device):
        return "fp32"
    return spec.precision
