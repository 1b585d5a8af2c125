"""The app's ClientApp: each node runs the morlfed client of its ``partition-id``."""

from morlfed.flower.app import client_app

#: Flower's ClientApp (``[tool.flwr.app.components] clientapp``)
app = client_app()
