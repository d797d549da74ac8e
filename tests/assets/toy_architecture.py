"""A toy architecture written as a user would add one: this file, registered through the public
API when it is imported, and nothing else.

``ToyMLM`` ("toy-d16-l1": d_model 16, 1 layer): token and position embeddings, then per layer one
Linear + GELU reading each position's state next to the sentence's mean state (its only context),
then a Linear head over the V + 4 ids. It has ``encode``, ``head`` and ``layout``, so it needs no
``parts`` or ``layout`` hook; no ``save_pretrained``, so checkpoints hold its state dict; no
``fisher_method``, so Tr(F) runs the per-example loop; no ``parameter_count``, so counting builds
it.
"""

import torch
from torch import nn

from flatlm.core.tokens import PAD_ID, token_layout
from flatlm.models import Architecture, register_architecture


class ToyMLM(nn.Module):
    def __init__(self, cfg, vocab_size: int, max_length: int):
        super().__init__()
        self.layout = token_layout(vocab_size, max_length)
        d, n_ids = cfg.d_model, self.layout.vocab_size
        self.embed = nn.Embedding(n_ids, d, padding_idx=PAD_ID)
        self.position = nn.Embedding(self.layout.n_positions, d)
        self.layers = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(cfg.n_layers))
        self.decoder = nn.Linear(d, n_ids)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(n, W) ids, W <= T + 2 -> (n, W, d), zero on padding."""
        real = attention_mask[..., None].to(self.embed.weight.dtype)  # (n, W, 1)
        h = self.embed(input_ids) + self.position.weight[: input_ids.shape[1]]
        for layer in self.layers:
            context = (h * real).sum(1, keepdim=True) / real.sum(1, keepdim=True)  # (n, 1, d)
            h = nn.functional.gelu(layer(torch.cat([h, context.expand_as(h)], -1)))
        return h * real

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(hidden)  # (..., V + 4)


TOY = register_architecture(Architecture(
    name="toy", label="toy MLM", shape="toy-d{d_model}-l{n_layers}", sizes=("d_model",),
    build=ToyMLM, classes=lambda: {"post": ToyMLM},
))
