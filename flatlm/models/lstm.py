"""A bidirectional LSTM masked LM on the shared token layout (the paper's HMM models, A.4).

Architecture (``cfg.d_hidden`` = h per direction, ``cfg.n_layers`` stacked layers)::

    ids (n, T+2) -> Embedding(V+4, h) -> dropout -> BiLSTM (n, T+2, 2h) -> dropout
                 -> head: Linear(2h, h) -> GELU -> LayerNorm(h) -> x @ E^T + b   (n, T+2, V+4)

The decoder reuses the input embedding matrix E (tied, as in BERT); the ``Linear(2h, h)``
projection bridges the two directions' 2h features to E's width h. Because the decoder reads
``embed.weight`` directly, the state dict holds no shared tensors and saves to safetensors as is.

Sequences are packed by length, so a sentence's features do not depend on how much padding
follows it, and padded positions come out as zero features. Parameters start like BERT's:
N(0, 0.02) embeddings and projection, zero [PAD] row; the LSTM keeps PyTorch's initialisation.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers.modeling_outputs import MaskedLMOutput

from flatlm.core.tokens import PAD_ID, token_layout
from flatlm.models.presets import ModelConfig

MODEL_TYPE = "flatlm_bilstm"  # config.json's model_type, so a reader can tell it from a BERT
WEIGHTS_NAME = "model.safetensors"  # the file name transformers uses too


def rnn_kernel(training: bool):
    """cuDNN's LSTM has no backward in eval mode and no double backward at all, so a measurement
    that differentiates the model in eval mode (Tr F, Tr H, sharpness) runs torch's native
    kernel; training and gradient-free reads (features, loss) keep cuDNN. No-op on the CPU."""
    if training or not torch.is_grad_enabled():
        return contextlib.nullcontext()
    return torch.backends.cudnn.flags(enabled=False)


class BiLSTMForMaskedLM(nn.Module):
    """Bidirectional LSTM masked LM; ``forward`` mirrors ``BertForMaskedLM`` (logits, loss)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, max_length: int):
        super().__init__()
        if cfg.arch != "lstm":
            raise ValueError(f"model.arch={cfg.arch!r}: BiLSTMForMaskedLM needs arch='lstm'")
        self.cfg = cfg
        self.layout = token_layout(vocab_size, max_length)
        h, n_ids = cfg.d_hidden, self.layout.vocab_size
        self.embed = nn.Embedding(n_ids, h, padding_idx=PAD_ID)
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = nn.LSTM(
            h, h, num_layers=cfg.n_layers, bidirectional=True, batch_first=True,
            dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,  # between layers; torch warns at 1
        )
        self.proj = nn.Linear(2 * h, h)
        self.norm = nn.LayerNorm(h)
        self.bias = nn.Parameter(torch.zeros(n_ids))  # decoder bias; the weight is embed.weight
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)
        with torch.no_grad():
            self.embed.weight[PAD_ID].zero_()

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(n, T+2) ids and prefix mask -> (n, T+2, 2h) features; zero on padding."""
        x = self.dropout(self.embed(input_ids))  # (n, T+2, h)
        # pack_padded_sequence wants lengths on the CPU; this is one small host copy per batch
        lengths = attention_mask.sum(1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        with rnn_kernel(self.training):
            out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=input_ids.shape[1])
        return self.dropout(out)  # (n, T+2, 2h)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., 2h) features -> (..., V+4) logits over every input id."""
        z = self.norm(nn.functional.gelu(self.proj(hidden)))  # (..., h)
        return nn.functional.linear(z, self.embed.weight, self.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> MaskedLMOutput:
        """Logits (n, T+2, V+4); with ``labels`` (-100 = ignore) also the mean cross-entropy."""
        logits = self.head(self.encode(input_ids, attention_mask))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return MaskedLMOutput(loss=loss, logits=logits)

    def save_pretrained(self, out_dir: str | Path) -> None:
        """Writes ``config.json`` and ``model.safetensors``, the file names transformers uses."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "model_type": MODEL_TYPE,
            "architectures": [type(self).__name__],
            "model": self.cfg.to_dict(),
            "n_words": self.layout.n_words,
            "max_length": self.layout.max_length,
            "vocab_size": self.layout.vocab_size,
        }
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> BiLSTMForMaskedLM:
        """Rebuilds a model written by ``save_pretrained``, in eval mode like transformers."""
        model_dir = Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        if config.get("model_type") != MODEL_TYPE:
            raise ValueError(f"{model_dir}/config.json is not a {MODEL_TYPE} checkpoint")
        model = cls(ModelConfig(**config["model"]), config["n_words"], config["max_length"])
        model.load_state_dict(load_file(str(model_dir / WEIGHTS_NAME)))
        return model.eval()


def build_lstm(cfg: ModelConfig, vocab_size: int, max_length: int) -> BiLSTMForMaskedLM:
    """A fresh BiLSTM masked LM for ``vocab_size`` words and sentences of ``max_length`` words
    (the BiLSTM's ``build`` hook in ``flatlm.models.architectures``)."""
    return BiLSTMForMaskedLM(cfg, vocab_size, max_length)


def lstm_classes() -> dict[str, type]:
    """The BiLSTM's ``classes`` hook: one class, no LayerNorm placement to choose."""
    return {"post": BiLSTMForMaskedLM}
