"""Writes that never go through a symbolic link, and the checks of an output directory.

A run directory may be shared, copied or prepared by someone else: a link planted under one of
the names flatlm writes (``.flatlm.lock``, ``train_log.jsonl.tmp``, ``checkpoints/step-N.tmp``)
would otherwise make flatlm truncate or overwrite the file it points to. Every file here is
opened with ``O_NOFOLLOW`` (the kernel refuses a link as the last component), and a rename onto
a link is refused unless the caller replaces such a link on purpose.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_atomic(d / "a.json", "{}\\n")
>>> (d / "b.json").symlink_to(d / "a.json")
>>> write_atomic(d / "b.json", "[]")  # doctest: +ELLIPSIS, +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
...
flatlm.core.safe_io.LinkRefusedError: .../b.json is a symbolic link ...
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class LinkRefusedError(ValueError):
    """A path flatlm would write is a symbolic link (planted, or left by someone else)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(f"{path} is a symbolic link; flatlm writes no file through a link "
                         "(it could point anywhere): remove the link, or write elsewhere")
        self.path = Path(path)

    def __reduce__(self):  # crosses process boundaries (Ray) with its field
        return LinkRefusedError, (self.path,)


def refuse_link(path: str | os.PathLike) -> None:
    """Raises LinkRefusedError if ``path`` is a symbolic link (dangling or not)."""
    if os.path.islink(path):
        raise LinkRefusedError(path)


def open_fd(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symbolic link as the last component."""
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkRefusedError(path) from None
        raise


def write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> None:
    """Creates or truncates ``path`` and writes ``data``, never through a link; ``mode``: its
    permissions (e.g. 0o600 for a file only its owner may read)."""
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644 if mode is None else mode)
    if mode is not None:
        os.fchmod(fd, mode)  # also when the file existed
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode())


def append_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = False) -> None:
    """Appends ``data`` on a line of its own (a torn last line is ended first), never through a
    link."""
    fd = open_fd(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    with os.fdopen(fd, "r+b") as f:
        end = f.seek(0, os.SEEK_END)
        if end > 0:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def write_atomic(path: str | os.PathLike, text: str | bytes, *,
                 replace_link: bool = False, mode: int | None = None) -> None:
    """Writes ``path.tmp`` (never through a link) and renames it over ``path``: a reader sees
    the old file or the new one. A link at ``path`` is refused, or replaced (not followed) with
    ``replace_link``. A failed write (a full disk) leaves no temporary file behind."""
    path = Path(path)
    if not replace_link:
        refuse_link(path)
    tmp = path.with_name(path.name + ".tmp")
    data = text.encode() if isinstance(text, str) else text
    try:
        write_bytes(tmp, data, mode)
        os.replace(tmp, path)
    except LinkRefusedError:
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            if not tmp.is_symlink():
                tmp.unlink()
        raise


def make_fresh_dir(path: str | os.PathLike) -> Path:
    """Creates the directory ``path`` anew (a leftover real directory is removed first; a link
    there is refused, never followed or emptied)."""
    path = Path(path)
    refuse_link(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def refuse_links_among(directory: str | os.PathLike, names, flag: str = "--out") -> None:
    """Before any of the files ``names`` is written in ``directory``: a ValueError naming the
    first that is a symbolic link (it, or the temporary ``write_atomic`` writes beside it),
    ``flag`` and the fix. Each write refuses a link too, but only when its turn comes: a writer
    stopped there would leave the files before it new and the others old."""
    for name in names:
        for path in (Path(directory) / name, Path(directory) / f"{name}.tmp"):
            if path.is_symlink():
                raise ValueError(f"{flag} {directory}: {path.name} there is a symbolic link (to "
                                 f"{os.readlink(path)}), and flatlm writes no file through a "
                                 f"link: remove it, or give another {flag}")


def check_output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """The output directory ``path`` as an absolute path, created if missing, or a ValueError
    naming ``flag`` and the fix: a link (dangling or not), a file, or a place that cannot be
    created or written."""
    path = Path(path)
    if path.is_symlink():
        target = os.readlink(path)
        raise ValueError(f"{flag} {path} is a symbolic link (to {target}); flatlm writes no "
                         "file through a link: give the directory itself")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a directory: give a directory (it is "
                         "created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot create it ({e.strerror}); give a directory "
                         "you can write") from None
    try:  # a real write: permission bits say nothing to root, and /proc takes no files

        fd, probe = tempfile.mkstemp(prefix=".flatlm-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write there ({e.strerror}); give a directory "
                         "you can write") from None
    return path.absolute()
