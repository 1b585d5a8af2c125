"""morlfed's hydra plugins: hydra finds plugins in the ``hydra_plugins`` namespace package only."""
