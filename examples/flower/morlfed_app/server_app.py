"""The app's ServerApp: runs the federation the run config describes and writes its run directory."""

from pathlib import Path

from morlfed.flower.app import server_app

#: Flower's ServerApp (``[tool.flwr.app.components] serverapp``); relative run directories land in the app's folder
app = server_app(Path(__file__).resolve().parents[1])
