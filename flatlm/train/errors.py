"""What a run raises that its callers catch by name: ``Diverged`` (exit status 3 of every command
that trains) and ``CheckpointWriteError`` (exit 5). Defined apart from ``flatlm.train.run``, which
re-exports them, so that ``flatlm.cli`` catches them without importing torch and transformers for
a command that never trains (``flatlm --help``, ``flatlm ui``).
"""

from __future__ import annotations

import shutil
from pathlib import Path


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota, a vanished directory). Its
    partial copy is removed; the checkpoints before it are untouched, so a resume continues
    from the newest of them once there is room."""

    @classmethod
    def of(cls, ckpt: Path, cause: BaseException,
           what: str = "checkpoint") -> CheckpointWriteError:
        free = shutil.disk_usage(_existing_parent(ckpt)).free
        why = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        return cls(f"could not write {what} {ckpt} ({why}); {free / 2**30:.2f} GiB free on "
                   "its disk. The earlier checkpoints are intact: free space, then resume")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


class Diverged(RuntimeError):  # noqa: N818 - the name the sweeps and CLI catch
    """Training diverged: the loss read-out was non-finite (a non-finite gradient makes it so at
    the next update) or above ``train.divergence_factor`` times the initial loss log V or the
    first logged loss. Raised before any later checkpoint is written or measured."""

    def __init__(self, step: int, loss: float, reason: str):
        self.step, self.loss, self.reason = step, loss, reason
        super().__init__(f"training diverged at step {step}: train/loss={loss:.6g} {reason}; "
                         "lower train.lr (or raise train.divergence_factor, None = off)")

    def __reduce__(self):  # pickles across processes (Ray) with its fields
        return Diverged, (self.step, self.loss, self.reason)
