"""The optimizer state a checkpoint saved, over the parameters a curvature measurement counts.

A training checkpoint (``flatlm.train.state``) holds ``training_state.pt`` beside the model:
``optimizer`` is ``torch.optim.Optimizer.state_dict()``, whose per-parameter state is keyed by
the parameter's index in the optimizer's order. That order is ``train.algorithms.
build_optimizer``'s (measure may not import train, so it is restated here and checked against
the saved groups' sizes and every moment's shape): the trainable parameters in
``model.parameters()`` order (tied ones once), matrices and embeddings (dim >= 2) first, then the
rest. ``saved_optimizer`` returns the state of the parameters asked for, in their order, or the
reason there is none usable (no training state, an optimizer this module does not read: muon's
state is two optimizers', ``{"muon": ..., "adamw": ...}``).

Adam's moments are read as torch's AdamW keeps them (``exp_avg`` m, ``exp_avg_sq`` v, ``step``
t): before bias correction, so m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t), and
torch's update is w <- w (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from flatlm.models.checkpoint import TRAINING_STATE_NAME
from flatlm.models.masked_lm import unwrap


@dataclass(frozen=True)
class SavedOptimizer:
    """The saved optimizer over the parameters asked for, in their order."""

    kind: str  # "adam" (torch Adam / AdamW: its groups have betas) or "sgd" (no momentum)
    lr: float  # the rate of the last update taken (the loop sets it before each update)
    weight_decay: tuple[float, ...]  # per parameter, its group's
    decoupled: bool  # AdamW's decay w (1 - lr wd), else SGD's and Adam's g + wd w
    # adam: per parameter, the updates its moments have seen (0: none yet, as at step 0 or for
    # a parameter that growth added, and then its moments are zeros), m and v (saved dtype)
    steps: tuple[int, ...] = ()
    betas: tuple[float, float] | None = None
    eps: float | None = None
    exp_avg: list[torch.Tensor] | None = None
    exp_avg_sq: list[torch.Tensor] | None = None

    def without_moments(self) -> int:
        """How many parameters have no second moment yet (all of them for SGD)."""
        return len(self.weight_decay) if self.kind != "adam" else self.steps.count(0)

    def v_hat(self) -> list[torch.Tensor]:
        """Adam's bias-corrected second moment v / (1 - beta2^t) per parameter (every one must
        have seen an update: ``without_moments() == 0``)."""
        if self.without_moments():
            raise ValueError(f"{self.without_moments()} parameters have no second moment yet")
        return [v / (1.0 - self.betas[1] ** t)
                for v, t in zip(self.exp_avg_sq, self.steps, strict=True)]


def optimizer_order(model: nn.Module) -> list[list[nn.Parameter]]:
    """The parameters of each of ``build_optimizer``'s groups, in its order."""
    params = [p for p in unwrap(model).parameters() if p.requires_grad]
    return [[p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]]


def read_training_state(checkpoint_dir) -> dict | None:
    """The checkpoint's ``training_state.pt`` as a dict, or None when it has none."""
    path = Path(checkpoint_dir) / TRAINING_STATE_NAME if checkpoint_dir is not None else None
    if path is None or not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def saved_optimizer(checkpoint_dir, model: nn.Module,
                    params: list[nn.Parameter]) -> tuple[SavedOptimizer | None, str]:
    """(the saved optimizer over ``params``, "") or (None, why there is none usable)."""
    state = read_training_state(checkpoint_dir)
    if state is None:
        return None, f"no {TRAINING_STATE_NAME} in {checkpoint_dir} (not a training checkpoint)"
    saved = state["optimizer"]
    if "param_groups" not in saved:  # train.algorithm=muon saves {"muon": ..., "adamw": ...}
        return None, (f"the saved optimizer is in parts {sorted(saved)}, not one torch "
                      "optimizer (muon: Muon and AdamW): not read here")
    entries, why = _per_parameter(saved, model, params)
    if entries is None:
        return None, why
    groups = [group for _, group in entries]
    unsupported = _unsupported(groups[0])
    if unsupported:
        return None, unsupported
    return _read(entries, groups, params), ""


def _per_parameter(saved: dict, model: nn.Module, params: list[nn.Parameter]):
    """[(state entry or {}, its group)] for ``params``, or (None, why the order does not fit)."""
    order = optimizer_order(model)
    if [len(g["params"]) for g in saved["param_groups"]] != [len(g) for g in order]:
        return None, ("the saved optimizer's groups do not match the model's parameters (not "
                      "an optimizer built by flatlm.train.algorithms.build_optimizer)")
    where = {}
    for group, group_params in zip(saved["param_groups"], order, strict=True):
        for index, p in zip(group["params"], group_params, strict=True):
            where[id(p)] = (saved["state"].get(index, {}), group)
    missing = [i for i, p in enumerate(params) if id(p) not in where]
    if missing:
        return None, f"parameters {missing} asked for are not the optimizer's"
    entries = [where[id(p)] for p in params]
    for p, (entry, _) in zip(params, entries, strict=True):
        moment = entry.get("exp_avg_sq")
        if moment is not None and moment.shape != p.shape:
            return None, (f"a saved moment of shape {tuple(moment.shape)} for a parameter of "
                          f"shape {tuple(p.shape)}: the optimizer's order does not fit")
    return entries, ""


def _unsupported(group: dict) -> str:
    """Why this module does not read an optimizer of this kind ("" if it does)."""
    if "betas" in group:
        if group.get("amsgrad") or group.get("maximize"):
            return "Adam with amsgrad or maximize: not read here"
        return ""
    if "momentum" in group:
        if group["momentum"] != 0 or group.get("maximize"):
            return "SGD with momentum or maximize: not read here"
        return ""
    return f"an optimizer with groups {sorted(group)}: neither Adam nor SGD"


def _read(entries, groups, params) -> SavedOptimizer:
    first = groups[0]
    decay = tuple(float(g["weight_decay"]) for g in groups)
    if "momentum" in first:
        return SavedOptimizer(kind="sgd", lr=float(first["lr"]), weight_decay=decay,
                              decoupled=False)
    # AdamW's groups say so in recent torch; an Adam-family group without the key is AdamW,
    # the only Adam that flatlm builds
    decoupled = bool(first.get("decoupled_weight_decay", True))
    moments = [(int(float(e["step"])), e["exp_avg"], e["exp_avg_sq"]) if e else
               (0, torch.zeros_like(p), torch.zeros_like(p))  # what Adam starts from
               for (e, _), p in zip(entries, params, strict=True)]
    return SavedOptimizer(kind="adam", lr=float(first["lr"]), weight_decay=decay,
                          decoupled=decoupled, betas=(float(first["betas"][0]),
                                                      float(first["betas"][1])),
                          eps=float(first["eps"]), steps=tuple(t for t, _, _ in moments),
                          exp_avg=[m.detach().cpu() for _, m, _ in moments],
                          exp_avg_sq=[v.detach().cpu() for _, _, v in moments])
