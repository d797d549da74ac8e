"""A toy source written as a user would add one: this file, registered through the public API
when it is imported (``--plugin tests.assets.toy_source``), and nothing else.

Sentences of L i.i.d. uniform words out of V; the truth at every position is uniform; task
"first" labels a sentence by its first word (V classes), under one rule.
"""

import numpy as np
import torch

from flatlm.sources import register_source
from flatlm.sources.base import Source, SourceError


class Uniform(Source):
    vocab: list[str]
    tasks = ("first",)
    label_rules = ("word",)

    def __init__(self, vocab: int, length: int):
        self.vocab = [f"u{i}" for i in range(vocab)]
        self.max_length = length
        self.spec = {"kind": "uniform", "vocab": vocab, "length": length}

    @classmethod
    def from_spec(cls, spec: dict) -> "Uniform":
        unknown = set(spec) - {"kind", "vocab", "length"}
        if unknown:
            raise SourceError(f"uniform spec: unknown field(s) {sorted(unknown)}")
        return cls(int(spec.get("vocab", 6)), int(spec.get("length", 4)))

    def sample(self, n, seed):
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, self.V, size=(n, self.max_length), dtype=np.int64)
        return torch.from_numpy(tokens), torch.full((n,), self.max_length, dtype=torch.int64)

    def _conditionals_batch(self, tokens, lengths, dtype):
        real = torch.arange(tokens.shape[1], device=tokens.device)[None] < lengths[:, None]
        return real[..., None].to(dtype) / self.V * torch.ones(self.V, dtype=dtype,
                                                                device=tokens.device)

    def labels(self, tokens, lengths, task, rule=None):
        return torch.as_tensor(tokens)[:, 0].clone()

    def num_classes(self, task):
        return self.V

    def _fingerprint_arrays(self):
        return [np.array([self.V, self.max_length])]


register_source("uniform", Uniform, "vocab")
