"""The peer strategies the papers compare against, one per module.

Local (no communication), FedAvg, FedProx, CFL, MaTFL, IFCA. Each is registered by name through
``morlfed/conf/algo``.
"""

if __name__ != "morlfed.baselines":
    # the folder also sits at the repository root, where `import baselines` would load a second copy
    # of every module (a second class for each class: isinstance fails across the two)
    raise ImportError(f"{__name__!r} is the package morlfed.baselines: import it as morlfed.baselines")

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 2
#: the peers are strategies: they build on morlfed/strategies/ (its base class, its similarity maths)
GROUP = "strategies"
