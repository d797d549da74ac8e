"""The "paper" growth construction is B.4.2's, entry for entry: every weight of the grown model is
built here by hand from the paper's formulas (m = 2) with explicit index loops, and compared
exactly with what ``grow`` returns.

B.4.2 (m = 2): W~_E = 1/2 [W_E; W_E]; gamma~ = [gamma; gamma], beta~ = [beta; beta], b~ = [b; b];
W~ = 1/2 [[W, W], [W, W]] for the MLP (W, U) and the attention output O; per head
Q~_k = 1/2 [Q_k; Q_k] (likewise K, V) for k <= n_h and head k > n_h a copy of head k - n_h; added
blocks filled with zeros. BERT's input embedding is word + position + token type, each
1/2 [E; E] (``enlarge.py`` divides every ``*embeddings.weight``); the MLM head's transform is a
Linear and a LayerNorm like the others; the decoder is tied to W~_E. Post-LN, the zero LayerNorms
of added blocks would zero the stream, so there they are (1, 0), the top one takes the last
original output LayerNorm, and that one becomes (1, 0) (``flatlm.models.growth``).
"""

import pytest
import torch

from flatlm.models import build_model, parse_model
from flatlm.models.growth import grow, max_logit_difference

V, T = 7, 5
SMALL = "d8-h2-l1-i16"  # head size 4
D, H, DH, I = 8, 2, 4, 16


def _moved(shape: str, seed: int = 0) -> torch.nn.Module:
    model = build_model(parse_model(shape), V, T, seed=seed).double().eval()
    g = torch.Generator().manual_seed(seed + 50)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _embedding(E: torch.Tensor) -> torch.Tensor:
    """1/2 [E; E] in transformers' (rows, d) layout: entry (r, j) = E[r, j mod d] / 2."""
    rows, d = E.shape
    out = torch.empty(rows, 2 * d, dtype=E.dtype)
    for r in range(rows):
        for j in range(2 * d):
            out[r, j] = E[r, j % d] / 2
    return out


def _vector(v: torch.Tensor) -> torch.Tensor:
    """[v; v]."""
    n = len(v)
    return torch.tensor([float(v[j % n]) for j in range(2 * n)], dtype=v.dtype)


def _square(W: torch.Tensor) -> torch.Tensor:
    """1/2 [[W, W], [W, W]]: entry (i, j) = W[i mod out, j mod in] / 2."""
    n_out, n_in = W.shape
    out = torch.empty(2 * n_out, 2 * n_in, dtype=W.dtype)
    for i in range(2 * n_out):
        for j in range(2 * n_in):
            out[i, j] = W[i % n_out, j % n_in] / 2
    return out


def _heads(W: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Query, key or value (transformers: rows = heads x head size, columns = input): head k of
    the grown layer is 1/2 [W_k; W_k] over the input, k > n_h a copy of head k - n_h."""
    out = torch.empty(2 * H * DH, 2 * D, dtype=W.dtype)
    bias = torch.empty(2 * H * DH, dtype=b.dtype)
    for k in range(2 * H):
        source = k if k < H else k - H
        for a in range(DH):
            bias[k * DH + a] = b[source * DH + a]
            for j in range(2 * D):
                out[k * DH + a, j] = W[source * DH + a, j % D] / 2
    return out, bias


def _expected_block(small: dict, prefix: str, norms: tuple[str, ...]) -> dict:
    exp = {}
    for name in ("attention.self.query", "attention.self.key", "attention.self.value"):
        w, b = _heads(small[f"{prefix}{name}.weight"], small[f"{prefix}{name}.bias"])
        exp[f"{prefix}{name}.weight"], exp[f"{prefix}{name}.bias"] = w, b
    for name in ("attention.output.dense", "intermediate.dense", "output.dense"):
        exp[f"{prefix}{name}.weight"] = _square(small[f"{prefix}{name}.weight"])
        exp[f"{prefix}{name}.bias"] = _vector(small[f"{prefix}{name}.bias"])
    for name in norms:
        for part in ("weight", "bias"):
            exp[f"{prefix}{name}.{part}"] = _vector(small[f"{prefix}{name}.{part}"])
    return exp


def _compare(big: torch.nn.Module, exp: dict) -> None:
    got = dict(big.named_parameters())
    assert set(got) == set(exp)
    for name, value in exp.items():
        assert got[name].shape == value.shape, name
        assert torch.equal(got[name].detach(), value), name


@pytest.mark.parametrize("added", [0, 1])
def test_post_ln_paper_growth_is_the_hand_built_half_tiling(added):
    small_model = _moved(SMALL)
    small = {k: v.detach() for k, v in small_model.named_parameters()}
    big = grow(small_model, parse_model(f"d16-h4-l{1 + added}-i32"), seed=3,
               construction="paper")
    exp = {}
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        key = f"bert.embeddings.{name}.weight"
        exp[key] = _embedding(small[key])
    for part in ("weight", "bias"):
        key = f"bert.embeddings.LayerNorm.{part}"
        exp[key] = _vector(small[key])
    exp |= _expected_block(small, "bert.encoder.layer.0.",
                           ("attention.output.LayerNorm", "output.LayerNorm"))
    head = "cls.predictions."
    exp[f"{head}transform.dense.weight"] = _square(small[f"{head}transform.dense.weight"])
    exp[f"{head}transform.dense.bias"] = _vector(small[f"{head}transform.dense.bias"])
    for part in ("weight", "bias"):  # tiled, not scaled: the 1/2 sits in the tied embedding
        key = f"{head}transform.LayerNorm.{part}"
        exp[key] = _vector(small[key])
    exp[f"{head}bias"] = small[f"{head}bias"]
    if added:
        top = "bert.encoder.layer.1."
        for name, p in big.bert.encoder.layer[1].named_parameters():
            exp[top + name] = torch.zeros_like(p)  # "fill in zeros to the added parameters"
        last = "bert.encoder.layer.0.output.LayerNorm."
        exp[top + "output.LayerNorm.weight"] = exp[last + "weight"]
        exp[top + "output.LayerNorm.bias"] = exp[last + "bias"]
        exp[top + "attention.output.LayerNorm.weight"] = torch.ones(2 * D, dtype=torch.float64)
        exp[last + "weight"] = torch.ones(2 * D, dtype=torch.float64)
        exp[last + "bias"] = torch.zeros(2 * D, dtype=torch.float64)
    _compare(big, exp)
    assert big.cls.predictions.decoder.weight is big.bert.embeddings.word_embeddings.weight
    assert max_logit_difference(small_model, big, n=16) < 1e-9


def test_pre_ln_paper_growth_is_the_hand_built_half_tiling_with_zero_blocks():
    """The released model is pre-LN: there an all-zero added block (LayerNorms too, as
    enlarge.py's torch.zeros_like leaves them) is the identity, and nothing is moved."""
    small_model = _moved(SMALL + "-pre")
    small = {k: v.detach() for k, v in small_model.named_parameters()}
    big = grow(small_model, parse_model("d16-h4-l2-i32-pre"), seed=3, construction="paper")
    base = "roberta_prelayernorm."
    exp = {}
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        key = f"{base}embeddings.{name}.weight"
        exp[key] = _embedding(small[key])
    for norm in ("embeddings.LayerNorm", "LayerNorm"):  # the last: the final LayerNorm
        for part in ("weight", "bias"):
            exp[f"{base}{norm}.{part}"] = _vector(small[f"{base}{norm}.{part}"])
    exp |= _expected_block(small, f"{base}encoder.layer.0.",
                           ("attention.LayerNorm", "intermediate.LayerNorm"))
    for name, p in big.roberta_prelayernorm.encoder.layer[1].named_parameters():
        exp[f"{base}encoder.layer.1.{name}"] = torch.zeros_like(p)
    exp["lm_head.dense.weight"] = _square(small["lm_head.dense.weight"])
    exp["lm_head.dense.bias"] = _vector(small["lm_head.dense.bias"])
    for part in ("weight", "bias"):
        exp[f"lm_head.layer_norm.{part}"] = _vector(small[f"lm_head.layer_norm.{part}"])
    exp["lm_head.bias"] = small["lm_head.bias"]
    _compare(big, exp)
    assert max_logit_difference(small_model, big, n=16) < 1e-9
