"""The vectorised RL engine (``engine=vectorised``): a worker's DQN or DDPG clients trained as one batch.

* :mod:`~morlfed.tasks.rl.vectorised.engine` -- the clients of a worker, trained in lockstep;
* :mod:`~morlfed.tasks.rl.vectorised.factory`, :mod:`~morlfed.tasks.rl.vectorised.host` -- the
  engine's picklable factory and its host (one per worker);
* :mod:`~morlfed.tasks.rl.vectorised.rollout`, :mod:`~morlfed.tasks.rl.vectorised.explore`,
  :mod:`~morlfed.tasks.rl.vectorised.replay` -- SB3's ``learn`` loop, exploration and replay buffers
  for all the clients at once;
* :mod:`~morlfed.tasks.rl.vectorised.learner`, :mod:`~morlfed.tasks.rl.vectorised.dqn`,
  :mod:`~morlfed.tasks.rl.vectorised.ddpg`, :mod:`~morlfed.tasks.rl.vectorised.mlp`,
  :mod:`~morlfed.tasks.rl.vectorised.optim` -- the stacked networks, their gradient steps and Adam;
* :mod:`~morlfed.tasks.rl.vectorised.template`, :mod:`~morlfed.tasks.rl.vectorised.keywords` -- the
  SB3 agent the engine mirrors and the SB3 arguments it implements.
"""
