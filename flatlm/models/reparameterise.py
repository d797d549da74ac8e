"""Function-preserving reparameterisations of a post-LN BERT: other weights, the same logits.

A reparameterisation that keeps every prediction can move a curvature measure by orders of
magnitude (Dinh, Pascanu, Bengio and Bengio, *Sharp Minima Can Generalize For Deep Nets*, 2017;
the 2026 critique of issue 54), so a measure that claims to explain generalisation should survive
them. Each one here maps a ``BertForMaskedLM`` (``flatlm.models.build_model``, post-LN) to a new
model whose logits equal the old one's on every input (in eval mode; in train mode too but for
where dropout's draws land under the permutation):

- ``query-key``: every layer's query weight and bias times c, its key weight and bias / c. The
  scores (x W_Q^T + b_Q)(x W_K^T + b_K)^T are unchanged term by term: exact.
- ``value-output``: every layer's value weight and bias times c, the attention output dense's
  weight / c (its bias kept). A softmax row sums to 1, so the context P (x W_V^T + b_V) is c
  times the old one and W_O / c undoes it: exact. (The MLP's analogue, up-projection times c and
  down-projection / c, is not a reparameterisation: GELU(c z) != c GELU(z).)
- ``layer-norm``: every LayerNorm but the MLM head's has its gain and bias times c; the linear
  maps that read its output have their weights / c (biases kept), and the sublayer output that
  joins that stream in the residual sum (attention output dense, MLP down-projection) has weight
  and bias times c. The next LayerNorm then sees c times its old input, and LayerNorm is scale
  invariant but for its eps: LN(c x) is LN(x) with eps / c^2, a relative change of
  eps (1 - 1/c^2) / (2 Var x) (transformers' BERT: eps = 1e-12). The head's LayerNorm is left
  alone: the decoder that reads it is tied to the input embeddings.
- ``permutation``: every hidden unit in a random order: the residual stream's d units wherever
  the stream is read or written (the embeddings' columns, hence the tied decoder's; every
  LayerNorm; the rows or columns of each Linear on it), each layer's heads, the dimensions within
  each head (queries and keys by one order, values and the output projection's columns by
  another) and the MLP units. LayerNorm commutes with a permutation, GELU acts elementwise:
  exact but for the order of float sums. Every measure's estimand is invariant under it (a
  permutation is orthogonal and maps each weight to a weight), and every parameter tensor but the
  MLM output bias moves, so it measures what an estimator does when its random draws in parameter
  space meet other coordinates: the control.

Each of the four is a ``TensorMap`` per parameter (a factor, or permutations of its dimensions),
so the optimizer's moments move with it (``moved_moments``): the gradient of w' = s w is g / s,
so Adam's m becomes m / s and v becomes v / s^2; under a permutation both are permuted. The
growth constructions (``flatlm.models.growth.grow``, "paper" and "head-norm") are function
preserving too, into a larger shape; they are not tensor maps (``flatlm.train.growth.
carry_state`` moves the optimizer state there).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from flatlm.models.bert import ln_mode, transformer_parts

DEFAULT_FACTOR = 10.0  # large enough that a measure that is not invariant moves by far more
# than its estimator's noise (Tr(H) of the scaled blocks by c^2)


@dataclass(frozen=True)
class TensorMap:
    """How one parameter moves: w' = factor * w with its dimensions reordered, ``orders`` holding
    (dim, permutation of range(w.shape[dim])) for each dimension that moves."""

    factor: float = 1.0
    orders: tuple[tuple[int, torch.Tensor], ...] = ()

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        return self.factor * self._permuted(w)

    def moment(self, m: torch.Tensor, power: int) -> torch.Tensor:
        """Adam's first (power 1) or second (power 2) moment of the moved parameter: the
        gradient of factor * w is gradient / factor, permuted as w is."""
        return self._permuted(m) / self.factor ** power

    def _permuted(self, w: torch.Tensor) -> torch.Tensor:
        for dim, order in self.orders:
            w = w.index_select(dim, order.to(w.device))
        return w


Maps = dict[str, TensorMap]  # parameter name (model.named_parameters()) -> its map


def _check_post_ln(model: nn.Module) -> None:
    if ln_mode(model) != "post":
        raise ValueError("these reparameterisations are of flatlm's post-LN BERT "
                         "(BertForMaskedLM); pre-LN places the LayerNorms elsewhere")


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name prefix, block) of every encoder block."""
    _check_post_ln(model)
    return [(f"bert.encoder.layer.{i}.", block)
            for i, block in enumerate(transformer_parts(model)[0].encoder.layer)]


def _scaled(prefix: str, factor: float, *, bias: bool = True) -> Maps:
    """The Linear or LayerNorm at ``prefix``: its weight (and bias) times ``factor``."""
    names = ("weight", "bias") if bias else ("weight",)
    return {f"{prefix}.{name}": TensorMap(factor=factor) for name in names}


def query_key_maps(model: nn.Module, c: float = DEFAULT_FACTOR) -> Maps:
    """Queries times c, keys / c, in every layer (module docstring)."""
    maps = {}
    for prefix, _ in _layers(model):
        maps |= _scaled(prefix + "attention.self.query", c)
        maps |= _scaled(prefix + "attention.self.key", 1.0 / c)
    return maps


def value_output_maps(model: nn.Module, c: float = DEFAULT_FACTOR) -> Maps:
    """Values times c, the attention output projection's weight / c, in every layer."""
    maps = {}
    for prefix, _ in _layers(model):
        maps |= _scaled(prefix + "attention.self.value", c)
        maps |= _scaled(prefix + "attention.output.dense", 1.0 / c, bias=False)
    return maps


def layer_norm_maps(model: nn.Module, c: float = DEFAULT_FACTOR) -> Maps:
    """Every LayerNorm but the head's times c, what reads it / c, what joins its stream times c
    (module docstring). Each parameter is touched once: a block's query, key and value read the
    LayerNorm below the block, its MLP up-projection reads the one inside it."""
    layers = _layers(model)
    maps = _scaled("bert.embeddings.LayerNorm", c)
    for prefix, _ in layers:
        for reader in ("query", "key", "value"):  # the stream from the LayerNorm below
            maps |= _scaled(prefix + "attention.self." + reader, 1.0 / c, bias=False)
        maps |= _scaled(prefix + "attention.output.dense", c)  # joins that stream: c (h + a)
        maps |= _scaled(prefix + "attention.output.LayerNorm", c)
        maps |= _scaled(prefix + "intermediate.dense", 1.0 / c, bias=False)
        maps |= _scaled(prefix + "output.dense", c)  # joins it: c (v + MLP(v))
        maps |= _scaled(prefix + "output.LayerNorm", c)
    return maps | _scaled("cls.predictions.transform.dense", 1.0 / c, bias=False)


def _within_heads(head_order: torch.Tensor, size: int, g: torch.Generator) -> torch.Tensor:
    """A permutation of n_heads * size rows: the heads in ``head_order``, each head's rows in a
    random order of its own."""
    return torch.cat([head * size + torch.randperm(size, generator=g) for head in head_order])


def permutation_maps(model: nn.Module, seed: int = 0) -> Maps:
    """Every hidden unit in a random order drawn from ``seed`` (module docstring): the residual
    stream's d units everywhere it is read or written (the embeddings' columns, so the tied
    decoder's too), each layer's heads and the dimensions within each head (queries and keys
    alike, values and the output projection's columns alike) and its MLP units."""
    g = torch.Generator().manual_seed(seed)
    config = model.config
    stream = torch.randperm(config.hidden_size, generator=g)
    size = config.hidden_size // config.num_attention_heads

    def reads(*out_orders):  # a Linear reading the stream, its outputs reordered as given
        return TensorMap(orders=(*out_orders, (1, stream)))

    maps = {f"bert.embeddings.{name}.weight": TensorMap(orders=((1, stream),))
            for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")}
    writes = TensorMap(orders=((0, stream),))  # a vector on the stream, a Linear's bias
    maps |= {"bert.embeddings.LayerNorm.weight": writes, "bert.embeddings.LayerNorm.bias": writes}
    for prefix, block in _layers(model):
        heads = torch.randperm(config.num_attention_heads, generator=g)
        query_key, value = _within_heads(heads, size, g), _within_heads(heads, size, g)
        mlp = torch.randperm(block.intermediate.dense.out_features, generator=g)
        for name, rows in (("query", query_key), ("key", query_key), ("value", value)):
            maps[f"{prefix}attention.self.{name}.weight"] = reads((0, rows))
            maps[f"{prefix}attention.self.{name}.bias"] = TensorMap(orders=((0, rows),))
        maps[prefix + "attention.output.dense.weight"] = TensorMap(orders=((0, stream),
                                                                           (1, value)))
        maps[prefix + "intermediate.dense.weight"] = reads((0, mlp))
        maps[prefix + "intermediate.dense.bias"] = TensorMap(orders=((0, mlp),))
        maps[prefix + "output.dense.weight"] = TensorMap(orders=((0, stream), (1, mlp)))
        for vector in ("attention.output.dense.bias", "attention.output.LayerNorm.weight",
                       "attention.output.LayerNorm.bias", "output.dense.bias",
                       "output.LayerNorm.weight", "output.LayerNorm.bias"):
            maps[prefix + vector] = writes
    head = "cls.predictions.transform."  # stream in, stream out (the tied decoder reads it)
    maps[head + "dense.weight"] = reads((0, stream))
    for vector in ("dense.bias", "LayerNorm.weight", "LayerNorm.bias"):
        maps[head + vector] = writes
    return maps


def moved(model: nn.Module, maps: Maps) -> nn.Module:
    """A copy of ``model`` with each parameter named in ``maps`` moved by its map."""
    names = dict(model.named_parameters())
    unknown = sorted(set(maps) - set(names))
    if unknown:
        raise KeyError(f"no parameters {unknown} in {type(model).__name__}")
    new = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in new.named_parameters():
            if name in maps:
                p.copy_(maps[name].weight(names[name].detach()))
    return new


def moved_moments(state: dict, tensor_map: TensorMap | None) -> dict:
    """One parameter's Adam state (``exp_avg``, ``exp_avg_sq``, ``step``) after ``tensor_map``
    moved it (None: unmoved)."""
    if tensor_map is None:
        return dict(state)
    powers = {"exp_avg": 1, "exp_avg_sq": 2}
    return {key: tensor_map.moment(value, powers[key]) if key in powers else value
            for key, value in state.items()}


@dataclass(frozen=True)
class TensorReparameterisation:
    """A reparameterisation given by a ``TensorMap`` per parameter."""

    name: str
    maps: Callable[[nn.Module], Maps]  # model -> its maps
    exact: str  # in which sense the logits are unchanged

    def __call__(self, model: nn.Module) -> nn.Module:
        return moved(model, self.maps(model))


TENSOR_REPARAMETERISATIONS = {r.name: r for r in (
    TensorReparameterisation("query-key", query_key_maps, "exact"),
    TensorReparameterisation("value-output", value_output_maps, "exact"),
    TensorReparameterisation("layer-norm", layer_norm_maps,
                             "up to LayerNorm's eps: relative eps (1 - 1/c^2) / (2 Var)"),
    TensorReparameterisation("permutation", permutation_maps,
                             "exact up to the order of float sums"),
)}
