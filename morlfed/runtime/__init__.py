"""Where clients run: the client skeleton, the executors (sequential, process, ray), fault injection."""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 2
