"""The optimizers of a pack: K members' AdamW or SGD steps as one step over stacked parameters.

Each stacked parameter ``(K, *shape)`` is updated by one call per operation of torch's
single-tensor AdamW (``torch.optim.adamw``, which the CPU runs) or SGD (no momentum), with each
member's own learning rate, weight decay and Adam constants broadcast along the member axis. Every
operation is the one torch applies with a Python scalar, written so that the member's slice goes
through the same arithmetic: a scalar ``c`` becomes a float32 ``(K, 1, ...)`` tensor holding the
same float (``float(c)`` rounded once), and ``x.addcmul_(g, g, value=c)`` becomes
``x.addcmul_(c * g, g)`` (``c * g`` is the product the kernel forms first). A member's
parameters and state therefore equal those of ``torch.optim.AdamW`` stepping the member alone,
bit for bit on the CPU (tests/train/test_pack.py).

Why hand-written, not torch's own optimizers: ``step_per_member`` makes the same update by
torch's functional AdamW / SGD, one call per member and parameter group on the member's views
``p[k]`` (per-member rates need a call each), and equals ``step`` bit for bit
(tests/train/test_pack_optim.py), but it is slower. bench/packs.py ``optimizer_costs``
(bench/results/packs_optimizer_cpu.json: 5 members of d64-h4-l2-i256, one thread, process CPU
time of one step; ratios over hand-batched): AdamW 2.29 ms hand-batched, 6.59 ms per member
single-tensor (2.875x), 4.93 ms per member foreach (2.150x), 6.31 ms for 5 separate
``torch.optim.AdamW`` (2.754x); SGD 0.64 ms, 1.13 ms (1.778x), 0.99 ms (1.562x), 1.17 ms
(1.842x). The per-member calls cost what K separate optimizers cost: some 4 ms more per
update than ``step``, where a whole packed update at batch 16 took about 25 ms of wall time
(bench/results/packs_cpu.json ``update_costs``).

A member's state travels as a torch optimizer's ``state_dict`` (``member_state_dict``), so a
member's checkpoint is the checkpoint its unpacked twin writes, and loads back (``load_members``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd

from flatlm.train.algorithms import build_optimizer


class PackedOptimizer:
    """K members' optimizer over ``params`` (each ``(K, *shape)``), one config per member."""

    def __init__(self, params: Sequence[nn.Parameter], cfgs: Sequence, kind: str):
        if kind not in ("adamw", "sgd"):
            raise ValueError(f"pack: optimizer {kind!r}: use adamw or sgd")
        self.params, self.cfgs, self.kind = list(params), list(cfgs), kind
        self.step_count = 0  # updates done (every member does each update)
        self.exp_avg = [torch.zeros_like(p) for p in self.params] if kind == "adamw" else []
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params] if kind == "adamw" else []

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, lrs: Sequence[float]) -> None:
        """One update of every member, member k at learning rate ``lrs[k]``."""
        self.step_count += 1
        scalars = self._scalars(lrs)
        decay = any(c.weight_decay for c in self.cfgs)
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            shape = (-1,) + (1,) * (p.dim() - 1)  # (K, 1, ...): broadcasts against p
            value = {name: v.view(shape) for name, v in scalars.items()}
            # as build_optimizer: matrices and embeddings decay, biases and LayerNorms do not
            decays = decay and p.dim() >= 3
            if self.kind == "adamw":
                self._adamw(i, p, value, decays)
            else:
                self._sgd(p, value, decays)

    def _scalars(self, lrs) -> dict[str, torch.Tensor]:
        """The step's scalars as torch's step forms them (Python floats), one (K,) float tensor
        each: one host-to-device copy per scalar and step."""
        cfgs, step = self.cfgs, self.step_count
        values = {"decay": [c.weight_decay for c in cfgs], "neg_lr": [-lr for lr in lrs],
                  "shrink": [1 - lr * c.weight_decay for lr, c in zip(lrs, cfgs, strict=True)]}
        if self.kind == "adamw":
            values.update({
                "one_minus_beta1": [1 - c.beta1 for c in cfgs],
                "beta2": [c.beta2 for c in cfgs], "one_minus_beta2": [1 - c.beta2 for c in cfgs],
                "root": [(1 - c.beta2 ** step) ** 0.5 for c in cfgs],
                "eps": [c.eps for c in cfgs],
                "neg_step_size": [-(lr / (1 - c.beta1 ** step))
                                  for lr, c in zip(lrs, cfgs, strict=True)]})
        p = self.params[0]
        return {k: torch.tensor(v, dtype=p.dtype, device=p.device) for k, v in values.items()}

    def _adamw(self, i, p, value, decays) -> None:
        grad, exp_avg, exp_avg_sq = p.grad, self.exp_avg[i], self.exp_avg_sq[i]
        if decays:
            p.mul_(value["shrink"])  # param.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, value["one_minus_beta1"])
        exp_avg_sq.mul_(value["beta2"])
        exp_avg_sq.addcmul_(value["one_minus_beta2"] * grad, grad)
        denom = exp_avg_sq.sqrt() / value["root"]
        denom.add_(value["eps"])
        p.addcdiv_(value["neg_step_size"] * exp_avg, denom)

    def _sgd(self, p, value, decays) -> None:
        grad = p.grad
        if decays:  # grad.add(param, alpha=wd): the product wd * param, then the sum
            grad = grad.addcmul(value["decay"], p)
        p.addcmul_(value["neg_lr"], grad)

    @torch.no_grad()
    def step_per_member(self, lrs: Sequence[float], *, foreach: bool = False) -> None:
        """The update ``step`` makes, by torch's own functional optimizers
        (``torch.optim.adamw.adamw``, ``torch.optim.sgd.sgd``): one call per member and parameter
        group, on the member's views ``p[k]``. The reference ``step`` is tested against
        (tests/train/test_pack_optim.py) and timed against (bench/packs.py ``optimizer_costs``);
        ``foreach=False`` is the path a single model's optimizer takes on the CPU."""
        self.step_count += 1
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        for decays in (True, False):  # build_optimizer's groups: dim >= 2 per member decays
            group = [i for i in live if (self.params[i].dim() >= 3) == decays]
            for k, (cfg, lr) in enumerate(zip(self.cfgs, lrs, strict=True)):
                self._member_step(k, group, lr, cfg.weight_decay if decays else 0.0, foreach)

    def _member_step(self, k, group, lr, weight_decay, foreach) -> None:
        params = [self.params[i][k] for i in group]
        grads = [self.params[i].grad[k] for i in group]
        if self.kind == "sgd":
            sgd(params, grads, [None] * len(group), foreach=foreach, weight_decay=weight_decay,
                momentum=0.0, lr=lr, dampening=0.0, nesterov=False, maximize=False)
            return
        cfg = self.cfgs[k]
        # torch.optim.AdamW's state["step"], one per parameter: the call adds this update
        steps = list(torch.full((len(group),), float(self.step_count - 1)).unbind())
        adamw(params, grads, [self.exp_avg[i][k] for i in group],
              [self.exp_avg_sq[i][k] for i in group], [], steps, foreach=foreach, amsgrad=False,
              beta1=cfg.beta1, beta2=cfg.beta2, lr=lr, weight_decay=weight_decay, eps=cfg.eps,
              maximize=False)

    # ------------------------------------------------------------------ members

    def member_state_dict(self, k: int, model: nn.Module) -> dict:
        """Member k's state as the ``state_dict`` of ``build_optimizer(cfg_k, model)``, ``model``
        holding member k's parameters (the single model's parameter order is the pack's)."""
        optimizer = build_optimizer(self.cfgs[k], model)
        if self.kind == "adamw" and self.step_count:
            for i, q in enumerate(model.parameters()):
                optimizer.state[q] = {
                    "step": torch.tensor(float(self.step_count)),
                    "exp_avg": self.exp_avg[i][k].detach().clone(),
                    "exp_avg_sq": self.exp_avg_sq[i][k].detach().clone()}
        return optimizer.state_dict()

    def load_members(self, states: Sequence[dict], models: Sequence[nn.Module]) -> None:
        """Restores every member from its ``member_state_dict`` (as a checkpoint stores it)."""
        steps = set()
        for k, (state, model) in enumerate(zip(states, models, strict=True)):
            optimizer = build_optimizer(self.cfgs[k], model)
            optimizer.load_state_dict(state)
            for i, q in enumerate(model.parameters()):
                s = optimizer.state.get(q, {})
                if "step" in s:
                    steps.add(int(s["step"]))
                if self.kind == "adamw" and s:
                    self.exp_avg[i][k].copy_(s["exp_avg"])
                    self.exp_avg_sq[i][k].copy_(s["exp_avg_sq"])
        if len(steps) > 1:
            raise ValueError(f"pack: the members' optimizers are at different steps {steps}")
        self.step_count = steps.pop() if steps else 0

    def keep(self, members: Sequence[int], params: Sequence[nn.Parameter]) -> None:
        """Keeps only ``members`` (indices), over the pack's new ``params``."""
        index = torch.tensor(list(members), device=params[0].device)
        self.params, self.cfgs = list(params), [self.cfgs[k] for k in members]
        self.exp_avg = [s.index_select(0, index) for s in self.exp_avg]
        self.exp_avg_sq = [s.index_select(0, index) for s in self.exp_avg_sq]
