"""The run directory's files: logs, status, data-only state files, manifests, the run lock."""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 1
