"""morlfed's foundation: flat parameters, messages, seeds, settings, signals, progress, parallelism."""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 0
