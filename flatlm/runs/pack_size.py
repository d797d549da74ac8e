"""How many trials a pack holds (``--pack K``): the check of a K and its default rule. No torch
here: the command lines' ``--help`` reads it.
"""

from __future__ import annotations

from flatlm.core.flags import number_flag

# ``--pack``'s parser (flatlm replicate, the sweeps): the same range as check_pack_size
PACK_SIZE = number_flag(int, at_least=1, hint="the most trials trained as one model; 1 trains "
                                              "every trial alone")


def check_pack_size(size) -> None:
    """A K is a whole number >= 1 (a ValueError naming ``--pack`` otherwise)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"--pack {size!r}: give a whole number >= 1 (the most trials trained "
                         "as one model; 1 trains every trial alone)")


# The default pack size where the device is CUDA. A GPU running one small trial is bound by
# kernel launches, not arithmetic (15 testbed trials time-slicing an H200 ran no faster than one
# CPU core each: bench/results/gpu_replication_h200.md), and a pack's update costs about one
# trial's launches; 16 holds those 15 in one pack. No GPU measurement chose 16 over another K.
CUDA_PACK = 16
# On a CPU packing is off by default: bench/results/packs_cpu.json shows no gain at the
# testbed's batch with 2 threads (1 thread, batch 16: 2.18x; batch 256 or 2 threads: none).
DEFAULT_RULE = (f"default: 1 (off) on a CPU, where bench/packs.py measured no gain at the "
                f"testbed's batch; {CUDA_PACK} on CUDA")


def default_pack_size(device) -> int:
    """``--pack``'s default on ``device`` (a name or a ``torch.device``): ``DEFAULT_RULE``.

    >>> default_pack_size("cpu"), default_pack_size("cuda:1")
    (1, 16)
    """
    return CUDA_PACK if str(device).split(":")[0] == "cuda" else 1
