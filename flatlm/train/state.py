"""Resumable training state as plain data, and where checkpoints live.

A checkpoint is a directory ``OUT/checkpoints/step-<N>/`` (N = updates done) holding the model in
the ``save_checkpoint`` layout (so transformers' ``from_pretrained`` reads it) and
``training_state.pt``: a ``TrainState`` as a dict of tensors, numbers, strings and lists.
The learning rate is a pure function of the step, so the step is the schedule's whole state.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

STATE_NAME = "training_state.pt"
_STEP_DIR = re.compile(r"step-(\d+)")


@dataclass
class TrainState:
    """Everything besides the weights that a resumed run needs to continue exactly."""

    step: int  # updates done
    data: dict  # the data position (BatchPipeline.state_dict)
    rng: dict  # global RNG states: {"cpu": ByteTensor, "cuda": [ByteTensor per device]}
    optimizer: dict  # optimizer.state_dict()
    config: dict  # the resolved TrainConfig, to check that a resumed run asks for the same run
    history: list[dict] = field(default_factory=list)  # metrics logged so far
    window: dict = field(default_factory=dict)  # metric sums since the last log, and their count


def capture_rng(device: torch.device) -> dict:
    """The global RNG states that dropout draws from on ``device``."""
    rng = {"cpu": torch.get_rng_state(), "cuda": []}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict, device: torch.device) -> None:
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])


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
    found = find_checkpoints(out_dir)
    return found[max(found)] if found else None
