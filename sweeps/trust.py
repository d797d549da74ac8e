"""What ``--resume`` lets Ray unpickle: only sweep state this user's flatlm wrote.

On restore Ray unpickles ``tuner.pkl``, the newest ``experiment_state-*.json`` (its trials carry
cloudpickled fields), the search algorithm's ``basic-variant-state-*.json`` /
``search_gen_state-*.json`` / ``searcher-state-*.pkl``, the callbacks' ``callback-states-*.pkl``
and, for the results, each trial's ``error.pkl``: running any code a planted file holds. So
before a restore every such file (:func:`state_files`) must be

* this user's own, not writable by others and not a link, as its directory (:func:`check_trusted`,
  ssh's rule for its keys);
* one that flatlm's driver wrote here: its SHA-256 among those recorded for its name in this
  user's own cache, outside the sweep's storage (:func:`check_digest`). The driver records them
  as Ray writes its state (the :class:`StateDigests` callback, from Ray's staging copy before it
  is synced to the storage), after the Tuner is built or restored, and at the end of each run.

A sweep whose state cannot be verified (copied or moved here, started by an older flatlm) is
refused; ``--trust-state`` accepts it explicitly. No Ray import here but the callback's base.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
from pathlib import Path

from flatlm.core.safe_io import write_atomic
from flatlm.storage.manifest import sha256
from sweeps.rayenv import tune

# Names of the files Ray unpickles on restore, in the experiment directory (and its trials').
STATE_PATTERNS = ("tuner.pkl", "experiment_state-*.json", "basic-variant-state-*.json",
                  "search_gen_state-*.json", "searcher-state-*.pkl", "callback-states-*.pkl",
                  "*.pkl")
KEPT_DIGESTS = 16  # per file name: Ray rewrites its state files; a kill mid-sync leaves an
#   older generation in the storage, which must still verify


class StateUnverified(ValueError):  # noqa: N818 - a refusal the user can overrule
    """The sweep's state files are not known to be the ones flatlm wrote here (no record of
    them on this machine: copied, moved, or an older flatlm); ``--trust-state`` overrules."""


class StateTampered(ValueError):  # noqa: N818 - a refusal nothing overrules
    """A sweep flatlm recorded here holds a state file it did not write (another file under a
    recorded name, or a file the record does not know): evidence of tampering, which no flag
    accepts and no message may advise accepting."""


def _is_state(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in STATE_PATTERNS)


def state_files(path: Path) -> list[Path]:
    """The files of the sweep at ``path`` that Ray would unpickle: its state files and its trials'
    pickles (links included, so that they can be refused); not the trials' checkpoints."""
    found = []
    for entry in _entries(path):
        if _is_state(entry.name) and not entry.is_dir(follow_symlinks=False):
            found.append(Path(entry.path))
        elif entry.is_dir(follow_symlinks=False):
            found += [Path(e.path) for e in _entries(Path(entry.path))
                      if fnmatch.fnmatch(e.name, "*.pkl") and not e.is_dir(follow_symlinks=False)]
    return sorted(found)


def _entries(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def check_trusted(path: Path) -> None:
    """The sweep directory, every file Ray unpickles and the directories holding them must be
    this user's own, not writable by others and not links: a file someone else could write is
    code they could run as you. The same trust rule as ssh's for its keys."""
    files = state_files(path)
    for item in sorted({path, *files, *(f.parent for f in files)}):
        if not (item.is_symlink() or item.exists()):
            continue
        info = item.lstat()
        if item.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise ValueError(f"refusing to resume from {item}: it is "
                             f"{'a symbolic link' if item.is_symlink() else 'not yours alone'} "
                             "(Ray would unpickle it, running any code in it); check its owner "
                             "and permissions (chmod go-w), or start a new sweep with --name")


def digest_file(path: Path) -> Path:
    """Where the digests of the sweep at ``path`` are kept: in this user's own cache, outside
    the sweep's storage (which, on a cluster, others may be able to write)."""
    key = hashlib.sha256(str(path.absolute()).encode()).hexdigest()[:24]
    return _cache_root() / "flatlm" / "tuner-digests" / f"{key}.json"


def _cache_root() -> Path:
    """``$XDG_CACHE_HOME`` where it is set to an absolute path (the XDG rule: a relative one is
    ignored), else ``~/.cache``."""
    chosen = os.environ.get("XDG_CACHE_HOME", "")
    return Path(chosen) if os.path.isabs(chosen) else Path.home() / ".cache"


def _read_record(path: Path) -> dict | None:
    try:
        return json.loads(digest_file(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _recorded(record: dict) -> dict[str, list[str]]:
    """name -> digests; a record written before the other files were kept holds tuner.pkl's."""
    files = dict(record.get("files", {}))
    if "sha256" in record:
        files.setdefault("tuner.pkl", [])
        if record["sha256"] not in files["tuner.pkl"]:
            files["tuner.pkl"] = [*files["tuner.pkl"], record["sha256"]]
    return files


def record_files(path: Path, root: Path, files: list[Path]) -> None:
    """Adds the digests of ``files`` (under ``root``, named relative to it) to the record of the
    sweep at ``path``."""
    if not files:
        return
    record = _read_record(path) or {}
    kept = _recorded(record)
    for file in files:
        name = file.relative_to(root).as_posix()
        digest = sha256(file)
        kept[name] = [*(d for d in kept.get(name, []) if d != digest), digest][-KEPT_DIGESTS:]
    out = {"path": str(path.absolute()), "files": kept}
    if "tuner.pkl" in kept:  # what older flatlm versions read
        out["sha256"] = kept["tuner.pkl"][-1]
    file = digest_file(path)
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(file, json.dumps(out) + "\n", mode=0o600)


def forget_digests(path: Path) -> None:
    """Drops the record of an earlier sweep at ``path`` as a new one starts there: its digests
    would otherwise still verify the old sweep's files, were they put back."""
    digest_file(path).unlink(missing_ok=True)


def record_digest(path: Path) -> None:
    """Records the digests of the state files now in the sweep at ``path`` (after Tune built or
    restored the Tuner, and at the end of a run)."""
    record_files(path, path, [f for f in state_files(path) if f.is_file() and not f.is_symlink()])


def check_digest(path: Path, *, refuse_unrecorded: bool = False) -> None:
    """Before Ray unpickles the sweep's state (running any code in it): each file must be one
    flatlm's driver recorded here. A sweep with no record on this machine (another machine, an
    older flatlm) is refused with ``refuse_unrecorded`` (the driver without --trust-state:
    ``StateUnverified``), else resumed with a warning; a file unknown to the record, or another
    one under a recorded name, is refused whatever the flags (``StateTampered``)."""
    record = _read_record(path)
    if record is None:
        why = (f"no digest of its state ({', '.join(f.name for f in state_files(path)[:3])}) "
               "was recorded on this machine: it was copied or moved here, or started by an "
               "older flatlm")
        if refuse_unrecorded:
            raise StateUnverified(f"refusing to resume from {path}: {why}. Ray would unpickle "
                                  "it, running any code in it")
        print(f"warning: {why}; resuming {path / 'tuner.pkl'} on the owner and permission "
              "checks alone (no digest)", file=sys.stderr, flush=True)
        return
    kept = _recorded(record)
    for file in state_files(path):
        name = file.relative_to(path).as_posix()
        if name not in kept:
            raise StateTampered(f"refusing to resume from {path}: its {name} was not written "
                                  f"by flatlm's driver here (no digest of it in "
                                  f"{digest_file(path)}); Ray would unpickle it, running any "
                                  "code in it. Remove it, or start a new sweep with --name")
        if sha256(file) not in kept[name]:
            raise StateTampered(f"refusing to resume from {path}: its {name} is not the file "
                                  f"flatlm wrote (its SHA-256 differs from the ones kept in "
                                  f"{digest_file(path)}); Ray would unpickle it, running any "
                                  "code in it. Start a new sweep with --name")


class StateDigests(tune.Callback):
    """Records the digests of the state Ray writes, as it writes it: Tune saves its state to a
    staging directory, asks the callbacks for theirs (``get_state``, here: record, and return
    nothing to save) and then copies that directory to the sweep's storage."""

    def __init__(self):
        self._paths: tuple[Path, Path] | None = None  # (staging, storage) of the experiment

    def on_step_begin(self, iteration, trials, **info):
        if self._paths is None and trials:  # the first step with trials: what Tune saved
            storage = trials[0].storage     # before it is recorded at once
            self._paths = (Path(storage.experiment_driver_staging_path),
                           Path(storage.experiment_fs_path))
            self.get_state()

    def get_state(self):
        if self._paths is not None:
            staging, storage = self._paths
            record_files(storage, staging, _staged_state(staging))
        return None  # nothing of its own to restore

    def __getstate__(self):  # pickled into tuner.pkl: the paths belong to this session only
        return {"_paths": None}


def _staged_state(staging: Path) -> list[Path]:
    return [f for f in state_files(staging) if f.is_file() and not f.is_symlink()]
