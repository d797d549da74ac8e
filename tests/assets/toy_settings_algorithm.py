"""A toy algorithm with a setting of its own, written as a user would add one: this file, and no
edit of ``TrainConfig``. Its settings class is its ``Algorithm.config``, its keys
``train.scaled_sign.*`` (``--set train.scaled_sign.scale=0.5``), read in the update by
``ctx.cfg.settings("scaled_sign")``.

scaled_sign: signSGD (``toy_algorithm``) whose step is ``scale`` times the learning rate.
"""

from dataclasses import dataclass

import torch

from flatlm.train.algorithms import StepContext, accumulate_mlm
from flatlm.train.data import StepInputs
from flatlm.train.registry import Algorithm, AlgorithmDefaults, register_algorithm


@dataclass(frozen=True, kw_only=True)
class ScaledSignConfig:
    scale: float = 1.0  # the step as a multiple of the learning rate; > 0

    def __post_init__(self):
        if not self.scale > 0:
            raise ValueError(f"train.scaled_sign.scale={self.scale!r}: use a multiple > 0")


def scaled_sign_step(ctx: StepContext, inputs: StepInputs) -> dict[str, torch.Tensor]:
    ctx.optimizer.zero_grad(set_to_none=True)
    loss = accumulate_mlm(ctx, inputs.mlm)
    step = ctx.optimizer.param_groups[0]["lr"] * ctx.cfg.settings("scaled_sign").scale
    with torch.no_grad():
        for p in ctx.model.parameters():
            if p.grad is not None:
                p.sub_(step * p.grad.sign())
    return {"train/loss": loss}


SCALED_SIGN = register_algorithm(Algorithm(
    name="scaled_sign", step=scaled_sign_step, section="scaled_sign", config=ScaledSignConfig,
    defaults=AlgorithmDefaults(optimizer="sgd", weight_decay=0.0, dropout=0.0, warmup_steps=0,
                               summary="signSGD with a step of scale x lr (a test asset)")))
