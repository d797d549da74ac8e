"""What a resumed sweep must share with the one it continues (its settings, recorded at the
start), and one driver per sweep at a time."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from flatlm.core.config import flatten_dict, to_dict
from flatlm.runs.trial import TrialConfig
from flatlm.storage.dirlock import DirectoryBusyError, writer_lock
from sweeps.spec import Sweep


@contextlib.contextmanager
def one_driver(trials_dir: Path, name: str):
    """Holds the sweep's lock (``flatlm.storage.dirlock`` on its trials directory): a second driver
    of the same sweep, say a second ``--resume``, would run the same trials again beside the first.
    The kernel drops the lock when a driver dies, so none goes stale."""
    with contextlib.ExitStack() as held:
        try:  # only taking the lock is this error; the sweep's own errors pass through
            held.enter_context(writer_lock(trials_dir))
        except DirectoryBusyError as e:
            raise ValueError(f"sweep {name!r} is being run by another driver (pid {e.holder}) "
                             f"in {trials_dir.parent.parent}: wait for it to end, or stop it "
                             f"(kill -INT {e.holder}) and then --resume") from None
        yield


SETTINGS_FILE = "flatlm_sweep.json"  # in the Ray experiment directory: what the trials run


def sweep_settings(sweep: Sweep) -> dict:
    """The settings a resumed sweep must share with the one it continues (flat keys)."""
    def plain(o):
        return {k: v for k, v in vars(o).items() if not k.startswith("_")} \
            if hasattr(o, "__dict__") else str(o)

    space = json.loads(json.dumps(sweep.space, default=plain, sort_keys=True))
    return {**flatten_dict(to_dict(sweep.base), "base."), **flatten_dict(space, "space.")}


def check_resume_settings(sweep: Sweep, path: Path, resume: bool) -> None:
    """``--resume`` with settings other than those ``record_settings`` kept is an error naming
    them (Tune would silently keep the old ones). A setting the record lacks (a config field
    added to flatlm since the sweep started) counts as its default: an upgrade alone changes
    nothing."""

    file = path / SETTINGS_FILE
    now = sweep_settings(sweep)
    if resume and file.exists():
        before = json.loads(file.read_text())
        defaults = flatten_dict(to_dict(TrialConfig()), "base.")
        changed = sorted(k for k in {*before, *now}
                         if before.get(k, defaults.get(k)) != now.get(k))
        if changed:
            diffs = "; ".join(f"{k}: {before.get(k, defaults.get(k))!r} -> {now.get(k)!r}"
                              for k in changed[:5])
            raise ValueError(f"--resume continues the sweep as it was started, but these "
                             f"settings changed: {diffs}{' ...' if len(changed) > 5 else ''}. "
                             "Resume with the original --set values, or start a new sweep "
                             "with --name")


def record_settings(sweep: Sweep, path: Path) -> None:
    """Writes the settings of a sweep being started (kept when one is resumed)."""
    file = path / SETTINGS_FILE
    if not file.exists():
        path.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(sweep_settings(sweep), indent=1, sort_keys=True) + "\n")
