"""Sizes checked against memory before anything is allocated.

A typo such as ``dyck:1000000`` (a million positions), ``hmm:vocab=1000000000`` or ``--model
d1000000-h1-l1-i64`` would otherwise fail deep in numpy or torch with an allocation traceback,
or, worse, be killed by the kernel after minutes. :func:`require` compares an estimate (a lower
bound) of what a step holds at once with the memory available and raises a ValueError naming
the setting that makes it too large; a request it refuses could never have fitted. What a
training run holds is estimated by ``flatlm.train.sizes.check_fits``; a source checks its own
arrays (``flatlm.sources.hmm``).

>>> require(2**20, "hmm vocab", "use a smaller vocabulary", available=2**30)
>>> require(2**40, "hmm vocab", "use a smaller vocabulary", available=2**30)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: hmm vocab needs at least 1024 GiB of memory, but 1.0 GiB is available: use a ...
"""

from __future__ import annotations

import os

import torch


def available_bytes(device=None) -> int:
    """Memory a new allocation can use: the GPU's free memory for a CUDA device, else the
    host's MemAvailable (Linux), else its physical memory."""
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require(nbytes: float, what: str, fix: str, *, available: int | None = None,
            device=None) -> None:
    """Raises ValueError when ``nbytes`` exceed the memory available (on ``device``), naming
    ``what`` needs it and the ``fix``."""
    available = available_bytes(device) if available is None else available
    if nbytes > available:
        raise ValueError(f"{what} needs at least {_gib(nbytes)} of memory, but "
                         f"{_gib(available)} is available: {fix}")


def _gib(n: float) -> str:
    gib = n / 2**30
    return f"{gib:.0f} GiB" if gib >= 100 else f"{gib:.1f} GiB"
