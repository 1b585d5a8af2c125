"""Folder for hydra's search path (:data:`envs.CONF_DIR`); its ``env/`` holds one YAML per environment."""
