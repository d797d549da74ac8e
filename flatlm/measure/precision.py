"""The arithmetic a measurement's model passes run in: a named setting per measurement.

- ``"fp32"`` (default; the released code's): float32 matrix products at full precision. The
  context asks for it explicitly (``torch.set_float32_matmul_precision("highest")``), so a caller
  that enabled TF32 for training does not change what a measurement reads.
- ``"tf32"``: float32 tensors, matrix products in TensorFloat-32 on a GPU that has it (10-bit
  mantissa inputs, float32 accumulation); on a CPU the same as fp32.
- ``"bf16"``: ``torch.autocast`` to bfloat16 (8-bit mantissa); it runs on a CPU too, which is
  where each estimator's tolerance is checked against its fp32 value (tests/measure/
  test_precision.py). TF32 rounds less than bf16, so an estimator within its tolerance in bf16
  is taken to be within it in TF32; ``bench/gpu_measure.py`` compares both with fp32 on a GPU.

Which measurements accept which (the tolerance each must meet, and why):

- ``flatness.fisher_precision`` (Tr(F)): fp32, tf32 or bf16. A Monte Carlo estimate with a
  relative standard error of ~2.5% at the defaults; bf16 moved it by under 1% in the tests.
- ``flatness.hessian_precision`` (Tr(H), its gap to Tr(F), Tr(H) with data labels): fp32 or
  tf32. The double backward in bf16 is refused: the gap Tr(H) - Tr(F) is a small difference at
  saturation and bf16's rounding of the residual p - q swamps it.
- ``loss.precision`` (pretrain/*): fp32 or tf32. KL to the truth is the difference of two
  cross-entropies of order 1 and is ~1e-2 at saturation; bf16 logits (error ~1e-2) would move it
  by its own size.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "tf32", "bf16")


def check_precision(value: str, field: str, allowed: tuple[str, ...] = PRECISIONS) -> None:
    """A ValueError naming ``field`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        refused = "" if value not in PRECISIONS else (
            f" ({value} is outside this measurement's tolerance: flatlm.measure.precision)")
        raise ValueError(f"{field}={value!r}: use one of {', '.join(allowed)}{refused}")


@contextlib.contextmanager
def computing_in(precision: str, device: str | torch.device):
    """The ``with`` block's model passes in ``precision`` on ``device``; the previous float32
    matmul setting is put back after. cuDNN's own TF32 switch (convolutions, the fused
    LSTM) is left as the caller has it: the measurements differentiate the unrolled LSTM."""
    check_precision(precision, "precision")
    device = torch.device(device)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        if precision == "bf16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                yield
        else:
            yield
    finally:
        torch.set_float32_matmul_precision(old)
