"""The models a run deploys, written as files anyone can load: ``RUN_DIR/models/``.

A run writes its clients' deployed models when it ends, into ``RUN_DIR/models/``, and with every
checkpoint, into ``checkpoints/round_<r>/models/``. Each distinct model is written once (a cluster
model that several clients share is one file), and a map says which client deploys which:

* ``model_<k>.safetensors``: model ``k``'s tensors (safetensors, no code runs on load), each named
  as the parameter layout names it (:class:`~morlfed.core.params.ParamLayout`: for an RL run, the SB3
  policy's parameter names, such as ``q_net.q_net.0.weight``);
* ``deployment.json``: the format and its version, the round after which the models were taken,
  the parameter layout (names, shapes, head layers), the files with the clients that deploy each,
  and per client its file and the strategy's model id (``model_id``; -1: its own fine-tuned model,
  "+FT"), with what those ids mean (``model_id_note``).

:func:`deployed_weights` resolves the clients that deploy a private personal model (``None`` in
:meth:`morlfed.federation.FederatedRound.deployed`) through the executor (or the Flower nodes) that holds them; :class:`Deployment` holds the
result, writes it and reads it back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from morlfed.core.params import ParamLayout
from morlfed.storage.safestate import UnsafeStateError, file_refusal


class PersonalModels(Protocol):
    """Where the clients' private personal models come from: an executor, or a Flower front-end's nodes."""

    def personal_models(self, cids: Sequence[int]) -> dict[int, torch.Tensor | None]:
        """Clients ``cids``' private personal models (``None``: one that has none yet).

        :param cids: client ids
        """
        ...


#: the folder of a run directory (and of each checkpoint) that holds the deployed models
MODELS = "models"
#: the map's file name in that folder
MAP_FILE = "deployment.json"
#: what ``deployment.json``'s ``format`` says, and the version of that format
FORMAT, VERSION = "morlfed-deployed-models", 1


@dataclass(frozen=True)
class Deployment:
    """Every client's deployed model, each distinct model once.

    :param round: the round after which the models were taken
    :param layout: the layout of the flat parameter vectors
    :param models: the distinct models, ``[d]`` float32 each
    :param client_model: each client's index into ``models``
    :param model_ids: each client's model id as the strategy numbers it (-1: its own "+FT" model)
    :param model_id_note: what the model ids mean
    """

    round: int
    layout: ParamLayout
    models: tuple[torch.Tensor, ...]
    client_model: dict[int, int]
    model_ids: dict[int, int]
    model_id_note: str = ""

    @classmethod
    def of(
        cls,
        round: int,
        layout: ParamLayout,
        deployed: Mapping[int, torch.Tensor],
        model_ids: Mapping[int, int],
        model_id_note: str = "",
    ) -> Deployment:
        """Group the clients' models into distinct ones (equal bytes: one model), in client order.

        :param round: the round after which the models were taken
        :param layout: their layout
        :param deployed: each client's ``[d]`` model
        :param model_ids: each client's model id (:meth:`~morlfed.strategies.base.Strategy.model_id`)
        :param model_id_note: what the model ids mean
        """
        models: list[torch.Tensor] = []
        index: dict[str, int] = {}
        client_model = {}
        for cid in sorted(deployed):
            model = deployed[cid].detach().float().cpu().contiguous()
            digest = hashlib.sha256(model.numpy().tobytes()).hexdigest()
            if digest not in index:
                index[digest] = len(models)
                models.append(model)
            client_model[cid] = index[digest]
        ids = {cid: int(model_ids[cid]) for cid in client_model}
        return cls(round, layout, tuple(models), client_model, ids, model_id_note)

    def model(self, cid: int) -> torch.Tensor:
        """Client ``cid``'s deployed model as a ``[d]`` vector.

        :raises KeyError: the run has no client ``cid``
        """
        if cid not in self.client_model:
            raise KeyError(f"no client {cid}: the run's clients are 0-{len(self.client_model) - 1}")
        return self.models[self.client_model[cid]]

    def named(self, cid: int) -> dict[str, torch.Tensor]:
        """Client ``cid``'s deployed model as named tensors (the layout's names and shapes)."""
        return self.layout.unflatten(self.model(cid))

    def write(self, directory: Path) -> None:
        """Write the models and ``deployment.json`` into ``directory``, replacing what it held.

        The folder is assembled beside it and renamed into place, so a reader never sees half of it.

        :param directory: the ``models`` folder (of a run directory or of a checkpoint being written)
        """
        directory = Path(directory)
        tmp = directory.with_name(f".tmp-{directory.name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        files = [f"model_{k}.safetensors" for k in range(len(self.models))]
        for k, (file, model) in enumerate(zip(files, self.models)):
            named = {name: t.clone() for name, t in self.layout.unflatten(model).items()}
            # one metadata entry: safetensors writes several in a hash map's order, which changes from
            # one write to the next, and equal models must be equal files (the checkpoints' hashes)
            about = json.dumps({"format": FORMAT, "model": k, "round": self.round}, sort_keys=True)
            save_file(named, str(tmp / file), metadata={"morlfed": about})
        record = {
            "format": FORMAT,
            "version": VERSION,
            "round": self.round,
            "layout": self.layout.to_dict(),
            "model_id_note": self.model_id_note,
            "models": [
                {"file": file, "clients": [c for c, m in self.client_model.items() if m == k]}
                for k, file in enumerate(files)
            ],
            "clients": [
                {"client": cid, "file": files[k], "model_id": self.model_ids[cid]}
                for cid, k in sorted(self.client_model.items())
            ],
        }
        (tmp / MAP_FILE).write_text(json.dumps(record, indent=1) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(tmp, directory)

    @classmethod
    def read(cls, directory: Path) -> Deployment:
        """Read what :meth:`write` wrote.

        :param directory: a ``models`` folder
        :raises FileNotFoundError: it holds no ``deployment.json``
        :raises ValueError: ``deployment.json`` is of another format or a newer version
        """
        directory = Path(directory)
        record = _load_map(directory)
        layout = ParamLayout.from_dict(record["layout"])
        files = [entry["file"] for entry in record["models"]]
        models = tuple(layout.flatten(load_file(str(directory / file))) for file in files)
        clients = record["clients"]
        client_model = {int(c["client"]): files.index(c["file"]) for c in clients}
        model_ids = {int(c["client"]): int(c["model_id"]) for c in clients}
        return cls(int(record["round"]), layout, models, client_model, model_ids, str(record["model_id_note"]))


def check_models(directory: Path) -> None:
    """Check a ``models`` folder's files without loading a tensor: the map parses and each model is safetensors.

    :param directory: a ``models`` folder (of a run directory or of a checkpoint)
    :raises UnsafeStateError: a file is not what :meth:`Deployment.write` writes (the message names it)
    """
    directory = Path(directory)
    try:
        files = [str(entry["file"]) for entry in _load_map(directory)["models"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise UnsafeStateError(f"{directory / MAP_FILE}: not a {FORMAT} map: {str(exc).splitlines()[0]}") from exc
    for file in files:
        try:
            with safe_open(str(directory / file), framework="pt") as fh:
                fh.keys()
        except (SafetensorError, OSError) as exc:
            raise file_refusal(directory / file, exc, "safetensors") from exc


def _load_map(directory: Path) -> dict[str, Any]:
    """The deployment map of the ``models`` folder ``directory``, its format and version checked.

    :raises FileNotFoundError: it holds no ``deployment.json``
    :raises ValueError: it is not JSON, or of another format or a newer version
    """
    path = directory / MAP_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no deployed models: no {MAP_FILE}")
    record = json.loads(path.read_text())
    if not isinstance(record, dict) or record.get("format") != FORMAT or int(record.get("version", 0)) > VERSION:
        found = (record.get("format"), record.get("version")) if isinstance(record, dict) else (None, None)
        raise ValueError(
            f"{path} is not a {FORMAT} map of version <= {VERSION}: format {found[0]!r}, version {found[1]!r}"
        )
    return record


def deployed_weights(
    deployed: Mapping[int, torch.Tensor | None], source: PersonalModels, initial: torch.Tensor
) -> dict[int, torch.Tensor]:
    """Each client's deployed model, its private personal model fetched where it deploys one.

    :param deployed: :meth:`~morlfed.federation.FederatedRound.deployed` (``None``: the client's personal model)
    :param source: where the personal models are fetched from (the executor that owns the clients, ...)
    :param initial: the shared initial model, which a client that never trained a personal model deploys
    """
    personal = source.personal_models([cid for cid, model in deployed.items() if model is None])
    resolved = {cid: model for cid, model in deployed.items() if model is not None}
    resolved |= {cid: initial if model is None else model for cid, model in personal.items()}
    return {cid: resolved[cid] for cid in deployed}
