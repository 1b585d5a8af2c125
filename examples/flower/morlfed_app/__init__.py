"""morlfed as a Flower app: ``server_app.app`` and ``client_app.app`` (``[tool.flwr.app.components]``)."""
