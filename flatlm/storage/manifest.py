"""``manifest.json`` of a checkpoint directory: every file's size and SHA-256, written last.

A torn write, a full disk or a flipped bit can leave a file that still parses (a safetensors
tensor with one wrong value loads without complaint). The manifest makes such damage an error
that names the file: the training loop writes it after everything else in the checkpoint
(``flatlm.train.loop``), ``--resume`` checks it before trusting the newest checkpoint and falls
back to an older one (``flatlm.train.state.readable_checkpoints``), and loading a model checks
the files it reads (``flatlm.models.checkpoint.load_checkpoint``). Files added to the directory
later (a checkpoint's measurements) are not in it and not checked. A directory without a
manifest (written before flatlm had one) is accepted as it is.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "model.bin").write_bytes(b"weights")
>>> _ = write_manifest(d)
>>> verify_manifest(d)
>>> listed_files(d)
['model.bin']
>>> _ = (d / "model.bin").write_bytes(b"weightz")
>>> verify_manifest(d)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: .../model.bin: its SHA-256 differs from the manifest's (damaged after it was written)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from flatlm.core.safe_io import write_atomic

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: str | os.PathLike) -> Path:
    """Records every file now in ``directory`` (recursively); returns the manifest's path."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size,
                                                     "sha256": sha256(p)} for p in files}
    path = directory / MANIFEST
    write_atomic(path, json.dumps({"files": entries}, indent=1) + "\n")  # no link followed
    return path


def verify_manifest(directory: str | os.PathLike,
                    which: Callable[[str], bool] = lambda name: True) -> None:
    """Raises ValueError naming the first listed file (of those whose name ``which`` accepts)
    that is missing, of another size or of another hash; nothing when ``directory`` has no
    manifest."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        return
    try:
        entries = json.loads(path.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is damaged ({type(e).__name__}); the checkpoint cannot be "
                         "trusted: use an earlier one") from None
    for name, entry in entries.items():
        if not which(name):
            continue
        file = directory / name
        if not file.is_file():
            raise ValueError(f"{file}: missing, but listed in {path}")
        if file.stat().st_size != entry["size"]:
            raise ValueError(f"{file}: {file.stat().st_size} bytes, the manifest says "
                             f"{entry['size']} (truncated or overwritten)")
        if sha256(file) != entry["sha256"]:
            raise ValueError(f"{file}: its SHA-256 differs from the manifest's (damaged after "
                             "it was written)")


def listed_files(directory: str | os.PathLike) -> list[str] | None:
    """The files ``directory``'s manifest lists (paths relative to it, ``/``-separated): those
    written with the checkpoint, not those added later (its measurements); None without a
    readable manifest."""
    try:
        return sorted(json.loads((Path(directory) / MANIFEST).read_text())["files"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
