r"""Linear CKA (Kornblith, Norouzi, Lee, Hinton, *Similarity of Neural Network Representations
Revisited*, ICML 2019) between a model's features and the truth's, or two models'.

For feature matrices X (n, p) and Y (n, q) over the same n inputs, columns centred,

.. math::
    CKA(X, Y) = \frac{\|Y^T X\|_F^2}{\|X^T X\|_F \, \|Y^T Y\|_F}
              = \frac{HSIC(K, L)}{\sqrt{HSIC(K, K)\, HSIC(L, L)}}, \quad K = X X^T, L = Y Y^T,

in [0, 1], invariant to orthogonal transforms and isotropic scaling of either side (not to other
invertible linear maps). Computed in float64, from the p x q side or the n x n side, whichever
costs fewer operations (the same number: <X X^T, Y Y^T> = ||Y^T X||_F^2).

Features (``cka_truth``), two levels, each with its key:

- ``cka/truth``, the sentence level: the model's features are the linear probe's
  (``probe.probed_states`` with ``measure.probe``'s positions and zero_padding: the states of the
  sentence's positions concatenated, one vector per downstream sentence); the truth's are the
  source's per-position posterior of its hidden structure (``Source.latent_posteriors``: for a
  PCFG the expected number of constituents labelled A over each word, ``sources.pcfg_marginals``;
  for an HMM the state posterior), concatenated over the positions, zero on padding. Where the
  sentences' lengths vary, both sides share the pattern of which positions are padding, and that
  alone gives a randomly initialised model a high value (``cka/truth_random_init``).
- ``cka/truth_token``, the token level: one row per real word of every sentence, the model's
  final-layer state at the word (d) against the word's posterior (K); no padding in it.

Both over the first ``cka.n_inputs`` downstream sentences. A source without
``latent_posteriors`` (Dyck, text, an LM) cannot give them. ``cka/truth_random_init`` and
``cka/truth_token_random_init`` are the same for the trial's shape randomly initialised (the
probe's random-features model; once per trial).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from flatlm.core.tokens import encode
from flatlm.measure import CKA_TRUTH, CKA_TRUTH_TOKEN, RANDOM_INIT
from flatlm.measure.curvature.common import eval_mode
from flatlm.measure.probes.probe import ProbeConfig, probed_states
from flatlm.measure.reference_cache import random_features_model
from flatlm.measure.timing import timer
from flatlm.models.masked_lm import encoder_features
from flatlm.sources.base import as_tokens, padding_mask

CKA_TRUTH_RANDOM_INIT = CKA_TRUTH + RANDOM_INIT


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
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sentence, token) features of the sentences from one eval-mode forward pass in batches
    of ``probe.forward_batch_size``: the linear probe's (n, D), ``probed_states`` with
    ``probe``'s positions and zero_padding (what ``encoder_probe_features`` gives), and the
    final-layer state of every real word (sum of the lengths, d), sentence by sentence."""
    tokens, lengths = as_tokens(tokens, lengths)
    sentence, token = [], []
    with torch.no_grad(), eval_mode(model):
        for i in range(0, len(tokens), probe.forward_batch_size):
            rows = slice(i, i + probe.forward_batch_size)
            ids, mask = encode(tokens[rows].to(device), lengths[rows].to(device))  # (B, T+2)
            states = encoder_features(model, ids, mask)  # (B, T+2, d)
            sentence.append(probed_states(states, mask, probe.positions,
                                          probe.zero_padding).float())
            words = padding_mask(lengths[rows].to(device), tokens.shape[1])  # (B, T)
            token.append(states[:, 1:-1][words].float())
    return torch.cat(sentence), torch.cat(token)


def feature_cka(X: tuple[torch.Tensor, torch.Tensor], Y: tuple[torch.Tensor, torch.Tensor]
                ) -> dict[str, float]:
    """{"sentence", "token"} linear CKA of two (sentence, token) feature pairs."""
    return {"sentence": linear_cka(X[0], Y[0]), "token": linear_cka(X[1], Y[1])}


def checkpoint_cka(model_a: nn.Module, model_b: nn.Module, tokens, lengths, probe: ProbeConfig,
                   device) -> dict[str, float]:
    """Linear CKA between two models' features on the same sentences (two checkpoints, two
    runs; the shapes may differ), at the sentence level (the probe's) and the token level."""
    return feature_cka(model_features(model_a, tokens, lengths, probe, device),
                       model_features(model_b, tokens, lengths, probe, device))


def has_latent_posteriors(source) -> bool:
    return callable(getattr(source, "latent_posteriors", None))


def truth_features(source, tokens, lengths, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sentence, token) features of the truth, float64 on ``device``:
    ``source.latent_posteriors`` (n, T, K) concatenated over the positions (zero on padding),
    and its rows of the real words (sum of the lengths, K)."""
    if not has_latent_posteriors(source):
        raise ValueError(f"{type(source).__name__} has no posterior of a hidden structure "
                         "(Source.latent_posteriors): cka_truth needs a pcfg or hmm source")
    tokens, lengths = as_tokens(tokens, lengths)
    posterior = source.latent_posteriors(tokens, lengths, device=device)  # (n, T, K)
    words = padding_mask(lengths.to(posterior.device), tokens.shape[1])
    return posterior.flatten(1), posterior[words]


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


def _truth(source, data, cfg, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The truth's features of the trial's downstream inputs, kept for the trial in
    ``EvalData.cache`` (they do not change with the model)."""
    if "cka_truth" not in data.cache:
        data.cache["cka_truth"] = tuple(
            f.cpu() for f in truth_features(source, *_inputs(data, cfg), device))
    return data.cache["cka_truth"]


def _keys(cka: dict[str, float], tail: str = "") -> dict[str, float]:
    return {CKA_TRUTH + tail: cka["sentence"], CKA_TRUTH_TOKEN + tail: cka["token"]}


def run_cka_truth(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """The registered measurement ``cka_truth``: ``cka/truth``, ``cka/truth_token``."""
    out = {}
    with timer(out, "cka_truth"):
        X = model_features(model, *_inputs(data, cfg), cfg.probe, device)
        out.update(_keys(feature_cka(X, _truth(source, data, cfg, device))))
    return out


def random_init_cka(source, data, cfg, device) -> dict[str, float] | None:
    """``cka/truth_random_init``, ``cka/truth_token_random_init``, once per trial, of the
    trial's shape randomly initialised: ``EvalData.random_model``, or (the probe's reference
    freed it already) the same model built again (``reference_cache.random_features_model``).
    None without the model's shape, or with ``cka.random_init`` off."""
    if not cfg.cka.random_init or (data.random_model is None and data.shape is None):
        return None
    model = data.random_model
    if model is None:
        model = random_features_model(data.shape, source, cfg.seed)
    X = model_features(model.to(device), *_inputs(data, cfg), cfg.probe, device)
    data.random_model = None  # measured (the probe's reference, if asked for, came first)
    return _keys(feature_cka(X, _truth(source, data, cfg, device)), RANDOM_INIT)
