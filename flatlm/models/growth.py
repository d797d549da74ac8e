"""Function-preserving growth of a BERT (paper B.4): a small masked LM as a point of a larger one.

``grow(model, target, construction=...)`` returns a BERT of shape ``target`` (post-LN
``BertForMaskedLM``, or pre-LN ``RobertaPreLayerNormForMaskedLM`` for a pre-LN model) whose logits
equal ``model``'s on every input (eval mode; float rounding and LayerNorm eps aside); growth keeps
the LayerNorm placement (``ln_mode``). With width factor ``m = d'/d``, intermediate factor
``k = d_inter'/d_inter`` and ``L' = n_layers' - n_layers`` added blocks.

Two constructions (``CONSTRUCTIONS``, in ``flatlm.models.constructions``) compute the same
function but are different points of the large architecture, so Tr(F) and Tr(H) of the grown
model differ between them (several-fold on the CPU sweep's models): a trace depends on the
parameterisation. Which one a grown number used is a
setting (``measure.growth_construction``, ``flatlm grow --construction``) and is recorded.

- ``"paper"`` (default): B.4.2 as written, ``W~_E = 1/m [W_E; ..; W_E]``, and the released
  ``enlarge.py``. Every input embedding (word, position, token type: ``enlarge.py`` divides every
  ``*embeddings.weight``; B.4.2's model has W_E alone, and dividing only the word embedding would
  change the function) is tiled and divided by m, so the tied decoder is ``tile(E) / m`` and
  ``[z, .., z] . tile(E)^T / m = z . E^T``; every LayerNorm is tiled unscaled, the MLM head's too.
  The embedding LayerNorm sees ``x / m`` and is scale invariant up to its eps
  (``LN(x/m) = LN(x)`` with eps replaced by ``m^2 eps``: a relative ``m^2 eps / (2 Var x)``, 1e-12
  in transformers' BERT). Added blocks: every parameter zero ("fill in zeros to the added
  parameters"; ``enlarge.py``: ``torch.zeros_like`` for every parameter the small model lacks).
  Pre-LN (the released model) an all-zero block is the identity exactly. Post-LN an all-zero block
  would emit its zero LayerNorm's beta = 0 (and B.4.2's "v_l = h_l" fails for any LayerNorm, see
  Depth below), so there the LayerNorms of added blocks follow the depth construction below; every
  other parameter of an added block (query, key, value, MLP up-projection, output projections,
  all biases) is zero.
- ``"head-norm"``: flatlm's earlier construction. The embeddings are tiled unscaled and the MLM
  head's LayerNorm absorbs the factor (gamma' = tile(gamma) / m, beta' = tile(beta) / m), so the
  decoder ``tile(E)`` meets ``[z, .., z] / m``; exact (no eps term). Added blocks: zero
  attention-output and MLP-output weights and biases; query, key, value and the MLP up-projection
  keep their fresh initialisation (``seed``), so gradients reach the zeroed projections when the
  grown model trains (``train.grow`` uses this one: from an all-zero block only the output biases
  would ever move).

The released ``enlarge.py`` (as committed it does not run: it reads ``args.small_model_path`` and
``state_dict_large``, neither defined, and saves over ``--large-model-path``) agrees with B.4.2
wherever the text says something: the same ``1/m`` on the input embeddings and the tied decoder,
LayerNorms tiled, ``W~ = tile(W) / m`` for every other weight (its one factor ``m`` for d_model and
d_inter alike; ``"paper"`` allows ``k != m`` as Table 4 needs), biases tiled, added parameters zero.
So there is no separate "released" construction.

Width (B.4.2, "replication"), both constructions. Every residual-stream vector ``h`` (d) becomes
``[h, .., h]`` (m d):

- LayerNorms: gamma and beta tiled. Tiling a vector keeps its mean and variance, so
  ``LN'([x, .., x]) = [LN(x), .., LN(x)]`` exactly, eps included;
- a Linear d_in -> d_out grown by (f_in, f_out): ``W' = tile(W, f_out, f_in) / f_in``,
  ``b' = tile(b, f_out)``. The input side averages the f_in copies, the output side repeats;
- attention: the head size d / n_heads stays (64 in the paper), so n_heads' = m n_heads and head
  ``j + c n_heads`` is a copy of head j (query, key and value are Linears as above). Each copy has
  the same scores, softmax scale 1/sqrt(head size) and pattern; the output projection averages;
- MLP: up-projection grown by (m, k), down-projection by (k, m); GELU acts elementwise.

Depth (B.4.2, "adding additional layers"). BERT is post-LN: a block maps h to
``LN_b(v + MLP(v))`` with ``v = LN_a(h + Attn(h))``. With zero attention-output and MLP-output
weights and biases a block computes ``LN_b(LN_a(h))``, which is not h: h is itself the output of a
LayerNorm with trained gamma and beta, and ``normalize(gamma * x_hat + beta) != x_hat`` unless
gamma is constant and beta too. (B.4.2's "v_l(x) = h_l(x)" holds only where the incoming stream is
already normalised with gamma = 1, beta = 0, e.g. at initialisation.) The construction used here:

- the last original block's output LayerNorm is set to (gamma = 1, beta = 0), so the stream it
  emits is ``x_hat``, the normalised vector;
- each added block has zero attention-output and MLP-output weights and biases and LayerNorms
  (1, 0), except the top block's output LayerNorm, which takes the original (gamma, beta).

The added blocks then compute ``gamma * normalize(..normalize(x_hat)) + beta``. ``normalize(x_hat)``
differs from ``x_hat`` only through the eps inside the square root (transformers' BERT: 1e-12):
the first re-normalisation scales ``x_hat`` by 1 - eps (1 - 1/Var(x)) / 2 (Var(x): the variance
the original LayerNorm divided by), later ones by 1 + O(eps^2). So added blocks are exact up to a
relative 1e-12 (tests: 1e-10 in float64; 1e-13 with eps = 0), and width growth alone (L' = 0) is
exact in exact arithmetic under ``"head-norm"``. No choice of the added block's own parameters
avoids moving (gamma, beta): with zero output projections it computes ``LN_b(LN_a(h))``, whose
input mean and variance depend on x_hat through gamma and beta. The zeroed and free parameters
change the Hessian with respect to the new blocks; B.4 compares traces over the shared parameters.

Pre-LN (``ln_mode="pre"``): a block maps h to ``v + MLP(LN_b(v))`` with ``v = h + Attn(LN_a(h))``
and a final LayerNorm follows the last block. Width growth is the same replication (each LayerNorm
sits in front of a sublayer, or is the final one, and is tiled). An added block with zero
attention-output and MLP-output weights and biases returns h itself, whatever its other
parameters: ``"paper"`` zeros them all (LayerNorms included), ``"head-norm"`` leaves them at their
fresh initialisation; no LayerNorm is moved.

>>> import torch
>>> from flatlm.models.masked_lm import build_model
>>> from flatlm.models.presets import parse_model
>>> from flatlm.core.tokens import encode
>>> small = build_model(parse_model("d64-h1-l1-i256"), vocab_size=10, max_length=5, seed=0).eval()
>>> big = grow(small, parse_model("d128-h2-l2-i512"))
>>> ids, mask = encode(torch.tensor([[3, 1, 4, -1, -1]]), torch.tensor([3]))
>>> with torch.no_grad():
...     diff = big(input_ids=ids, attention_mask=mask).logits - small(input_ids=ids,
...                                                                 attention_mask=mask).logits
>>> bool(diff.abs().max() < 1e-5)
True
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from flatlm.core.tokens import encode
from flatlm.models.architectures import architecture, can_grow, labels_where
from flatlm.models.bert import is_transformer, ln_mode, transformer_parts
from flatlm.models.checkpoint import load_checkpoint, save_checkpoint
from flatlm.models.constructions import DEFAULT_CONSTRUCTION, check_construction
from flatlm.models.masked_lm import build_model, model_layout, unwrap
from flatlm.models.presets import ModelConfig, parse_model, shape_string


@dataclasses.dataclass(frozen=True, kw_only=True)
class Growth:
    """How a target shape relates to a source shape (``growth``)."""

    width: int  # m = d_model' / d_model, also n_heads' / n_heads; >= 1
    inter: int  # k = d_inter' / d_inter; >= 1
    added_layers: int  # L' = n_layers' - n_layers; >= 0


def growth(source: ModelConfig, target: ModelConfig) -> Growth:
    """The factors taking ``source`` to ``target``; a ValueError names the field that does not fit.

    >>> growth(parse_model("bert-4.8m"), parse_model("bert-950m"))
    Growth(width=15, inter=15, added_layers=16)
    """
    for name, cfg in (("checkpoint", source), ("target", target)):
        check_can_grow(cfg, f"{name} model.arch={cfg.arch!r}")
    if target.ln_mode != source.ln_mode:
        raise ValueError(f"target model.ln_mode={target.ln_mode!r} but the checkpoint's is "
                         f"{source.ln_mode!r}: growth keeps the LayerNorm placement (a pre-LN "
                         "shape ends in '-pre')")
    d, h, i, n = source.d_model, source.n_heads, source.d_inter, source.n_layers
    if target.d_model < d or target.d_model % d:
        raise ValueError(f"target model.d_model={target.d_model} is not a multiple of the "
                         f"checkpoint's d_model={d} (width grows by replication, B.4.2)")
    m = target.d_model // d
    if target.n_heads != m * h:
        raise ValueError(f"target model.n_heads={target.n_heads}: width x{m} duplicates each of "
                         f"the checkpoint's {h} heads {m} times, so n_heads must be {m * h} "
                         f"(head size {d // h} is kept)")
    if target.d_inter < i or target.d_inter % i:
        raise ValueError(f"target model.d_inter={target.d_inter} is not a multiple of the "
                         f"checkpoint's d_inter={i}")
    if target.n_layers < n:
        raise ValueError(f"target model.n_layers={target.n_layers} is fewer than the "
                         f"checkpoint's n_layers={n}; blocks can only be added")
    return Growth(width=m, inter=target.d_inter // i, added_layers=target.n_layers - n)


def check_can_grow(cfg: ModelConfig, what: str) -> None:
    """A ValueError starting with ``what`` unless ``cfg``'s architecture can grow."""
    if not can_grow(cfg):
        raise ValueError(f"{what}: only {labels_where(can_grow)}s can grow (B.4)")


def bert_shape(model: nn.Module) -> ModelConfig:
    """The ``ModelConfig`` of a built BERT (either ``ln_mode``), read from its own ``config``."""
    c = unwrap(model).config
    return ModelConfig(arch="bert", d_model=c.hidden_size, n_heads=c.num_attention_heads,
                       n_layers=c.num_hidden_layers, d_inter=c.intermediate_size,
                       dropout=c.hidden_dropout_prob, ln_mode=ln_mode(model))


def _linear(dst: nn.Linear, src: nn.Linear) -> None:
    f_out = dst.out_features // src.out_features
    f_in = dst.in_features // src.in_features
    dst.weight.copy_(src.weight.repeat(f_out, f_in) / f_in)  # (out', in')
    dst.bias.copy_(src.bias.repeat(f_out))


def _layer_norm(dst: nn.LayerNorm, src: nn.LayerNorm, scale: float = 1.0) -> None:
    f = dst.weight.numel() // src.weight.numel()
    dst.weight.copy_(src.weight.repeat(f) * scale)
    dst.bias.copy_(src.bias.repeat(f) * scale)


def _reset(norm: nn.LayerNorm) -> None:
    norm.weight.fill_(1.0)
    norm.bias.zero_()


def _zero(linear: nn.Linear) -> None:
    linear.weight.zero_()
    linear.bias.zero_()


_BLOCK_LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense", "intermediate.dense", "output.dense")
_BLOCK_NORMS = {"post": ("attention.output.LayerNorm", "output.LayerNorm"),
                "pre": ("attention.LayerNorm", "intermediate.LayerNorm")}
# MLM head: (transform dense, its LayerNorm, output bias owner) under the model, by ln_mode
_HEAD = {"post": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                  "cls.predictions"),
         "pre": ("lm_head.dense", "lm_head.layer_norm", "lm_head")}


def grow(model: nn.Module, target: ModelConfig, *, seed: int = 0,
         construction: str = DEFAULT_CONSTRUCTION) -> nn.Module:
    """A BERT of shape ``target`` computing the same logits as ``model`` (a post- or pre-LN
    BERT from ``build_model``; ``target.ln_mode`` must be the model's), by ``construction``
    (``CONSTRUCTIONS``: "paper", B.4.2 and enlarge.py, or "head-norm"; module docstring).

    ``target`` must be ``model``'s shape with d_model and d_inter multiplied by integers,
    n_heads by the d_model factor, and n_layers the same or more (``growth`` says why not).
    ``target.dropout`` and ``.attention`` configure the new model. ``seed`` initialises the
    parameters "head-norm" leaves free (query, key, value and MLP up-projection of added
    blocks; pre-LN: also their LayerNorms); "paper" zeros them. The result has ``model``'s
    device, dtype and train/eval mode.
    """
    check_construction(construction)
    small = unwrap(model)
    if not is_transformer(small):
        raise ValueError("model.arch: only a BertForMaskedLM or RobertaPreLayerNormForMaskedLM "
                         f"(pre-LN) can grow, got {type(small).__name__}")
    mode = ln_mode(small)
    g = growth(bert_shape(small), target)
    layout = model_layout(small)
    small_encoder = transformer_parts(small)[0]
    ref = small_encoder.embeddings.word_embeddings.weight
    big = build_model(target, layout.n_words, layout.max_length, seed=seed)
    big = big.to(device=ref.device, dtype=ref.dtype).train(small.training)
    big.config.layer_norm_eps = small.config.layer_norm_eps
    for module in big.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = small.config.layer_norm_eps

    paper = construction == "paper"
    with torch.no_grad():
        big_encoder = transformer_parts(big)[0]
        if paper:  # B.4.2 / enlarge.py: "fill in zeros to the added parameters"
            for block in big_encoder.encoder.layer[len(small_encoder.encoder.layer):]:
                for p in block.parameters():
                    p.zero_()
        _grow_encoder(small_encoder, big_encoder, g, mode,
                      embedding_scale=1.0 / g.width if paper else 1.0)
        dense, norm, bias_owner = _HEAD[mode]
        _linear(big.get_submodule(dense), small.get_submodule(dense))
        # the factor m of [z, .., z] . tile(E)^T: in the tied embedding (paper) or here
        _layer_norm(big.get_submodule(norm), small.get_submodule(norm),
                    scale=1.0 if paper else 1.0 / g.width)
        big.get_submodule(bias_owner).bias.copy_(small.get_submodule(bias_owner).bias)
    decoder = big.get_output_embeddings()
    assert decoder.weight is transformer_parts(big)[0].embeddings.word_embeddings.weight
    return big


def _grow_encoder(s_enc: nn.Module, b_enc: nn.Module, g: Growth, mode: str, *,
                  embedding_scale: float) -> None:
    """Embeddings (tiled, times ``embedding_scale``) and blocks of the encoder ``s_enc`` into
    ``b_enc`` (module docstring)."""
    s, b = s_enc.embeddings, b_enc.embeddings
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        tiled = getattr(s, name).weight.repeat(1, g.width)  # (n, m d)
        getattr(b, name).weight.copy_(tiled * embedding_scale)
    _layer_norm(b.LayerNorm, s.LayerNorm)
    n = len(s_enc.encoder.layer)
    for s_block, b_block in zip(s_enc.encoder.layer, b_enc.encoder.layer[:n], strict=True):
        for path in _BLOCK_LINEARS + _BLOCK_NORMS[mode]:
            copy = _linear if path in _BLOCK_LINEARS else _layer_norm
            copy(b_block.get_submodule(path), s_block.get_submodule(path))
    for b_block in b_enc.encoder.layer[n:]:  # zero outputs: pre-LN blocks are then identities
        _zero(b_block.attention.output.dense)
        _zero(b_block.output.dense)
    if mode == "pre":
        _layer_norm(b_enc.LayerNorm, s_enc.LayerNorm)  # the final LayerNorm
        return
    for b_block in b_enc.encoder.layer[n:]:
        for path in _BLOCK_NORMS[mode]:
            _reset(b_block.get_submodule(path))
    if g.added_layers:  # move the last original (gamma, beta) to the top; see the docstring
        last, top = b_enc.encoder.layer[n - 1].output.LayerNorm, b_enc.encoder.layer[-1]
        top.output.LayerNorm.load_state_dict(last.state_dict())
        _reset(last)


def grow_checkpoint(
    ckpt_dir: str | Path, target: str | ModelConfig, out_dir: str | Path, *, seed: int = 0,
    construction: str = DEFAULT_CONSTRUCTION,
) -> Path:
    """Grows the BERT checkpoint in ``ckpt_dir`` to ``target`` and saves it to ``out_dir``.

    ``target`` is a preset name, a shape string (``d128-h2-l5-i512``) or a ``ModelConfig``; a
    name or shape takes the checkpoint's dropout, attention implementation and ``ln_mode`` (a
    pre-LN checkpoint grows pre-LN without the '-pre' suffix). ``out_dir`` must be
    new or empty. ``construction``: ``CONSTRUCTIONS``. ``flatlm.json`` keeps the source spec and
    extras and adds ``extra["grown_from"]`` (the checkpoint's path and shape, the factors,
    ``seed`` and ``construction``). Returns ``out_dir``.
    """
    check_construction(construction, "--construction")
    ckpt_dir, out_dir = Path(ckpt_dir), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"--out {out_dir} exists and is not an empty directory")
    model, info = load_checkpoint(ckpt_dir)
    source = ModelConfig(**info["model"])
    if isinstance(target, ModelConfig):
        target_cfg = target
    else:
        target_cfg = parse_model(target)
        if target_cfg.ln_mode == "post":  # unsuffixed: the checkpoint's; "-pre" is checked
            target_cfg = dataclasses.replace(target_cfg, ln_mode=source.ln_mode)
        target_cfg = dataclasses.replace(target_cfg, dropout=source.dropout,
                                         attention=source.attention)
    g = growth(source, target_cfg)
    big = architecture(source).grow(model, target_cfg, seed=seed, construction=construction)
    extra = dict(info.get("extra") or {})
    extra["grown_from"] = {"checkpoint": str(ckpt_dir.resolve()), "shape": shape_string(source),
                           **dataclasses.asdict(g), "seed": seed, "construction": construction}
    json.dumps(extra)  # fail before writing anything
    return save_checkpoint(big, out_dir, source_spec=info["source"], model_cfg=target_cfg,
                           extra=extra)


def random_inputs(
    model: nn.Module, n: int, *, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode``d random sentences for ``model``: n rows of uniform words, lengths 1..T."""
    layout = model_layout(model)
    g = torch.Generator().manual_seed(seed)
    T = layout.max_length
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    tokens = torch.randint(0, layout.n_words, (n, T), generator=g)
    tokens[torch.arange(T)[None, :] >= lengths[:, None]] = -1
    return encode(tokens, lengths)


@torch.no_grad()
def max_logit_difference(small: nn.Module, big: nn.Module, *, n: int = 8, seed: int = 0) -> float:
    """max |logits(big) - logits(small)| over all positions of n random sentences, in eval mode."""
    ids, mask = random_inputs(small, n, seed=seed)
    device = next(small.parameters()).device
    modes = small.training, big.training
    small.eval(), big.eval()
    try:
        a = small(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        b = big(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    finally:
        small.train(modes[0]), big.train(modes[1])
    return float((a.double() - b.double().to(a.device)).abs().max())
