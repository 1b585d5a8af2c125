"""The kinds of federated problem a run can train: ``rl`` (the default) and ``vision``.

Each is a :class:`~morlfed.tasks.base.Task` in its own sub-package, chosen by the ``task`` config group.
"""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 4
