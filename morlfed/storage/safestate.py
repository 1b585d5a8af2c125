"""State files that hold data only (tensors, numbers, strings, lists), so that reading one never runs code.

A state (a client's ``get_state()``, the server's checkpoint state) is a tree of dicts, lists,
tuples, ``None``, bools, ints, floats, strings, torch tensors, numpy arrays and numpy scalars.
:func:`state_to_bytes` writes it as one `safetensors <https://huggingface.co/docs/safetensors>`_
file: every tensor (a numpy array as a tensor) under a number, and the tree, each tensor replaced by
a reference to its number, as UTF-8 JSON in one more tensor (:data:`TREE`). Reading one
(:func:`state_from_bytes`, :func:`load_state`) parses the safetensors header, the tensors' bytes and
that JSON: nothing is unpickled, so no file can make the reader run code. Anything else (a pickle,
a truncated or altered file) is refused with :class:`UnsafeStateError`, whose message names the file.

Objects of other classes are not written: a client turns them into such a tree first
(:func:`plain_attributes` takes an object's data attributes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

#: The tensor that holds the tree's JSON.
TREE = "morlfed.tree"
#: The key of a tagged node (a tuple, a tensor, a dict with other keys than strings, ...) in the JSON.
_TAG = "$"
#: The command that converts an earlier morlfed's pickled checkpoints (:mod:`morlfed.cli.convert`).
CONVERT = "`python -m morlfed.cli.convert RUN_DIR`"
#: The scalar types a tree holds as they are.
_PLAIN = (type(None), bool, int, float, str)


class UnsafeStateError(ValueError):
    """A file that is not a state file of this format: refused without reading anything from it but data."""


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """The JSON node of ``obj``; its tensors go into ``tensors``."""
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach().to("cpu", copy=True).contiguous()
        return {_TAG: "tensor", "key": key, "device": str(obj.device)}
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError(f"{where}: a numpy array of Python objects cannot be written as data")
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.array(obj, copy=True, order="C"))
        return {_TAG: "ndarray", "key": key}
    if isinstance(obj, np.generic):
        return {_TAG: "npscalar", "dtype": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else {_TAG: "tuple", "items": items}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and _TAG not in obj:
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {
            _TAG: "dict",
            "items": [
                [_encode(k, tensors, f"{where} key"), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()
            ],
        }
    raise TypeError(
        f"{where}: a {type(obj).__name__} cannot be written as data (tensors, numbers, strings, lists only)"
    )


def _decode(node: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The value of a JSON node that :func:`_encode` wrote."""
    if isinstance(node, list):
        return [_decode(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    tag = node.get(_TAG)
    if tag is None:
        return {k: _decode(v, tensors) for k, v in node.items()}
    if tag == "tensor":
        tensor = tensors[node["key"]]
        device = torch.device(node["device"])
        return tensor.to(device) if device.type == "cpu" or _available(device) else tensor
    if tag == "ndarray":
        return tensors[node["key"]].numpy()
    if tag == "npscalar":
        return np.dtype(node["dtype"]).type(node["value"])
    if tag == "tuple":
        return tuple(_decode(v, tensors) for v in node["items"])
    if tag == "dict":
        return {_hashable(_decode(k, tensors)): _decode(v, tensors) for k, v in node["items"]}
    raise ValueError(f"unknown node {tag!r}")


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        raise ValueError("a list as a dict key")
    return key


def _available(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def state_to_bytes(state: Any) -> bytes:
    """The state file of ``state`` (see the module docstring).

    :param state: a tree of dicts, lists, tuples, scalars, strings, tensors and numpy arrays
    :raises TypeError: ``state`` holds an object of another class (the message says where)
    """
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, "state")
    tensors[TREE] = torch.frombuffer(bytearray(json.dumps(tree).encode()), dtype=torch.uint8)
    return save_tensors(tensors)


def state_from_bytes(data: bytes, name: str = "state") -> Any:
    """The state that :func:`state_to_bytes` wrote; nothing in ``data`` is ever unpickled.

    :param data: the file's bytes
    :param name: how an error names the file
    :raises UnsafeStateError: ``data`` is not such a file (a pickle, a truncated or altered file)
    """
    try:
        tensors = load_tensors(data)
        tree = json.loads(bytes(tensors.pop(TREE).numpy()).decode())
        return _decode(tree, tensors)
    except (SafetensorError, KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise _refusal(name, data[:9], exc) from exc


#: What a state file is, in the errors that refuse one.
STATE_FILE = "morlfed state file (safetensors with a data tree)"


def file_refusal(path: Path, exc: BaseException, expected: str = STATE_FILE) -> UnsafeStateError:
    """The error for the file ``path`` that failed to read as ``expected``, saying whether it is a pickle.

    :param path: the file (its first bytes tell a pickle)
    :param exc: what failed when the file was read
    :param expected: what the file should have been
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
    except OSError:
        head = b""  # a missing or unreadable file: ``exc`` says so
    return _refusal(str(path), head, exc, expected)


def _refusal(name: str, head: bytes, exc: BaseException, expected: str = STATE_FILE) -> UnsafeStateError:
    """The error for the file ``name`` that is not what it should be, saying whether it is a pickle.

    :param name: how the error names the file
    :param head: the file's first 9 bytes
    :param exc: what failed when the file was read
    :param expected: what the file should have been
    """
    # torch.save's zip, or a bare pickle (a safetensors file's JSON header starts at byte 8)
    if head[:4] == b"PK\x03\x04" or (head[:1] == b"\x80" and head[8:9] != b"{"):
        return UnsafeStateError(
            f"{name}: a pickle, which can run code when read: refused (if it is a checkpoint that an "
            f"earlier morlfed wrote in a run directory you trust, convert it with {CONVERT})"
        )
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UnsafeStateError(f"{name}: not a {expected}: {detail}")


def save_state(path: Path, state: Any) -> None:
    """Write ``state`` to ``path`` (:func:`state_to_bytes`).

    :param path: the file
    :param state: the state
    """
    Path(path).write_bytes(state_to_bytes(state))


def load_state(path: Path) -> Any:
    """The state in ``path`` (:func:`state_from_bytes`).

    :param path: the file
    :raises UnsafeStateError: it is not a state file; the message names ``path``
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UnsafeStateError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    return state_from_bytes(data, str(path))


def check_state(path: Path) -> None:
    """Check that ``path`` is a state file: its safetensors header and its data tree (no tensor data is read).

    :param path: the file
    :raises UnsafeStateError: it is not one (a pickle, a truncated or altered file); the message names ``path``
    """
    try:
        with safe_open(str(path), framework="pt") as fh:
            keys = set(fh.keys())
            tree = json.loads(bytes(fh.get_tensor(TREE).numpy()).decode())
        missing = _references(tree) - keys
        if missing:
            raise ValueError(f"the data tree names tensors the file does not hold ({', '.join(sorted(missing)[:3])})")
    except (SafetensorError, OSError, KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise file_refusal(path, exc) from exc


def _references(node: Any) -> set[str]:
    """The tensor keys a data tree refers to."""
    if isinstance(node, list):
        return set().union(*map(_references, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    if node.get(_TAG) in ("tensor", "ndarray"):
        return {str(node["key"])}
    return set().union(*map(_references, node.values())) if node else set()


def plain_attributes(obj: object) -> dict[str, Any]:
    """The data attributes of ``obj`` that a state file can hold: arrays, tensors, numbers, strings and tuples of them.

    An SB3 replay buffer, for example, becomes its arrays, position and sizes (not its spaces or device).

    :param obj: any object with a ``__dict__``
    """
    return {name: value for name, value in vars(obj).items() if _is_data(value)}


def _is_data(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_data(v) for v in value)
    return isinstance(value, (*_PLAIN, np.ndarray, np.generic, torch.Tensor)) and not (
        isinstance(value, np.ndarray) and value.dtype == object
    )
