"""The seed papers' strategies: FedPref (and, in later modules, FedFew, FedMHC, FedPG)."""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 2
