"""The architecture registry: each masked-LM architecture is one ``Architecture`` object here.

Every place that used to branch on ``cfg.arch == "lstm"`` or ``isinstance(model, ...)`` asks the
registry instead: ``architecture(cfg)`` by a ``ModelConfig`` (or its ``arch`` name),
``flatlm.models.masked_lm.architecture_of(model)`` by a built model. What it answers:

- the ``ModelConfig`` it accepts (``sizes``, ``ln_modes``, ``check``) and its shape string
  (``shape``, read by ``parse_model``), its parameter count without building it;
- how to build it (``build``), the class it builds per ``ln_mode`` (``classes``: checkpoint save
  checks, ``architecture_of``), how to load a checkpoint of it (``load``), its encoder and MLM
  head (``parts``: ``word_logits``, ``sentence_features``) and token layout (``layout``);
- for the measurements: the word-logit function that has a second derivative (Tr(H),
  sharpness) and the per-example gradient-norm method of ``measure.fisher`` (Tr(F));
- growth (paper B.4): the function that grows it, or None (then growth says it cannot).

Adding a model (``tests/assets/toy_architecture.py`` does exactly this)::

    from flatlm.models import Architecture, register_architecture

    register_architecture(Architecture(
        name="toy", label="toy MLM", shape="toy-d{d_model}-l{n_layers}", sizes=("d_model",),
        build=ToyMLM,                       # (cfg, vocab_size, max_length) -> nn.Module
        classes=lambda: {"post": ToyMLM}))  # what build returns, per ln_mode

after which ``parse_model("toy-d16-l1")``, ``build_model``, ``word_logits``, checkpoints, training
and every measurement work on it. The model needs ``encode(input_ids, attention_mask)`` -> (n, T+2,
d), ``head(hidden)`` -> (..., V+4) and a ``layout`` (``flatlm.core.tokens.TokenLayout``), or the
``parts`` and ``layout`` hooks; Tr(F) then runs the per-example loop, Tr(H) differentiates
``word_logits``. Register in a plug-in module (``--plugin MODULE`` on the ``flatlm`` commands and
the sweeps, ``FLATLM_PLUGINS``, or the ``flatlm.plugins`` entry-point group:
``flatlm.core.registry``), which every process imports before it reads a config naming the
architecture, Ray workers included.

Why hooks may be strings: a hook is a function or ``"module:name"``, imported on its first call.
This module imports only the ground floor (``flatlm.core``), so ``models.presets`` (torch-free:
sweep configs are parsed without importing torch) validates a ``ModelConfig`` against the registry,
while the built-in hooks live next to what they build (``models.bert``, ``models.lstm``,
``models.growth``) and import transformers only when called. No hook names the measure layer: the
second-order logits of the BiLSTM are model code (``models.lstm_unrolled``), and the Tr(F) method is
a name that ``measure.fisher`` looks up in its own table; so measure imports models, never the
reverse.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Callable

from flatlm.core.registry import LazyRef, Registry

# The ModelConfig size fields an architecture may read (besides n_layers, which all read); the
# others stay None. A new architecture reuses these: ModelConfig has no other size fields.
SIZES = ("d_model", "n_heads", "d_inter", "d_hidden")

Hook = Callable | str  # a function, or "module:name" imported on its first call
# The default parameter count: build the model and count (an architecture without a closed form)
COUNT_BY_BUILDING = "flatlm.models.masked_lm:count_by_building"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Architecture:
    """One architecture: a name for ``ModelConfig.arch`` and its hooks (module docstring)."""

    name: str  # ModelConfig.arch
    label: str  # how messages name it: "BERT" ("only BERTs can grow")
    # shape string, the sizes in braces: "lstm-h{d_hidden}-l{n_layers}". parse_model also reads it
    # with the name in front ("bert-d64-h1-l1-i256") and a "-pre" suffix for ln_mode "pre".
    shape: str
    sizes: tuple[str, ...]  # the SIZES it reads, each an integer >= 1
    build: Hook  # (cfg, vocab_size, max_length) -> a fresh nn.Module, initialised from torch's RNG
    classes: Hook  # () -> {ln_mode: class that build returns for it}
    ln_modes: tuple[str, ...] = ("post",)  # the ModelConfig.ln_modes it has; the first is default
    check: Hook | None = None  # (cfg) -> None; a ValueError for what sizes alone do not rule out
    # (cfg, vocab_size, max_length) -> int without building (the default builds it and counts)
    parameter_count: Hook = COUNT_BY_BUILDING
    paper_parameter_count: Hook | None = None  # (cfg) -> int as the paper counts; None: it has none
    parts: Hook | None = None  # model -> (encoder(ids, mask), head(hidden)); None: .encode, .head
    layout: Hook | None = None  # model -> TokenLayout; None: model.layout
    # (model_dir, cfg) -> model; None: class.from_pretrained(dir) if it has one, else the state
    # dict that flatlm.models.checkpoint saves for a model without save_pretrained
    load: Hook | None = None
    # (model, input_ids, attention_mask, positions) -> (B, V) logits with a second derivative
    # (Tr(H), sharpness); None: word_logits itself
    second_order_logits: Hook | None = None
    # Tr(F)'s per-example norms: a method of flatlm.measure.curvature.fisher
    fisher_method: str = "loop"
    # (model, target cfg, *, seed, construction) -> same logits, larger (construction: one of
    # flatlm.models.constructions.CONSTRUCTIONS); None: cannot grow
    grow: Hook | None = None
    # (models) -> one module with a leading member axis that trains them as a trial pack
    # (flatlm.train.pack), for the models of ``pack_ln_modes``; None: never packed
    pack: Hook | None = None
    pack_ln_modes: tuple[str, ...] = ("post",)

    def __post_init__(self):
        for field in dataclasses.fields(self):  # field.type is the annotation's text
            value = getattr(self, field.name)
            if field.type.startswith("Hook") and isinstance(value, str):
                object.__setattr__(self, field.name, LazyRef(value))
        unknown = set(self.sizes) - set(SIZES)
        if unknown:
            raise ValueError(f"architecture {self.name!r}: sizes {sorted(unknown)} are not "
                             f"ModelConfig fields; use some of {SIZES}")
        in_shape = {f for _, f, _, _ in string.Formatter().parse(self.shape) if f}
        if in_shape != {*self.sizes, "n_layers"}:
            raise ValueError(f"architecture {self.name!r}: shape {self.shape!r} must name "
                             f"n_layers and each of sizes {self.sizes} once in braces")

    def shape_string(self, cfg) -> str:
        """``cfg``'s sizes written into ``shape`` (no ln_mode suffix: ``presets.shape_string``)."""
        return self.shape.format(**{f: getattr(cfg, f) for f in (*self.sizes, "n_layers")})

    def parse_shape(self, key: str) -> dict[str, int] | None:
        """The sizes in a shape string of this architecture, or None when it is not one."""
        m = _shape_pattern(self.shape, self.name).fullmatch(key)
        return None if m is None else {f: int(v) for f, v in m.groupdict().items()}


def _shape_pattern(shape: str, name: str) -> re.Pattern:
    parts = [re.escape(text) + (rf"(?P<{field}>\d+)" if field else "")
             for text, field, _, _ in string.Formatter().parse(shape)]
    prefix = "" if shape.startswith(f"{name}-") else f"(?:{re.escape(name)}-)?"
    return re.compile(prefix + "".join(parts))


ARCHITECTURES: Registry[Architecture] = Registry(
    "architecture", key="model.arch",
    how_to_add="flatlm.models.register_architecture in a plug-in module: --plugin MODULE")


def register_architecture(arch: Architecture, *, replace: bool = False) -> Architecture:
    """Adds ``arch`` under ``arch.name`` and returns it (``replace``: over one registered
    before); a name is registered once, and the same architecture again is a no-op."""
    return ARCHITECTURES.add(arch, Architecture, "register_architecture", replace=replace)


def architecture(arch) -> Architecture:
    """The registered architecture of a ``ModelConfig`` or of an ``arch`` name."""
    if isinstance(arch, Architecture):
        return arch
    return ARCHITECTURES.lookup(getattr(arch, "arch", arch))


def all_architectures() -> tuple[Architecture, ...]:
    """Every registered architecture, in registration order (built-ins first)."""
    return tuple(ARCHITECTURES.values())


def can_grow(arch) -> bool:
    """Whether an architecture (or a ``ModelConfig``'s) grows (paper B.4): its ``grow`` hook."""
    return architecture(arch).grow is not None


def unpackable_reason(cfg) -> str | None:
    """Why models of ``cfg`` (a ModelConfig) cannot train in a trial pack, or None when they can:
    their architecture's ``pack`` hook, for its ``pack_ln_modes``."""
    arch = architecture(cfg)
    if arch.pack is not None and cfg.ln_mode in arch.pack_ln_modes:
        return None
    packed = " or ".join(f"the {'/'.join(a.pack_ln_modes)}-LN {a.label}"
                         for a in ARCHITECTURES.values() if a.pack is not None)
    return f"model {arch.label} ln_mode={cfg.ln_mode}: only {packed or 'no model'} is packed"


def counts_by_building(arch) -> bool:
    """Whether an architecture (or a ``ModelConfig``'s) counts its parameters only by building
    the model (no ``parameter_count`` of its own): a size check before allocation cannot ask it."""
    return architecture(arch).parameter_count == LazyRef(COUNT_BY_BUILDING)


def labels_where(test: Callable[[Architecture], bool]) -> str:
    """The labels of the architectures passing ``test``, for messages: "BERT", "BERT or X"."""
    return " or ".join(a.label for a in ARCHITECTURES.values() if test(a)) or "no architecture"


BERT = register_architecture(Architecture(
    name="bert", label="BERT", shape="d{d_model}-h{n_heads}-l{n_layers}-i{d_inter}",
    sizes=("d_model", "n_heads", "d_inter"), ln_modes=("post", "pre"),
    check="flatlm.models.presets:check_bert",
    parameter_count="flatlm.models.presets:bert_parameter_count",
    paper_parameter_count="flatlm.models.presets:bert_paper_parameter_count",
    build="flatlm.models.bert:build_bert", classes="flatlm.models.bert:transformer_classes",
    load="flatlm.models.bert:load_bert", parts="flatlm.models.bert:bert_parts",
    layout="flatlm.models.bert:bert_layout",
    fisher_method="ghost",  # measure.ghost: every parameter in a Linear/Embedding/LayerNorm
    grow="flatlm.models.growth:grow",
    pack="flatlm.models.packed:PackedBert",  # the post-LN BertForMaskedLM, hand-batched
))
LSTM = register_architecture(Architecture(
    name="lstm", label="BiLSTM", shape="lstm-h{d_hidden}-l{n_layers}", sizes=("d_hidden",),
    parameter_count="flatlm.models.presets:lstm_parameter_count",
    build="flatlm.models.lstm:build_lstm", classes="flatlm.models.lstm:lstm_classes",
    # the fused cuDNN LSTM has no double backward (and none in eval mode): run it unrolled
    second_order_logits="flatlm.models.lstm_unrolled:lstm_word_logits_unrolled",
    fisher_method="lstm-ghost",  # measure.lstm_ghost: ghost norms through the unrolled LSTM
))
