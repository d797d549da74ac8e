"""Model shapes: ``ModelConfig``, the paper's presets, shape strings and analytic parameter counts.

Presets (``PRESETS``, a registry: ``register_preset`` adds one; ``parse_model`` also reads shape
strings):

- ``bert-2m`` .. ``bert-730m``: Table 3 (Section 2), named by their parameter count in the paper's
  convention (``paper_parameter_count``). Head size is always 64.
- ``bert-17m``, ``bert-25m``, ``bert-79m``, ``bert-208m``, ``bert-950m``: the Figure 5 shapes of
  Table 4 not already in Table 3 (Table 4 also lists ``bert-4.8m`` and ``bert-8.3m``; the whole
  sequence is ``TABLE4``). Table 4 prints d_inter as 1024, 2048, 3072, 4096, 5120 for these rows,
  the Table 3 column shifted by one row; we use d_inter = 4 d_model instead, because B.4.2 states
  d_inter = 4 d_h, the function-preserving embedding of B.4 needs each d_inter to divide the
  largest one (768 does not divide 5120), and only 4 d_model gives the "950M" of Section 2.
  The literal rows remain available as shapes, e.g. ``d320-h5-l6-i1024``.
- ``lstm-h{128,256,512,768,1024}-l{4,6,8,12,16}``: the LSTM grid of A.4 (d_hidden per direction).

Shape strings: ``d64-h1-l1-i256`` (d_model, heads, layers, d_inter) and ``lstm-h256-l4``, or
those of a registered architecture (``flatlm.models.architectures``, ``Architecture.shape``).
A ``-pre`` suffix on a BERT shape or preset (``d64-h1-l1-i256-pre``, ``bert-2m-pre``) asks for
the pre-LN encoder (``ModelConfig.ln_mode``); presets are post-LN, as in the paper.
``ModelSpec`` holds a preset name or shape string as a config value, checked on construction.

>>> parse_model("bert-2m") == parse_model("d64-h1-l1-i256")
True
>>> parse_model("bert-2m-pre").ln_mode, shape_string(parse_model("bert-2m-pre"))
('pre', 'd64-h1-l1-i256-pre')
>>> round(paper_parameter_count(parse_model("bert-110m")) / 1e6, 1)
109.5
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from flatlm.core.config import ConfigValue
from flatlm.core.registry import Registry
from flatlm.models.architectures import SIZES, all_architectures, architecture, labels_where

ATTENTIONS = ("sdpa", "eager")
LN_MODES = ("post", "pre")
PRE_LN_SUFFIX = "-pre"  # on a BERT shape string or preset name: ln_mode="pre"
PAPER_VOCAB = 30_522  # bert-large-uncased's WordPiece vocabulary (A.2)
PAPER_POSITIONS = 512  # BERT-base max_position_embeddings
PAPER_TOKEN_TYPES = 2  # BERT-base type_vocab_size (sentence A / B)
N_SPECIAL = 4  # [PAD] [MASK] [CLS] [SEP]; see flatlm.core.tokens
# RoBERTa-style position ids (the pre-LN model) start at padding_idx + 1 = PAD_ID + 1 = 1, so that
# model has this many position rows besides the T + 2 it reads (row 0, [PAD]'s, stays zero).
# flatlm.core.tokens.PAD_ID is 0; not imported, to keep this module free of torch.
PRE_LN_EXTRA_POSITIONS = 1


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape and regularisation of a masked LM; the vocabulary and length come from the source."""

    # a registered architecture (flatlm.models.architectures): "bert" (transformers'
    # BertForMaskedLM), "lstm" (bidirectional nn.LSTM), or one a user registered
    arch: str = "bert"
    n_layers: int  # transformer blocks or stacked LSTM layers; 1..24 in the paper
    d_model: int | None = None  # bert only: hidden width, a multiple of n_heads; 64..1920
    n_heads: int | None = None  # bert only: attention heads; the paper keeps d_model/n_heads = 64
    d_inter: int | None = None  # bert only: MLP intermediate width; 4 * d_model in the paper
    d_hidden: int | None = None  # lstm only: hidden units per direction (hidden_size); 128..1024
    dropout: float = 0.1  # embedding, hidden and attention dropout probability in [0, 1); paper 0.1
    attention: str = "sdpa"  # bert kernel: "sdpa", or "eager" for attention weights / GPU HVPs
    # bert only: "post" (BertForMaskedLM, the paper's) or "pre" (LayerNorm before attention and
    # MLP, plus a final one: transformers' RobertaPreLayerNormForMaskedLM; the released code's
    # academic-budget-bert ``--encoder_ln_mode pre-ln``). Shape strings spell it as "-pre".
    ln_mode: str = "post"

    def __post_init__(self):
        arch = architecture(self.arch)
        if not (isinstance(self.n_layers, int) and self.n_layers >= 1):
            raise ValueError(f"model.n_layers={self.n_layers!r}: use an integer >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout={self.dropout!r}: use a probability in [0, 1)")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"model.attention={self.attention!r}: use one of {ATTENTIONS}")
        if self.ln_mode not in LN_MODES:
            raise ValueError(f"model.ln_mode={self.ln_mode!r}: use one of {LN_MODES} "
                             f"(or the shape suffix {PRE_LN_SUFFIX!r} for 'pre')")
        if self.ln_mode not in arch.ln_modes:
            raise ValueError(f"model.ln_mode={self.ln_mode!r} is not an option of "
                             f"arch={self.arch!r} (it has {arch.ln_modes}): leave "
                             f"ln_mode={arch.ln_modes[0]!r}")
        for name in arch.sizes:
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(
                    f"model.{name}={value!r}: arch={self.arch!r} needs an integer >= 1"
                )
        for name in SIZES:
            if name not in arch.sizes and getattr(self, name) is not None:
                raise ValueError(f"model.{name} is not used by arch={self.arch!r}; leave it None")
        if arch.check is not None:
            arch.check(self)

    def to_dict(self) -> dict:
        return asdict(self)


def check_bert(cfg: ModelConfig) -> None:
    """BERT's shapes beyond their sizes (``Architecture.check``): heads split d_model evenly."""
    if cfg.d_model % cfg.n_heads:
        raise ValueError(
            f"model.d_model={cfg.d_model} is not divisible by model.n_heads={cfg.n_heads}; "
            f"pick d_model = 64 * n_heads as the paper does (e.g. {64 * cfg.n_heads})"
        )


def _bert(d_model: int, n_heads: int, n_layers: int, d_inter: int) -> ModelConfig:
    return ModelConfig(arch="bert", d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                       d_inter=d_inter)


def _lstm(d_hidden: int, n_layers: int) -> ModelConfig:
    return ModelConfig(arch="lstm", d_hidden=d_hidden, n_layers=n_layers)


TABLE3 = {  # name: paper_parameter_count rounded as the paper quotes sizes
    "bert-2m": _bert(64, 1, 1, 256),
    "bert-4.8m": _bert(128, 2, 4, 512),
    "bert-8.3m": _bert(192, 3, 5, 768),
    "bert-12.8m": _bert(256, 4, 6, 1024),
    "bert-41m": _bert(512, 8, 8, 2048),
    "bert-110m": _bert(768, 12, 12, 3072),
    "bert-234m": _bert(1024, 16, 16, 4096),
    "bert-435m": _bert(1280, 20, 20, 5120),
    "bert-730m": _bert(1536, 24, 24, 6144),
}
_FIG5 = {  # Table 4 rows not in Table 3, with d_inter = 4 d_model (see the module docstring)
    "bert-17m": _bert(320, 5, 6, 1280),
    "bert-25m": _bert(384, 6, 7, 1536),
    "bert-79m": _bert(640, 10, 12, 2560),
    "bert-208m": _bert(960, 15, 16, 3840),
    "bert-950m": _bert(1920, 30, 20, 7680),
}
TABLE4 = ("bert-4.8m", "bert-8.3m", *_FIG5)  # the Figure 5 sequence, smallest first
LSTM_GRID = {  # A.4: d_hidden x layers
    f"lstm-h{h}-l{n}": _lstm(h, n) for h in (128, 256, 512, 768, 1024) for n in (4, 6, 8, 12, 16)
}


def _check_preset(name: str, cfg: ModelConfig) -> None:
    """A preset is a lower-case name of a registered architecture's model that reads as no other
    model's shape (the LSTM grid's names are their shapes): ``parse_model`` looks names up before
    shapes, and lower-cases what it is given."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"model preset {name!r}: give a ModelConfig, not {cfg!r}")
    if name != name.strip().lower() or name.endswith(PRE_LN_SUFFIX):
        raise ValueError(f"model preset {name!r}: use a lower-case name without the "
                         f"{PRE_LN_SUFFIX!r} suffix (parse_model adds pre-LN to any preset)")
    architecture(cfg.arch)  # a ValueError naming the registered ones
    for arch in all_architectures():
        sizes = arch.parse_shape(name)
        if sizes is not None and ModelConfig(arch=arch.name, **sizes) != cfg:
            raise ValueError(f"model preset {name!r} reads as the shape of another model; "
                             "choose a name that is no shape string (the paper's: bert-<size>)")


PRESETS: Registry[ModelConfig] = Registry(
    "model preset", key="model", check=_check_preset,
    how_to_add="flatlm.models.presets.register_preset in a plug-in module: --plugin MODULE")


def register_preset(name: str, cfg: ModelConfig, *, replace: bool = False) -> ModelConfig:
    """Adds the preset ``name`` (``--model name``, ``model: name`` in a sweep's grid)."""
    return PRESETS.register(name, cfg, replace=replace)


for _name, _cfg in {**TABLE3, **_FIG5, **LSTM_GRID}.items():
    register_preset(_name, _cfg)



def parse_model(name_or_shape: str | ModelSpec | ModelConfig) -> ModelConfig:
    """A preset name or a shape string -> ``ModelConfig`` (a ``ModelConfig`` passes through).

    A ``-pre`` suffix on a BERT preset or shape gives its pre-LN variant (``ln_mode="pre"``).
    Dropout and attention keep their defaults; vary them with ``dataclasses.replace``.
    """
    if isinstance(name_or_shape, ModelConfig):
        return name_or_shape
    if isinstance(name_or_shape, ModelSpec):
        return name_or_shape.config
    key = str(name_or_shape).strip().lower()
    if key.endswith(PRE_LN_SUFFIX):
        base = _parse_post(key.removesuffix(PRE_LN_SUFFIX), name_or_shape)
        if "pre" not in architecture(base).ln_modes:
            raise ValueError(f"model {name_or_shape!r}: the {PRE_LN_SUFFIX!r} suffix (pre-LN) "
                             f"applies to {labels_where(_has_pre_ln)} shapes only")
        return replace(base, ln_mode="pre")
    return _parse_post(key, name_or_shape)


def _has_pre_ln(arch) -> bool:
    return "pre" in arch.ln_modes


def _parse_post(key: str, name_or_shape) -> ModelConfig:
    if key in PRESETS:
        return PRESETS[key]
    for arch in all_architectures():
        sizes = arch.parse_shape(key)
        if sizes is not None:
            return ModelConfig(arch=arch.name, **sizes)
    shapes = " or ".join(f"{a.shape!r} ({a.label})" for a in all_architectures())
    raise ValueError(
        f"model {name_or_shape!r} is neither a preset nor a shape. Presets: "
        f"{', '.join(PRESETS)}. Shapes: {shapes}; "
        f"add {PRE_LN_SUFFIX!r} to a {labels_where(_has_pre_ln)} for pre-LN; add a preset with "
        f"{PRESETS.how_to_add}."
    )


class ModelSpec(ConfigValue):
    """A preset name or shape string, checked on construction; equal when the shapes are.

    >>> ModelSpec("BERT-2m")
    ModelSpec('bert-2m')
    >>> ModelSpec("bert-2m") == ModelSpec("d64-h1-l1-i256"), ModelSpec("bert-2m").config.d_model
    (True, 64)
    """

    __slots__ = ("name", "config")

    def __init__(self, name: str | ModelSpec = "bert-2m"):
        if isinstance(name, ModelSpec):
            name = name.name
        if not isinstance(name, str):
            raise ValueError(f"model {name!r}: give a preset name or a shape string")
        key = name.strip().lower()
        object.__setattr__(self, "config", parse_model(key))
        object.__setattr__(self, "name", key)

    def __setattr__(self, name, value):
        raise AttributeError(f"ModelSpec is immutable; build a new one (cannot set {name})")

    def __reduce__(self):
        return (ModelSpec, (self.name,))

    def to_json(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other) -> bool:
        return isinstance(other, ModelSpec) and self.config == other.config

    def __hash__(self) -> int:
        return hash(self.config)


def shape_string(cfg: ModelConfig) -> str:
    """The shape string ``parse_model`` reads back: ``d64-h1-l1-i256`` (``...-pre`` for pre-LN)
    or ``lstm-h256-l4``."""
    suffix = PRE_LN_SUFFIX if cfg.ln_mode == "pre" else ""
    return architecture(cfg).shape_string(cfg) + suffix


def _bert_count(cfg: ModelConfig, n_ids: int, n_positions: int, n_types: int) -> int:
    """Parameters of transformers' BertForMaskedLM, tied decoder counted once, no pooler.

    Pre-LN (RobertaPreLayerNormForMaskedLM) has the same blocks with each LayerNorm moved in
    front of its sublayer, plus one final LayerNorm; ``n_positions`` is whatever it is given.
    """
    d, i = cfg.d_model, cfg.d_inter
    ln = 2 * d  # LayerNorm weight + bias
    embeddings = (n_ids + n_positions + n_types) * d + ln
    attention = 4 * (d * d + d) + ln  # Q, K, V, output projections
    mlp = (d * i + i) + (i * d + d) + ln
    head = (d * d + d) + ln + n_ids  # transform dense + LayerNorm + decoder bias (weight tied)
    final = ln if cfg.ln_mode == "pre" else 0
    return embeddings + cfg.n_layers * (attention + mlp) + final + head


def bert_parameter_count(cfg: ModelConfig, vocab_size: int, max_length: int) -> int:
    """BERT's ``Architecture.parameter_count``: V + 4 token ids, T + 2 positions (pre-LN:
    T + 2 + ``PRE_LN_EXTRA_POSITIONS``), one token type."""
    extra = PRE_LN_EXTRA_POSITIONS if cfg.ln_mode == "pre" else 0
    return _bert_count(cfg, vocab_size + N_SPECIAL, max_length + 2 + extra, 1)


def bert_paper_parameter_count(cfg: ModelConfig) -> int:
    """BERT's ``Architecture.paper_parameter_count`` (``paper_parameter_count``)."""
    return _bert_count(cfg, PAPER_VOCAB, PAPER_POSITIONS, PAPER_TOKEN_TYPES)


def lstm_parameter_count(cfg: ModelConfig, vocab_size: int, max_length: int) -> int:
    """Parameters of ``flatlm.models.lstm.BiLSTMForMaskedLM`` (embedding width = d_hidden); the
    BiLSTM's ``Architecture.parameter_count`` (it has no position embeddings: T is unused)."""
    h, n_ids = cfg.d_hidden, vocab_size + N_SPECIAL

    def per_direction(d_in: int) -> int:  # W_ih [4h, d_in], W_hh [4h, h], b_ih and b_hh [4h]
        return 4 * h * (d_in + h) + 8 * h

    # layer 0 reads the h-wide embeddings; later layers read both directions (2h)
    lstm = 2 * per_direction(h) + (cfg.n_layers - 1) * 2 * per_direction(2 * h)
    head = (2 * h * h + h) + 2 * h + n_ids  # 2h -> h projection + LayerNorm + decoder bias
    return n_ids * h + lstm + head


def parameter_count(cfg: ModelConfig, vocab_size: int, max_length: int) -> int:
    """Parameters of ``build_model(cfg, vocab_size, max_length)``, computed without building it
    (``Architecture.parameter_count``; ``bert_parameter_count`` says what a BERT holds).

    ``vocab_size`` is V (source words) and ``max_length`` is T.
    """
    return architecture(cfg).parameter_count(cfg, vocab_size, max_length)


def paper_parameter_count(cfg: ModelConfig) -> int:
    """Parameter count in the convention that reproduces the paper's model sizes.

    The paper's transformers (Izsak et al.'s BERT with the bert-large-uncased tokenizer) are counted
    as transformers' ``BertForMaskedLM`` in the BERT-base layout: 30,522 token embeddings, 512
    positions, 2 token types, embedding LayerNorm, the encoder blocks, and the MLM head (transform
    dense + LayerNorm + output bias) whose decoder weight is tied to the token embeddings and
    counted once; no pooler. This gives 2.07M, 4.81M, 8.25M, 12.78M, 41.4M, 109.5M, 234.4M, 435.0M
    and 730.0M for Table 3; adding the pooler (d^2 + d) gives 235.5M for ``bert-234m``, the "235M"
    quoted in Figures 3-4, but moves the other rows further from their names. A pre-LN shape
    counts its final LayerNorm (2 d) on top, in the same layout.
    """
    count = architecture(cfg).paper_parameter_count
    if count is None:
        raise ValueError(f"model.arch={cfg.arch!r}: the paper quotes parameter counts only for "
                         f"{labels_where(_has_paper_count)}s")
    return count(cfg)


def _has_paper_count(arch) -> bool:
    return arch.paper_parameter_count is not None


def describe(cfg: ModelConfig, vocab_size: int, max_length: int) -> str:
    """One line naming the shape and its parameter count here (and in the paper's convention).

    >>> describe(parse_model("bert-2m"), vocab_size=200, max_length=18)  # doctest: +ELLIPSIS
    'bert d64-h1-l1-i256: 69,004 parameters with 200 words ... (paper convention: 2,071,226)'
    """
    here = parameter_count(cfg, vocab_size, max_length)
    text = (f"{cfg.arch} {shape_string(cfg)}: {here:,} parameters with {vocab_size} words + "
            f"{N_SPECIAL} special ids")
    if not _has_paper_count(architecture(cfg)):
        return text
    paper = paper_parameter_count(cfg)
    positions = max_length + 2 + (PRE_LN_EXTRA_POSITIONS if cfg.ln_mode == "pre" else 0)
    return f"{text} and {positions} positions (paper convention: {paper:,})"
