"""Resumable training state as plain data, and where checkpoints live.

A checkpoint is a directory ``OUT/checkpoints/step-<N>/`` (N = updates done) holding the model in
the ``save_checkpoint`` layout (so transformers' ``from_pretrained`` reads it) and
``training_state.pt``: a ``TrainState`` as a dict of tensors, numbers, strings and lists.
The learning rate is a pure function of the step, so the step is the schedule's whole state.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flatlm.models.checkpoint import (  # defers transformers
    TRAINING_STATE_NAME,
    is_model_file,
    load_checkpoint,
)
from flatlm.storage.manifest import verify_manifest

STATE_NAME = TRAINING_STATE_NAME
_STEP_DIR = re.compile(r"step-(\d+)")

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Everything besides the weights that a resumed run needs to continue exactly."""

    step: int  # updates done
    data: dict  # the data position (BatchPipeline.state_dict)
    rng: dict  # global RNG states: {"cpu": ByteTensor, "cuda": [the training device's]}
    optimizer: dict  # optimizer.state_dict()
    config: dict  # the resolved TrainConfig, to check that a resumed run asks for the same run
    history: list[dict] = field(default_factory=list)  # metrics logged so far
    window: dict = field(default_factory=dict)  # metric sums since the last log, and their count


def capture_rng(device: torch.device) -> dict:
    """The global RNG states that dropout draws from on ``device``: the CPU's and, on CUDA, that
    device's alone (not every visible GPU's: a resume with fewer GPUs visible must still load)."""
    rng = {"cpu": torch.get_rng_state(), "cuda": []}
    if device.type == "cuda":
        rng["cuda"] = [torch.cuda.get_rng_state(device)]
    return rng


def restore_rng(rng: dict, device: torch.device) -> None:
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and rng["cuda"]:
        states = rng["cuda"]  # one state; or, saved before, one per visible device
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_rng_state(states[min(index, len(states) - 1)], device)


def save_state(state: TrainState, ckpt_dir: Path) -> None:
    torch.save(dataclasses.asdict(state), Path(ckpt_dir) / STATE_NAME)


def load_state(ckpt_dir: Path) -> TrainState:
    return TrainState(**torch.load(Path(ckpt_dir) / STATE_NAME, map_location="cpu",
                                 weights_only=True))


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    """``out_dir/checkpoints/step-<step>``."""
    return Path(out_dir) / "checkpoints" / f"step-{step}"


def find_checkpoints(out_dir: Path) -> dict[int, Path]:
    """Complete checkpoints under ``out_dir`` (those with a training state), by step."""
    root = Path(out_dir) / "checkpoints"
    found = {}
    for d in root.iterdir() if root.is_dir() else ():
        m = _STEP_DIR.fullmatch(d.name)
        if m and (d / STATE_NAME).is_file():
            found[int(m.group(1))] = d
    return dict(sorted(found.items()))


def newest_checkpoint(out_dir: Path) -> Path | None:
    """The newest checkpoint that loads (training state and model); unreadable ones (a torn
    write, a full disk, a truncated file) are skipped with a warning naming the file."""
    return readable_checkpoints(out_dir)[0]


def readable_checkpoints(out_dir: Path, before: int | None = None
                         ) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest checkpoint that loads or None, [(newer unreadable checkpoint, why)]);
    ``before``: only the checkpoints at earlier steps are looked at (a run that must train a
    later one again, ``flatlm.runs.trial.retrain_from``)."""
    bad = []
    for step, ckpt in sorted(find_checkpoints(out_dir).items(), reverse=True):
        if before is not None and step >= before:
            continue
        try:
            verify_manifest(ckpt, lambda name: not is_model_file(name))  # load_checkpoint
            load_state(ckpt)  # checks the model's files
            load_checkpoint(ckpt)
        except Exception as e:  # noqa: BLE001 - any unreadable file: fall back to an older one
            why = _why(e)
            log.warning("checkpoint %s is unreadable (%s); falling back to an older one",
                        ckpt, why)
            bad.append((ckpt, why))
            continue
        return ckpt, bad
    return None, bad


def measurable_model(ckpt: Path):
    """The checkpoint's model (``load_checkpoint``: on the CPU, in eval mode) to be measured,
    or None when it fails its manifest or does not load: it is then set aside, as a resume sets
    aside a newer checkpoint that does not load, and the run trains it again
    (``flatlm.runs.trial.retrain_from``) instead of stopping at it on every rerun."""
    try:
        return load_checkpoint(ckpt)[0]
    except Exception as e:  # noqa: BLE001 - any unreadable file: set aside, trained again
        log.warning("checkpoint %s is unreadable (%s); set aside as %s, to be trained again",
                    ckpt, _why(e), set_aside_dir(ckpt).name)
        set_aside(ckpt)
        return None


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def set_aside_dir(ckpt: Path) -> Path:
    """Where ``set_aside`` puts the checkpoint ``ckpt``: ``step-<N>.corrupt`` beside it."""
    return Path(ckpt).with_name(Path(ckpt).name + ".corrupt")


def set_aside(ckpt: Path) -> Path:
    """Renames an unreadable checkpoint to ``step-<N>.corrupt`` (kept for inspection, no longer
    found), replacing an older one set aside under that name."""
    target = set_aside_dir(ckpt)
    shutil.rmtree(target, ignore_errors=True)
    ckpt.rename(target)
    return target
