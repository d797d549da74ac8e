"""A pack's Ray trial (``--pack K``): its members trained as one model (``flatlm.runs.pack``),
each reported to its own MLflow run, in its own trial directory, exactly as the unpacked
trainable (``sweeps.trainable``) reports a trial, so that the runs table, the report and resume
see one run per member.

Tune hears once per round of checkpoints: one result whose ``members`` holds each member's row
(the console prints a line per member), and one Tune checkpoint holding, per member, its newest
measured checkpoint with its tracking state (``sweeps.travel``) under ``<member>/``. A retried
pack restores every member from it (on a fresh node) and resumes them together.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from flatlm.core.config import apply_overrides, from_dict
from flatlm.runs.pack import run_pack
from flatlm.runs.trial import TrialConfig, validate_trial, with_downstream_resolved
from flatlm.train.run import Diverged
from sweeps.console import member_label
from sweeps.progress_board import poster
from sweeps.rayenv import tune
from sweeps.trainable import (
    ARTIFACT_FOLDERS,
    TRIAL_ARTIFACTS,
    end_diverged,
    end_finished,
    quiet_ray_train,
    tracker_for,
    trainable,
)
from sweeps.travel import restore_tracking, save_tracking

ROUNDS_DIR = "rounds"  # under the pack's directory: the round handed to Tune, then removed


def any_trial(config: dict) -> None:
    """The sweeps' Tune function trainable: a trial (``overrides``: ``sweeps.trainable``), a
    pack of one (its trial), or a pack (``pack_trainable``)."""
    pack = config.get("pack")
    if pack is None:
        return trainable(config)
    if len(pack) == 1:
        return trainable({**config, "overrides": pack[0]})
    return pack_trainable(config)


def pack_trainable(config: dict) -> None:
    """``config``: ``base``, ``pack`` (each member's point of the grid) and ``sweep``."""
    quiet_ray_train()
    sweep = config["sweep"]
    trials_dir = Path(sweep["trials_dir"])
    pack_id = tune.get_context().get_trial_id()
    names = [member_label(p, pack_id, k) for k, p in enumerate(config["pack"])]
    cfgs = [apply_overrides(from_dict(TrialConfig, config["base"]), p) for p in config["pack"]]
    source, _ = validate_trial(cfgs[0])
    cfgs = [with_downstream_resolved(c, source) for c in cfgs]  # the params name the rule
    outs = [trials_dir / name for name in names]
    run_ids = _restored_run_ids(outs)
    trackers = [tracker_for(c, sweep, n, d, run_ids.get(n))
                for c, n, d in zip(cfgs, names, outs, strict=True)]
    rounds = Rounds(trials_dir / tune.get_context().get_trial_name() / ROUNDS_DIR, trackers)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        results = run_pack(cfgs, outs, [rounds.reporter(k) for k in range(len(cfgs))],
                           device=device, eval_cache=trials_dir.parents[1] / "eval_cache",
                           on_progress=poster(tune.get_context().get_trial_name()),
                           on_round=rounds.report)
    except BaseException:
        for tracker in trackers:
            tracker.finish("FAILED")
        raise
    for cfg, name, out, tracker, result in zip(cfgs, names, outs, trackers, results,
                                               strict=True):
        if isinstance(result, Diverged):  # its run FAILED and tagged; the others finished
            end_diverged(tracker, out, result)
        else:
            end_finished(tracker, out, name, cfg)


def _restored_run_ids(outs: list[Path]) -> dict[str, str | None]:
    """Each member's MLflow run id from the pack's restored Tune checkpoint (its files copied
    into the member's directory where missing: ``restore_tracking``); {} without one."""
    ckpt = tune.get_checkpoint()
    if ckpt is None:
        return {}
    found = {}
    with ckpt.as_directory() as d:
        for out in outs:
            if (Path(d) / out.name).is_dir():
                found[out.name] = restore_tracking(Path(d) / out.name, out)
    return found


class Rounds:
    """The members' reports, sent to MLflow at once and to Tune once per round."""

    def __init__(self, folder: Path, trackers: list):
        self.folder, self.trackers = folder, trackers
        self.pending: dict[str, dict] = {}  # member -> its row since Tune last heard
        self.newest: dict[int, tuple[int, Path]] = {}  # member -> (step, checkpoint) reported

    def reporter(self, k: int):
        tracker = self.trackers[k]

        def report(step: int, metrics: dict, ckpt_dir: Path) -> None:
            tracker.report(step, metrics, ckpt_dir)  # MLflow first, as the unpacked trainable
            tracker.sync_artifacts(tracker.trial_dir, patterns=TRIAL_ARTIFACTS,
                                   folders=ARTIFACT_FOLDERS)
            self.pending[tracker.trial_dir.name] = {**metrics, "step": step}
            self.newest[k] = (step, Path(ckpt_dir))
        return report

    def report(self) -> None:
        """One Tune result (each member's new row) and checkpoint (each member's newest)."""
        if not self.pending:
            return
        step = max(row["step"] for row in self.pending.values())
        round_dir = self.folder / f"step-{step}"
        shutil.rmtree(round_dir, ignore_errors=True)
        for k, (member_step, ckpt) in self.newest.items():
            tracker = self.trackers[k]
            target = round_dir / tracker.trial_dir.name
            shutil.copytree(ckpt, target, copy_function=_link_or_copy)
            save_tracking(target, tracker.trial_dir, tracker.run_id, member_step)
        tune.report({"step": step, "members": self.pending},
                    checkpoint=tune.Checkpoint.from_directory(str(round_dir)))
        self.pending = {}
        shutil.rmtree(round_dir, ignore_errors=True)  # Tune persisted its copy


def _link_or_copy(src: str, dst: str) -> None:
    """A checkpoint's files never change once written: a hard link is a copy, for free."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
