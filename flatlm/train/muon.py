"""Algorithm "muon": Muon on the encoder's hidden matrices, AdamW on everything else.

Muon (Jordan et al., 2024; ``torch.optim.Muon``) keeps a momentum of each matrix's gradient and
steps along its orthogonalisation, a few Newton-Schulz iterations (in bfloat16, as torch does)
that push its singular values towards 1. Its authors prescribe it for the 2-D weights of the
hidden layers only, and AdamW for the rest; so here:

- Muon: every 2-D parameter of the encoder's layers (``base_model.encoder``): the attention's
  query, key, value and output matrices and the MLP's two matrices, in ``model.parameters()``
  order (``hidden_matrices``);
- AdamW (torch's, fused on CUDA): the embeddings, the MLM head (its transform matrix, its bias;
  the decoder is tied to the word embeddings), every bias and LayerNorm, grouped and decayed as
  ``build_optimizer`` groups them for adamw (``train.weight_decay`` on dim >= 2), with the trial's
  ``train.lr``, ``train.beta1``, ``train.beta2`` and ``train.eps``.

Muon's own settings are ``MuonConfig``, the keys ``train.muon.*`` (a section of its own, as a
plug-in declares one: ``Algorithm.config``). Its rate follows the run's schedule: its param group
carries ``lr_scale`` = ``train.muon.lr / train.lr``, which the loop multiplies the schedule's rate
by, so warmup and decay shape both parts alike and ``train.muon.lr`` is Muon's peak.

The two optimizers are one to the loop (``MuonWithAdamW``): one ``zero_grad``, one ``step``, one
``state_dict`` holding both parts, which the checkpoint saves and a resume loads, so that a resumed
run equals the uninterrupted one bit for bit on the CPU (tests/train/test_resume.py, "muon").

The settings class lives in ``flatlm.train.muon_config`` (torch-free: the registry reads it
when configs are parsed); the registry reaches this module only through its lazy references.
"""

from __future__ import annotations

import torch

from flatlm.train.algorithms import adamw_optimizer, decay_groups


def check_model(cfg, model_cfg) -> None:
    """Refuses a model without a transformer encoder before any work (``Algorithm.model_check``;
    ``cfg`` a TrainConfig, ``model_cfg`` a ModelConfig)."""
    if model_cfg.arch != "bert":
        raise ValueError(f"train.algorithm='muon': model.arch={model_cfg.arch!r} has no "
                         "transformer encoder, whose hidden matrices Muon steps; use a BERT "
                         "model (or another train.algorithm)")


def hidden_matrices(model) -> list:
    """The parameters Muon steps: every trainable 2-D parameter of the encoder's layers
    (``base_model.encoder`` of a transformers model), in ``model.parameters()`` order."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    encoder = getattr(getattr(inner, "base_model", None), "encoder", None)
    if encoder is None:
        raise ValueError(f"train.algorithm='muon': {type(inner).__name__} has no "
                         "base_model.encoder whose matrices Muon would step; use a BERT model")
    inside = {id(p) for p in encoder.parameters()}
    return [p for p in inner.parameters()
            if p.requires_grad and p.dim() == 2 and id(p) in inside]


def muon_optimizer(cfg, model, *, fused: bool = False) -> MuonWithAdamW:
    """The optimizer of algorithm "muon" over ``model`` (``cfg`` a resolved TrainConfig):
    ``Algorithm.make_optimizer``. ``fused``: the fused AdamW kernel (CUDA)."""


    settings = cfg.muon
    hidden = hidden_matrices(model)
    chosen = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    muon = torch.optim.Muon(
        [{"params": hidden, "lr_scale": settings.lr / cfg.lr}], lr=settings.lr,
        weight_decay=settings.weight_decay, momentum=settings.momentum,
        nesterov=settings.nesterov, ns_steps=settings.ns_steps, adjust_lr_fn=settings.adjust_lr)
    return MuonWithAdamW(muon, adamw_optimizer(cfg, decay_groups(cfg, rest), fused=fused))


class MuonWithAdamW:
    """Two torch optimizers over disjoint parameters, one optimizer to the loop: its
    ``param_groups`` are Muon's then AdamW's (the loop sets each group's rate), ``state_dict``
    is ``{"muon": ..., "adamw": ...}``."""

    def __init__(self, muon, adamw):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return [*self.muon.param_groups, *self.adamw.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError(f"train.algorithm='muon': the checkpoint's optimizer state has "
                             f"parts {sorted(state)[:4]}, not Muon's and AdamW's; resume it "
                             "with the algorithm it was trained with")
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])
