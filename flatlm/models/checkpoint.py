"""Checkpoints: the ``save_pretrained`` layout plus ``flatlm.json``, readable without flatlm.

A checkpoint directory holds::

    config.json         a transformers BertConfig (RobertaPreLayerNormConfig for a pre-LN BERT),
                        or the BiLSTM's sizes (model_type flatlm_bilstm)
    model.safetensors   the weights (the BERT's decoder stays tied to its embeddings on reload)
    flatlm.json         the source spec, the ModelConfig (with ln_mode), the token ids and input
                        layout, extras

The model writes and reads its own files when its class has ``save_pretrained`` (BERT, BiLSTM):
the architecture's ``load`` hook, or ``from_pretrained(dir)``, reads them back. A model without
(a registered architecture that did not write one) is saved as its state dict alone, in
``model.safetensors``, and rebuilt from ``flatlm.json``'s ModelConfig and token layout.

A BERT checkpoint loads with ``transformers.BertForMaskedLM.from_pretrained(dir)`` alone (pre-LN:
``RobertaPreLayerNormForMaskedLM``); its inputs are rebuilt from ``flatlm.json["tokens"]``: word c
has id c + 4, a sentence reads ``[CLS] x_1 .. x_L [SEP]`` padded with [PAD] to T + 2 positions.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from safetensors.torch import load_model, save_model
from torch import nn

from flatlm.models.architectures import architecture
from flatlm.models.masked_lm import build_model, count_parameters, model_layout, unwrap
from flatlm.models.presets import ModelConfig, shape_string
from flatlm.sources import load
from flatlm.storage.manifest import sha256, verify_manifest

INFO_NAME = "flatlm.json"
FORMAT = "flatlm-checkpoint-1"  # bump when the meaning of a flatlm.json field changes
WEIGHTS_NAME = "model.safetensors"  # the file name transformers uses too
# flatlm.json's extra key holding Source.fingerprint() of the language trained on (written by
# flatlm.train.run, compared on resume and measure by check_language)
SOURCE_FINGERPRINT = "source_fingerprint"
# the training state beside the model (flatlm.train.state.TrainState: optimizer, data position,
# RNG): named here so that measure (which may not import train) finds the optimizer's moments
TRAINING_STATE_NAME = "training_state.pt"


def is_model_file(name: str) -> bool:
    """A file of the model (weights, configs), not of the training state (``*.pt``)."""
    return not name.endswith(".pt")


def save_checkpoint(
    model: nn.Module,
    out_dir: str | Path,
    *,
    source_spec: dict,
    model_cfg: ModelConfig,
    extra: dict | None = None,
) -> Path:
    """Writes ``model`` and its description to ``out_dir`` (created if needed); returns the path.

    ``source_spec`` is the dict that rebuilds the source (``Source.spec``); ``extra`` is any
    JSON-serialisable data (step, metrics, vocabulary). Both go to ``flatlm.json`` unchanged.
    """
    model = unwrap(model)
    expected = architecture(model_cfg).classes()[model_cfg.ln_mode]
    if not isinstance(model, expected):
        raise ValueError(
            f"model_cfg.arch={model_cfg.arch!r}, ln_mode={model_cfg.ln_mode!r} but the model is "
            f"a {type(model).__name__}"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        with _no_shard_bar():
            model.save_pretrained(out_dir)
    else:  # shared (tied) tensors are written once and retied on load
        save_model(model, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
    info = {
        "format": FORMAT,
        "source": source_spec,
        "model": model_cfg.to_dict(),
        "shape": shape_string(model_cfg),
        "n_parameters": count_parameters(model),
        "tokens": model_layout(model).to_dict(),
        "load": _load_hint(model),
        "extra": extra or {},
        # the weights' SHA-256 beside them: a checkpoint whose manifest.json is lost is still
        # checked (load_checkpoint), where it would otherwise be taken as it is
        "weights_sha256": {p.name: sha256(p) for p in sorted(out_dir.iterdir())
                           if p.is_file() and is_model_file(p.name) and p.name != INFO_NAME},
    }
    # serialise before writing so a non-JSON extra fails without leaving a half-written file
    text = json.dumps(info, indent=2) + "\n"
    (out_dir / INFO_NAME).write_text(text)
    return out_dir


def _load_hint(model: nn.Module) -> str:
    """How to load the checkpoint: transformers reads its own classes without flatlm."""
    ours = "flatlm.models.load_checkpoint(dir)"
    if not type(model).__module__.startswith("transformers."):
        return ours
    return f"transformers.{type(model).__name__}.from_pretrained(dir) or {ours}"


def verify_weights(model_dir: Path, info: dict) -> None:
    """The weight files against the digests ``flatlm.json`` keeps beside them (checkpoints
    written before it kept them: nothing to check); a ValueError naming the damaged file."""
    for name, digest in (info.get("weights_sha256") or {}).items():
        path = model_dir / name
        if not path.is_file() or sha256(path) != digest:
            raise ValueError(f"{path}: {'missing' if not path.is_file() else 'its SHA-256'} "
                             f"differs from the one {INFO_NAME} keeps (damaged after it was "
                             "written): use an earlier checkpoint (resume falls back by itself)")


def load_checkpoint(model_dir: str | Path) -> tuple[nn.Module, dict]:
    """(model in eval mode on the CPU, the ``flatlm.json`` dict); ``ModelConfig(**info["model"])``.

    Reads only local files. A BERT gets its saved ``ModelConfig.attention`` implementation and
    the class of its ``ln_mode`` (absent in older checkpoints: "post").
    """
    model_dir = Path(model_dir)
    verify_manifest(model_dir, is_model_file)  # what the model reads: not the training
    try:  # state, which can be twice its size
        info = json.loads((model_dir / INFO_NAME).read_text())
    except json.JSONDecodeError as e:  # a torn write: name the file, not just the position
        raise ValueError(f"{model_dir / INFO_NAME} is not valid JSON ({e}); the checkpoint is "
                         "damaged: use an earlier one (resume falls back by itself)") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        info = info if isinstance(info, dict) else {}
        raise ValueError(f"{model_dir / INFO_NAME}: format {info.get('format')!r}, not {FORMAT}")
    verify_weights(model_dir, info)
    cfg = ModelConfig(**info["model"])
    return _load_model(model_dir, cfg, info["tokens"]).eval(), info


def _load_model(model_dir: Path, cfg: ModelConfig, tokens: dict) -> nn.Module:
    """The model of a checkpoint (module docstring): the architecture's ``load`` hook, else the
    class's ``from_pretrained``, else the state dict into a model rebuilt from ``cfg``."""
    arch = architecture(cfg)
    if arch.load is not None:
        return arch.load(model_dir, cfg)
    model_class = arch.classes()[cfg.ln_mode]
    if hasattr(model_class, "from_pretrained"):
        return model_class.from_pretrained(model_dir)
    model = build_model(cfg, tokens["n_words"], tokens["max_length"], seed=0)  # RNG untouched
    load_model(model, str(model_dir / WEIGHTS_NAME))
    return model


def check_language(ckpt: Path, info: dict, source, action: str) -> None:
    """Refuses to ``action`` (resume, measure) the checkpoint ``ckpt`` (its ``flatlm.json`` dict
    ``info``) on ``source`` when that is another language than the one it was trained on,
    naming both: same vocabulary size is not enough (another grammar over the same 12 words
    is another language). The fingerprint the checkpoint recorded is compared; an older
    checkpoint without one has its own source rebuilt and fingerprinted (its spec compared
    when that source can no longer be built)."""
    saved = info.get("extra", {}).get(SOURCE_FINGERPRINT)
    trained_on = info.get("source")
    if saved is None:
        saved = _fingerprint_of(trained_on)
    same = (saved == source.fingerprint()) if saved is not None else trained_on == source.spec
    if not same:
        raise ValueError(f"cannot {action} {ckpt} on --source {source.spec}: it was trained on "
                         f"another language ({trained_on}); give its own source (omit "
                         "--source, or pass the one it was trained on), or start a new run")


def _fingerprint_of(spec) -> str | None:
    """The fingerprint of the source ``spec`` builds, or None if it cannot be built here."""
    try:
        return load(spec).fingerprint()
    except (ValueError, OSError):
        return None


@contextlib.contextmanager
def _no_shard_bar():
    """transformers draws a "Writing model shards" bar per save: one per checkpoint of every
    trial, which buries the sweep's own lines. Off while saving; the caller's setting after."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


# The same switch for a whole run asked for no progress output (``progress=False``, `flatlm train
# --no-progress`): transformers also draws a "Loading weights" bar on every load.
quiet_transformers_bars = _no_shard_bar
