"""The RL task: SB3 agents on MO-Gymnasium environments (:class:`~morlfed.tasks.rl.task.RLTask`).

* :mod:`morlfed.tasks.rl.task` -- the task: env spec and preferences from the config;
* :mod:`morlfed.tasks.rl.client` -- the SB3 client (one agent per client);
* :mod:`morlfed.tasks.rl.vectorised` -- the vectorised engine (a worker's clients as stacked tensors);
* what both engines share: :mod:`~morlfed.tasks.rl.agent` (the SB3 agent of a spec, the parameter
  layout), :mod:`~morlfed.tasks.rl.clock` (the exploration clock), :mod:`~morlfed.tasks.rl.state`
  (optimiser slots, the state a client carries across rounds), :mod:`~morlfed.tasks.rl.factory`
  (the fields of an engine's factory), :mod:`~morlfed.tasks.rl.fit_report` (losses and metrics);
* :mod:`morlfed.tasks.rl.report` -- ``final.csv``, ``front.png``, ``metrics.json``.
"""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 5
