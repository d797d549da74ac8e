"""A toy measurement written as a user would add one: this file, imported before the config is
built, and nothing else.

"param_norm": the global L2 norm of the model's parameters at each checkpoint, as
``toy/param_norm``; it needs no truth and reads no MeasureConfig section.
"""

import torch

from flatlm.measure.registry import Measurement, register_measurement

PARAM_NORM = "toy/param_norm"


def param_norm(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    squares = sum(p.detach().double().pow(2).sum() for p in model.parameters())
    return {PARAM_NORM: float(torch.sqrt(squares))}


register_measurement(Measurement(name="param_norm", run=param_norm, keys=(PARAM_NORM,)))
