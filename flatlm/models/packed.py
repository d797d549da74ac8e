"""A pack: K BERTs of one shape as one model with a leading member axis (issue 41).

``PackedBert`` holds each parameter of ``transformers.BertForMaskedLM`` (post-LN, the paper's) once,
stacked over K members: ``(K, *shape)``, under the name the single model gives it. Its forward is
the single model's, hand-batched: every linear layer is one ``baddbmm`` over the members, every
elementwise op one call on the ``(K, n, T+2, d)`` tensor, so an update of K members runs the
operations of about one (HFTA, Wang et al., MLSys 2021). ``torch.func.vmap`` over
``functional_call`` does the same at more overhead (bench/packs.py measures both).

Each member draws its dropout from its own ``torch.Generator``, one mask per dropout site of the
shape the single model draws it in and in the same order (embeddings; each layer's attention
probabilities, attention output, feed-forward output), with the kernel the single model's
``F.dropout`` calls on the CPU (``bernoulli_(1 - p)``, then ``div_(1 - p)``). A member whose
generator is in the state of its unpacked twin's global RNG therefore draws the twin's masks, bit
for bit (tests/train/test_pack.py). On CUDA the twin uses the fused dropout kernel, whose draws
differ: there the member's masks are equal to the twin's in distribution only.

Attention is what the single model's ``sdpa`` runs on the CPU: with dropout, the composite (math)
form, reproduced here (q and k each scaled by scale ** 0.5, masked positions at -inf, softmax,
each member's dropout); without, the fused kernel itself on the K n sentences as one batch. A
LayerNorm is one call per member (the fused kernel's weight and bias gradients add rows in an
order no batched form reproduces); every other op is one call for the pack. On CUDA the cuBLAS
and fused kernels need not keep these orders: members equal their twins there to float rounding.

>>> import torch
>>> from flatlm.models.bert import build_model
>>> from flatlm.models.presets import parse_model
>>> cfg = parse_model("d32-h2-l1-i64")
>>> models = [build_model(cfg, 12, 4, seed=s).eval() for s in (0, 1)]
>>> pack = PackedBert(models)
>>> ids = torch.tensor([[2, 5, 6, 7, 3, 0]]); mask = (ids != 0).long()
>>> logits = pack.word_logits(ids.expand(2, 1, 6), mask.expand(2, 1, 6), dropout=(0.0, 0.0))
>>> logits.shape  # (K, n, T+2, V)
torch.Size([2, 1, 6, 12])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from flatlm.core.tokens import WORD_OFFSET
from flatlm.models.masked_lm import unwrap

PREFIX = "bert."
HEAD = "cls.predictions."
LN_EPS = 1e-12  # BertConfig.layer_norm_eps, which build_bert leaves at its default


def packable(model: nn.Module) -> str | None:
    """None if ``model`` can be packed, else why not (for messages)."""
    from transformers import BertForMaskedLM  # deferred: the doctest imports build_model anyway

    inner = unwrap(model)
    if not isinstance(inner, BertForMaskedLM):
        return (f"only the post-LN BERT (BertForMaskedLM) is hand-batched, not "
                f"{type(inner).__name__}; train it unpacked")
    config = inner.config
    if config.hidden_act != "gelu" or config.layer_norm_eps != LN_EPS:
        return "its activation or LayerNorm epsilon differs from build_bert's"
    return None


class PackedBert(nn.Module):
    """K post-LN BERTs of one shape: parameter ``name`` is ``self.p(name)``, ``(K, *shape)``."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        why = next((w for w in map(packable, models) if w is not None), None)
        if why is not None:
            raise ValueError(f"pack: {why}")
        first = unwrap(models[0])
        self.names = [n for n, _ in first.named_parameters()]  # the single model's order
        shapes = {n: p.shape for n, p in first.named_parameters()}
        for m in models[1:]:
            other = {n: p.shape for n, p in unwrap(m).named_parameters()}
            if other != shapes:
                raise ValueError("pack: the members' models differ in shape")
        config = first.config
        self.n_heads, self.n_layers = config.num_attention_heads, config.num_hidden_layers
        self.params = nn.ParameterList([
            nn.Parameter(torch.stack([dict(unwrap(m).named_parameters())[n].detach()
                                      for m in models]))
            for n in self.names])

    @property
    def k(self) -> int:
        return self.params[0].shape[0]

    def p(self, name: str) -> torch.Tensor:
        return self.params[self.names.index(name)]

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters under the single model's names (copies, detached)."""
        return {n: p[k].detach().clone() for n, p in zip(self.names, self.params, strict=True)}

    def load_member(self, k: int, model: nn.Module) -> nn.Module:
        """Copies member k's parameters into ``model`` (a single BERT of the shape); returns it."""
        with torch.no_grad():
            params = dict(unwrap(model).named_parameters())
            for n, p in zip(self.names, self.params, strict=True):
                params[n].copy_(p[k])
        return model

    def keep(self, members: Sequence[int]) -> None:
        """Keeps only ``members`` (indices into the current pack), in that order."""
        index = torch.tensor(list(members), device=self.params[0].device)
        for i, p in enumerate(self.params):
            self.params[i] = nn.Parameter(p.detach().index_select(0, index))

    # ------------------------------------------------------------------ the forward

    def encoder(self, input_ids, attention_mask, dropout, generators=None) -> torch.Tensor:
        """(K, n, T+2, d) last hidden states for (K, n, T+2) ids and mask."""
        drop = _Dropout(dropout, generators)
        h = self._embeddings(input_ids)
        h = drop(_layer_norm(h, self.p(PREFIX + "embeddings.LayerNorm.weight"),
                             self.p(PREFIX + "embeddings.LayerNorm.bias")))
        blocked = ~attention_mask.bool()[:, :, None, None, :]  # (K, n, 1, 1, T+2)
        for i in range(self.n_layers):
            h = self._layer(h, blocked, f"{PREFIX}encoder.layer.{i}.", drop)
        return h

    def _embeddings(self, input_ids):
        K, n, width = input_ids.shape
        word = self.p(PREFIX + "embeddings.word_embeddings.weight")  # (K, V+4, d)
        position = self.p(PREFIX + "embeddings.position_embeddings.weight")
        token_type = self.p(PREFIX + "embeddings.token_type_embeddings.weight")
        h = _member_embedding(input_ids, word)  # (K, n, T+2, d)
        zeros = input_ids.new_zeros(K, n, width)  # one token type, as the single model reads it
        h = h + _member_embedding(zeros, token_type)
        ids = torch.arange(width, device=input_ids.device).expand(K, 1, width)
        return h + _member_embedding(ids, position)  # (K, 1, T+2, d) broadcast over n

    def _layer(self, h, blocked, pre, drop):
        K, n, width, d = h.shape
        H = self.n_heads
        dh = d // H

        def heads(x):  # (K, n, T+2, d) -> (K, n, H, T+2, dh)
            return x.view(K, n, width, H, dh).transpose(2, 3)

        q = heads(_linear(h, self.p(pre + "attention.self.query.weight"),
                          self.p(pre + "attention.self.query.bias")))
        k = heads(_linear(h, self.p(pre + "attention.self.key.weight"),
                          self.p(pre + "attention.self.key.bias")))
        v = heads(_linear(h, self.p(pre + "attention.self.value.weight"),
                          self.p(pre + "attention.self.value.bias")))
        context = _attention(q, k, v, blocked, drop).transpose(2, 3).reshape(K, n, width, d)
        out = drop(_linear(context, self.p(pre + "attention.output.dense.weight"),
                           self.p(pre + "attention.output.dense.bias")))
        h = _layer_norm(out + h, self.p(pre + "attention.output.LayerNorm.weight"),
                        self.p(pre + "attention.output.LayerNorm.bias"))
        inner = F.gelu(_linear(h, self.p(pre + "intermediate.dense.weight"),
                               self.p(pre + "intermediate.dense.bias")))
        out = drop(_linear(inner, self.p(pre + "output.dense.weight"),
                           self.p(pre + "output.dense.bias")))
        return _layer_norm(out + h, self.p(pre + "output.LayerNorm.weight"),
                           self.p(pre + "output.LayerNorm.bias"))

    def head(self, hidden: torch.Tensor, members=None) -> torch.Tensor:
        """Logits over all V+4 ids for (K, m, d) states (m any rows); ``members``: the states
        are those of these members (indices) only."""

        def p(name):
            return self.p(name) if members is None else self.p(name)[members]

        x = F.gelu(_linear(hidden, p(HEAD + "transform.dense.weight"),
                           p(HEAD + "transform.dense.bias")))
        x = _layer_norm(x, p(HEAD + "transform.LayerNorm.weight"),
                        p(HEAD + "transform.LayerNorm.bias"))
        return _linear(x, p(PREFIX + "embeddings.word_embeddings.weight"),
                       p(HEAD + "bias"))  # decoder tied to the word embeddings

    def word_logits(self, input_ids, attention_mask, positions=None, *, dropout,
                    generators=None) -> torch.Tensor | list[torch.Tensor]:
        """``flatlm.models.masked_lm.word_logits`` per member, for (K, n, T+2) ids and mask:
        (K, n, T+2, V) everywhere, (K, n, V) at one word position per sentence (``positions``
        (K, n) int), or at the True entries of bool ``positions`` (K, n, T) a list of K
        (k_m, V), the members' counts differing (the head runs on them padded to the largest)."""
        hidden = self.encoder(input_ids, attention_mask, dropout, generators)  # (K, n, T+2, d)
        if positions is None:
            return self._word_head(hidden)
        if positions.dtype != torch.bool:
            members = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
            rows = torch.arange(hidden.shape[1], device=hidden.device)[None, :]
            return self._word_head(hidden[members, rows, positions + 1])  # (K, n, V)
        # one head per member on its own k_m rows: padded to one length, the head's bias
        # gradients would sum over another number of rows, in another order
        return [self._word_head(h[:, 1:-1][pos][None], members=[k])[0]
                for k, (h, pos) in enumerate(zip(hidden, positions, strict=True))]

    def _word_head(self, hidden: torch.Tensor, members=None) -> torch.Tensor:
        """The head's logits over the V words (columns 4..V+3) for (K, ..., d) states, or for
        those of the pack's ``members`` (a list of indices) only."""
        K, *rows, d = hidden.shape
        logits = self.head(hidden.reshape(K, -1, d), members)
        return logits.view(K, *rows, -1)[..., WORD_OFFSET:]


class _Dropout:
    """Each member's dropout from its own generator, as ``F.dropout`` draws it on the CPU: a
    ``bernoulli_(1 - p)`` mask of the member's slice, ``div_(1 - p)``, times the input. A member
    at p = 0 draws nothing (``F.dropout`` returns its input)."""

    def __init__(self, p: Sequence[float], generators):
        self.p = [float(x) for x in p]
        self.generators = generators
        if any(x > 0 for x in self.p) and generators is None:
            raise ValueError("pack: dropout > 0 needs one generator per member")

    @property
    def active(self) -> bool:
        return any(self.p)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return x
        noise = torch.empty_like(x)  # member k's slice is contiguous: the draw of its shape
        keep = []
        for k, p in enumerate(self.p):
            if p == 0:
                noise[k].fill_(1.0)
            else:
                noise[k].bernoulli_(1 - p, generator=self.generators[k])
            keep.append(1 - p)
        shape = (len(keep),) + (1,) * (x.dim() - 1)  # / (1 - p): the kernel divides, as ours
        return x * noise.div_(torch.tensor(keep, dtype=x.dtype, device=x.device).view(shape))


def _attention(q, k, v, blocked, drop) -> torch.Tensor:
    """(K, n, H, T+2, dh) attention outputs, as the single model's ``sdpa`` computes them on the
    CPU: a member with dropout through the composite (math) kernel, reproduced here so that its
    mask is drawn from its own generator; a member without, through the fused kernel itself, on
    the K n sentences as one batch (a sentence's result does not depend on the batch). A pack
    that mixes the two computes both and picks each member's (the other's gradient is 0)."""
    K, n, H, width, dh = q.shape
    scale = dh ** -0.5
    fused = math = None
    if not all(drop.p):
        fused = F.scaled_dot_product_attention(
            q.reshape(K * n, H, width, dh), k.reshape(K * n, H, width, dh),
            v.reshape(K * n, H, width, dh), attn_mask=~blocked.reshape(K * n, 1, 1, width),
            scale=scale).view(K, n, H, width, dh)
    if drop.active:
        root = scale ** 0.5  # the math kernel scales q and k by sqrt(scale) each
        scores = (q * root) @ (k.transpose(-2, -1) * root)  # (K, n, H, T+2, T+2)
        scores = scores.masked_fill(blocked, float("-inf"))
        math = drop(torch.softmax(scores, dim=-1)) @ v
    if fused is None or math is None:
        return math if fused is None else fused
    dropped = torch.tensor([p > 0 for p in drop.p], device=q.device).view(K, 1, 1, 1, 1)
    return torch.where(dropped, math, fused)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``F.linear`` per member: x (K, ..., in), weight (K, out, in), bias (K, out)."""
    K, *rows, n_in = x.shape
    out = torch.baddbmm(bias[:, None, :], x.reshape(K, -1, n_in), weight.transpose(1, 2))
    return out.view(K, *rows, -1)


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``F.layer_norm`` over the last dim with member k's weight and bias on slice k."""
    # one call per member: the fused kernel's weight and bias gradients sum the rows in an
    # order that a batched form (normalise, then scale and shift) does not reproduce
    return torch.stack([F.layer_norm(x_k, x.shape[-1:], w_k, b_k, eps=LN_EPS)
                        for x_k, w_k, b_k in zip(x, weight, bias, strict=True)])


def _member_embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows of member k's table (K, N, d) at ids[k]: one embedding lookup over the stacked
    tables, so that its backward adds each member's rows in the single model's order."""
    K, N, d = table.shape
    offsets = (torch.arange(K, device=ids.device) * N).view(K, *([1] * (ids.dim() - 1)))
    return F.embedding(ids + offsets, table.reshape(K * N, d))
