"""One writer per run directory: an exclusive advisory lock held while a process trains or
measures into it.

Two ``flatlm train --out same`` (or two sweep drivers resuming the same trials) would otherwise
interleave checkpoints and metrics silently. ``fcntl.flock`` is released by the kernel when the
holder exits, even by SIGKILL, so no stale lock outlives a crash; the file keeps the holder's
pid for the message. Re-entrant within a process (``run_trial`` holds it around ``train``).
The lock file is opened with ``O_NOFOLLOW``: a planted link is refused, never truncated.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> with writer_lock(d), writer_lock(d):
...     pass
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from flatlm.core.safe_io import open_fd

LOCK_FILE = ".flatlm.lock"
_HELD: dict[Path, int] = {}  # lock path -> nesting depth in this process


class DirectoryBusyError(ValueError):
    """Another live process writes to the directory (its pid: ``holder``)."""

    def __init__(self, directory: Path, holder: str):
        super().__init__(f"{directory} is being written by another process (pid {holder}): "
                         "wait for it to finish, or write to another directory")
        self.directory, self.holder = directory, holder

    def __reduce__(self):  # crosses process boundaries (Ray) with its fields
        return DirectoryBusyError, (self.directory, self.holder)


@contextlib.contextmanager
def writer_lock(directory: str | os.PathLike):
    """Holds the directory's lock for the ``with`` block; DirectoryBusyError if another process
    holds it (its pid named)."""
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    if path in _HELD:
        _HELD[path] += 1
        try:
            yield
        finally:
            _HELD[path] -= 1
        return
    fd = open_fd(path, os.O_RDWR | os.O_CREAT)  # a link there: refused, not truncated
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryBusyError(directory, holder) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _HELD[path] = 1
        yield
    finally:
        _HELD.pop(path, None)
        os.close(fd)  # closing the descriptor releases the lock


def held_elsewhere(directory: str | os.PathLike) -> bool:
    """Whether another process holds ``directory``'s lock now (a trial training into it). It
    asks without taking the lock (``LOCK_SH | LOCK_NB`` on a second descriptor, released at
    once); a directory without a lock file is not held."""
    path = Path(directory).absolute() / LOCK_FILE
    if path in _HELD:
        return False
    try:
        fd = open_fd(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the shared lock, if it was granted
    return False
