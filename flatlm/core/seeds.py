"""Seeds every stage derives its randomness from: one integer per (run seed, stream, index).

Library code takes a seed and turns it into a generator here; it never seeds globally. A random
choice made at update i of stream "mask" is then a pure function of (seed, "mask", i), which is what
makes resumed runs and re-measured checkpoints exact.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def derive_seed(seed: int, stream: str, index: int = 0) -> int:
    """A 63-bit seed for item ``index`` of the named random ``stream`` of a run seeded ``seed``.

    >>> derive_seed(0, "data", 5) == derive_seed(0, "data", 5) != derive_seed(0, "mask", 5)
    True
    """
    entropy = [seed % 2**63, zlib.crc32(stream.encode()), index]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def generator(seed: int, stream: str, index: int = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by ``derive_seed``."""
    return torch.Generator().manual_seed(derive_seed(seed, stream, index))
