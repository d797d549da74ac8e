"""A transformers causal LM restricted to a set of its tokens: loading, the restricted
next-token log-probabilities, and the rule that picks the set.

``load_causal_lm(model, dtype, device)`` loads ``AutoModelForCausalLM.from_pretrained`` (a local
directory, or a hub id the user can reach; memoised per process), in eval mode, with clear
errors. ``RestrictedLM(model, ids)`` gives, for token ids ``ids`` (k of them),

    log p_r(c | prefix) = log softmax_{c in ids}(logits(prefix)[ids])[c],

i.e. the LM's next-token distribution renormalised over ``ids``, computing only the k logits it
needs (the head's rows ``ids`` applied to the last hidden state; checked against the full
logits once, else the full logits are sliced).

Vocabulary rules (``top_ids``), both deterministic for a given model, seed and dtype on the CPU
(where the source runs them):

- ``"unigram"`` (default): the top-k of the LM's own unigram distribution over sentences of
  length T drawn from its unrestricted distribution after BOS, estimated without sampling noise in
  the token counted (Rao-Blackwellised): u(c) = mean over n sampled sentences and positions t of
  p(c | x_<t). The paper's "top-2000 frequent tokens" without a text corpus to count them in.
- ``"bos"``: the top-k of p(. | BOS), the first word's distribution (exact, no samples).

Special tokens (the config's bos, eos and pad ids) are never words: sentences have no end, every
one has exactly T words. Ties are broken by the lower token id.
"""

from __future__ import annotations

import functools
import hashlib
import os

import numpy as np
import torch

from flatlm.sources.base import SourceError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}
RULES = ("unigram", "bos")


@functools.lru_cache(maxsize=4)
def load_causal_lm(model: str, dtype: str, device: str):
    """The causal LM at ``model`` (directory or hub id) in ``dtype`` on ``device``, eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Loading weights" bar per trial buries a sweep's lines
    try:
        lm = AutoModelForCausalLM.from_pretrained(model, dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError) as e:
        where = "directory" if os.path.isdir(model) else "hub id"
        raise SourceError(
            f"lm spec: 'model' {model!r} ({where}) is not a transformers causal LM this machine "
            f"can load: {str(e).splitlines()[0]}; give a directory written by save_pretrained "
            "or a hub id such as facebook/opt-125m"
        ) from None
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    if lm.config.bos_token_id is None:
        raise SourceError(f"lm spec: model {model!r} has no bos_token_id in its config; "
                          "sentences start from BOS, so set config.bos_token_id and save it")
    return lm.to(device).eval().requires_grad_(False)


def max_positions(config) -> int | None:
    """The longest input the LM takes (None if its config does not say)."""
    for name in ("max_position_embeddings", "n_positions"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return None


def special_ids(config) -> set[int]:
    """The config's bos, eos and pad ids: never words of the language."""
    ids = set()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids


def weights_digest(lm) -> np.ndarray:
    """sha256 of every parameter and buffer (name, dtype, shape, bytes) as uint8 [32]."""
    h = hashlib.sha256()
    for name, tensor in sorted(lm.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return np.frombuffer(h.digest(), dtype=np.uint8).copy()


class RestrictedLM:
    """log p_r(. | prefix) over token ids ``ids`` (None: the whole vocabulary) of a causal LM."""

    def __init__(self, lm, ids: torch.Tensor | None):
        self.lm = lm
        self.ids = ids
        self.bos = int(lm.config.bos_token_id)
        head = lm.get_output_embeddings()
        self._head = None
        if ids is not None and isinstance(head, torch.nn.Linear):
            self._head = self._restricted_head(head, ids)

    def _restricted_head(self, head, ids):
        """(weight [k, d], bias [k] | None) if head(base(x))[ids] equals the LM's logits[ids]
        on a probe input (no logit scaling or soft-capping after the head), else None."""
        weight = head.weight[ids.to(head.weight.device)]
        bias = None if head.bias is None else head.bias[ids.to(head.weight.device)]
        probe = torch.full((1, 2), self.bos, device=weight.device)
        call = dict(input_ids=probe, attention_mask=torch.ones_like(probe))
        full = self.lm(**call).logits[..., ids.to(weight.device)]
        hidden = self.lm.base_model(**call).last_hidden_state
        mine = torch.nn.functional.linear(hidden, weight, bias)
        # a few ulps of the dtype (a logit scale or soft-capping moves logits far more)
        tol = 64 * torch.finfo(full.dtype).eps * max(1.0, float(full.abs().max()))
        return (weight, bias) if torch.allclose(mine, full, rtol=0, atol=tol) else None

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    @torch.no_grad()
    def log_probs(self, input_ids: torch.Tensor, past=None, cache: bool = False):
        """(log p_r(. | input_ids[:, :s+1]) for every s: [B, L, k] in float32 or wider, the
        KV cache if ``cache``). ``past`` (a previous call's cache) continues its prefix."""
        seen = 0 if past is None else past.get_seq_length()
        # every position is real: an explicit mask (no padding guess when pad id = BOS id)
        mask = torch.ones(input_ids.shape[0], seen + input_ids.shape[1], dtype=torch.int64,
                          device=input_ids.device)
        call = dict(input_ids=input_ids, attention_mask=mask, past_key_values=past, use_cache=cache)
        if self._head is not None:
            out = self.lm.base_model(**call)
            logits = torch.nn.functional.linear(out.last_hidden_state, *self._head)  # (B, L, k)
        else:
            out = self.lm(**call)
            logits = out.logits if self.ids is None else out.logits[..., self.ids.to(self.device)]
        wide = torch.promote_types(logits.dtype, torch.float32)
        return logits.to(wide).log_softmax(-1), out.past_key_values

    def sample(self, u: torch.Tensor, batch: int, mean_probs: bool = False):
        """Sentences by inverse CDF from uniforms ``u`` [n, T] (CPU float64): indices into
        ``ids`` [n, T] int64 (CPU), and with ``mean_probs`` the mean over sentences and
        positions of p_r(. | x_<t) [k] float64. One LM call per position (KV cache), ``batch``
        sentences at a time; the draws do not depend on ``batch``."""
        n, T = u.shape
        words = torch.zeros(n, T, dtype=torch.int64)
        total = None
        for i in range(0, n, batch):
            rows = u[i : i + batch]
            x = torch.full((len(rows), 1), self.bos, device=self.device)  # BOS
            past = None
            for t in range(T):
                logp, past = self.log_probs(x, past, cache=True)
                p = logp[:, -1].double().exp().cpu()  # (b, k)
                total = p.sum(0) if total is None else total + p.sum(0)
                cdf = p.cumsum(-1)
                cdf[:, -1] = 1.0
                drawn = torch.searchsorted(cdf, rows[:, t : t + 1].contiguous(), right=True)[:, 0]
                words[i : i + len(rows), t] = drawn.clamp_max(cdf.shape[1] - 1)
                x = self.token_ids(words[i : i + len(rows), t : t + 1]).to(self.device)
        return (words, total / (n * T)) if mean_probs else words

    def token_ids(self, words: torch.Tensor) -> torch.Tensor:
        """LM token ids of word indices (identity without a restriction)."""
        return words if self.ids is None else self.ids.to(words.device)[words]


def top_ids(lm, rule: str, k: int, T: int, n: int, seed: int, batch: int) -> torch.Tensor:
    """The k token ids of ``rule`` (module docstring), best first: [k] int64 on the CPU."""
    full = RestrictedLM(lm, None)
    if rule == "bos":
        bos = torch.full((1, 1), full.bos, device=full.device)
        score = full.log_probs(bos)[0][0, -1].double().exp().cpu()
    else:
        u = torch.from_numpy(np.random.default_rng(seed).random((n, T)))
        score = full.sample(u, batch, mean_probs=True)[1]
    score[sorted(special_ids(lm.config) & set(range(len(score))))] = -1.0
    order = torch.sort(score, descending=True, stable=True).indices
    return order[:k].clone()
