"""The SB3 keyword arguments (an env spec's ``agent_kwargs``) the vectorised engine implements.

The engine does not run SB3's ``learn``: it reads the hyper-parameters it implements off a template
SB3 agent (:mod:`.template`) and trains with its own learners, replay, exploration and lockstep
loop. An SB3 argument none of them reads (``replay_buffer_kwargs``, ``n_steps``, a features
extractor, another optimiser, a learning-rate schedule ...) would change the SB3 client's training
and not this engine's, so a spec that holds one is refused (:func:`check_agent_kwargs`), by the
engine and, before anything is written, by the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from morlfed.envs import EnvSpec

_BOTH = {
    "learning_rate": "Adam's step size (optim.MaskedAdam; a constant: a schedule is refused by the learner)",
    "buffer_size": "each client's replay capacity (replay.StackedReplay)",
    "learning_starts": "env steps of random actions before the first gradient step (rollout.LoopSettings)",
    "batch_size": "the minibatch of a gradient step (rollout.LoopSettings)",
    "tau": "the target networks' Polyak step (the learner)",
    "gamma": "the TD target's discount (the learner)",
    "train_freq": "a rollout's length in steps or episodes (rollout.LoopSettings)",
    "gradient_steps": "gradient steps after a rollout, -1: its env steps (rollout.LoopSettings)",
    "policy_kwargs.net_arch": "the hidden layers of the networks SB3 builds (mlp.StackedMLP runs them)",
    "policy_kwargs.activation_fn": "their activation, one of mlp.ACTIVATIONS (mlp.StackedMLP)",
    "policy_kwargs.optimizer_kwargs.betas": "Adam's moment decay rates (optim.MaskedAdam)",
    "policy_kwargs.optimizer_kwargs.eps": "Adam's denominator term (optim.MaskedAdam)",
}

#: Every keyword the vectorised engine implements, per agent, with what implements it; a keyword
#: inside ``policy_kwargs`` (or its ``optimizer_kwargs``) is named by its dotted path. Each one is
#: checked against SB3 by tests/test_vectorised_dqn.py / test_vectorised_ddpg.py and shown to change
#: the training by tests/test_vectorised_keywords.py.
HONOURED: dict[str, dict[str, str]] = {
    "dqn": _BOTH
    | {
        "target_update_interval": "env steps between target updates (dqn.StackedDQN.after_env_step)",
        "exploration_fraction": "the budget-wide epsilon decay (explore.EpsilonGreedy, clock.EpsilonDecay)",
        "exploration_initial_eps": "the budget-wide epsilon decay (explore.EpsilonGreedy, clock.EpsilonDecay)",
        "exploration_final_eps": "the budget-wide epsilon decay (explore.EpsilonGreedy, clock.EpsilonDecay)",
        "max_grad_norm": "per-client gradient clipping (dqn.StackedDQN.gradient_step)",
    },
    "ddpg": _BOTH
    | {
        "action_noise_std": "the Gaussian exploration noise (explore.ActionNoise)",
        "policy_kwargs.n_critics": "the critics, whose minimum is the TD target (ddpg.StackedDDPG)",
    },
}


def unhonoured(spec: EnvSpec) -> list[str]:
    """The keywords of ``spec.agent_kwargs`` the vectorised engine does not implement, in their order.

    They are named by dotted paths (``replay_buffer_kwargs``,
    ``policy_kwargs.features_extractor_class``).

    :param spec: an env spec whose agent is ``dqn`` or ``ddpg``
    """
    honoured = HONOURED[spec.agent]

    def walk(kwargs: Mapping[str, Any], prefix: str) -> list[str]:
        refused = []
        for key, value in kwargs.items():
            name = prefix + key
            # a group of keywords (policy_kwargs, optimizer_kwargs) is looked into, None being SB3's
            # empty group; any other value, a mapping too (net_arch={pi, qf}), is one argument
            group = any(h.startswith(f"{name}.") for h in honoured)
            if group and isinstance(value, Mapping):
                refused += walk(value, f"{name}.")
            elif not (group and value is None) and name not in honoured:
                refused.append(name)
        return refused

    return walk(spec.agent_kwargs, "")


def check_agent_kwargs(spec: EnvSpec) -> None:
    """Raise ``ValueError`` naming the ``spec.agent_kwargs`` keywords the vectorised engine does not implement.

    The message also names the keywords it does implement.

    :param spec: the environment spec (its ``agent`` is ``dqn`` or ``ddpg``)
    """
    refused = unhonoured(spec)
    if refused:
        raise ValueError(
            f"engine=vectorised does not implement agent_kwargs {', '.join(refused)} (env {spec.name}, agent "
            f"{spec.agent}); it implements {', '.join(sorted(HONOURED[spec.agent]))}. "
            "Remove them, or train with engine=sb3, which passes every SB3 argument to SB3"
        )
