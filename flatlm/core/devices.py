"""The one reading of a ``--device`` value: ``auto``, ``cpu``, ``cuda`` or ``cuda:<i>``, checked
against this machine before any work (a missing GPU is a message, not a CUDA traceback).

>>> resolve_device("cpu")
device(type='cpu')
>>> resolve_device("tpu")
Traceback (most recent call last):
...
ValueError: --device 'tpu': use auto, cpu, cuda or cuda:<index>
"""

from __future__ import annotations

import re

import torch


def resolve_device(name: str | None) -> torch.device:
    """``auto``/None: cuda when available, else cpu; a named device must exist here."""
    name = (name or "auto").strip()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise ValueError(f"--device {name!r}: use auto, cpu, cuda or cuda:<index>")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: this machine has no CUDA device "
                             "(torch.cuda.is_available() is False); use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                             "CUDA device(s), numbered from 0")
    return device
