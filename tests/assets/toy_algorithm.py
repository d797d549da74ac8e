"""A toy algorithm written as a user would add one: this file, registered through the public API.

sign_sgd: every parameter moves by the learning rate against the sign of its gradient (signSGD,
Bernstein et al., 2018), the optimizer's own step unused. Data-parallel: the same on the gradient
reduced over the ranks. No settings of its own (no config section).
"""

import torch

from flatlm.train.algorithms import StepContext, accumulate_mlm
from flatlm.train.data import StepInputs
from flatlm.train.distributed import reduce_gradients
from flatlm.train.registry import Algorithm, AlgorithmDefaults, register_algorithm


def sign_sgd_step(ctx: StepContext, inputs: StepInputs) -> dict[str, torch.Tensor]:
    ctx.optimizer.zero_grad(set_to_none=True)
    loss = accumulate_mlm(ctx, inputs.mlm)
    _step_against_sign(ctx)
    return {"train/loss": loss}


def data_parallel_sign_sgd_step(ctx: StepContext, inputs: StepInputs) -> dict[str, torch.Tensor]:
    ctx.optimizer.zero_grad(set_to_none=True)
    loss = accumulate_mlm(ctx, inputs.mlm)
    loss = reduce_gradients(ctx.model, loss, inputs.mlm.n_targets())
    _step_against_sign(ctx)
    return {"train/loss": loss}


@torch.no_grad()
def _step_against_sign(ctx: StepContext) -> None:
    lr = ctx.optimizer.param_groups[0]["lr"]  # the loop sets the schedule's rate there
    for p in ctx.model.parameters():
        if p.grad is not None:
            p.sub_(lr * p.grad.sign())


SIGN_SGD = register_algorithm(Algorithm(
    name="sign_sgd", step=sign_sgd_step, data_parallel_step=data_parallel_sign_sgd_step,
    defaults=AlgorithmDefaults(optimizer="sgd", weight_decay=0.0, dropout=0.0, warmup_steps=0,
                               summary="signSGD: each parameter moves by lr against the sign "
                                       "of its gradient (a test asset)")))
