"""Per-example squared gradient norms from one batched forward and backward ("ghost norms").

For a batch of B inputs and a scalar per input, s_i = <u_i, z_i(theta)> (z_i the logits of input
i, u_i a fixed output direction), ``GhostNorms`` returns ||grad_theta s_i||^2 for every i from one
backward of sum_i s_i, without forming a per-example gradient. Hooks save each layer's input a and
the gradient g of its output; per example (positions t, s of one sequence):

- ``nn.Linear`` weight: ||sum_t g_t a_t^T||^2 = sum_{t,s} (a_t . a_s)(g_t . g_s) (Gram form), or
  the outer products summed directly when T (d_in + d_out) > d_in d_out; bias ||sum_t g_t||^2.
- ``nn.Embedding``: sum_{t,s} [id_t = id_s != padding_idx] (g_t . g_s).
- ``nn.LayerNorm``: ||sum_t g_t * xhat_t||^2 and ||sum_t g_t||^2, xhat the normalised input.

A parameter used by several modules (BERT's word embedding tied to the decoder) needs the cross
term 2 <G_emb, G_dec>; for those the per-example gradient is materialised, (B, *shape), summed over
its users and then squared: cheap for a vocabulary of a few hundred words. A parameter reachable
under two names (the head's aliased output bias) is one object and counts once.

Backward passes use ``torch.autograd.grad`` with respect to the embeddings' outputs, so no
parameter gradient is computed and ``.grad`` is untouched (every hooked layer must lie on the path
to an embedding, which is checked). Every hooked layer must see the batch in
dimension 0: BERT is run with explicit (B, T) position and token-type ids (``word_logits_b``),
since transformers' default broadcast (1, T) position ids would sum their gradient over the batch.

Supported (``supports``): ``build_model``'s transformers, post-LN ``BertForMaskedLM`` and pre-LN
``RobertaPreLayerNormForMaskedLM``; both hold every parameter in a Linear, Embedding or LayerNorm
(pre-LN's MLM output bias is its decoder Linear's bias, aliased as ``lm_head.bias``). Other models
(the BiLSTM: ``nn.LSTM`` has no per-example form here, and its decoder reads the embedding through
``F.linear``) use the fallbacks in ``measure.fisher``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flatlm.core.tokens import WORD_OFFSET
from flatlm.models.bert import is_transformer, position_ids, transformer_parts
from flatlm.models.masked_lm import unwrap, word_logits

LAYERS = (nn.Linear, nn.Embedding, nn.LayerNorm)


def supports(model: nn.Module) -> bool:
    """Whether ``GhostNorms`` handles this model (every parameter in a Linear/Embedding/LayerNorm
    that sees the batch in dimension 0)."""
    return is_transformer(model)


def word_logits_b(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``word_logits`` at one word per sentence (n, V), with explicit (n, T+2) position and
    token-type ids for the transformers so that every embedding's output has the batch
    dimension."""
    if not is_transformer(model):
        return word_logits(model, input_ids, attention_mask, positions)
    encoder, head = transformer_parts(model)
    hidden = encoder(
        input_ids=input_ids, attention_mask=attention_mask,
        position_ids=position_ids(model, input_ids), token_type_ids=torch.zeros_like(input_ids),
    ).last_hidden_state  # (n, T+2, d)
    rows = torch.arange(len(input_ids), device=hidden.device)
    return head(hidden[rows, positions + 1])[:, WORD_OFFSET:]  # (n, V)


def _flat(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, ..., i), (B, ..., o) -> (B, S, i), (B, S, o) in at least float32."""
    dtype = torch.promote_types(g.dtype, torch.float32)
    return a.reshape(a.shape[0], -1, a.shape[-1]).to(dtype), g.reshape(g.shape[0], -1,
                                                                       g.shape[-1]).to(dtype)


def _gram(x: torch.Tensor) -> torch.Tensor:
    return x @ x.transpose(1, 2)  # (B, S, S)


def linear_weight_sq(a: torch.Tensor, g: torch.Tensor, gram=_gram) -> torch.Tensor:
    """Per-example ||sum_t g_t a_t^T||^2 (B,): the squared norm of a Linear weight's gradient
    from its inputs a (B, ..., i) and output gradients g (B, ..., o), in the cheaper of the Gram
    and outer-product forms (module docstring; ``measure.lstm_ghost`` reads it for the LSTM's
    weights). ``gram`` computes a's Gram matrix: a cache shares it between layers reading one
    input (query, key and value)."""
    a, g = _flat(a, g)  # (B, S, i), (B, S, o)
    S, i, o = a.shape[1], a.shape[2], g.shape[2]
    if S == 1:
        return a.square().sum((1, 2)) * g.square().sum((1, 2))
    if S * (i + o) <= i * o:  # Gram form: B S^2 (i + o) flops
        return (gram(a) * _gram(g)).sum((1, 2))
    return torch.einsum("bso,bsi->boi", g, a).square().sum((1, 2))


def _embedding_sq(ids: torch.Tensor, g: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
    ids = ids.reshape(ids.shape[0], -1)  # (B, S)
    g = g.reshape(g.shape[0], -1, g.shape[-1]).to(torch.promote_types(g.dtype, torch.float32))
    same = ids[:, :, None] == ids[:, None, :]  # (B, S, S)
    if padding_idx is not None:
        same &= (ids != padding_idx)[:, :, None]
    return ((g @ g.transpose(1, 2)) * same).sum((1, 2))


def _layernorm_xhat(module: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, module.normalized_shape, eps=module.eps)


def _per_example_grad(module: nn.Module, kind: str, a: torch.Tensor, g: torch.Tensor):
    """Per-example gradient (B, *param.shape) of ``module``'s ``kind`` ("weight" / "bias")."""
    if isinstance(module, nn.Embedding):
        ids = a.reshape(a.shape[0], -1)  # (B, S)
        g = g.reshape(g.shape[0], -1, g.shape[-1]).to(torch.promote_types(g.dtype, torch.float32))
        if module.padding_idx is not None:
            g = g * (ids != module.padding_idx)[:, :, None]
        out = g.new_zeros(ids.shape[0], module.num_embeddings, g.shape[-1])
        return out.scatter_add_(1, ids[:, :, None].expand_as(g), g)
    if isinstance(module, nn.LayerNorm):
        a = _layernorm_xhat(module, a)
    a, g = _flat(a, g)
    if kind == "bias":
        return g.sum(1)
    if isinstance(module, nn.Linear):
        return torch.einsum("bso,bsi->boi", g, a)
    return (g * a).sum(1)  # LayerNorm weight


def _sq_norm(
    module: nn.Module, kind: str, a: torch.Tensor, g: torch.Tensor, gram=_gram
) -> torch.Tensor:
    """||per-example gradient||^2 (B,) of ``module``'s ``kind`` without materialising it."""
    if isinstance(module, nn.Embedding):
        return _embedding_sq(a, g, module.padding_idx)
    if kind == "bias":
        return _flat(g, g)[1].sum(1).square().sum(1)
    if isinstance(module, nn.Linear):
        return linear_weight_sq(a, g, gram)
    xhat, g = _flat(_layernorm_xhat(module, a), g)
    return (g * xhat).sum(1).square().sum(1)


def _tied_cross(emb: nn.Embedding, ids, g_e, a, g_d) -> torch.Tensor:
    """<G_emb, G_dec> per example for an embedding and a Linear sharing one (N, d) weight:
    sum_{t,s} g_d[s, id_t] (a_s . g_e[t]), t over the embedded ids (not padding), s over the
    decoder's positions."""
    ids = ids.reshape(ids.shape[0], -1)  # (B, T)
    g_e = g_e.reshape(g_e.shape[0], -1, g_e.shape[-1])  # (B, T, d)
    a, g_d = _flat(a, g_d)  # (B, S, d), (B, S, N)
    g_e = g_e.to(a.dtype)
    if emb.padding_idx is not None:
        g_e = g_e * (ids != emb.padding_idx)[:, :, None]
    at_ids = g_d.gather(2, ids[:, None, :].expand(-1, g_d.shape[1], -1))  # (B, S, T)
    return (at_ids * (a @ g_e.transpose(1, 2))).sum((1, 2))


def _shared_sq(pieces: list) -> torch.Tensor:
    """||sum of the users' per-example gradients||^2 of one shared parameter (B,)."""
    kinds = sorted((type(m).__name__, kind) for m, kind, _, _ in pieces)
    if kinds == [("Embedding", "weight"), ("Linear", "weight")]:  # tied embedding / decoder
        (emb, _, ids, g_e), (_, _, a, g_d) = sorted(
            pieces, key=lambda piece: not isinstance(piece[0], nn.Embedding))
        return (_sq_norm(emb, "weight", ids, g_e) + linear_weight_sq(a, g_d)
                + 2 * _tied_cross(emb, ids, g_e, a, g_d))
    total = None
    for module, kind, a, g in pieces:  # any other sharing: materialise (B, *shape)
        pe = _per_example_grad(module, kind, a, g)
        total = pe if total is None else total + pe
    return total.flatten(1).square().sum(1)


class GhostNorms:
    """Hooks that give per-example squared gradient norms of ``params`` after each backward.

    Use as a context manager around the forward and the backward passes::

        with GhostNorms(model, params) as ghost:
            logits = word_logits_b(model, ids, mask, positions)  # (B, V)
            for u in directions:                                  # (B, V) each
                ghost.backward((u * logits).sum(), retain_graph=True)
                sq = ghost.pop()                                  # (B,) ||grad s_i||^2
    """

    def __init__(self, model: nn.Module, params: dict[str, nn.Parameter]):
        self.model = model
        wanted = {id(p): name for name, p in params.items()}
        users: dict[int, list[tuple[nn.Module, str]]] = {}
        for module in model.modules():
            if not isinstance(module, LAYERS):
                continue
            for kind in ("weight", "bias"):
                p = getattr(module, kind, None)
                if isinstance(p, nn.Parameter) and id(p) in wanted:
                    users.setdefault(id(p), []).append((module, kind))
        missing = [name for key, name in wanted.items() if key not in users]
        if missing or not supports(model):
            raise TypeError(
                "ghost norms need BertForMaskedLM or RobertaPreLayerNormForMaskedLM with every "
                f"parameter in {LAYERS}; "
                f"got {type(unwrap(model)).__name__}, unsupported: {missing[:5]}"
            )
        self._shared = {key for key, u in users.items() if len(u) > 1}
        self._kinds: dict[nn.Module, list[tuple[str, int]]] = {}
        for key, u in users.items():
            for module, kind in u:
                self._kinds.setdefault(module, []).append((kind, key))
        self._handles: list = []
        self._outputs: list[torch.Tensor] = []
        self._inputs_side: list[torch.Tensor] = []  # the embeddings' outputs
        self._grams: dict = {}  # saved input -> its Gram matrix, for the current forward
        self._expected = self._fired = 0
        self._sq: torch.Tensor | None = None
        self._pieces: dict[int, list] = {}  # shared parameter -> its users' (module, kind, a, g)

    def __enter__(self) -> GhostNorms:
        for module in self._kinds:
            self._handles.append(module.register_forward_hook(self._save))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.new_forward()

    def _save(self, module: nn.Module, inputs, output) -> None:
        if not (torch.is_grad_enabled() and output.requires_grad):
            return
        a = inputs[0].detach()
        self._outputs.append(output)
        if isinstance(module, nn.Embedding):
            self._inputs_side.append(output)
        self._expected += 1
        output.register_hook(lambda g, m=module, a=a: self._accumulate(m, a, g.detach()))

    def _accumulate(self, module: nn.Module, a: torch.Tensor, g: torch.Tensor) -> None:
        self._fired += 1
        if a.shape[0] != g.shape[0] or (self._sq is not None and g.shape[0] != len(self._sq)):
            raise RuntimeError(f"{type(module).__name__} does not see the batch in dimension 0")
        for kind, key in self._kinds[module]:
            if key in self._shared:
                self._pieces.setdefault(key, []).append((module, kind, a, g))
            else:
                sq = _sq_norm(module, kind, a, g, self._cached_gram)
                self._sq = sq if self._sq is None else self._sq + sq

    def _cached_gram(self, a: torch.Tensor) -> torch.Tensor:
        """Gram matrix of a saved input, once per forward (shared by query, key and value, and
        by the backward passes of several directions)."""
        key = (a.data_ptr(), a.shape, a.stride(), a.dtype)
        if key not in self._grams:  # holding ``a`` keeps its address from being reused
            self._grams[key] = (a, _gram(a))
        return self._grams[key][1]

    def backward(self, scalar: torch.Tensor, *, retain_graph: bool = False) -> None:
        """Backward of ``scalar`` through the hooked layers only (no parameter gradients)."""
        if not self._outputs:
            raise RuntimeError("no hooked layer ran with gradients enabled since entering")
        # Asking for the embeddings' outputs only sends the gradient through every layer above
        # them (firing their hooks) without capturing a copy at each; no weight gradient is formed.
        self._fired = 0
        torch.autograd.grad(scalar, self._inputs_side or self._outputs,
                            retain_graph=retain_graph, allow_unused=True)
        if self._fired != self._expected:
            raise RuntimeError(f"{self._expected - self._fired} hooked layer outputs got no "
                               "gradient; they lie off the path to the embeddings")

    def pop(self) -> torch.Tensor:
        """(B,) per-example squared norms since the last ``pop``; resets for the next backward."""
        total = self._sq
        for pieces in self._pieces.values():
            sq = _shared_sq(pieces)
            total = sq if total is None else total + sq
        self._sq, self._pieces = None, {}
        if total is None:
            raise RuntimeError("no gradient reached a hooked layer")
        return total

    def new_forward(self) -> None:
        """Forget the previous forward's outputs (call before each new batch)."""
        self._outputs.clear()
        self._inputs_side.clear()
        self._grams.clear()
        self._expected = 0
