"""The command line's machinery: override checks, config groups, resume and branch, start and stop."""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 7
