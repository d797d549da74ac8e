"""A helper process that died: one error for every process a command starts beside its work (a
batch-building worker of ``train.prefetch_workers=processes``, the background measurer of
``flatlm trial --measure-in background``), which ``flatlm.cli`` ends the same way for every
command: one line saying which process died and how, and the command that resumes (exit 6, as
``flatlm replicate``'s killed ``--jobs`` worker). What the process was doing is lost; the
checkpoints written before are not.

>>> str(WorkerDied("the measuring process", -9))
'the measuring process was killed by SIGKILL'
>>> str(WorkerDied("the measuring process", 2))
'the measuring process failed with exit status 2'
"""

from __future__ import annotations

import signal


class WorkerDied(RuntimeError):  # noqa: N818 - the name the CLI catches, beside Diverged
    """A process this one depended on died; ``returncode``: its exit status (a signal as
    ``subprocess`` gives it, negative), None when unknown (a pool that only says it broke)."""

    def __init__(self, what: str, returncode: int | None = None):
        self.what, self.returncode = what, returncode
        super().__init__(f"{what} {how_it_ended(returncode)}")

    def __reduce__(self):  # crosses process boundaries (Ray) with its fields
        return WorkerDied, (self.what, self.returncode)


def how_it_ended(returncode: int | None) -> str:
    """``was killed by SIGKILL``, ``failed with exit status 2``, or ``died`` (unknown)."""
    if returncode is None:
        return "died (killed, or out of memory)"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"failed with exit status {returncode}"
