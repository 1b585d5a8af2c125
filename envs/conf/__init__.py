"""Folder for hydra's search path (:data:`morlfed.envs.CONF_DIR`); its ``env/`` holds one YAML per environment."""
