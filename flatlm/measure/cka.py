r"""Linear CKA (Kornblith, Norouzi, Lee, Hinton, *Similarity of Neural Network Representations
Revisited*, ICML 2019) between a model's features and the truth's, or two models'.

For feature matrices X (n, p) and Y (n, q) over the same n inputs, columns centred,

.. math::
    CKA(X, Y) = \frac{\|Y^T X\|_F^2}{\|X^T X\|_F \, \|Y^T Y\|_F}
              = \frac{HSIC(K, L)}{\sqrt{HSIC(K, K)\, HSIC(L, L)}}, \quad K = X X^T, L = Y Y^T,

in [0, 1], invariant to orthogonal transforms and isotropic scaling of either side (not to other
invertible linear maps). Computed in float64, from the p x q side or the n x n side, whichever
costs fewer operations (the same number: <X X^T, Y Y^T> = ||Y^T X||_F^2).

Features (``cka_truth``, key ``cka/truth``): the model's are the linear probe's
(``probe.encoder_probe_features`` with ``measure.probe``'s positions, zero_padding and forward
batch size; one vector per downstream sentence); the truth's are the source's per-position
posterior of its hidden structure (``Source.latent_posteriors``: for a PCFG the expected number
of constituents labelled A over each word, ``sources.pcfg_marginals``; for an HMM the state
posterior), concatenated over positions, zero on padding. Both over the first ``cka.n_inputs``
downstream sentences. A source without ``latent_posteriors`` (Dyck, text, an LM) cannot give it.
``cka/truth_random_init`` is the same for the trial's shape randomly initialised (the probe's
random-features model; once per trial).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from flatlm.measure.probe import ProbeConfig, encoder_probe_features
from flatlm.measure.progress import timer
from flatlm.measure.reference_cache import random_features_model

CKA_TRUTH = "cka/truth"
CKA_TRUTH_RANDOM_INIT = "cka/truth_random_init"


@dataclass(frozen=True, kw_only=True)
class CKAConfig:
    """Inputs of ``cka_truth`` (``measure.cka``); the features are the probe's."""

    n_inputs: int | None = None  # the first n downstream sentences; None = all (n_downstream)
    random_init: bool = True  # also cka/truth_random_init (once per trial)

    def __post_init__(self):
        if self.n_inputs is not None and self.n_inputs < 2:
            raise ValueError(f"cka.n_inputs={self.n_inputs}: use an integer >= 2 (features are "
                             "centred over the inputs), or None for every downstream sentence")


def _centred(X: torch.Tensor) -> torch.Tensor:
    X = X.double()
    return X - X.mean(0, keepdim=True)


def _products(X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(||Y^T X||_F^2, ||X^T X||_F, ||Y^T Y||_F) of centred X, Y from the cheaper side."""
    n, p, q = X.shape[0], X.shape[1], Y.shape[1]
    if n * n * (p + q) < n * (p * p + q * q + p * q):  # n x n Gram matrices
        K, L = X @ X.T, Y @ Y.T
        return (K * L).sum(), K.norm(), L.norm()
    return (Y.T @ X).square().sum(), (X.T @ X).norm(), (Y.T @ Y).norm()


def linear_cka(X: torch.Tensor, Y: torch.Tensor) -> float:
    """Linear CKA of features X (n, p) and Y (n, q) of the same n inputs (module docstring); nan
    when either side is constant over the inputs.

    >>> X = torch.tensor([[1.0, 2.0], [3.0, 1.0], [0.0, 5.0]])
    >>> round(linear_cka(X, 2 * X + 7), 12)
    1.0
    """
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(f"linear_cka: features of the same n inputs as (n, p), (n, q); got "
                         f"{tuple(X.shape)} and {tuple(Y.shape)}")
    X, Y = _centred(X), _centred(Y.to(X.device))
    cross, xx, yy = _products(X, Y)
    if xx == 0 or yy == 0:
        return float("nan")
    return float(cross / (xx * yy))


def model_features(model: nn.Module, tokens, lengths, probe: ProbeConfig, device
                   ) -> torch.Tensor:
    """The linear probe's features of the sentences (eval mode): ``encoder_probe_features``
    with ``probe``'s positions, zero_padding and forward batch size."""
    return encoder_probe_features(model, tokens, lengths, device=device,
                                  batch_size=probe.forward_batch_size,
                                  positions=probe.positions, zero_padding=probe.zero_padding)


def checkpoint_cka(model_a: nn.Module, model_b: nn.Module, tokens, lengths, probe: ProbeConfig,
                   device) -> float:
    """Linear CKA between two models' probe features on the same sentences (two checkpoints,
    two runs; the shapes may differ)."""
    return linear_cka(model_features(model_a, tokens, lengths, probe, device),
                      model_features(model_b, tokens, lengths, probe, device))


def has_latent_posteriors(source) -> bool:
    return callable(getattr(source, "latent_posteriors", None))


def truth_features(source, tokens, lengths, device) -> torch.Tensor:
    """The truth's features (n, T K): ``source.latent_posteriors`` concatenated over the
    positions, float64 on ``device``."""
    if not has_latent_posteriors(source):
        raise ValueError(f"{type(source).__name__} has no posterior of a hidden structure "
                         "(Source.latent_posteriors): cka_truth needs a pcfg or hmm source")
    return source.latent_posteriors(tokens, lengths, device=device).flatten(1)


def check_cka_source(source) -> None:
    """The registry's check: a source with a truth but no hidden structure's posterior (Dyck,
    an LM) cannot give ``cka/truth``; one without a truth is skipped (needs_truth)."""
    if source.has_truth and not has_latent_posteriors(source):
        raise ValueError(f"measure.what: 'cka_truth' needs a source with a posterior over its "
                         f"hidden structure (pcfg, hmm), not {type(source).__name__}; drop "
                         "'cka_truth'")


def _inputs(data, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    n = cfg.cka.n_inputs
    return data.downstream_tokens[:n], data.downstream_lengths[:n]


def _truth(source, data, cfg, device) -> torch.Tensor:
    """The truth's features of the trial's downstream inputs, kept for the trial in
    ``EvalData.cache`` (they do not change with the model)."""
    if "cka_truth" not in data.cache:
        data.cache["cka_truth"] = truth_features(source, *_inputs(data, cfg), device).cpu()
    return data.cache["cka_truth"]


def run_cka_truth(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """The registered measurement ``cka_truth``: ``cka/truth`` of the checkpoint."""
    out = {}
    with timer(out, "cka_truth"):
        X = model_features(model, *_inputs(data, cfg), cfg.probe, device)
        out[CKA_TRUTH] = linear_cka(X, _truth(source, data, cfg, device))
    return out


def random_init_cka(source, data, cfg, device) -> dict[str, float] | None:
    """``cka/truth_random_init``, once per trial, of the trial's shape randomly initialised:
    ``EvalData.random_model``, or (the probe's reference freed it already) the same model built
    again (``reference_cache.random_features_model``). None without the model's shape, or with
    ``cka.random_init`` off."""
    if not cfg.cka.random_init or (data.random_model is None and data.shape is None):
        return None
    model = data.random_model
    if model is None:
        model = random_features_model(data.shape, source, cfg.seed)
    X = model_features(model.to(device), *_inputs(data, cfg), cfg.probe, device)
    data.random_model = None  # measured (the probe's reference, if asked for, came first)
    return {CKA_TRUTH_RANDOM_INIT: linear_cka(X, _truth(source, data, cfg, device))}
