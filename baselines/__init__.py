"""The peer strategies the papers compare against, one per module.

Local (no communication), FedAvg, FedProx, CFL, MaTFL, IFCA. Each is registered by name through
``morlfed/conf/algo``.
"""
