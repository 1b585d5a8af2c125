"""The SB3 agent of an env spec as both RL engines build it, and its networks' layout in the federated vector.

The SB3 client (:mod:`morlfed.tasks.rl.client`) trains such an agent; the vectorised engine
(:mod:`morlfed.tasks.rl.vectorised`) builds one as a template and mirrors its networks, initial
parameters and hyper-parameters. Building both from :func:`build_agent` with the same init seed,
and flattening both with :func:`layout_of`, is what makes every client start from the same network
in either engine and a model trained by one engine load into the other.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from stable_baselines3 import DDPG, DQN
from stable_baselines3.common.noise import ActionNoise
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from morlfed.core.params import ParamLayout
from morlfed.core.seeding import derive_seed
from morlfed.envs import EnvSpec

#: The SB3 algorithm of each ``agent`` an env spec can name.
AGENTS: dict[str, type[OffPolicyAlgorithm]] = {"dqn": DQN, "ddpg": DDPG}


def build_agent(
    spec: EnvSpec, env: Any, seed: int, device: str = "cpu", action_noise: ActionNoise | None = None
) -> OffPolicyAlgorithm:
    """The SB3 agent of an env spec: ``AGENTS[spec.agent]("MlpPolicy", env, ...)``.

    It gets the spec's hyper-parameters and the init seed derived from the root seed, which is the
    same for every client, so all clients (and the vectorised engine's stacked copies) start from
    one shared initial network.

    :param spec: the environment spec (``agent: dqn`` or ``ddpg``)
    :param env: the agent's training env (its spaces define the networks)
    :param seed: the run's root seed
    :param device: torch device of the agent's networks
    :param action_noise: DDPG's exploration noise (an SB3 argument that does not touch the networks)
    """
    kwargs = spec.sb3_kwargs  # a deep copy: SB3 changes policy_kwargs in place
    if action_noise is not None:
        kwargs["action_noise"] = action_noise
    return AGENTS[spec.agent]("MlpPolicy", env, seed=derive_seed(seed, "init"), device=device, **kwargs)


def check_sb3_kwargs(spec: EnvSpec) -> None:
    """Raise ``ValueError`` unless SB3's class of the spec's agent takes every ``agent_kwargs`` key.

    The keys of ``agent_kwargs.policy_kwargs`` are checked against the class's ``MlpPolicy``. The
    message names the keys it does not take and those it does.

    :param spec: the env spec
    """
    algorithm = AGENTS[spec.agent]
    kwargs = spec.sb3_kwargs
    passed = ("self", "policy", "env", "seed", "device")  # what build_agent passes itself
    _refuse(kwargs, algorithm.__init__, passed, f"stable_baselines3.{algorithm.__name__}", "agent_kwargs")
    policy = algorithm.policy_aliases["MlpPolicy"]
    spaces = ("self", "observation_space", "action_space", "lr_schedule")  # what SB3 passes its policy
    _refuse(kwargs.get("policy_kwargs") or {}, policy.__init__, spaces, policy.__name__, "agent_kwargs.policy_kwargs")


def _refuse(kwargs: Mapping[str, Any], function: Callable[..., Any], own: Collection[str], name: str, key: str) -> None:
    """Raise ``ValueError`` naming the keys of ``kwargs`` that ``function`` does not take (or that morlfed sets)."""
    params = inspect.signature(function).parameters.values()
    named = (p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    takes = sorted(n for n in named if n not in own and not n.startswith("_"))
    unknown = sorted(set(kwargs) - set(takes))
    if unknown:
        raise ValueError(f"{key} {', '.join(unknown)}: not an argument of {name}, which takes {', '.join(takes)}")


def layout_of(online: dict[str, torch.nn.Module]) -> ParamLayout:
    """The federated vector's layout of an SB3 agent's online networks.

    Every parameter of each module, named ``<key>.<parameter name>`` in the dict's order, the last
    linear layer of each (its weight and bias) as the head. Both engines use it, so a model trained
    by one engine loads in the other.

    :param online: the online networks by prefix (DQN: ``{"q_net": ...}``; DDPG: ``{"actor": ...,
        "critic": ...}``)
    """
    shapes, head = {}, []
    for prefix, module in online.items():
        names = [n for n, _ in module.named_parameters()]
        for name, p in module.named_parameters():
            shapes[f"{prefix}.{name}"] = tuple(p.shape)
        head += [f"{prefix}.{n}" for n in names[-2:]]  # the last linear layer's weight and bias
    return ParamLayout.from_shapes(shapes, head)
