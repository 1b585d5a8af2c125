"""A directory's manifest: the SHA-256 and size of every file below it, to tell a complete copy from a damaged one.

:func:`write_manifest` walks the whole directory (every file in every subfolder, whatever wrote it)
and writes ``manifest.json`` (:data:`MANIFEST`) last, atomically. :func:`verify_manifest` walks it
again and raises :class:`CorruptError` naming the first file that is missing, has changed, or is not
in the manifest, or the manifest itself when it is missing or unreadable. A checkpoint
(:mod:`morlfed.federation.checkpoint`) has one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from morlfed.storage.rundir import atomic_write_text, to_json

#: The manifest's file name, at the top of the directory it describes.
MANIFEST = "manifest.json"
#: The manifest's format (its ``format`` field).
FORMAT = 1


class CorruptError(ValueError):
    """A directory does not match its manifest; the message names the file.

    :param path: the file that is missing, changed or unlisted (or the manifest)
    :param why: what is wrong with it
    """

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    """Every file below ``directory`` but the manifest, as sorted POSIX paths relative to it."""
    return sorted(
        p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST
    )


def write_manifest(directory: Path) -> None:
    """Write ``directory/manifest.json``: each file's SHA-256 and size (written last, atomically).

    :param directory: the directory, complete
    """
    directory = Path(directory)
    files = {
        name: {"sha256": _sha256(directory / name), "bytes": (directory / name).stat().st_size}
        for name in _files(directory)
    }
    atomic_write_text(directory / MANIFEST, to_json({"format": FORMAT, "files": files}, indent=1) + "\n")


def verify_manifest(directory: Path) -> None:
    """Check every file below ``directory`` against its manifest.

    :param directory: a directory with a manifest
    :raises CorruptError: the manifest is missing or unreadable, or a file is missing, differs, or is not listed
    """
    directory = Path(directory)
    manifest = directory / MANIFEST
    try:
        record = json.loads(manifest.read_text())
        files = record["files"]
        if record.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError(f"not a format-{FORMAT} manifest")
        expected = {str(name): (str(entry["sha256"]), int(entry["bytes"])) for name, entry in files.items()}
    except FileNotFoundError as exc:
        raise CorruptError(manifest, "missing (the directory was never completed)") from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptError(manifest, f"unreadable ({type(exc).__name__}: {exc})") from exc
    present = set(_files(directory))
    for name in sorted(present):
        if name not in expected:
            raise CorruptError(directory / name, "not in the manifest (added after the directory was completed)")
    for name, (sha, size) in expected.items():
        path = directory / name
        if name not in present:
            raise CorruptError(path, "missing (listed in the manifest)")
        if path.stat().st_size != size:
            raise CorruptError(
                path, f"{path.stat().st_size} bytes where the manifest says {size} (truncated or altered)"
            )
        if _sha256(path) != sha:
            raise CorruptError(path, "its SHA-256 differs from the manifest's (the file was altered or damaged)")
